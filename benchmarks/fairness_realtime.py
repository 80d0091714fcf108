"""Noisy neighbour in real time: the scenario of ``benchmarks/fairness.py`` through ``gateway serve``.

Real processes on loopback (``benchmarks/live_stack.py``): one gateway (``--replicas N``: N on one
``redis-server``, clients round robin over them, the replicas sharing their tenants as on any
Redis store: ``core/tenant_share.py``) in front of an interactive pool of simulated ``gemma4-nvfp4``
engines in real time, prefilling ``CHUNK_TOKENS`` tokens a step as in ``benchmarks/fairness.py``
(``--max-num-batched-tokens``), or external engines (``--engines interactive=URL,URL``).
Four API keys, one tenant each, of equal weight, are created through the admin API
(``POST /admin/keys``, the client ``gateway keys --url`` uses); each tenant's requests are a Poisson
stream with its own key, streamed and timed by the client. The scenario, its rates and the
summary are ``benchmarks/fairness.py``'s (``scenarios``, ``compare``): ``C``, what the pool serves
within its budgets with one tenant far over it (``probe_rates``), is measured first (or given with
``--capacity``); a tenant's share is C / 4; then, with fair queueing (``fair``) and without
(``unfair``: ``tenants.fair: false``): the three well-behaved tenants alone at 60 % of their share (``quiet``),
the same plus the noisy one at 5x its share (``noisy``), everyone over their share
(``backlogged``: the token shares, Jain's index) and the noisy one alone (``alone``). Every run
starts fresh gateways and a fresh store, so nothing learned carries over.

``summary.json`` has per run (``fair``, ``unfair``) per tenant ``slo_attainment`` (in the noisy
scenario), ``slo_attainment_without_noisy``, ``kept``, ``share`` (backlogged), ``weight``, and
``jain_index``; ``runs.json`` every scenario's rows (with why requests missed: ``missed_ttft``,
``missed_itl``, and each well-behaved tenant's misses one by one), the CPU it took and the host's load.

    python benchmarks/fairness_realtime.py [--seconds 150] [--replicas 1] [--capacity C]
    python benchmarks/fairness_realtime.py --engines interactive=http://h:8000,http://h:8001 --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import httpx
from fairness import (
    BUDGET,
    CHUNK_TOKENS,
    INPUT,
    OUTPUT,
    TENANTS,
    WARMUP_S,
    WEIGHTS,
    WELL_BEHAVED,
    compare,
    plot,
    probe_rates,
    rates_of,
    scenarios,
)
from live_stack import (
    CpuMeter,
    Engines,
    RoundRobin,
    open_engines,
    redis_server,
    say,
    start_replicas,
    stop_all,
    wait_engines_idle,
)

from priority_gateway.bench import envelope, loadgen, stats
from priority_gateway.bench.loadgen import Sample
from priority_gateway.bench.workload import load_arrivals
from priority_gateway.engines.sim.sweep import percentile
from priority_gateway.keys.remote import RemoteKeys

ROOT = Path(__file__).resolve().parents[1]
MISSES_LISTED = 100
"""A well-behaved tenant's missed requests listed one by one per run (``misses``), at most."""
GATEWAY_METRICS = (
    "gateway_tenant_tokens_total",
    "gateway_tenant_slo_total",
    "gateway_tenant_share_replicas",
    "gateway_engine_concurrency_limit",
)
"""The replicas' own metrics kept in ``runs.json`` at the end of each run: per tenant, how many
replicas' tenants count (sharing), and the concurrency limit admission learned for each engine."""


def progress(message: str) -> None:
    say("fairness_realtime", message)


def gateway_config(
    engines: Engines, store: str, fair: bool, admin: str, budget_ms: tuple[float, float]
) -> dict[str, Any]:
    return {
        "pools": {"interactive": {"engines": engines.urls["interactive"]}},
        "classes": {"interactive": {"ttft_p99_ms": budget_ms[0], "itl_p99_ms": budget_ms[1]}},
        "tenants": {"fair": fair},
        "keys": {"admin": admin},
        "store": store,
        "log_level": "info",
    }


def create_keys(url: str, admin: str, tenants: list[str]) -> dict[str, str]:
    """One key per tenant (its ``tenant`` and ``weight``), through the admin API; tenant -> secret."""
    with RemoteKeys(url, admin) as keys:
        return {
            t: keys.create(t, ["interactive"], "interactive", None, None, tenant=t, weight=WEIGHTS.get(t, 1.0))[1]
            for t in tenants
        }


