"""Step times of one real vLLM engine on the device, for fitting a simulator profile.

Two groups of phases, chosen with ``--phases``:

- ``single``: the phases of ``benchmarks/vllm_calibration.py`` (TTFT of a lone request by prompt
  length, ITL while n sequences decode, TTFT of a repeated prompt, a closed loop, cold against
  warm), sized for a 7B model on an H200, run against an engine already serving (the other engines
  idle), and written in the same raw form so ``vllm_calibration.fit_report`` fits it.
- ``mixed``: steps that mix a prefill chunk with many decodes, and the tail of plain decode steps.
  D sequences (1k-token prompts, long outputs, ``ignore_eos``) decode; while they do, a prefill of
  P tokens (a token-id prompt: the length is exact) joins, one at a time, several times per P. Every
  streamed token's arrival is kept for one decoder (the step timeline) and, per joining prefill,
  the gaps of all decoders around its first token (the steps that held its chunks) and its TTFT.
  ``D = 0`` is the prefill alone. Each D level also has a window of plain decode (the step-time
  distribution at that D) and scrapes ``/metrics`` before and after its windows (vLLM's own
  iteration-token and latency histograms, to cross-check the client's timestamps).

    python3 benchmarks/gpu/calibrate.py --url http://127.0.0.1:8101 --model llama7b --out calibration.json
    python3 benchmarks/gpu/calibrate.py --phases mixed --url http://127.0.0.1:8101 --model llama7b --out mixed.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import vllm_calibration as vc

from priority_gateway.bench import envelope

FULL = {
    "ttft_lengths": [128, 512, 1024, 2048, 4096, 8192, 16384, 32768],
    # 64 sequences of 4096 tokens (266k) outgrow the engine's 225k-token cache; the first run at 64
    # also lost its connection (httpx.ReadError, cause not established): 48 is what was measured.
    "decode_seqs": [1, 4, 16, 48],
    "itl_prompt_lengths": [512, 4096],
    "warm_lengths": [1024, 4096, 16384],
    "concurrency": [1, 8, 32],
    "reps": 3,
    "rounds": 3,
}
QUICK = {**FULL, "ttft_lengths": [128, 1024], "decode_seqs": [1, 4], "itl_prompt_lengths": [512]}
QUICK |= {"warm_lengths": [1024], "concurrency": [1, 4], "reps": 1, "rounds": 2}


MIXED = {
    "decode_seqs": [0, 1, 8, 16, 32, 48],
    "prefill_tokens": [256, 1024, 2048, 4096, 8192],
    "decoder_prompt_tokens": 1024,
    # Long enough to outlast a level (~20 s at <= 25 ms a step); 48 x (1024 + 3000) tokens stay
    # inside one engine's 225k-token cache. Decoders are cancelled when their level ends.
    "decoder_max_tokens": 3000,
    "reps": 3,
    "plain_decode_s": 4.0,
    "settle_s": 0.3,
    # Held out from the fit: closed loops at levels the single-engine phases do not run.
    "loop_concurrency": [4, 16, 48, 64],
    "loop_rounds": 4,
}
MIXED_QUICK = {**MIXED, "decode_seqs": [0, 1, 4], "prefill_tokens": [256, 1024], "reps": 1, "plain_decode_s": 1.0}
MIXED_QUICK |= {"loop_concurrency": [2], "loop_rounds": 2}
# vLLM's own view of the steps, scraped around each window.
METRIC_FAMILIES = (
    "vllm:iteration_tokens_total",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:time_to_first_token_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_prefill_kv_computed_tokens",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)
# Gaps kept per joining prefill, counted from the decoder step that ends with its first token.
STEPS_BEFORE, STEPS_AFTER = 6, 2


async def measure(url: str, sizes: dict) -> dict:
    prompts = vc.Prompts(0)
    limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
    out: dict = {"sizes": sizes, "phase_s": {}}
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        for _ in range(3):
            await vc.stream_completion(client, prompts.unique(256), 8)
        out["vllm"] = (await client.get("/version")).json().get("version")
        phases = {
            "ttft_vs_prompt": lambda: vc.measure_ttft_vs_prompt(client, prompts, sizes["ttft_lengths"], sizes["reps"]),
            "itl_vs_decode_seqs": lambda: vc.measure_itl_vs_decode_seqs(
                client, prompts, sizes["decode_seqs"], sizes["itl_prompt_lengths"], 64, 1
            ),
            "warm_ttft_vs_cached": lambda: vc.measure_warm_ttft_vs_cached(
                client, prompts, sizes["warm_lengths"], sizes["reps"]
            ),
            "closed_loop": lambda: vc.measure_closed_loop(
                client, prompts, sizes["concurrency"], 1000, 64, sizes["rounds"]
            ),
            "warm_vs_cold": lambda: vc.measure_warm_vs_cold(client, prompts, 1000, sizes["reps"], 2),
        }
        for name, phase in phases.items():
            began = time.monotonic()
            out[name] = await phase()
            out["phase_s"][name] = round(time.monotonic() - began, 1)
            vc.log("phase_done", phase=name, seconds=out["phase_s"][name])
    return out


async def scrape(client: httpx.AsyncClient) -> dict[str, float]:
    """The samples of ``METRIC_FAMILIES`` (histogram buckets, sums, counts, gauges) by full name."""
    try:
        text = (await client.get("/metrics")).text
    except httpx.HTTPError:
        return {}
    found = {}
    for line in text.splitlines():
        if line.startswith(METRIC_FAMILIES):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def gap_stats(gaps: list[float]) -> dict:
    if not gaps:
        return {"n": 0}
    return {
        "n": len(gaps),
        "mean_ms": vc.ms(statistics.fmean(gaps)),
        **{f"p{q}_ms": vc.ms(vc.percentile(gaps, q)) for q in (10, 50, 90, 99)},
        "max_ms": vc.ms(max(gaps)),
    }


def steps_around(sample: vc.Sample, at: float) -> list[tuple[float, float, int]] | None:
    """The decoder's gaps from ``STEPS_BEFORE`` before to ``STEPS_AFTER`` after its chunk nearest ``at``.

    Each as (end relative to ``at``, gap, tokens in the chunk that ended it), in seconds."""
    chunks = [(t, n) for t, n in sample.chunks if n]
    times = [t for t, _ in chunks]
    if len(times) < STEPS_BEFORE + STEPS_AFTER + 2:
        return None
    nearest = min(range(1, len(times)), key=lambda i: abs(times[i] - at))
    if nearest - STEPS_BEFORE < 1 or nearest + STEPS_AFTER >= len(times):
        return None
    return [
        (times[i] - at, times[i] - times[i - 1], chunks[i][1])
        for i in range(nearest - STEPS_BEFORE, nearest + STEPS_AFTER + 1)
    ]


async def wait_idle(client: httpx.AsyncClient, seconds: float) -> bool:
    """Until the engine runs nothing (cancelled streams are aborted asynchronously)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        metrics = await scrape(client)
        running = sum(
            v for k, v in metrics.items() if k.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
        )
        if running == 0:
            return True
        await asyncio.sleep(0.2)
    return False


