"""Relay overhead: the gateway against direct engine access and the Rust ``vllm-router``.

On a 2-core machine the gateway (or router) gets core 0 to itself; the engines (``--engines``,
simulated, ``instant`` profile) and the load generator (``wrk``, from Debian's packages) share
core 1. For each target it measures concurrency 1 (latency added at p50) and 64 (throughput, p99),
streamed (32 and 512 tokens) and not, and the router's own CPU time per request (from /proc,
every process of its group). All targets run side by side in one invocation, every round in a
rotated order, so ratios are comparable; medians over the rounds are reported, with each round's
figures and the host's load beside them; ratios between targets are the median of each round's.

The gateway runs with its defaults (``log_level: info``: an access line per request; metrics on),
and reports its event loop's lag (``gateway_event_loop_lag_seconds``) during each measurement.
``--profile`` also records a py-spy flame graph of the gateway (and of ``--baseline``) under load,
in a run of its own after the measured ones.

    python benchmarks/relay_overhead.py [--duration 10] [--rounds 3] [--engines 2]
        [--baseline CHECKOUT] [--profile] [--out benchmarks/results/relay_overhead]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from priority_gateway.bench import envelope
from priority_gateway.loopback import Proc, free_port

ROOT = Path(__file__).resolve().parents[1]

MODEL = "sim-model"
WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = [[%s]]
wrk.headers["Content-Type"] = "application/json"
function done(summary, latency, requests)
  io.write(string.format('{"requests": %%d, "duration_us": %%d, "errors": %%d, "non2xx": %%d, ' ..
    '"p50_us": %%d, "p90_us": %%d, "p99_us": %%d, "mean_us": %%f}\\n',
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
end
"""
LAG_METRIC = "gateway_event_loop_lag_seconds"
CLOCK_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Case:
    key: str
    stream: bool
    tokens: int
    concurrency: int


CASES = {
    c.key: c
    for c in (
        Case("nostream_c1", False, 32, 1),
        Case("nostream_c64", False, 32, 64),
        Case("stream_c1", True, 32, 1),
        Case("stream_c64", True, 32, 64),
        Case("stream512_c64", True, 512, 64),
    )
}


def body(case: Case) -> str:
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say something short about relays."}],
        "max_tokens": case.tokens,
        "ignore_eos": True,
        "stream": case.stream,
    }
    return json.dumps(payload)


def pinned() -> bool:
    return bool(shutil.which("taskset")) and (os.cpu_count() or 1) > 1


def taskset(cpu: str, cmd: list[str]) -> list[str]:
    return ["taskset", "-c", cpu, *cmd] if pinned() else cmd


# -- what the host did meanwhile -------------------------------------------------------------