async def load(
    urls: list[str],
    model: str,
    secrets_by_tenant: dict[str, str],
    rates: dict[str, float],
    seconds: float,
    warmup_s: float,
) -> tuple[float, dict[str, list[Sample]]]:
    """Each tenant's requests sent after the warm-up, and when the run started (``loadgen.now``)."""
    tag = secrets.token_hex(4)
    finished: list[Sample] = []
    streams = {}
    for tenant, rate in rates.items():
        seed = zlib.crc32(tenant.encode())
        spec = f"poisson:rate={rate:.5f},input={INPUT},output={OUTPUT},spread=0,minutes={seconds / 60.0},seed={seed}"
        arrivals = load_arrivals([spec], x_priority="interactive", tag=f"{tag}/{tenant}")
        client = RoundRobin(urls, read_timeout=600, api_key=secrets_by_tenant[tenant])
        streams[tenant] = (loadgen.Target(client, model, x_priority="interactive"), arrivals)
    start = loadgen.now()

    async def report() -> None:
        while True:
            await asyncio.sleep(30)
            refused = sum(s.refused is not None for s in finished)
            progress(f"  {loadgen.now() - start:5.0f} s: {len(finished)} requests done, {refused} refused")

    reporter = asyncio.create_task(report())
    try:
        results = await asyncio.gather(
            *(loadgen.open_loop(target, arrivals, finished.append) for target, arrivals in streams.values())
        )
    finally:
        reporter.cancel()
        for target, _ in streams.values():
            await target.client.aclose()
    return start, {
        tenant: [s for s in samples if s.sent - start >= warmup_s]
        for tenant, samples in zip(streams, results, strict=True)
    }


def per_tenant(
    samples: dict[str, list[Sample]], start: float, span_s: float, budget_ms: tuple[float, float]
) -> dict[str, dict[str, Any]]:
    """``benchmarks/fairness.py``'s rows from what the clients saw: requests sent after the warm-up,
    those within both budgets, those refused, and the tokens (prompt + output) of those completed;
    and why the others missed: over the TTFT budget (``missed_ttft``), within it but over the ITL
    budget (``missed_itl``), and a well-behaved tenant's misses one by one (``misses``)."""
    rows = {}
    for tenant, mine in samples.items():
        done = [s for s in mine if stats.completed(s)]
        missed = [s for s in mine if not stats.meets_slo(s, *budget_ms)]
        # A request that completed within its TTFT budget and missed can only have missed on ITL.
        started = [s for s in missed if stats.completed(s) and s.chunks]
        late = [s for s in started if (s.chunks[0] - s.sent) * 1000.0 > budget_ms[0]]
        rows[tenant] = {
            "requests": len(mine),
            "met": len(mine) - len(missed),
            "refused": sum(s.refused is not None for s in mine),
            "errors": sum(s.error is not None for s in mine),
            "missed_ttft": len(late),
            "missed_itl": len(started) - len(late),
            "tokens": sum((s.prompt_tokens or INPUT) + stats.tokens(s) for s in done),
        }
        if tenant in WELL_BEHAVED:
            rows[tenant]["misses"] = [miss(s, start) for s in missed[:MISSES_LISTED]]
    return rates_of(rows, span_s)


def miss(sample: Sample, start: float) -> dict[str, Any]:
    """A request that missed its budgets, as the client saw it: when it was sent (s into the run),
    how late the client sent it, its TTFT, its ITL p99 and largest gap, and whether it was refused."""
    gaps = stats.gaps(sample)
    first = (sample.chunks[0] - sample.sent) * 1000.0 if sample.chunks else None
    return {
        "sent_s": round(sample.sent - start, 2),
        "lag_ms": round(sample.lag * 1000.0, 1),
        "ttft_ms": round(first, 1) if first is not None else None,
        "itl_p99_ms": round(percentile(gaps, 99) * 1000.0, 2) if gaps else None,
        "itl_max_ms": round(max(gaps) * 1000.0, 2) if gaps else None,
        "refused": sample.refused,
        "error": sample.error,
    }


