"""Relay overhead: the gateway against direct engine access and the Rust ``vllm-router``.

On a 2-core machine the gateway (or router) gets core 0 to itself; the engine and the
load generator (``wrk``, from Debian's packages) share core 1. For each target it measures
concurrency 1 (latency added at p50) and 64 (throughput), streaming (32 tokens) and not.
All targets run side by side in one invocation, so ratios are comparable.

    python benchmarks/relay_overhead.py [--duration 10] [--out benchmarks/results/relay_overhead]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def body(stream: bool) -> str:
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say something short about relays."}],
        "max_tokens": 32,
        "ignore_eos": True,
        "stream": stream,
    }
    return json.dumps(payload)


def case_key(stream: bool, concurrency: int) -> str:
    return f"{'stream' if stream else 'nostream'}_c{concurrency}"


def taskset(cpu: str, cmd: list[str]) -> list[str]:
    return ["taskset", "-c", cpu, *cmd] if shutil.which("taskset") and os.cpu_count() and os.cpu_count() > 1 else cmd


def run_wrk(url: str, stream: bool, concurrency: int, duration: float, tmp: Path) -> dict:
    script = tmp / f"wrk-{'s' if stream else 'n'}.lua"
    script.write_text(WRK_SCRIPT % body(stream))
    seconds = max(1, round(duration))
    wrk = f"wrk -t 1 -c {concurrency} -d {seconds}s --latency -s {script} {url}/v1/chat/completions"
    cmd = taskset("1", wrk.split())
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


def median_run(runs: list[dict]) -> dict:
    """The run with the median throughput, with every round's figures kept beside it."""
    ordered = sorted(runs, key=lambda r: r["rps"])
    middle = dict(ordered[len(ordered) // 2])
    if len(runs) > 1:
        middle["rounds_rps"] = [round(r["rps"], 1) for r in runs]
        middle["rounds_p50_us"] = [r["p50_us"] for r in runs]
    return middle


def start_engine(tmp: Path) -> Proc:
    port = free_port()
    cmd = taskset(
        "1",
        [
            sys.executable,
            "-m",
            "priority_gateway.engines.sim",
            "--port",
            str(port),
            "--model",
            MODEL,
            "--profile",
            "instant",
        ],
    )
    return Proc(cmd, f"http://127.0.0.1:{port}", tmp / "engine.log").start().wait_ready()


def start_gateway(tmp: Path, engine: str, source: Path | None = None, log_level: str = "warning") -> Proc:
    """The gateway of this checkout, or of the checkout at ``source`` (a baseline to compare with)."""
    port = free_port()
    config = tmp / "gateway.yaml"
    pools = f"pools:\n  interactive:\n    engines: ['{engine}']\n  batch:\n    engines: ['{engine}']\n"
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


def start_router(tmp: Path, engine: str, router_bin: str) -> Proc:
    port = free_port()
    cmd = taskset(
        "0",
        [
            router_bin,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            engine,
            "--policy",
            "round_robin",
            "--log-level",
            "warning",
            "--disable-retries",
            "--disable-circuit-breaker",
            "--prometheus-port",
            str(free_port()),
        ],
    )
    return Proc(cmd, f"http://127.0.0.1:{port}", tmp / "router.log").start().wait_ready("/health", timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/relay_overhead"))
    parser.add_argument(
        "--router-bin", default=shutil.which("vllm-router") or str(ROOT / ".venv-router/bin/vllm-router")
    )
    parser.add_argument("--targets", default="direct,gateway,vllm-router")
    parser.add_argument("--rounds", type=int, default=1, help="repeat every measurement; medians are reported")
    parser.add_argument(
        "--baseline", default=None, help="also measure the gateway of this checkout (another commit), as 'baseline'"
    )
    parser.add_argument(
        "--cases",
        default="nostream_c1,nostream_c64,stream_c1,stream_c64",
        help="which measurements, of nostream_c1, nostream_c64, stream_c1, stream_c64",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        help="the gateways' log_level: info writes an access line per request (default: warning, none)",
    )
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is needed: apt-get install wrk")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        engine = start_engine(tmp)
        procs = [engine]
        targets = {"direct": engine.url}
        try:
            wanted = args.targets.split(",")
            if "gateway" in wanted:
                gw = start_gateway(tmp, engine.url, log_level=args.log_level)
                procs.append(gw)
                targets["gateway"] = gw.url
            if args.baseline:
                wanted.append("baseline")
                base = start_gateway(tmp, engine.url, Path(args.baseline).resolve(), args.log_level)
                procs.append(base)
                targets["baseline"] = base.url
            if "vllm-router" in wanted and Path(args.router_bin).exists():
                router = start_router(tmp, engine.url, args.router_bin)
                procs.append(router)
                targets["vllm-router"] = router.url
            chosen = args.cases.split(",")
            cases = [(s, c) for s in (False, True) for c in (1, 64) if case_key(s, c) in chosen]
            total = len(cases) * len(targets) * args.rounds
            n = 0
            rounds: dict[str, dict[str, list[dict]]] = {}
            # Rounds interleave the targets, so a noisy spell on the shared machine hits all of them.
            for _ in range(args.rounds):
                for stream, concurrency in cases:
                    for name, url in targets.items():
                        if name not in wanted:
                            continue
                        n += 1
                        key = case_key(stream, concurrency)
                        print(f"[{n}/{total}] {name:12s} {key} ...", end=" ", flush=True)
                        run_wrk(url, stream, concurrency, 1.0, tmp)  # warm-up
                        r = run_wrk(url, stream, concurrency, args.duration, tmp)
                        rounds.setdefault(name, {}).setdefault(key, []).append(r)
                        errors = r["errors"] + r["non2xx"]
                        print(f"{r['rps']:.0f} req/s, p50 {r['p50_us'] / 1000:.2f} ms, errors {errors}")
            for name, keys in rounds.items():
                for key, runs in keys.items():
                    results.setdefault(name, {})[key] = median_run(runs)
        finally:
            for proc in reversed(procs):
                proc.stop()
    summary = {}
    for name in results:
        if name == "direct":
            continue
        s = {}
        for key, r in results[name].items():
            d = results["direct"][key]
            s[key] = {
                "rps": round(r["rps"], 1),
                "added_p50_ms": round((r["p50_us"] - d["p50_us"]) / 1000, 3),
                "rps_vs_direct": round(r["rps"] / d["rps"], 3),
            }
        summary[name] = s
    if "gateway" in results and "baseline" in results:
        gateway, baseline = results["gateway"], results["baseline"]
        summary["gateway_vs_baseline_rps"] = {k: round(gateway[k]["rps"] / baseline[k]["rps"], 3) for k in gateway}
    if "gateway" in results and "vllm-router" in results:
        summary["gateway_vs_vllm_router_rps"] = {
            key: round(results["gateway"][key]["rps"] / results["vllm-router"][key]["rps"], 3)
            for key in results["gateway"]
        }
    report = {
        "command": " ".join(["python", "benchmarks/relay_overhead.py", *sys.argv[1:]]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "duration_s": args.duration,
        "baseline": args.baseline,
        "cpus": os.cpu_count(),
        "results": results,
        "summary": summary,
    }
    (out_dir / "results.json").write_text(json.dumps(report, indent=2))
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
    keys = [k for k in ("nostream_c64", "stream_c64") if all(k in results[n] for n in names)]
    if not keys:
        return
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        colors = ["grey", "tab:blue", "tab:orange", "tab:green"][: len(names)]
        ax.bar(names, [results[n][key]["rps"] for n in names], color=colors)
        ax.set_title(f"{key.replace('_', ', ')}: requests/s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
