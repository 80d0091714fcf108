"""Fleet-wide admission in real time: one ``gateway serve`` against several on one ``redis-server``,
under a batch flood, the clients spread round robin over the replicas.

Real processes on loopback (``benchmarks/live_stack.py``): an interactive pool of ``gemma4-nvfp4``
and a batch pool of ``gemma4-nvfp4-mtp4`` simulated engines (``--scheduling-policy priority``) in
real time, or external engines (``--engines``, e.g. real vLLM on a GPU host); the replicas share
one ``redis-server`` (``store: redis``, ``fleet`` on). Interactive requests arrive as a
Poisson stream (streamed, timed by the client from its chunks); a batch flood keeps ``--flood``
non-streamed batch requests outstanding, more than the batch pool takes, so the gateways also
backfill the interactive pool. Runs, repeated ``--repeats`` times in turn so that the machine's
noise falls on all of them alike:

- ``one``: one replica (the reference);
- ``fleet``: ``--replicas`` replicas sharing in-flight counts and learned limits over Redis;
- ``fleet_redis_killed``: the same, with ``redis-server`` SIGKILLed a third into the run and started
  again (same port, empty) two thirds in (``--no-redis-restart``: left dead): each replica admits its
  safe share of every limit meanwhile.

Per run: interactive TTFT p99 and ITL p99 (requests sent after ``--warmup-s``), the share refused,
batch goodput (output tokens/s of batch requests completed after the warm-up), and per engine the
most it held (its own ``vllm:num_requests_running`` + ``waiting``, sampled every ``--sample-ms``)
against the fleet's limit for it; the CPU each part took. Targets: the fleet's TTFT and ITL p99
within 5 % of one replica's, batch goodput within 10 %; with Redis killed, the budgets hold.

    python benchmarks/fleet_admission_realtime.py [--minutes 3] [--repeats 3] [--replicas 4]
    python benchmarks/fleet_admission_realtime.py --engines interactive=http://h:8000,http://h:8001 \\
        batch=http://h:8002,http://h:8003 --redis-server /usr/bin/redis-server --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from live_stack import (
    CpuMeter,
    Engines,
    RoundRobin,
    Sampler,
    open_engines,
    redis_server,
    say,
    start_replicas,
    stop_all,
    wait_engines_idle,
)

from priority_gateway.bench import envelope, loadgen, stats
from priority_gateway.bench.loadgen import Sample
from priority_gateway.bench.workload import SyntheticWorkload, load_arrivals
from priority_gateway.loopback import RedisServer

ROOT = Path(__file__).resolve().parents[1]
BUDGET_MS = (500.0, 50.0)  # the interactive class's TTFT p99 and ITL p99, as in benchmarks/admission.py
SETUPS = ("one", "fleet", "fleet_redis_killed")


def progress(message: str) -> None:
    say("fleet_admission_realtime", message)


class Flood:
    """``workers`` clients, each streaming one batch request after another (started ``ramp_s`` apart
    in all, as clients that are not synchronized), timed like the interactive ones."""

    def __init__(self, target: loadgen.Target, workload: SyntheticWorkload) -> None:
        self.target = target
        self.workload = workload
        self.samples: list[Sample] = []

    async def worker(self, delay: float) -> None:
        await asyncio.sleep(delay)
        while True:
            sample = Sample("batch", loadgen.now())
            self.samples.append(sample)
            await loadgen.stream_one(self.target, self.workload.next(), sample)
            if sample.refused is not None or sample.error is not None:
                await asyncio.sleep(sample.retry_after or 1.0)

    def statuses(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.samples:
            key = s.refused or s.error or ("cancelled" if s.cancelled else "200" if s.done else "streaming")
            out[key] = out.get(key, 0) + 1
        return out

    def goodput(self, start: float, since_s: float, until_s: float) -> float:
        """Output tokens/s the batch clients received in the window, of requests that did not fail
        (each request's tokens spread over its events; one still streaming at the end is counted
        with the mean tokens per event)."""
        done = [s for s in self.samples if s.output_tokens and s.chunks]
        per_event = sum(s.output_tokens or 0 for s in done) / max(1, sum(len(s.chunks) for s in done)) or 1.0
        tokens = 0.0
        for s in self.samples:
            if s.error is not None or not s.chunks:
                continue
            weight = s.output_tokens / len(s.chunks) if s.output_tokens else per_event
            tokens += weight * sum(1 for t in s.chunks if since_s <= t - start <= until_s)
        return round(tokens / (until_s - since_s), 1)


async def drive(
    urls: list[str],
    engines: Engines,
    args: argparse.Namespace,
    seed: int,
    outage: tuple[float, float] | None,
    redis: RedisServer,
) -> dict[str, Any]:
    seconds = args.minutes * 60.0
    tag = secrets.token_hex(4)
    arrivals = load_arrivals(
        [f"poisson:rate={args.rate},input={args.input},output={args.output},minutes={args.minutes},seed={seed}"],
        x_priority="interactive",
        tag=tag,
    )
    interactive = RoundRobin(urls, read_timeout=600)
    batch = RoundRobin(urls, read_timeout=3600)
    target = loadgen.Target(interactive, engines.model, x_priority="interactive")
    loop = asyncio.get_running_loop()
    start = loadgen.now()
    workload = SyntheticWorkload(args.input, args.output, seed=seed, tag=f"{tag}/batch")
    flood = Flood(loadgen.Target(batch, engines.model, x_priority="batch"), workload)
    flooders = [loop.create_task(flood.worker(args.ramp_s * n / args.flood)) for n in range(args.flood)]
    samples: list[Sample] = []
    finished: list[Sample] = []
    timers = []
    if outage is not None:
        timers.append(loop.call_later(outage[0], lambda: loop.run_in_executor(None, redis.kill)))
        if outage[1] < seconds:
            timers.append(loop.call_later(outage[1], lambda: loop.run_in_executor(None, redis.start)))

    async def report() -> None:
        while True:
            await asyncio.sleep(30)
            refused = sum(s.refused is not None for s in finished)
            progress(
                f"  {loadgen.now() - start:5.0f} s: interactive {len(finished)}/{len(arrivals)} done, "
                f"{refused} refused; batch {flood.statuses()}"
            )

    reporter = loop.create_task(report())
    try:
        samples += await loadgen.open_loop(target, arrivals, finished.append)
    finally:
        for task in [*flooders, reporter]:
            task.cancel()
        await asyncio.gather(*flooders, reporter, return_exceptions=True)
        for timer in timers:
            timer.cancel()
        await interactive.aclose()
        await batch.aclose()
    warm = [s for s in samples if s.sent - start >= args.warmup_s]
    out: dict[str, Any] = {
        "interactive": stats.summarize(warm, *args.budget_ms),
        "interactive_refused_share": round(sum(s.refused is not None for s in warm) / max(1, len(warm)), 4),
        "batch_goodput_tokens_per_s": flood.goodput(start, args.warmup_s, seconds),
        "batch_statuses": flood.statuses(),
        "elapsed_s": round(loadgen.now() - start, 1),
    }
    if outage is not None:
        during = [s for s in samples if outage[0] <= s.sent - start < outage[1]]
        out["interactive_while_redis_down"] = stats.summarize(during, *args.budget_ms)
        out["batch_goodput_while_redis_down"] = flood.goodput(start, outage[0], min(outage[1], seconds))
    return out


def gateway_config(engines: Engines, store: str, args: argparse.Namespace) -> dict[str, Any]:
    batch_pool: dict[str, Any] = {"engines": engines.urls["batch"]}
    if args.batch_scheduling == "priority":
        batch_pool["scheduling_policy"] = "priority"
    return {
        "pools": {"interactive": {"engines": engines.urls["interactive"]}, "batch": batch_pool},
        "classes": {"interactive": {"ttft_p99_ms": args.budget_ms[0], "itl_p99_ms": args.budget_ms[1]}},
        "store": store,
        "log_level": "info",
    }


def one_run(setup: str, rep: int, engines: Engines, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    replicas_n = 1 if setup == "one" else args.replicas
    seconds = args.minutes * 60.0
    outage = None
    if setup == "fleet_redis_killed":
        outage = (seconds / 3, 2 * seconds / 3 if args.redis_restart else float("inf"))
    redis = redis_server(args.redis_server, tmp).start()
    replicas = []
    try:
        replicas = start_replicas(tmp, gateway_config(engines, redis.url, args), replicas_n)
        urls = [r.url for r in replicas]
        meter = CpuMeter()
        meter.start({"engines": engines.procs, "gateways": replicas, "redis": [redis.proc] if redis.proc else []})
        sampler = Sampler(engines.pool_of, urls, args.sample_ms / 1000.0, args.warmup_s)
        if outage is not None:
            sampler.down_window(*outage)
        result = asyncio.run(drive(urls, engines, args, seed=args.seed + rep, outage=outage, redis=redis))
        sampled = sampler.stop()
        result["cpu"] = meter.stop({"sampler": sampled.pop("sampler_cpu_s") or 0.0})
        result["engines"] = sampled["engines"]
        result["gateway_logs"] = {r.url: log_events(r.log_path.read_text()) for r in replicas}
    finally:
        stop_all(replicas)
        redis.stop()
    if not wait_engines_idle([u for us in engines.urls.values() for u in us]):
        progress("  engines still hold requests 120 s after the run: the next run starts on a busy fleet")
    return {"setup": setup, "repeat": rep, "replicas": replicas_n, "redis_down_s": outage, **result}


def log_events(text: str) -> dict[str, int]:
    """How often a replica logged that it lost the channel and took, then left, its safe share."""
    events = ("routing_share_lost", "admission_safe_share", "admission_safe_share_ended")
    return {e: len(re.findall(rf"\bevent={e}(?: |$)", text, re.M)) for e in events}


def figures(run: dict[str, Any]) -> dict[str, Any]:
    i = run["interactive"]
    engines = run["engines"].values()
    return {
        "ttft_p99_ms": i.get("ttft_p99_ms"),
        "itl_p99_ms": i.get("itl_p99_ms"),
        "ttft_p50_ms": i.get("ttft_p50_ms"),
        "itl_p50_ms": i.get("itl_p50_ms"),
        "slo_attainment": i.get("slo_attainment"),
        "refused_share": run["interactive_refused_share"],
        "batch_goodput_tokens_per_s": run["batch_goodput_tokens_per_s"],
        "interactive_requests": i["requests"],
        "engine_over_limit_share_max": max((e["over_share"] or 0.0 for e in engines), default=None),
        "engine_max_over_limit": max((e["over_by_max"] for e in engines), default=None),
        "engine_over_samples_redis_up": sum(e["over"] - e["down_over"] for e in engines),
        **{
            f"{pool}_{key}": max((e[key] for e in engines if e["pool"] == pool), default=None)
            for pool in ("interactive", "batch")
            for key in ("max_held_after_warmup", "limit_max", "down_max_held")
        },
        "ttft_p99_ms_redis_down": run.get("interactive_while_redis_down", {}).get("ttft_p99_ms"),
        "itl_p99_ms_redis_down": run.get("interactive_while_redis_down", {}).get("itl_p99_ms"),
        "machine_busy_share": run["cpu"]["machine_busy_share"],
        "ours_share_of_cores": run["cpu"]["ours_share_of_cores"],
    }


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def summarize(runs: list[dict[str, Any]], budget_ms: tuple[float, float]) -> dict[str, Any]:
    by_setup: dict[str, list[dict[str, Any]]] = {s: [] for s in SETUPS}
    for run in runs:
        by_setup[run["setup"]].append(figures(run))
    medians = {s: {k: median([r[k] for r in rows]) for k in rows[0]} for s, rows in by_setup.items() if rows}
    one = medians.get("one", {})

    def ratio(row: dict[str, Any], key: str) -> float | None:
        return round(row[key] / one[key], 4) if row.get(key) is not None and one.get(key) else None

    # Ratios within each repeat (the runs of one repeat were side by side), then their median.
    paired: dict[str, dict[str, float | None]] = {}
    for setup in SETUPS[1:]:
        pairs = [(a, b) for a, b in zip(by_setup["one"], by_setup[setup], strict=False) if a["ttft_p99_ms"] is not None]
        paired[setup] = {
            f"{key}_vs_one": median([b[key] / a[key] if a[key] and b[key] is not None else None for a, b in pairs])
            for key in ("ttft_p99_ms", "itl_p99_ms", "batch_goodput_tokens_per_s")
        }
    fleet = paired.get("fleet", {})
    killed = medians.get("fleet_redis_killed", {})
    return {
        "repeats": {s: rows for s, rows in by_setup.items()},
        "medians": medians,
        "median_ratios_vs_one": {s: {k: ratio(m, k) for k in m} for s, m in medians.items() if s != "one"},
        "paired_ratio_medians": paired,
        "targets": {
            "fleet_ttft_within_5pct": _within(fleet.get("ttft_p99_ms_vs_one"), 1.05),
            "fleet_itl_within_5pct": _within(fleet.get("itl_p99_ms_vs_one"), 1.05),
            "fleet_goodput_within_10pct": _within(fleet.get("batch_goodput_tokens_per_s_vs_one"), 0.9, above=True),
            "redis_killed_budgets_hold": None
            if not killed
            else all(
                (killed[f"{kind}_p99_ms{when}"] or 0.0) <= budget
                for kind, budget in zip(("ttft", "itl"), budget_ms, strict=True)
                for when in ("", "_redis_down")
            ),
        },
    }


def _within(value: float | None, bound: float, above: bool = False) -> bool | None:
    if value is None:
        return None
    return value >= bound if above else value <= bound


def plot(summary: dict[str, Any], runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(15, 8))
    grid = fig.add_gridspec(2, 6)
    top = [fig.add_subplot(grid[0, 2 * i : 2 * i + 2]) for i in range(3)]
    colors = {"one": "tab:grey", "fleet": "tab:blue", "fleet_redis_killed": "tab:orange"}
    for ax, key, budget, title in (
        (top[0], "ttft_p99_ms", summary["scenario"]["budget_ms"]["ttft_p99"], "interactive TTFT p99 (ms)"),
        (top[1], "itl_p99_ms", summary["scenario"]["budget_ms"]["itl_p99"], "interactive ITL p99 (ms)"),
        (top[2], "batch_goodput_tokens_per_s", None, "batch output tokens/s"),
    ):
        for i, setup in enumerate(SETUPS):
            rows = summary["repeats"].get(setup) or []
            values = [r[key] for r in rows if r[key] is not None]
            ax.scatter([i] * len(values), values, color=colors[setup], alpha=0.6)
            if (m := summary["medians"].get(setup, {}).get(key)) is not None:
                ax.hlines(m, i - 0.3, i + 0.3, color=colors[setup], linewidth=3)
        if budget is not None:
            ax.axhline(budget, color="black", linestyle="--", linewidth=1, label="budget")
            ax.legend(fontsize=8)
        ax.set_xticks(range(len(SETUPS)), SETUPS, fontsize=8)
        ax.set_title(title + ": repeats, median")
    killed = next((r for r in reversed(runs) if r["setup"] == "fleet_redis_killed"), None)
    if killed is not None:
        for n, pool in enumerate(("interactive", "batch")):
            ax = fig.add_subplot(grid[1, 3 * n : 3 * n + 3])
            traces = [t for _, t in sorted(killed["engines"].items()) if t["pool"] == pool and t["series"]]
            for i, trace in enumerate(traces):
                t, held, limit = zip(*trace["series"], strict=True)
                line = ax.plot(t, held, linewidth=1, label=f"engine {i}: held")[0]
                ax.plot(t, limit, linestyle=":", color=line.get_color(), linewidth=1.5, label=f"engine {i}: limit")
            start, end = killed["redis_down_s"]
            ax.axvspan(start, min(end, killed["elapsed_s"]), color="tab:red", alpha=0.1, label="redis-server down")
            ax.set_xlabel("seconds into the run")
            ax.set_title(f"{pool} engines, fleet_redis_killed (repeat {killed['repeat']}): running + waiting, limit")
            ax.legend(fontsize=7, ncol=3)
    fig.suptitle("gateway serve in real time: 1 replica vs a fleet on one redis-server, under a batch flood")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def scenario(args: argparse.Namespace, engines: Engines) -> dict[str, Any]:
    return {
        "model": engines.model,
        "engines": engines.urls if args.engines else None,
        "interactive_engines": len(engines.urls["interactive"]),
        "batch_engines": len(engines.urls["batch"]),
        "profiles": None if args.engines else [args.interactive_profile, args.batch_profile],
        "rate_rps": args.rate,
        "tokens": [args.input, args.output],
        "flood": args.flood,
        "flood_ramp_s": args.ramp_s,
        "minutes": args.minutes,
        "warmup_s": args.warmup_s,
        "replicas": args.replicas,
        "budget_ms": {"ttft_p99": args.budget_ms[0], "itl_p99": args.budget_ms[1]},
        "redis_restart": args.redis_restart,
        "sample_ms": args.sample_ms,
        "host_cores": os.cpu_count(),
    }


def run_all(
    args: argparse.Namespace, setups: list[str], out: Path, provenance: envelope.Envelope
) -> tuple[dict[str, Any], list]:
    """Every run, in turn; after each, ``runs.json`` and ``summary.json`` hold what is done so far
    (an interrupted invocation leaves a summary that ``--from-runs`` can merge with another's)."""
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    summary: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        batch_args = ["--profile", args.batch_profile, "--scheduling-policy", args.batch_scheduling]
        simulated = {
            "interactive": (args.interactive_engines, ["--profile", args.interactive_profile]),
            "batch": (args.batch_engines, batch_args),
        }
        engines = open_engines(tmp, args.engines, simulated)
        try:
            for rep in range(args.repeats):
                for setup in setups:
                    progress(f"repeat {rep + 1}/{args.repeats}, {setup}: {args.minutes:g} min ...")
                    run = one_run(setup, rep, engines, args, tmp)
                    runs.append(run)
                    f = figures(run)
                    progress(
                        f"  TTFT p99 {f['ttft_p99_ms']} ms, ITL p99 {f['itl_p99_ms']} ms, refused "
                        f"{f['refused_share']:.1%}, batch {f['batch_goodput_tokens_per_s']} tok/s, engines over "
                        f"their limit in {f['engine_over_limit_share_max']} of samples, machine busy "
                        f"{f['machine_busy_share']:.0%}"
                    )
                    summary = {
                        "scenario": scenario(args, engines),
                        **summarize(runs, args.budget_ms),
                        "wall_s": round(time.monotonic() - started, 1),
                    }
                    (out / "runs.json").write_text(json.dumps(runs, separators=(",", ":")) + "\n")
                    (out / "summary.json").write_text(json.dumps(provenance.wrap(summary), indent=2) + "\n")
        finally:
            engines.stop()
    return summary, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=3.0, help="length of each run")
    parser.add_argument("--warmup-s", type=float, default=30.0, help="requests sent before this are not measured")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--setups", default=",".join(SETUPS), help="which runs, of " + ",".join(SETUPS))
    parser.add_argument("--rate", type=float, default=0.42, help="interactive requests/s (Poisson)")
    parser.add_argument("--input", type=int, default=2048, help="prompt tokens (both classes)")
    parser.add_argument("--output", type=int, default=512, help="output tokens (both classes)")
    parser.add_argument("--flood", type=int, default=160, help="batch requests kept outstanding")
    parser.add_argument("--ramp-s", type=float, default=10.0, help="the flood's clients start over this long")
    parser.add_argument("--interactive-engines", type=int, default=4, help="simulated engines")
    parser.add_argument("--batch-engines", type=int, default=2, help="simulated engines")
    parser.add_argument("--interactive-profile", default="gemma4-nvfp4")
    parser.add_argument("--batch-profile", default="gemma4-nvfp4-mtp4")
    parser.add_argument(
        "--engines",
        nargs="+",
        metavar="POOL=URL,URL",
        help="external engines (e.g. real vLLM): interactive=URL,URL batch=URL,URL; no engine is simulated",
    )
    parser.add_argument("--batch-scheduling", choices=("priority", "fcfs"), default="priority")
    parser.add_argument(
        "--budget-ms",
        type=lambda v: tuple(float(x) for x in v.split(",")),
        default=BUDGET_MS,
        metavar="TTFT,ITL",
        help="the interactive class's TTFT p99 and ITL p99 budgets (default 500,50)",
    )
    parser.add_argument("--redis-server", default="redis-server", help="the redis-server binary")
    parser.add_argument("--redis-restart", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--sample-ms", type=float, default=10.0, help="engine concurrency sampling period")
    parser.add_argument("--seed", type=int, default=0, help="repeat r draws its arrivals with seed + r")
    parser.add_argument(
        "--from-runs",
        nargs="+",
        metavar="DIR",
        help="run nothing: summarize the runs of earlier invocations (their --out folders, which keep runs.json)",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/fleet_admission_realtime"))
    args = parser.parse_args()
    setups = [s for s in args.setups.split(",") if s]
    if unknown := set(setups) - set(SETUPS):
        parser.error(f"--setups: unknown {sorted(unknown)}")
    provenance = envelope.start()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.from_runs:
        earlier = [json.loads((Path(d) / "summary.json").read_text()) for d in args.from_runs]
        runs = [run for d in args.from_runs for run in json.loads((Path(d) / "runs.json").read_text())]
        summary = {
            "commands": [e["command"] for e in earlier],
            "commits": [e.get("commit") for e in earlier],
            "scenario": earlier[0]["scenario"],
            **summarize(runs, tuple(earlier[0]["scenario"]["budget_ms"].values())),
            "wall_s": round(sum(e["wall_s"] for e in earlier), 1),
        }
    else:
        summary, runs = run_all(args, setups, out, provenance)
    (out / "summary.json").write_text(json.dumps(provenance.wrap(summary), indent=2) + "\n")
    plot(summary, runs, out / "fleet_admission_realtime.png")
    print(json.dumps({k: summary[k] for k in ("medians", "paired_ratio_medians", "targets")}, indent=2))


if __name__ == "__main__":
    main()