def one_run(
    engines: Engines, args: argparse.Namespace, tmp: Path, rates: dict[str, float], fair: bool
) -> dict[str, Any]:
    admin = secrets.token_urlsafe(16)
    redis = redis_server(args.redis_server, tmp).start() if args.replicas > 1 else None
    replicas = []
    try:
        config = gateway_config(engines, redis.url if redis else "memory", fair, admin, args.budget_ms)
        replicas = start_replicas(tmp, config, args.replicas)
        urls = [r.url for r in replicas]
        keys = create_keys(urls[0], admin, list(rates))
        meter = CpuMeter()
        meter.start({"engines": engines.procs, "gateways": replicas, "redis": [redis.proc] if redis else []})
        start, samples = asyncio.run(load(urls, engines.model, keys, rates, args.seconds, args.warmup_s))
        cpu = meter.stop()
        gateway_metrics = [
            line
            for r in replicas
            for line in httpx.get(r.url + "/metrics", timeout=10).text.splitlines()
            if line.startswith(GATEWAY_METRICS)
        ]
    finally:
        stop_all(replicas)
        if redis is not None:
            redis.stop()
    if not wait_engines_idle(engines.urls["interactive"]):
        progress("  engines still hold requests 120 s after the run")
    return {
        "rows": per_tenant(samples, start, args.seconds - args.warmup_s, args.budget_ms),
        "cpu": cpu,
        "gateway_metrics": gateway_metrics,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=150.0, help="each run's length")
    parser.add_argument("--warmup-s", type=float, default=WARMUP_S, help="requests sent before this are not counted")
    parser.add_argument("--modes", default="fair,unfair", help="fair queueing on (fair), off (unfair), or both")
    parser.add_argument("--replicas", type=int, default=1, help="gateway replicas (more than one: on one redis-server)")
    parser.add_argument("--capacity", type=float, help="C in requests/s: skip measuring it")
    parser.add_argument("--interactive-engines", type=int, default=8, help="simulated engines")
    parser.add_argument("--profile", default="gemma4-nvfp4", help="simulated engines' profile")
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=CHUNK_TOKENS,
        help="simulated engines' prefill tokens per step (default: benchmarks/fairness.py's)",
    )
    parser.add_argument("--engines", nargs="+", metavar="interactive=URL,URL", help="external engines; none simulated")
    parser.add_argument(
        "--budget-ms",
        type=lambda v: tuple(float(x) for x in v.split(",")),
        default=(BUDGET.ttft_s * 1000.0, BUDGET.itl_s * 1000.0),
        metavar="TTFT,ITL",
        help="the interactive class's TTFT p99 and ITL p99 budgets (default: benchmarks/fairness.py's, 500,50)",
    )
    parser.add_argument("--redis-server", default="redis-server", help="the redis-server binary (--replicas > 1)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/fairness_realtime"))
    args = parser.parse_args()
    if args.seconds <= args.warmup_s:
        parser.error(f"--seconds must be longer than the warm-up ({args.warmup_s:g} s)")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - {"fair", "unfair"}:
        parser.error("--modes: fair, unfair or fair,unfair")
    provenance = envelope.start()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        simulated = {
            "interactive": (
                args.interactive_engines,
                ["--profile", args.profile, "--max-num-batched-tokens", str(args.max_num_batched_tokens)],
            )
        }
        engines = open_engines(tmp, args.engines, simulated)
        try:
            n = len(engines.urls["interactive"])
            if args.capacity is None:
                rates = probe_rates(n)
                progress(f"capacity probe: one tenant at {sum(rates.values()):g} requests/s, {args.seconds:g} s ...")
                probe = one_run(engines, args, tmp, rates, fair=True)
                runs["capacity_probe"] = probe
                c = sum(row["met"] for row in probe["rows"].values()) / (args.seconds - args.warmup_s)
            else:
                c = args.capacity
            share = c / len(TENANTS)
            progress(f"C = {c:.3f} requests/s within budget; a tenant's share {share:.3f}")
            by_mode: dict[str, dict[str, Any]] = {}
            for mode in modes:
                for name, rates in scenarios(share).items():
                    progress(f"{mode} / {name}: {', '.join(f'{t} {r:.3f}/s' for t, r in rates.items())} ...")
                    run = one_run(engines, args, tmp, rates, fair=mode == "fair")
                    runs[f"{mode}/{name}"] = run
                    by_mode.setdefault(mode, {})[name] = run["rows"]
                    progress(
                        "  "
                        + "; ".join(
                            f"{t}: {row['slo_attainment']} met, {row['refused']}/{row['requests']} refused, "
                            f"{row['tokens_per_s']} tok/s"
                            for t, row in run["rows"].items()
                        )
                    )
                    (out / "runs.json").write_text(json.dumps(runs, indent=1))
        finally:
            engines.stop()
    summary: dict[str, Any] = {
        "mode": "real time" + (f", {args.replicas} replicas" if args.replicas > 1 else ""),
        "profile": engines.model if args.engines else args.profile,
        "max_num_batched_tokens": None if args.engines else args.max_num_batched_tokens,
        "engines": len(engines.urls["interactive"]),
        "replicas": args.replicas,
        "budget_ms": {"ttft_p99": args.budget_ms[0], "itl_p99": args.budget_ms[1]},
        "request_tokens": {"input": INPUT, "output": OUTPUT},
        "seconds": args.seconds,
        "warmup_s": args.warmup_s,
        "capacity_rps": round(c, 4),
        "capacity_measured": args.capacity is None,
        "share_rps": round(share, 4),
        "rates_rps": {name: {t: round(r, 4) for t, r in rates.items()} for name, rates in scenarios(share).items()},
        **compare(by_mode, c * (INPUT + OUTPUT)),
        "wall_s": round(time.monotonic() - started, 1),
    }
    (out / "summary.json").write_text(json.dumps(provenance.wrap(summary), indent=2) + "\n")
    if len(modes) == 2:
        plot(summary, out / "fairness_realtime.png")
    headline = ("jain_index", "well_behaved_kept_min", "noisy_alone_share_of_capacity")
    print(json.dumps({mode: {k: summary[mode][k] for k in headline} for mode in modes}, indent=2))


if __name__ == "__main__":
    main()