async def mixed_level(client: httpx.AsyncClient, prompts: vc.Prompts, sizes: dict, decoders: int) -> dict:
    origin = time.perf_counter()
    samples = [vc.Sample(sizes["decoder_prompt_tokens"], origin) for _ in range(decoders)]
    tasks = [
        asyncio.create_task(
            vc.stream_completion(client, prompts.unique(sizes["decoder_prompt_tokens"]), sizes["decoder_max_tokens"], s)
        )
        for s in samples
    ]
    level: dict = {"decode_seqs": decoders, "metrics": {}}
    try:
        # Steady: every decoder has streamed a few tokens (their prefills are over).
        deadline = time.monotonic() + 120
        while decoders and min(len(s.chunks) for s in samples) < 4:
            if time.monotonic() > deadline or any(t.done() for t in tasks):
                raise RuntimeError(f"decoders did not start: {[t.exception() for t in tasks if t.done()]}")
            await asyncio.sleep(0.01)
        level["ramp_s"] = round(time.perf_counter() - origin, 3)
        if decoders:
            level["metrics"]["plain_before"] = await scrape(client)
            began = time.perf_counter()
            await asyncio.sleep(sizes["plain_decode_s"])
            ended = time.perf_counter()
            level["metrics"]["plain_after"] = await scrape(client)
            gaps = [
                (now - previous) / tokens
                for s in samples
                for (previous, _), (now, tokens) in zip(s.chunks, s.chunks[1:], strict=False)
                if tokens and previous >= began and now <= ended
            ]
            multi = sum(1 for s in samples for t, n in s.chunks if began <= t <= ended and n > 1)
            level["plain"] = {
                "began_s": round(began - origin, 5),
                "window_s": round(ended - began, 3),
                "multi_token_chunks": multi,
                **gap_stats(gaps),
            }
        trials = []
        for prefill in sizes["prefill_tokens"]:
            for _ in range(sizes["reps"]):
                await asyncio.sleep(sizes["settle_s"])
                joined = await vc.stream_completion(client, prompts.unique(prefill), 1)
                await asyncio.sleep(0.1)  # the decoders' steps after the first token
                around = [steps_around(s, joined.first_token_at) for s in samples]
                around = [a for a in around if a is not None]
                trial = {
                    "prefill_tokens": prefill,
                    "ttft_ms": vc.ms(joined.ttft),
                    "sent_s": round(joined.sent_at - origin, 5),
                    "decoders_seen": len(around),
                    "decoder_context_tokens": round(
                        statistics.fmean(s.prompt_tokens + sum(n for _, n in s.chunks) for s in samples)
                    )
                    if samples
                    else 0,
                }
                if around:
                    # Step k's gap and end (relative to the prefill's first token), median over decoders.
                    trial["steps_end_ms"] = [
                        vc.ms(statistics.median(a[k][0] for a in around)) for k in range(len(around[0]))
                    ]
                    trial["steps_ms"] = [
                        vc.ms(statistics.median(a[k][1] for a in around)) for k in range(len(around[0]))
                    ]
                    trial["steps_multi_token"] = [sum(a[k][2] > 1 for a in around) for k in range(len(around[0]))]
                trials.append(trial)
            vc.log(
                "mixed",
                decode_seqs=decoders,
                prefill_tokens=prefill,
                ttft_ms=trials[-1]["ttft_ms"],
                steps_ms=trials[-1].get("steps_ms"),
            )
        level["trials"] = trials
        level["metrics"]["trials_after"] = await scrape(client)
        if samples:
            # One decoder's whole timeline (seconds from the level's start, tokens per chunk): every step.
            level["timeline"] = [[round(t - origin, 5), n] for t, n in samples[0].chunks]
            level["decoders_finished_early"] = sum(1 for t in tasks if t.done())
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    level["idle_after"] = await wait_idle(client, 30)
    level["level_s"] = round(time.perf_counter() - origin, 2)
    return level