def group_cpu_s(pgid: int) -> float:
    """User and system CPU seconds of every live process in the process group ``pgid``."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command's name: state, ppid, pgrp, ... utime and stime are the 12th and 13th.
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total * CLOCK_TICK_S


def cores_busy() -> list[tuple[int, int]]:
    """(busy, total) jiffies of each core since boot."""
    rows = []
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            values = [int(v) for v in line.split()[1:]]
            idle = values[3] + values[4]
            rows.append((sum(values) - idle, sum(values)))
    return rows


# -- the gateway's event loop lag, from its own histogram ------------------------------------


def lag_buckets(url: str) -> dict[float, float] | None:
    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    buckets = {}
    for line in text.splitlines():
        if line.startswith(LAG_METRIC + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float(le)] = float(line.rsplit(" ", 1)[1])
    return buckets or None


def lag_quantiles(before: dict[float, float] | None, after: dict[float, float] | None) -> dict | None:
    """p50/p99/max-bucket of the lag observed between two scrapes (the upper bound of the bucket it falls in)."""
    if not before or not after:
        return None
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1]
    if total <= 0:
        return None

    def quantile(q: float) -> float:
        for bound, count in zip(bounds, counts, strict=True):
            if count >= q * total:
                return bound
        return bounds[-1]

    worst = next((b for b, c in zip(bounds, counts, strict=True) if c >= total), bounds[-1])
    return {"samples": int(total), "p50_s": quantile(0.5), "p99_s": quantile(0.99), "max_bucket_s": worst}


# -- one measurement -------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    proc: Proc
    has_lag: bool = False

    @property
    def url(self) -> str:
        return self.proc.url

    @property
    def pid(self) -> int:
        assert self.proc.popen is not None
        return self.proc.popen.pid


def run_wrk(url: str, case: Case, duration: float, tmp: Path) -> dict:
    script = tmp / f"wrk-{case.key}.lua"
    script.write_text(WRK_SCRIPT % body(case))
    seconds = max(1, round(duration))
    wrk = f"wrk -t 1 -c {case.concurrency} -d {seconds}s --latency -s {script} {url}/v1/chat/completions"
    out = subprocess.run(taskset("1", wrk.split()), capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


def measure(target: Target, case: Case, duration: float, tmp: Path) -> dict:
    run_wrk(target.url, case, 1.0, tmp)  # warm-up
    lag_before = lag_buckets(target.url) if target.has_lag else None
    cpu_before, busy_before, wall_before = group_cpu_s(target.pid), cores_busy(), time.monotonic()
    r = run_wrk(target.url, case, duration, tmp)
    cpu_s, wall_s = group_cpu_s(target.pid) - cpu_before, time.monotonic() - wall_before
    busy = [(b - b0) / max(1, t - t0) for (b, t), (b0, t0) in zip(cores_busy(), busy_before, strict=True)]
    r["router_cpu_s"] = round(cpu_s, 3)
    r["router_cpu_ms_per_request"] = round(cpu_s * 1000 / max(1, r["requests"]), 4)
    r["router_cpu_share"] = round(cpu_s / wall_s, 3)
    r["cores_busy"] = [round(b, 3) for b in busy]
    # Core 0 holds only the router: whatever else kept it busy was someone else's work.
    r["core0_others"] = round(max(0.0, busy[0] - r["router_cpu_share"]), 3) if busy else None
    r["load_average"] = envelope.load_average()
    if target.has_lag:
        r["event_loop_lag"] = lag_quantiles(lag_before, lag_buckets(target.url))
    return r


def median_run(runs: list[dict]) -> dict:
    """Each figure's median over the rounds (a round's own figures kept beside them)."""
    out: dict = {"rounds": len(runs)}
    for field in ("rps", "p50_us", "p90_us", "p99_us", "router_cpu_ms_per_request", "router_cpu_share"):
        out[field] = statistics.median(r[field] for r in runs)
    out["errors"] = sum(r["errors"] + r["non2xx"] for r in runs)
    out["requests"] = sum(r["requests"] for r in runs)
    lags = [r["event_loop_lag"] for r in runs if r.get("event_loop_lag")]
    if lags:
        out["event_loop_lag_p99_s"] = statistics.median(lag["p99_s"] for lag in lags)
        out["event_loop_lag_p50_s"] = statistics.median(lag["p50_s"] for lag in lags)
    out["each_round"] = runs
    return out


# -- the processes ---------------------------------------------------------------------------


def start_engine(tmp: Path) -> Proc:
    port = free_port()
    cmd = [sys.executable, "-m", "priority_gateway.engines.sim", "--port", str(port), "--model", MODEL]
    cmd += ["--profile", "instant"]
    return Proc(taskset("1", cmd), f"http://127.0.0.1:{port}", tmp / f"engine-{port}.log").start()


def start_gateway(tmp: Path, engines: list[str], source: Path | None = None, log_level: str = "info") -> Proc:
    """The gateway of this checkout, or of the checkout at ``source`` (a baseline to compare with)."""
    port = free_port()
    config = tmp / f"gateway-{port}.yaml"
    urls = ", ".join(f"'{e}'" for e in engines)
    pools = f"pools:\n  interactive:\n    engines: [{urls}]\n  batch:\n    engines: [{urls}]\n"
    config.write_text(pools + f"log_level: {log_level}\n")
    # A checkout from before the package took its own name runs as ``gateway``.
    package = "gateway" if source is not None and not (source / "priority_gateway").is_dir() else "priority_gateway"
    cmd = [sys.executable, "-m", package, "serve", "--config", str(config), "--port", str(port)]
    # The other checkout's packages ahead of the installed ones: run from there (``-m`` puts the
    # working directory first on the path), and on PYTHONPATH, which precedes site-packages.
    env = None if source is None else {**os.environ, "PYTHONPATH": str(source)}
    log = tmp / f"gateway-{port}.log"
    proc = Proc(taskset("0", cmd), f"http://127.0.0.1:{port}", log, env, cwd=source)
    return proc.start().wait_ready("/ready")


def start_router(tmp: Path, engines: list[str], router_bin: str) -> Proc:
    port = free_port()
    cmd = [router_bin, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *engines]
    cmd += ["--policy", "round_robin", "--log-level", "warning", "--disable-retries", "--disable-circuit-breaker"]
    cmd += ["--prometheus-port", str(free_port())]
    return Proc(taskset("0", cmd), f"http://127.0.0.1:{port}", tmp / "router.log").start().wait_ready("/health", 60)


def start_floor(tmp: Path, engines: list[str], kind: str) -> Proc:
    """A relay that does nothing else (``relay_floor.py``): the least any relay on its stack costs."""
    port = free_port()
    cmd = [sys.executable, str(ROOT / "benchmarks/relay_floor.py"), kind, str(port), ",".join(engines)]
    return Proc(taskset("0", cmd), f"http://127.0.0.1:{port}", tmp / f"floor-{kind}.log").start().wait_ready("/")


def profile(target: Target, case: Case, seconds: float, tmp: Path, out: Path) -> Path | None:
    """A py-spy flame graph of ``target`` under ``case``'s load (py-spy on core 1, beside the load)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("relay-overhead: py-spy not found (pip install py-spy): no profile", file=sys.stderr)
        return None
    path = out / f"profile-{target.name}-{case.key}.svg"
    cmd = taskset("1", [spy, "record", "-p", str(target.pid), "-o", str(path), "-d", str(round(seconds))])
    # Blocking samples (py-spy pauses the process for each): without, stacks read while they change
    # come out torn under load. The profiled run is apart from the measured ones.
    spy_proc = subprocess.Popen([*cmd, "-r", "250", "-f", "flamegraph"], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    run_wrk(target.url, case, seconds, tmp)
    spy_proc.wait(timeout=60)
    return path if path.exists() else None


# -- the run ---------------------------------------------------------------------------------


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def summarise(results: dict[str, dict]) -> dict:
    summary: dict = {}
    direct = results.get("direct", {})
    for name, keys in results.items():
        if name == "direct":
            continue
        s = {}
        for key, r in keys.items():
            d = direct.get(key)
            s[key] = {
                "rps": round(r["rps"], 1),
                "p99_ms": round(r["p99_us"] / 1000, 2),
                "cpu_ms_per_request": r["router_cpu_ms_per_request"],
            }
            if d is not None:
                s[key]["added_p50_ms"] = round((r["p50_us"] - d["p50_us"]) / 1000, 3)
                s[key]["rps_vs_direct"] = ratio(r["rps"], d["rps"])
        summary[name] = s
    for ours in ("gateway", "baseline", "asgi-floor", "protocol-floor"):
        if ours not in results:
            continue
        for other in ("vllm-router", "baseline"):
            if other == ours or other not in results:
                continue
            pair = {}
            for key in results[ours]:
                a, b = results[ours][key], results[other].get(key)
                if b is not None:
                    # Each round's two figures were measured minutes apart at most: the median of the
                    # rounds' ratios, then the ratio of the medians.
                    rounds = list(zip(a["each_round"], b["each_round"], strict=True))
                    pair[key] = {
                        field: statistics.median(ratio(x[name], y[name]) or 0.0 for x, y in rounds)
                        for field, name in (
                            ("rps", "rps"),
                            ("p99", "p99_us"),
                            ("cpu_per_request", "router_cpu_ms_per_request"),
                        )
                    }
                    pair[key]["rps_of_medians"] = ratio(a["rps"], b["rps"])
            summary[f"{ours}_vs_{other}"] = pair
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="repeat every measurement, rotating the order")
    parser.add_argument("--engines", type=int, default=2, help="simulated engines behind every router")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/relay_overhead"))
    parser.add_argument(
        "--router-bin", default=shutil.which("vllm-router") or str(ROOT / ".venv-router/bin/vllm-router")
    )
    parser.add_argument(
        "--targets",
        default="direct,gateway,vllm-router",
        help="of direct, gateway, vllm-router, asgi-floor, protocol-floor (relay_floor.py: non-streamed cases only)",
    )
    parser.add_argument(
        "--baseline", default=None, help="also measure the gateway of this checkout (another commit), as 'baseline'"
    )
    parser.add_argument("--cases", default=",".join(CASES), help=f"which measurements, of {', '.join(CASES)}")
    parser.add_argument("--log-level", default="info", help="the gateways' log_level (info: an access line each)")
    parser.add_argument("--profile", action="store_true", help="also record py-spy flame graphs of the gateways")
    args = parser.parse_args()
    provenance = envelope.start()
    if not shutil.which("wrk"):
        sys.exit("wrk is needed: apt-get install wrk")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = [CASES[k] for k in args.cases.split(",")]
    wanted = args.targets.split(",")
    rounds: dict[str, dict[str, list[dict]]] = {}
    profiles: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        engines = [start_engine(tmp) for _ in range(args.engines)]
        procs = list(engines)
        try:
            for engine in engines:
                engine.wait_ready()
            urls = [e.url for e in engines]
            targets: list[Target] = []
            if "direct" in wanted:
                # Direct access is to one engine: the others idle, as each takes 1/n of a router's load.
                targets.append(Target("direct", engines[0]))
            if "gateway" in wanted:
                gw = start_gateway(tmp, urls, log_level=args.log_level)
                procs.append(gw)
                targets.append(Target("gateway", gw, has_lag=True))
            if args.baseline:
                base = start_gateway(tmp, urls, Path(args.baseline).resolve(), args.log_level)
                procs.append(base)
                targets.append(Target("baseline", base, has_lag=lag_buckets(base.url) is not None))
            for kind in ("asgi", "protocol"):
                if f"{kind}-floor" in wanted:
                    floor = start_floor(tmp, urls, kind)
                    procs.append(floor)
                    targets.append(Target(f"{kind}-floor", floor))
            if "vllm-router" in wanted and Path(args.router_bin).exists():
                router = start_router(tmp, urls, args.router_bin)
                procs.append(router)
                targets.append(Target("vllm-router", router))
            floors = sum(t.name.endswith("-floor") for t in targets)
            total = (len(cases) * len(targets) - floors * sum(c.stream for c in cases)) * args.rounds
            n = 0
            for round_no in range(args.rounds):
                # Each round starts with the next target, so no target always follows the same one.
                order = targets[round_no % len(targets) :] + targets[: round_no % len(targets)]
                for case in cases:
                    for target in order:
                        if case.stream and target.name.endswith("-floor"):
                            continue  # the floors relay whole answers only
                        n += 1
                        print(f"[{n}/{total}] {target.name:12s} {case.key} ...", end=" ", flush=True)
                        r = measure(target, case, args.duration, tmp)
                        rounds.setdefault(target.name, {}).setdefault(case.key, []).append(r)
                        lag = r.get("event_loop_lag") or {}
                        print(
                            f"{r['rps']:.0f} req/s, p50 {r['p50_us'] / 1000:.2f} ms, p99 {r['p99_us'] / 1000:.1f} ms,"
                            f" cpu {r['router_cpu_ms_per_request']:.3f} ms/req, errors {r['errors'] + r['non2xx']}"
                            + (f", loop lag p99 {lag['p99_s'] * 1000:.1f} ms" if lag else ""),
                            flush=True,
                        )
            if args.profile:
                for target in targets:
                    if target.name in ("gateway", "baseline"):
                        for key in ("nostream_c64", "stream_c64"):
                            path = profile(target, CASES[key], args.duration, tmp, out_dir)
                            if path is not None:
                                profiles[f"{target.name}/{key}"] = str(path.relative_to(out_dir))
        finally:
            for proc in reversed(procs):
                proc.stop()
    results = {name: {key: median_run(runs) for key, runs in keys.items()} for name, keys in rounds.items()}
    summary = summarise(results)
    report = {
        "baseline": args.baseline,
        "baseline_commit": envelope.code_commit(Path(args.baseline).resolve())[0] if args.baseline else None,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "engines": args.engines,
        "log_level": args.log_level,
        "pinned": pinned(),
        "profiles": profiles,
        "summary": summary,
        "results": results,
    }
    (out_dir / "results.json").write_text(json.dumps(provenance.wrap(report), indent=2))
    print(json.dumps(summary, indent=2))
    plot(results, out_dir / "relay_overhead.png")


def plot(results: dict[str, dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(results)
    keys = [k for k in ("nostream_c64", "stream_c64", "stream512_c64") if any(k in results[n] for n in names)]
    if not keys:
        return
    panels = (
        ("rps", "requests/s", 1.0),
        ("p99_us", "p99 latency (ms)", 1e-3),
        ("router_cpu_ms_per_request", "router CPU per request (ms)", 1.0),
    )
    fig, axes = plt.subplots(len(panels), len(keys), figsize=(4.5 * len(keys), 3.2 * len(panels)), squeeze=False)
    colors = {
        "direct": "grey",
        "gateway": "tab:blue",
        "baseline": "tab:cyan",
        "vllm-router": "tab:orange",
        "asgi-floor": "tab:olive",
        "protocol-floor": "tab:green",
    }
    for row, (field, label, scale) in enumerate(panels):
        for col, key in enumerate(keys):
            ax = axes[row][col]
            shown = [
                n for n in names if key in results[n] and not (n == "direct" and field == "router_cpu_ms_per_request")
            ]
            ax.bar(shown, [results[n][key][field] * scale for n in shown], color=[colors.get(n, "k") for n in shown])
            ax.set_title(f"{key}: {label}", fontsize=9)
            ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
