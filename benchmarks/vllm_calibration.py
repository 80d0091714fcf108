"""Calibrate the simulator's ``tiny-cpu`` profile against real vLLM on this machine.

Starts one real vLLM engine (CI variant: ``--enforce-eager``, block size 128, KV 256 MiB)
pinned to one core, pins this client to the other core, and measures with streaming
completions whose prompts are token-id lists (exact lengths; every prompt unique unless
a phase repeats it on purpose):

1. ``ttft_vs_prompt``: TTFT of a lone request against prompt length.
2. ``itl_vs_decode_seqs``: inter-token latency while n sequences decode together.
3. ``warm_ttft_vs_cached``: TTFT of a repeated prompt against its cached prefix.
4. ``closed_loop``: c workers each sending 1000-token prompts / 64 output tokens back
   to back; TTFT and ITL p50/p99 and output tokens per second, leaving out the first and
   last c requests (the synchronized start and the drain), as the simulator's sweep does;
   the same levels are then replayed by the simulator with the fitted timing.
5. ``warm_vs_cold``: TTFT of a 1000-token prompt the first time and when repeated.

The machine is shared, so every phase waits for a quiet moment, records how many cores
other processes kept busy meanwhile (``foreign_cores``), and runs ``--runs`` times; the
tables hold the median across runs. Then it fits the simulator's step model
``step_s = base + a*prefill_tokens + b*decode_seqs + c*context_tokens + q*prefill_pairs``
(``context_tokens``: the summed length of the step's sequences), and again with the
per-request costs real vLLM pays before the first step (once, and per prompt token cached
or not), and writes JSON and a PNG plot:

    .venv/bin/python benchmarks/vllm_calibration.py            # about 6 minutes on a quiet machine
    .venv/bin/python benchmarks/vllm_calibration.py --refit benchmarks/results/vllm_calibration/calibration.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from priority_gateway.bench import envelope
from priority_gateway.engines.vllm.serve import Engine, EngineSpec, start

RESULTS = Path(__file__).resolve().parent / "results" / "vllm_calibration"
ENGINE_LOG = Path(__file__).resolve().parents[1] / ".cache" / "vllm-calibration-engine.log"
MODEL = "tiny"
VOCAB = 4096
FIRST_ORDINARY_TOKEN = 3  # 0..2 are the specials


def log(event: str, **fields: object) -> None:
    parts = " ".join(f"{key}={value}" for key, value in fields.items())
    print(f"event={event} {parts}".rstrip(), file=sys.stderr, flush=True)


class Prompts:
    """Token-id prompts; ``unique`` ones never share a first block with any other."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def unique(self, length: int) -> list[int]:
        return [self._rng.randrange(FIRST_ORDINARY_TOKEN, VOCAB) for _ in range(length)]


@dataclass
class Sample:
    prompt_tokens: int
    sent_at: float
    first_token_at: float = 0.0
    # Arrival time of each streamed chunk and how many tokens it carried.
    chunks: list[tuple[float, int]] = field(default_factory=list)
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def ttft(self) -> float:
        return self.first_token_at - self.sent_at

    def itls(self, after: float = 0.0) -> list[float]:
        return [gap for gap, _ in self.itl_points(after)]

    def itl_points(self, after: float = 0.0) -> list[tuple[float, int]]:
        """(gap, tokens emitted before it) for consecutive chunks that start after ``after``.

        A chunk of k tokens counts as k gaps of 1/k of its wait.
        """
        points: list[tuple[float, int]] = []
        emitted = 0
        for (previous, earlier), (now, tokens) in zip(self.chunks, self.chunks[1:], strict=False):
            emitted += earlier
            if previous >= after and tokens > 0:
                points.extend([((now - previous) / tokens, emitted)] * tokens)
        return points