async def measure_mixed(url: str, sizes: dict) -> dict:
    prompts = vc.Prompts(16)  # not the single-engine phases' prompts: no prefix cache hits between them
    limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
    out: dict = {"sizes": sizes, "phase_s": {}, "levels": []}
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        out["vllm"] = (await client.get("/version")).json().get("version")
        for prefill in sizes["prefill_tokens"]:  # an eager engine's first prefill of a length pays setup
            await vc.stream_completion(client, prompts.unique(prefill), 1)
        out["metrics_before"] = await scrape(client)
        for decoders in sizes["decode_seqs"]:
            began = time.monotonic()
            out["levels"].append(await mixed_level(client, prompts, sizes, decoders))
            out["phase_s"][f"decode_seqs_{decoders}"] = round(time.monotonic() - began, 1)
            vc.log("mixed_level_done", decode_seqs=decoders, seconds=out["phase_s"][f"decode_seqs_{decoders}"])
        out["metrics_after"] = await scrape(client)
        began = time.monotonic()
        out["closed_loop"] = await vc.measure_closed_loop(
            client, prompts, sizes["loop_concurrency"], 1000, 64, sizes["loop_rounds"]
        )
        out["phase_s"]["closed_loop"] = round(time.monotonic() - began, 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--quick", action="store_true", help="a few points only (a dry run on simulated engines)")
    p.add_argument("--phases", choices=("single", "mixed"), default="single")
    args = p.parse_args()
    provenance = envelope.start()
    vc.MODEL = args.model  # the served model name the phases ask for
    if args.phases == "mixed":
        raw = asyncio.run(measure_mixed(args.url, MIXED_QUICK if args.quick else MIXED))
    else:
        raw = asyncio.run(measure(args.url, QUICK if args.quick else FULL))
    args.out.write_text(json.dumps(provenance.wrap(raw), indent=1) + "\n")


if __name__ == "__main__":
    main()
