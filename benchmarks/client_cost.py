"""What an HTTP client costs per request: the gateway's lean client against httpx.

Why the gateway relays to engines with its own client (``priority_gateway.upstream.h1``) while the tools
that talk to arbitrary endpoints use httpx (docs/architecture.md). One process drives a
simulated engine (``--profile instant``) with each client in turn, ``--concurrency`` streams at a
time for ``--duration`` seconds, the rounds interleaved so that a noisy spell on the shared
machine hits both. The client gets core 0 and the engine core 1 where there are two. Reported:
requests per second and the client process's CPU time per request (what the relay would spend
on the engine side of every request), medians over the rounds, and their ratios.

    python benchmarks/client_cost.py [--rounds 5] [--duration 4] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from priority_gateway.bench import envelope
from priority_gateway.loopback import Proc, free_port
from priority_gateway.upstream.h1 import EngineClient

ROOT = Path(__file__).resolve().parents[1]
MODEL = "sim-model"
PATH = "/v1/chat/completions"


def request_body(stream: bool) -> bytes:
    messages = [{"role": "user", "content": "Say something short about clients."}]
    return orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 32, "ignore_eos": True, "stream": stream})


async def lean(url: str, concurrency: int, duration: float, stream: bool) -> int:
    client = EngineClient(url, max_idle=concurrency)
    body = request_body(stream)
    headers = ((b"content-type", b"application/json"),)

    async def one() -> None:
        response = await client.request(b"POST", PATH.encode(), headers, body)
        try:
            while await response.next_chunk() is not None:
                pass
        finally:
            response.close()

    try:
        return await closed_loop(one, concurrency, duration)
    finally:
        client.close()


async def with_httpx(url: str, concurrency: int, duration: float, stream: bool) -> int:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    body = request_body(stream)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30.0) as client:

        async def one() -> None:
            headers = {"content-type": "application/json"}
            async with client.stream("POST", PATH, content=body, headers=headers) as response:
                async for _ in response.aiter_raw():
                    pass

        return await closed_loop(one, concurrency, duration)


async def closed_loop(one, concurrency: int, duration: float) -> int:
    """``concurrency`` callers back to back for ``duration`` seconds; how many requests completed."""
    done = 0
    deadline = time.monotonic() + duration

    async def caller() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            await one()
            done += 1

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return done


CLIENTS = {"lean": lean, "httpx": with_httpx}


def measure(name: str, url: str, concurrency: int, duration: float, stream: bool) -> dict[str, float]:
    """One client on the loop the gateway runs on (uvloop), after half a second of warm-up."""
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(CLIENTS[name](url, concurrency, 0.5, stream))
        cpu, wall = time.process_time(), time.monotonic()
        requests = runner.run(CLIENTS[name](url, concurrency, duration, stream))
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    return {"requests": requests, "rps": requests / wall, "cpu_us_per_request": cpu / max(1, requests) * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/client_cost"))
    args = parser.parse_args()
    provenance = envelope.start()
    two_cores = (os.cpu_count() or 1) > 1
    if two_cores:
        os.sched_setaffinity(0, {0})
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "priority_gateway.engines.sim",
            "--port",
            str(port),
            "--model",
            MODEL,
            "--profile",
            "instant",
        ]
        if two_cores:
            cmd = ["taskset", "-c", "1", *cmd]
        engine = Proc(cmd, f"http://127.0.0.1:{port}", Path(tmp) / "engine.log").start().wait_ready()
        try:
            total, n = args.rounds * 2 * len(CLIENTS), 0
            for _ in range(args.rounds):
                for stream in (False, True):
                    case = "stream" if stream else "nostream"
                    for name in CLIENTS:
                        n += 1
                        print(f"[{n}/{total}] {name:6s} {case} ...", end=" ", flush=True)
                        result = measure(name, engine.url, args.concurrency, args.duration, stream)
                        runs.setdefault(case, {}).setdefault(name, []).append(result)
                        print(
                            f"{result['rps']:.0f} req/s, {result['cpu_us_per_request']:.0f} us CPU/request", flush=True
                        )
        finally:
            engine.stop()
    medians = {
        case: {
            name: {key: round(statistics.median(r[key] for r in rounds), 1) for key in ("rps", "cpu_us_per_request")}
            for name, rounds in clients.items()
        }
        for case, clients in runs.items()
    }
    summary = {
        case: {
            "httpx_cpu_per_request_vs_lean": round(
                m["httpx"]["cpu_us_per_request"] / m["lean"]["cpu_us_per_request"], 2
            ),
            "httpx_rps_vs_lean": round(m["httpx"]["rps"] / m["lean"]["rps"], 2),
        }
        for case, m in medians.items()
    }
    report = {
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "httpx_version": httpx.__version__,
        "medians": medians,
        "summary": summary,
        "runs": runs,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(provenance.wrap(report), indent=2))
    print(json.dumps({"medians": medians, "summary": summary}, indent=2))
    plot(medians, out / "client_cost.png")


def plot(medians: dict[str, dict[str, dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(medians)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in zip(
        axes, ("cpu_us_per_request", "rps"), ("client CPU per request (us)", "requests/s"), strict=True
    ):
        width = 0.38
        for i, name in enumerate(CLIENTS):
            xs = [c + (i - 0.5) * width for c in range(len(cases))]
            ax.bar(xs, [medians[case][name][key] for case in cases], width, label=name)
        ax.set_xticks(range(len(cases)), cases)
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