async def stream_completion(
    client: httpx.AsyncClient, prompt: list[int], max_tokens: int, sample: Sample | None = None
) -> Sample:
    """One streamed completion; ``sample`` (when given) fills as chunks arrive, for a caller that watches it."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    sample = sample or Sample(prompt_tokens=len(prompt), sent_at=time.perf_counter())
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                details = chunk["usage"].get("prompt_tokens_details") or {}
                sample.cached_tokens = details.get("cached_tokens") or 0
                sample.completion_tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                # Engines that do not return token ids stream one token per chunk with text.
                tokens = len(choice.get("token_ids") or []) or int(bool(choice.get("text")))
                if tokens and not sample.chunks:
                    sample.first_token_at = now
                sample.chunks.append((now, tokens))
    return sample


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


class ForeignLoad:
    """CPU time other processes take while we measure (cores busy, from /proc).

    The machine is shared: every phase waits for a quiet moment and records how busy
    the cores were with work that is neither the engine nor this client.
    """

    HZ = os.sysconf("SC_CLK_TCK")

    def __init__(self, engine_pid: int) -> None:
        self._roots = (engine_pid, os.getpid())

    def _our_pids(self) -> set[int]:
        """The engine's process tree (API server, EngineCore, ...) and this client."""
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError):
                    parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        ours = set(self._roots)
        grew = True
        while grew:
            children = {pid for pid, parent in parents.items() if parent in ours} - ours
            ours |= children
            grew = bool(children)
        return ours

    def _snapshot(self) -> tuple[float, float, float]:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
        busy = user + nice + system + irq + softirq + steal
        ours = 0
        for pid in self._our_pids():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ours += int(stat[11]) + int(stat[12])  # utime, stime
        return time.monotonic(), busy / self.HZ, ours / self.HZ

    def start(self) -> None:
        self._start = self._snapshot()

    def cores(self) -> float:
        """Foreign cores busy on average since ``start``."""
        now, busy, ours = self._snapshot()
        then, busy0, ours0 = self._start
        return round(max(0.0, (busy - busy0) - (ours - ours0)) / max(now - then, 1e-3), 2)

    async def wait_for_quiet(self, limit: float, patience_s: float) -> float:
        """Wait (up to ``patience_s``) for a second in which others use under ``limit`` cores."""
        deadline = time.monotonic() + patience_s
        while True:
            self.start()
            await asyncio.sleep(1.0)
            busy = self.cores()
            if busy < limit or time.monotonic() > deadline:
                return busy
            log("waiting_for_quiet", foreign_cores=busy)


async def measure_ttft_vs_prompt(
    client: httpx.AsyncClient, prompts: Prompts, lengths: Sequence[int], reps: int
) -> list[dict]:
    rows = []
    for length in lengths:
        # The first prefill of a new length pays one-off kernel setup in eager mode.
        await stream_completion(client, prompts.unique(length), 2)
        ttfts = [(await stream_completion(client, prompts.unique(length), 2)).ttft for _ in range(reps)]
        rows.append(
            {"prompt_tokens": length, "ttft_ms": [ms(t) for t in ttfts], "median_ms": ms(statistics.median(ttfts))}
        )
        log("ttft_vs_prompt", prompt_tokens=length, median_ms=rows[-1]["median_ms"])
    return rows


async def measure_itl_vs_decode_seqs(
    client: httpx.AsyncClient,
    prompts: Prompts,
    counts: Sequence[int],
    prompt_lengths: Sequence[int],
    output_tokens: int,
    reps: int,
) -> list[dict]:
    """ITL once every sequence of the batch has its first token (pure decode steps)."""
    rows = []
    for prompt_length in prompt_lengths:
        for n in counts:
            points: list[tuple[float, int]] = []
            for _ in range(reps):
                samples = await asyncio.gather(
                    *(stream_completion(client, prompts.unique(prompt_length), output_tokens) for _ in range(n))
                )
                steady_from = max(s.first_token_at for s in samples)
                points.extend(point for s in samples for point in s.itl_points(after=steady_from))
            itls = [gap for gap, _ in points]
            mean_context = prompt_length + statistics.fmean(emitted for _, emitted in points)
            rows.append(
                {
                    "decode_seqs": n,
                    "prompt_tokens": prompt_length,
                    "context_tokens": round(n * mean_context),
                    "itl_samples": len(itls),
                    "median_ms": ms(statistics.median(itls)),
                    "p90_ms": ms(percentile(itls, 90)),
                }
            )
            log("itl_vs_decode_seqs", prompt_tokens=prompt_length, n=n, median_ms=rows[-1]["median_ms"])
    return rows


