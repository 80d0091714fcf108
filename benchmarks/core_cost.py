"""The request path's own work, without HTTP: what one request costs in parsing, routing and admission.

The gateway's relay pays, per request, for the body's parse and checks, the model's resolution and the
prompt's hashing (``Placement.route_request``), admission and placement (``Scheduler.submit``), the
attempt's start and stop, and the finish that frees its slot. This drives exactly those calls of the
product's own code, in process, on a gateway built from a configuration as ``gateway serve`` builds it
(two engines per pool, as ``relay_overhead.py`` runs), and reports microseconds per request: the part of
``relay_overhead``'s CPU per request that is the core's and not the HTTP layers'.

``--baseline CHECKOUT`` measures another checkout's code the same way, alternating with this one, each
round in a process of its own; the ratio is the median of the rounds' ratios.

    python benchmarks/core_cost.py [--requests 20000] [--rounds 5] [--baseline CHECKOUT]
        [--out benchmarks/results/core_cost]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
URLS = ["http://127.0.0.1:9", "http://127.0.0.1:10"]
MODEL = "sim-model"
PROMPT = "Summarise the following report in three sentences. " * 8


async def _measure(requests: int) -> float:
    """Microseconds per request of this process's ``priority_gateway``."""
    import orjson

    from priority_gateway.config.load import parse_config
    from priority_gateway.http.body import parse_body
    from priority_gateway.http.proxy import ENDPOINTS
    from priority_gateway.runtime import Gateway

    config = parse_config({"pools": {"interactive": {"engines": URLS}, "batch": {"engines": URLS}}, "store": "memory"})
    gateway = Gateway(config)
    for pool in gateway.dispatcher.pools.values():
        for engine in pool.engines:
            engine.models = frozenset({MODEL})
    endpoint = ENDPOINTS["/v1/chat/completions"]
    budget = gateway.budgets["interactive"]
    scheduler, placement = gateway.scheduler, gateway.placement
    messages = [[{"role": "user", "content": f"{PROMPT} Case {n}."}] for n in range(64)]
    bodies = [orjson.dumps({"model": MODEL, "messages": m, "max_tokens": 32}) for m in messages]

    def one(body: bytes) -> None:
        parsed = parse_body(body, endpoint.required, endpoint.check)
        req = placement.route_request(parsed, endpoint.hashes_prompt, "interactive", budget, None, time.monotonic())
        dispatch = scheduler.submit(req)
        scheduler.running(req, lambda: False)
        scheduler.stopped(req)
        scheduler.finish(dispatch, True, 32, 40)

    for n in range(requests // 10):  # warm: the prefix index and the limits at their steady state
        one(bodies[n % len(bodies)])
    started = time.perf_counter()
    for n in range(requests):
        one(bodies[n % len(bodies)])
    return (time.perf_counter() - started) / requests * 1e6


def _round(checkout: Path, requests: int) -> float:
    """One measurement in a fresh process running ``checkout``'s code."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    cmd = [sys.executable, __file__, "--one", str(requests)]
    out = subprocess.run(cmd, env=env, cwd=checkout, capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", default=None, help="another checkout to measure alongside this one")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/core_cost"))
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(f"{asyncio.run(_measure(args.one)):.3f}")
        return
    from priority_gateway.bench import envelope

    provenance = envelope.start()
    targets = {"gateway": ROOT}
    if args.baseline:
        targets["baseline"] = Path(args.baseline).resolve()
    runs: dict[str, list[float]] = {name: [] for name in targets}
    for n in range(args.rounds):
        order = list(targets.items())
        if n % 2:
            order.reverse()  # neither always runs first
        for name, checkout in order:
            runs[name].append(_round(checkout, args.requests))
            print(f"[{n + 1}/{args.rounds}] {name:8s} {runs[name][-1]:.1f} us/request", flush=True)
    report: dict[str, object] = {
        "requests": args.requests,
        "rounds": args.rounds,
        "engines_per_pool": len(URLS),
        "us_per_request": {name: round(statistics.median(values), 2) for name, values in runs.items()},
        "runs": runs,
    }
    if args.baseline:
        report["baseline"] = args.baseline
        report["baseline_commit"] = envelope.code_commit(targets["baseline"])[0]
        ratios = [g / b for g, b in zip(runs["gateway"], runs["baseline"], strict=True)]
        report["gateway_vs_baseline"] = round(statistics.median(ratios), 3)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(provenance.wrap(report), indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
