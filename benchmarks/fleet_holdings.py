"""What holding slots costs in real time: one engine behind one or two ``gateway serve`` replicas.

Replicas fill an engine only within the slots they hold (``priority_gateway/core/holdings.py``); a
replica that needs more than it holds waits for a round on the channel (its claim, and the others'
releases). This measures that wait where it shows: Poisson arrivals to one simulated engine whose
concurrency limit is pinned at 4, at about two thirds of what it serves, clients streaming short
completions; the engine's own running + waiting is sampled every 5 ms.

Runs, alternated ``--repeats`` times so that each sees the machine alike:
- ``one_memory``: one replica, ``store: memory`` (nothing shared: the reference);
- ``one_redis``: one replica on ``redis-server``, sharing on, alone (it holds the whole limit);
- ``two_idle_peer``: two replicas on Redis, every request to the first (the second holds nothing it
  does not use, and gives up its even share when the first waits);
- ``two_spread``: two replicas, requests alternated between them.

Reported per run: TTFT p50 and p99 (client side), requests served per second, and the engine's peak
load and the share of samples above the limit. Medians over the repeats in ``summary.json``.

    python benchmarks/fleet_holdings.py [--seconds 30] [--repeats 2] [--out benchmarks/results/fleet_holdings]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from priority_gateway.bench import envelope
from priority_gateway.loopback import Proc, free_port, start_engine, start_gateway

LIMIT = 4
TOKENS = 16
TOKEN_DELAY_MS = 20
RATE = 7.5  # requests/s: each holds a slot ~0.35 s, 4 slots serve ~11/s
RUNS = ("one_memory", "one_redis", "two_idle_peer", "two_spread")


def progress(message: str) -> None:
    print(f"fleet_holdings: {message}", file=sys.stderr, flush=True)


class Redis:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(tmp), "--save", ""]
        self.proc = Proc(cmd, f"redis://127.0.0.1:{self.port}", tmp / f"redis-{self.port}.log").start()
        deadline = time.monotonic() + 10
        while subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True).stdout != b"PONG\n":
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start:\n{self.proc.log()}")
            time.sleep(0.05)


def gateways(tmp: Path, engine: Proc, run: str, redis: Redis | None) -> list[Proc]:
    config: dict[str, Any] = {
        "pools": {"interactive": {"engines": [engine.url]}},
        "classes": {"interactive": {"ttft_p99_ms": 30000, "itl_p99_ms": 1000}},
        "admission": {"initial_limit": LIMIT, "min_limit": LIMIT, "max_limit": LIMIT},
        "access_log": False,
    }
    if redis is not None:
        config["store"] = redis.proc.url
    procs = [start_gateway(tmp, config) for _ in range(2 if run.startswith("two") else 1)]
    for proc in procs:
        proc.wait_ready("/ready")
    if len(procs) > 1:
        for proc in procs:
            deadline = time.monotonic() + 10
            while _metric(proc.url, "gateway_routing_share_peers") < 1:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the replicas never heard each other:\n{proc.log()}")
                time.sleep(0.1)
    time.sleep(1.5)  # past the joining replica's safe share: what is measured is the holdings
    return procs


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


async def load(targets: list[str], engine: str, seconds: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    ttfts: list[float] = []
    failed: list[str] = []
    samples: list[float] = []
    stop = asyncio.Event()

    async def one(client: httpx.AsyncClient, url: str, n: int) -> None:
        body = {"model": "sim-model", "prompt": f"request {n}: count slowly " * 8, "max_tokens": TOKENS, "stream": True}
        sent = time.monotonic()
        try:
            async with client.stream("POST", url + "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    failed.append(f"{r.status_code}: {(await r.aread())[:200]!r}")
                    return
                first = True
                async for line in r.aiter_lines():
                    if first and line.startswith("data: {"):
                        ttfts.append(time.monotonic() - sent)
                        first = False
        except httpx.HTTPError as exc:
            failed.append(f"{type(exc).__name__}: {exc}")

    async def watch(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            text = (await client.get(engine + "/metrics")).text
            samples.append(
                sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))
                )
            )
            await asyncio.sleep(0.005)

    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        watcher = asyncio.create_task(watch(client))
        started = time.monotonic()
        tasks = []
        at, n = 0.0, 0
        while at < seconds:
            at += rng.expovariate(RATE)
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            tasks.append(asyncio.create_task(one(client, targets[n % len(targets)], n)))
            n += 1
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - started
        stop.set()
        await watcher
    ttfts.sort()
    return {
        "requests": n,
        "served": len(ttfts),
        "failed": len(failed),
        "failures": failed[:3],
        "served_per_s": round(len(ttfts) / elapsed, 3),
        "ttft_p50_ms": round(1000 * ttfts[len(ttfts) // 2], 2) if ttfts else None,
        "ttft_p99_ms": round(1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 2) if ttfts else None,
        "engine_peak": max(samples, default=0.0),
        "engine_over_limit_share": round(sum(s > LIMIT for s in samples) / max(1, len(samples)), 4),
        "engine_samples": len(samples),
    }


def measure(run: str, seconds: float, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fleet-holdings-") as name:
        tmp = Path(name)
        procs: list[Proc] = []
        redis = None
        try:
            engine = start_engine(tmp, "--token-delay-ms", str(TOKEN_DELAY_MS), "--max-num-seqs", "64")
            procs.append(engine)
            engine.wait_ready()
            if run != "one_memory":
                redis = Redis(tmp)
            replicas = gateways(tmp, engine, run, redis)
            procs += replicas
            targets = [replicas[0].url] if run != "two_spread" else [r.url for r in replicas]
            return asyncio.run(load(targets, engine.url, seconds, seed))
        finally:
            for proc in reversed(procs):
                proc.stop()
            if redis is not None:
                redis.proc.stop()


def summarise(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    keys = ("ttft_p50_ms", "ttft_p99_ms", "served_per_s", "engine_peak", "engine_over_limit_share")
    table = {run: {k: statistics.median(r[k] for r in rows) for k in keys} for run, rows in results.items()}
    ref = table["one_memory"]
    for row in table.values():
        row["ttft_p50_vs_one_memory"] = round(row["ttft_p50_ms"] / ref["ttft_p50_ms"], 4)
        row["ttft_p99_vs_one_memory"] = round(row["ttft_p99_ms"] / ref["ttft_p99_ms"], 4)
        row["served_vs_one_memory"] = round(row["served_per_s"] / ref["served_per_s"], 4)
    return table


def plot(table: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(table)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key, title in (
        (axes[0], "ttft_p50_ms", "TTFT p50 (ms)"),
        (axes[1], "ttft_p99_ms", "TTFT p99 (ms)"),
        (axes[2], "engine_peak", f"engine's peak running + waiting (limit {LIMIT})"),
    ):
        ax.bar(names, [table[n][key] for n in names], color=["tab:grey", "tab:blue", "tab:orange", "tab:green"])
        ax.set_title(title)
        ax.tick_params(axis="x", labelsize=8)
    axes[2].axhline(LIMIT, color="black", linestyle="--", linewidth=1)
    fig.suptitle("holding slots across replicas: its cost in real time (medians over repeats)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="arrivals per run (seconds)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/fleet_holdings")
    args = parser.parse_args()
    provenance = envelope.start()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, Any]]] = {run: [] for run in RUNS}
    started = time.monotonic()
    for repeat in range(args.repeats):
        for run in RUNS:
            progress(f"repeat {repeat + 1}/{args.repeats}: {run} ({args.seconds:g} s) ...")
            row = measure(run, args.seconds, seed=repeat)
            progress(f"  {json.dumps(row)}")
            results[run].append(row)
    table = summarise(results)
    summary = {
        "limit": LIMIT,
        "rate_rps": RATE,
        "tokens": TOKENS,
        "token_delay_ms": TOKEN_DELAY_MS,
        "table": table,
        "wall_s": round(time.monotonic() - started, 1),
    }
    (out / "summary.json").write_text(json.dumps(provenance.wrap(summary), indent=2))
    (out / "runs.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(summary, indent=2))
    plot(table, out / "fleet_holdings.png")


if __name__ == "__main__":
    main()