async def measure_closed_loop(
    client: httpx.AsyncClient,
    prompts: Prompts,
    concurrencies: Sequence[int],
    prompt_tokens: int,
    output_tokens: int,
    rounds: int,
) -> list[dict]:
    rows = []
    for concurrency in concurrencies:
        per_worker = max(rounds, 8 // concurrency)
        samples: list[Sample] = []

        async def worker(count: int, sink: list[Sample] = samples) -> None:
            for _ in range(count):
                sink.append(await stream_completion(client, prompts.unique(prompt_tokens), output_tokens))

        await asyncio.gather(*(worker(per_worker) for _ in range(concurrency)))
        # As the simulator's sweep: leave out the synchronized start and the drain.
        in_order = sorted(samples, key=lambda s: s.sent_at)
        measured = in_order[concurrency:-concurrency] if len(in_order) > 2 * concurrency else in_order
        window_start = min(s.sent_at for s in measured)
        window_end = max(s.chunks[-1][0] for s in measured)
        delivered = sum(n for s in samples for t, n in s.chunks if window_start <= t <= window_end)
        ttfts = [s.ttft for s in measured]
        itls = [gap for s in measured for gap in s.itls()]
        e2e = [s.chunks[-1][0] - s.sent_at for s in measured]
        rows.append(
            {
                "concurrency": concurrency,
                "requests": len(samples),
                "measured": len(measured),
                "ttft_p50_ms": ms(percentile(ttfts, 50)),
                "ttft_p99_ms": ms(percentile(ttfts, 99)),
                "itl_p50_ms": ms(percentile(itls, 50)),
                "itl_p99_ms": ms(percentile(itls, 99)),
                "e2e_p50_ms": ms(percentile(e2e, 50)),
                "output_tok_s": round(delivered / (window_end - window_start), 1),
            }
        )
        log("closed_loop", **rows[-1])
    return rows


async def measure_warm_vs_cold(
    client: httpx.AsyncClient, prompts: Prompts, prompt_tokens: int, prompts_count: int, repeats: int
) -> dict:
    cold: list[float] = []
    warm: list[float] = []
    cached: list[int] = []
    before = await prefix_cache_counters(client)
    for _ in range(prompts_count):
        prompt = prompts.unique(prompt_tokens)
        cold.append((await stream_completion(client, prompt, 2)).ttft)
        for _ in range(repeats):
            sample = await stream_completion(client, prompt, 2)
            warm.append(sample.ttft)
            cached.append(sample.cached_tokens)
    after = await prefix_cache_counters(client)
    result = {
        "prompt_tokens": prompt_tokens,
        "cold_ms": [ms(t) for t in cold],
        "warm_ms": [ms(t) for t in warm],
        "cold_median_ms": ms(statistics.median(cold)),
        "warm_median_ms": ms(statistics.median(warm)),
        "cold_over_warm": round(statistics.median(cold) / statistics.median(warm), 2),
        "warm_cached_tokens": sorted(set(cached)),
        "prefix_cache_queries_delta": after[0] - before[0],
        "prefix_cache_hits_delta": after[1] - before[1],
    }
    log("warm_vs_cold", cold_ms=result["cold_median_ms"], warm_ms=result["warm_median_ms"])
    return result


async def measure_warm_ttft_vs_cached(
    client: httpx.AsyncClient, prompts: Prompts, lengths: Sequence[int], reps: int
) -> list[dict]:
    """TTFT of repeated prompts: about one block of new tokens after a growing cached prefix."""
    rows = []
    for length in lengths:
        warm: list[float] = []
        cached: set[int] = set()
        for _ in range(reps):
            prompt = prompts.unique(length)
            await stream_completion(client, prompt, 2)
            for _ in range(2):
                sample = await stream_completion(client, prompt, 2)
                warm.append(sample.ttft)
                cached.add(sample.cached_tokens)
        rows.append(
            {
                "prompt_tokens": length,
                "cached_tokens": sorted(cached),
                "warm_ms": [ms(t) for t in warm],
                "median_ms": ms(statistics.median(warm)),
            }
        )
        log("warm_ttft_vs_cached", prompt_tokens=length, cached=sorted(cached), median_ms=rows[-1]["median_ms"])
    return rows


async def prefix_cache_counters(client: httpx.AsyncClient) -> tuple[float, float]:
    text = (await client.get("/metrics")).text
    values = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return values["vllm:prefix_cache_queries_total"], values["vllm:prefix_cache_hits_total"]


# --- the step-time fit ------------------------------------------------------------------

# The simulator's step model (engines/sim/profile.py; per_seq_ms left at 0: with one
# prefill per measured step it cannot be told apart from the base and decode terms).
# ``prefill_pairs`` are the causal attention pairs of a prefill chunk: new tokens times
# (cached tokens + new tokens / 2).
STEP_TERMS = ("base_s", "per_prefill_token_s", "per_decode_seq_s", "per_context_token_s", "per_prefill_pair_s")
# Diagnostic: what real vLLM spends once per request, and per prompt token whether cached
# or not (API server, request hashing, transfer to the EngineCore), before the first step.
REQUEST_TERMS = ("request_overhead_s", "per_prompt_token_s")


@dataclass(frozen=True)
class Observation:
    """One measured duration and the step it covers, in the simulator's terms.

    ``context_tokens`` is the summed length of the step's sequences (cached prefix
    included); a TTFT also pays the per-request costs once for ``prompt_tokens``.
    """

    kind: str
    seconds: float
    prefill_tokens: float
    decode_seqs: float
    context_tokens: float
    prompt_tokens: float = 0.0

    def regressors(self, terms: Sequence[str]) -> list[float]:
        first = 1.0 if self.prompt_tokens else 0.0
        prefill_pairs = self.prefill_tokens * (self.context_tokens - self.prefill_tokens / 2)
        values = {
            "base_s": 1.0,
            "per_prefill_token_s": self.prefill_tokens,
            "per_decode_seq_s": self.decode_seqs,
            "per_context_token_s": self.context_tokens,
            "per_prefill_pair_s": prefill_pairs,
            "request_overhead_s": first,
            "per_prompt_token_s": self.prompt_tokens,
        }
        return [values[term] for term in terms]


def observations(raw: dict) -> list[Observation]:
    found = [
        Observation(
            "ttft", row["median_ms"] / 1000, row["prompt_tokens"], 0, row["prompt_tokens"], row["prompt_tokens"]
        )
        for row in raw["ttft_vs_prompt"]
    ]
    found += [
        Observation("itl", row["median_ms"] / 1000, 0, row["decode_seqs"], row["context_tokens"])
        for row in raw["itl_vs_decode_seqs"]
    ]
    warm_rows = [
        (row["prompt_tokens"], max(row["cached_tokens"]), row["median_ms"]) for row in raw["warm_ttft_vs_cached"]
    ]
    warm = raw["warm_vs_cold"]
    warm_rows.append((warm["prompt_tokens"], max(warm["warm_cached_tokens"]), warm["warm_median_ms"]))
    found += [
        Observation("warm_ttft", median / 1000, length - cached, 0, length, length)
        for length, cached, median in warm_rows
    ]
    return found


def fit(found: Sequence[Observation], terms: Sequence[str]) -> dict[str, float]:
    """Least squares on relative error, refitting without any term that comes out negative."""
    x = np.array([o.regressors(terms) for o in found])
    y = np.array([o.seconds for o in found])
    weights = 1.0 / y
    active = list(range(len(terms)))
    while True:
        solution, *_ = np.linalg.lstsq(x[:, active] * weights[:, None], y * weights, rcond=None)
        negative = [index for index, value in zip(active, solution, strict=True) if value < 0]
        if not negative:
            break
        active.remove(negative[0])
    coefficients = dict.fromkeys(terms, 0.0)
    for index, value in zip(active, solution, strict=True):
        coefficients[terms[index]] = float(value)
    return coefficients


def predict(coefficients: dict[str, float], observation: Observation) -> float:
    regressors = observation.regressors(list(coefficients))
    return sum(c * r for c, r in zip(coefficients.values(), regressors, strict=True))


def describe_fit(found: Sequence[Observation], terms: Sequence[str]) -> dict:
    coefficients = fit(found, terms)
    points = [
        {
            "kind": o.kind,
            "prefill_tokens": o.prefill_tokens,
            "decode_seqs": o.decode_seqs,
            "context_tokens": o.context_tokens,
            "measured_ms": ms(o.seconds),
            "fitted_ms": ms(predict(coefficients, o)),
        }
        for o in found
    ]
    errors = [abs(p["fitted_ms"] - p["measured_ms"]) / p["measured_ms"] for p in points]
    return {
        "coefficients": {name: float(f"{value:.4g}") for name, value in coefficients.items()},
        "median_relative_error": round(statistics.median(errors), 3),
        "max_relative_error": round(max(errors), 3),
        "points": points,
    }


def fit_report(raw: dict) -> dict:
    found = observations(raw)
    step = describe_fit(found, STEP_TERMS)
    return {
        "model": "step_s = base + a*prefill_tokens + b*decode_seqs + c*context_tokens + q*prefill_pairs",
        **step,
        "profile_timing": profile_timing(step["coefficients"]),
        "with_request_costs": describe_fit(found, STEP_TERMS + REQUEST_TERMS),
    }


def profile_timing(coefficients: dict[str, float]) -> dict[str, float]:
    """The fit in the keys of an ``engines/sim`` profile's ``timing`` section (ms)."""
    return {
        "overhead_ms": round(coefficients["base_s"] * 1e3, 3),
        "per_seq_ms": 0.0,
        "prefill_ms_per_token": round(coefficients["per_prefill_token_s"] * 1e3, 5),
        "decode_ms_per_token": round(coefficients["per_decode_seq_s"] * 1e3, 4),
        "attention_ms_per_ktoken": round(coefficients["per_context_token_s"] * 1e6, 4),
        "weights_ms": 0.0,
        "kv_read_ms_per_ktoken": 0.0,
        "prefill_attention_ms_per_mpair": round(coefficients["per_prefill_pair_s"] * 1e9, 4),
    }


def simulated_closed_loop(raw: dict) -> list[dict]:
    """The closed-loop phase replayed by the simulator (virtual time) with the fitted timing."""
    from priority_gateway.engines.sim.profile import Timing, load_profile
    from priority_gateway.engines.sim.sweep import run_level

    known = {f.name for f in fields(Timing)}
    timing = Timing(**{key: value for key, value in raw["fit"]["profile_timing"].items() if key in known})
    profile = replace(load_profile("tiny-cpu"), timing=timing)
    rows = []
    for measured in raw["closed_loop"]:
        level = run_level(profile, measured["concurrency"], 1000, 64, spread=0.0)
        row = {"concurrency": measured["concurrency"]}
        for key, sim_key in (
            ("ttft_p50_ms", "ttft_p50_ms"),
            ("ttft_p99_ms", "ttft_p99_ms"),
            ("itl_p50_ms", "itl_p50_ms"),
            ("itl_p99_ms", "itl_p99_ms"),
            ("output_tok_s", "output_tokens_per_s"),
        ):
            row[key] = {"measured": measured[key], "simulated": level[sim_key]}
        rows.append(row)
    return rows


# --- plot -------------------------------------------------------------------------------


def plot(raw: dict, fitted: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fits = {
        "fit (simulator's model)": (fitted["coefficients"], "--"),
        "fit + request costs": (fitted["with_request_costs"]["coefficients"], ":"),
    }

    def draw_fits(ax: Any, xs: Sequence[float], observed: Sequence[Observation], color: str | None = None) -> None:
        for label, (coefficients, style) in fits.items():
            values = [ms(predict(coefficients, o)) for o in observed]
            ax.plot(xs, values, style, color=color, label=label if color is None else None)

    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    ax = axes[0][0]
    rows = raw["ttft_vs_prompt"]
    lengths = [r["prompt_tokens"] for r in rows]
    for r in rows:
        ax.scatter([r["prompt_tokens"]] * len(r["ttft_ms"]), r["ttft_ms"], s=8, color="tab:blue", alpha=0.4)
    ax.plot(lengths, [r["median_ms"] for r in rows], "o-", label="measured median")
    draw_fits(ax, lengths, [Observation("ttft", 0, n, 0, n, n) for n in lengths])
    ax.set(title="TTFT of a lone request", xlabel="prompt tokens", ylabel="ms")
    ax.legend()

    ax = axes[0][1]
    for prompt_length in sorted({r["prompt_tokens"] for r in raw["itl_vs_decode_seqs"]}):
        rows = [r for r in raw["itl_vs_decode_seqs"] if r["prompt_tokens"] == prompt_length]
        counts = [r["decode_seqs"] for r in rows]
        line = ax.plot(counts, [r["median_ms"] for r in rows], "o-", label=f"measured, prompt {prompt_length}")
        observed = [Observation("itl", 0, 0, r["decode_seqs"], r["context_tokens"]) for r in rows]
        draw_fits(ax, counts, observed, color=line[0].get_color())
    ax.set(title="ITL vs sequences decoding together (lines: fits)", xlabel="decode sequences", ylabel="ms")
    ax.set(xscale="log", xticks=[1, 2, 4, 8, 16])
    ax.set_xticklabels(["1", "2", "4", "8", "16"])
    ax.minorticks_off()
    ax.legend()

    ax = axes[0][2]
    rows = raw["warm_ttft_vs_cached"]
    cached = [max(r["cached_tokens"]) for r in rows]
    ax.plot(cached, [r["median_ms"] for r in rows], "o-", label="measured median")
    observed = [
        Observation("warm_ttft", 0, r["prompt_tokens"] - c, 0, r["prompt_tokens"], r["prompt_tokens"])
        for r, c in zip(rows, cached, strict=True)
    ]
    draw_fits(ax, cached, observed)
    ax.set(title="TTFT of a repeated prompt (last block recomputed)", xlabel="cached prompt tokens", ylabel="ms")
    ax.set_ylim(bottom=0)
    ax.legend()

    ax = axes[1][0]
    rows = raw["closed_loop"]
    counts = [r["concurrency"] for r in rows]
    simulated = raw.get("simulated_closed_loop", [])
    for key, style in (("ttft_p50_ms", "o-"), ("ttft_p99_ms", "o--"), ("itl_p50_ms", "s-"), ("itl_p99_ms", "s--")):
        line = ax.plot(counts, [r[key] for r in rows], style, label=key.removesuffix("_ms"))
        if simulated and key.endswith("p50_ms"):
            sim_values = [r[key]["simulated"] for r in simulated]
            ax.plot(counts, sim_values, "x:", color=line[0].get_color(), label=key.removesuffix("_ms") + " simulated")
    ax.set(title="Closed loop: 1000-token prompts, 64 output tokens", xlabel="concurrency", ylabel="ms")
    ax.set(yscale="log", xscale="log")
    ax.set_xticks(counts, [str(c) for c in counts])
    ax.minorticks_off()
    twin = ax.twinx()
    twin.plot(counts, [r["output_tok_s"] for r in rows], "k-.", label="output tok/s")
    if simulated:
        twin.plot(counts, [r["output_tok_s"]["simulated"] for r in simulated], "kx:", label="simulated tok/s")
    twin.set_ylabel("output tok/s")
    ax.legend(loc="upper left", fontsize=8)
    twin.legend(loc="lower right", fontsize=8)

    ax = axes[1][1]
    warm = raw["warm_vs_cold"]
    ax.boxplot([warm["cold_ms"], warm["warm_ms"]])
    ax.set_xticks([1, 2], ["cold", f"warm ({warm['warm_cached_tokens']} cached)"])
    ax.set(title=f"TTFT of a repeated {warm['prompt_tokens']}-token prompt", ylabel="ms")

    ax = axes[1][2]
    ax.axis("off")
    lines = ["profile timing (ms):", *(f"  {key} = {value}" for key, value in fitted["profile_timing"].items())]
    lines.append(f"  |error| median {fitted['median_relative_error']:.0%}, max {fitted['max_relative_error']:.0%}")
    extended = fitted["with_request_costs"]
    lines += ["", "with request costs (s):", *(f"  {k} = {v}" for k, v in extended["coefficients"].items())]
    lines.append(f"  |error| median {extended['median_relative_error']:.0%}, max {extended['max_relative_error']:.0%}")
    ax.text(0, 1, "\n".join(lines), va="top", family="monospace", fontsize=9)

    fig.suptitle(f"real vLLM {raw['engine']['vllm']} on one pinned core ({raw['machine']['cpu']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# --- run --------------------------------------------------------------------------------


def machine() -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()}


async def measure(engine: Engine, args: argparse.Namespace, run: int) -> dict:
    prompts = Prompts(args.seed + 1000 * run)
    load = ForeignLoad(engine.process.pid)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    results: dict = {"foreign_cores": {}}
    async with httpx.AsyncClient(base_url=engine.url, timeout=300, limits=limits) as client:
        for _ in range(3):  # warm the engine's first-request paths
            await stream_completion(client, prompts.unique(256), 8)
        results["vllm"] = (await client.get("/version")).json().get("version")
        phases = {
            "ttft_vs_prompt": lambda: measure_ttft_vs_prompt(client, prompts, args.ttft_lengths, args.reps),
            "itl_vs_decode_seqs": lambda: measure_itl_vs_decode_seqs(
                client, prompts, args.decode_seqs, args.itl_prompt_lengths, args.itl_output_tokens, 2
            ),
            "warm_ttft_vs_cached": lambda: measure_warm_ttft_vs_cached(client, prompts, args.warm_lengths, args.reps),
            "closed_loop": lambda: measure_closed_loop(client, prompts, args.concurrency, 1000, 64, args.rounds),
            "warm_vs_cold": lambda: measure_warm_vs_cold(client, prompts, 1000, args.reps, 4),
        }
        for name, phase in phases.items():
            await load.wait_for_quiet(args.quiet_below, args.quiet_patience)
            load.start()
            results[name] = await phase()
            results["foreign_cores"][name] = load.cores()
            log("phase_done", run=run, phase=name, foreign_cores=results["foreign_cores"][name])
    return results


PHASE_KEYS = {
    "ttft_vs_prompt": ("prompt_tokens",),
    "itl_vs_decode_seqs": ("prompt_tokens", "decode_seqs"),
    "warm_ttft_vs_cached": ("prompt_tokens",),
    "closed_loop": ("concurrency",),
}


def combine_runs(runs: Sequence[dict]) -> dict:
    """One table per phase across runs: the median of every number, samples pooled."""
    combined: dict = {name: combine_rows([run[name] for run in runs], keys) for name, keys in PHASE_KEYS.items()}
    (combined["warm_vs_cold"],) = combine_rows([[run["warm_vs_cold"]] for run in runs], ("prompt_tokens",))
    warm = combined["warm_vs_cold"]
    warm["cold_median_ms"] = round(statistics.median(warm["cold_ms"]), 2)
    warm["warm_median_ms"] = round(statistics.median(warm["warm_ms"]), 2)
    warm["cold_over_warm"] = round(warm["cold_median_ms"] / warm["warm_median_ms"], 2)
    return combined


def combine_rows(tables: Sequence[Sequence[dict]], keys: tuple[str, ...]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for table in tables:
        for row in table:
            groups.setdefault(tuple(row[key] for key in keys), []).append(row)
    combined = []
    for rows in groups.values():
        merged: dict = {}
        for name, first in rows[0].items():
            values = [row[name] for row in rows]
            if name in keys:
                merged[name] = first
            elif isinstance(first, list) and all(isinstance(v, int) for vs in values for v in vs):
                merged[name] = sorted({v for vs in values for v in vs})  # token counts
            elif isinstance(first, list):
                merged[name] = [v for vs in values for v in vs]  # samples
            else:
                merged[name] = round(statistics.median(values), 2)
        combined.append(merged)
    return combined


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8190)
    parser.add_argument("--engine-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=3, help="measure every phase this many times")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=6, help="closed loop: requests per worker")
    parser.add_argument(
        "--ttft-lengths", type=int, nargs="+", default=[128, 256, 512, 768, 1024, 1280, 1536, 1792, 2000]
    )
    parser.add_argument("--decode-seqs", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--itl-prompt-lengths", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--itl-output-tokens", type=int, default=160)
    parser.add_argument("--warm-lengths", type=int, nargs="+", default=[256, 512, 1024, 1536, 2000])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--quiet-below", type=float, default=0.3, help="foreign cores busy that count as quiet")
    parser.add_argument("--quiet-patience", type=float, default=120.0, help="seconds to wait for quiet per phase")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--refit", type=Path, default=None, help="refit and replot an earlier JSON")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    provenance = envelope.start()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.refit is not None:
        raw = json.loads(args.refit.read_text())  # the measurement's envelope, not the refit's
    else:
        os.sched_setaffinity(0, {args.client_core})
        spec = EngineSpec(port=args.port, core=args.engine_core)
        engine = start(spec, ENGINE_LOG)
        try:
            log("engine_starting", port=args.port, core=args.engine_core)
            log("engine_ready", seconds=round(engine.wait_healthy(), 1))
            runs = [asyncio.run(measure(engine, args, run)) for run in range(args.runs)]
        finally:
            engine.stop()
        raw = provenance.wrap(
            {
                "machine": machine(),
                "engine": {
                    "vllm": runs[0]["vllm"],
                    "argv": spec.argv()[3:],
                    "pinned_core": args.engine_core,
                    "client_core": args.client_core,
                    "block_size": spec.block_size,
                    "kv_cache_bytes": spec.kv_cache_bytes,
                },
                **combine_runs(runs),
                "runs": runs,
            }
        )
    raw["fit"] = fit_report(raw)
    raw["simulated_closed_loop"] = simulated_closed_loop(raw)
    (args.out / "calibration.json").write_text(json.dumps(raw, indent=2) + "\n")
    plot(raw, raw["fit"], args.out / "calibration.png")
    log("written", json=args.out / "calibration.json", png=args.out / "calibration.png", **raw["fit"]["coefficients"])


if __name__ == "__main__":
    main()
