"""The flood scenario of ``benchmarks/admission.py`` live over HTTP, next to its virtual-time twin.

Real processes on loopback: ``gateway serve`` (admission on, default settings) in front of 4
interactive ``gemma4-nvfp4`` and 4 batch ``gemma4-nvfp4-mtp4`` simulated engines running in real
time. Interactive requests arrive as a Poisson stream (streamed, timed by the client); a batch
flood keeps ``--flood`` non-streamed batch requests outstanding. Then the same scenario runs in
virtual time through ``gateway sim``, and the two are put side by side.

    python benchmarks/admission_realtime.py [--minutes 5] [--flood 320] [--out benchmarks/results/admission_realtime]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

import orjson

from priority_gateway.bench import envelope, loadgen, stats
from priority_gateway.bench.workload import load_arrivals
from priority_gateway.loopback import start_engine, start_gateway
from priority_gateway.simulate.cli import add_arguments
from priority_gateway.simulate.cli import run as run_sim
from priority_gateway.upstream.h1 import EngineClient, UpstreamError

ROOT = Path(__file__).resolve().parents[1]

RATE = 0.42
PROFILES = "interactive=gemma4-nvfp4,batch=gemma4-nvfp4-mtp4"


def progress(message: str) -> None:
    print(f"admission-realtime: {message}", file=sys.stderr, flush=True)


async def flood(url: str, workers: int, until: float, counters: dict[str, float]) -> None:
    client = EngineClient(url, read_timeout=600)

    async def worker(n: int) -> None:
        i = 0
        while time.monotonic() < until:
            i += 1
            body = {
                "model": "sim-model",
                "max_tokens": 512,
                "ignore_eos": True,
                "messages": [{"role": "user", "content": f"[flood {n}.{i} {secrets.token_hex(4)}] " + "x" * 8180}],
            }
            try:
                response = await client.request(
                    b"POST",
                    b"/v1/chat/completions",
                    [(b"content-type", b"application/json"), (b"x-priority", b"batch")],
                    orjson.dumps(body),
                )
                payload = await response.read()
                response.close()
            except UpstreamError:
                counters["errors"] += 1
                await asyncio.sleep(1.0)
                continue
            if response.status == 200:
                done = time.monotonic()
                if done <= until:
                    counters["completed"] += 1
                    counters["tokens"] += orjson.loads(payload)["usage"]["completion_tokens"]
            else:
                counters[f"status_{response.status}"] = counters.get(f"status_{response.status}", 0) + 1
                await asyncio.sleep(1.0)

    await asyncio.gather(*(worker(n) for n in range(workers)))
    client.close()


async def live(gateway_url: str, minutes: float, workers: int) -> dict:
    start = time.monotonic()
    until = start + minutes * 60.0
    counters: dict[str, float] = {"completed": 0, "tokens": 0, "errors": 0}
    arrivals = load_arrivals(
        [f"poisson:rate={RATE},input=2048,output=512,minutes={minutes}@interactive"], tag=secrets.token_hex(4)
    )
    target = loadgen.Target(EngineClient(gateway_url, read_timeout=600), "sim-model", x_priority="interactive")
    flood_task = asyncio.create_task(flood(gateway_url, workers, until, counters))
    samples = await loadgen.open_loop(target, arrivals)
    await flood_task
    elapsed = time.monotonic() - start
    summary = stats.summarize(samples, 500.0, 50.0)
    refused = sum(1 for s in samples if s.refused is not None)
    return {
        "interactive": summary,
        "interactive_requests": len(samples),
        "interactive_refused": refused,
        "batch": {**counters, "tokens_per_s": round(counters["tokens"] / (minutes * 60.0), 1)},
        "elapsed_s": round(elapsed, 1),
    }


def virtual(minutes: float, workers: int) -> dict:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--trace",
            f"poisson:rate={RATE},input=2048,output=512,minutes={minutes}@interactive",
            "--flood-lengths",
            "2048,512",
            "--engines",
            "interactive=4,batch=4",
            "--profile",
            PROFILES,
            "--policy",
            "prefix",
            "--batch-flood",
            str(workers),
            "--minutes",
            str(minutes),
            "--no-oracle",
        ]
    )
    return next(iter(run_sim(args).values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--flood", type=int, default=320, help="batch requests kept outstanding")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/admission_realtime"))
    args = parser.parse_args()
    provenance = envelope.start()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        try:
            progress("starting 8 simulated engines and the gateway ...")
            interactive = [start_engine(tmp, "--profile", "gemma4-nvfp4") for _ in range(4)]
            batch = [
                start_engine(tmp, "--profile", "gemma4-nvfp4-mtp4", "--scheduling-policy", "priority") for _ in range(4)
            ]
            procs += interactive + batch
            for engine in procs:
                engine.wait_ready()
            config = {
                "pools": {
                    "interactive": {"engines": [e.url for e in interactive]},
                    "batch": {"engines": [e.url for e in batch], "scheduling_policy": "priority"},
                },
                "log_level": "warning",
            }
            gateway = start_gateway(tmp, config)
            procs.append(gateway)
            gateway.wait_ready("/ready")
            progress(f"live run: {args.minutes:g} min, interactive {RATE} req/s, flood {args.flood} ...")
            live_result = asyncio.run(live(gateway.url, args.minutes, args.flood))
            live_result["gateway_metrics_excerpt"] = [
                line
                for line in __import__("httpx").get(gateway.url + "/metrics").text.splitlines()
                if line.startswith(("gateway_admission_total", "gateway_engine_concurrency_limit"))
            ]
        finally:
            for proc in reversed(procs):
                proc.stop()
    progress("virtual-time twin ...")
    twin = virtual(args.minutes, args.flood)
    vi = twin["by_class"]["interactive"]
    li = live_result["interactive"]
    comparison = {
        "interactive_ttft_p99_ms": {"live": li.get("ttft_p99_ms"), "virtual": vi["ttft_p99_ms"]},
        "interactive_itl_p99_ms": {"live": li.get("itl_p99_ms"), "virtual": vi["itl_p99_ms"]},
        "interactive_admitted_share": {
            "live": round(1 - live_result["interactive_refused"] / max(1, live_result["interactive_requests"]), 4),
            "virtual": round(1 - vi["rejected"] / max(1, vi["requests"]), 4),
        },
        "interactive_slo_attainment": {"live": li.get("slo_attainment"), "virtual": vi["slo_attainment"]},
        "batch_tokens_per_s": {
            "live": live_result["batch"]["tokens_per_s"],
            "virtual": twin["by_class"]["batch"]["output_tokens_per_s"],
        },
    }
    report = {
        "minutes": args.minutes,
        "flood": args.flood,
        "rate": RATE,
        "comparison": comparison,
        "live": live_result,
        "virtual": twin,
    }
    (out / "results.json").write_text(json.dumps(provenance.wrap(report), indent=2))
    print(json.dumps(comparison, indent=2))


if __name__ == "__main__":
    main()
