"""Closed-loop concurrency sweeps of one engine, in virtual time.

``run_sweep(profile, levels, input_len, output_len)`` runs, for each concurrency level ``c``,
``c`` clients that each send a request, wait for its last token and send the next one at once
(as ``vllm bench serve --max-concurrency c`` does), and reports latency and throughput.

Rules of measurement:
- Prompt and output lengths are drawn per request, uniformly within ``±spread`` of the given
  means, from a seeded RNG; outputs run to their drawn length (``ignore_eos``).
- With ``shared_prefix_len``, every prompt starts with the same that many tokens (a common
  system prompt or document); the rest of each prompt is unique.
- The first ``c`` requests (the synchronized start) and the last ``c`` (the drain) are not
  measured; the measured requests' TTFT and inter-token gaps (one gap per step that gave the
  request tokens, as a streaming client sees chunks) give the percentiles.
- Throughput is every output token delivered between the first measured arrival and the last
  measured completion, divided by that time.
- A level meets the SLO when TTFT p99 and ITL p99 are both within it; ``slo_attainment`` is the
  share of measured requests whose own TTFT and own ITL p99 are within it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from priority_gateway.engines.sim import virtual
from priority_gateway.engines.sim.core import EngineCore, EngineRequest, StepOutput
from priority_gateway.engines.sim.kv_cache import lru_hit_ratio
from priority_gateway.engines.sim.profile import Profile
from priority_gateway.engines.sim.tokens import block_hashes_for_trace

DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32)


@dataclass(slots=True)
class _Record:
    index: int
    arrival: float
    output_len: int
    first: float | None = None
    last: float | None = None
    done: float | None = None
    gaps: list[float] = field(default_factory=list)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100), as numpy's default."""
    if not values:
        return float("nan")
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def run_level(
    profile: Profile,
    concurrency: int,
    input_len: int,
    output_len: int,
    *,
    num_requests: int | None = None,
    spread: float = 0.25,
    shared_prefix_len: int = 0,
    enable_prefix_caching: bool | None = None,
    ttft_slo_ms: float = 500.0,
    itl_slo_ms: float = 50.0,
    seed: int = 0,
) -> dict[str, Any]:
    total = num_requests or max(40, 10 * concurrency) + 2 * concurrency
    core = EngineCore(profile, enable_prefix_caching=enable_prefix_caching, seed=seed)
    rng = random.Random(f"{profile.name}/{concurrency}/{seed}")
    loop = _ClosedLoop(core, profile, rng, total, input_len, output_len, spread, shared_prefix_len)
    first = [loop.new_request(0.0) for _ in range(min(concurrency, total))]
    trace = virtual.run(core, first, loop.on_output)
    records = loop.records
    measured = [r for r in records.values() if concurrency <= r.index < total - concurrency] or list(records.values())
    window_start = min(r.arrival for r in measured)
    window_end = max(r.done or 0.0 for r in measured)
    tokens = sum(o.new_tokens for t, o in trace.deliveries if window_start <= t <= window_end)
    ttfts = [(r.first - r.arrival) * 1000.0 for r in measured if r.first is not None]
    gaps = [g * 1000.0 for r in measured for g in r.gaps]
    ttft_slo_s, itl_slo_s = ttft_slo_ms / 1000.0, itl_slo_ms / 1000.0
    within = sum(
        1
        for r in measured
        if r.first is not None and r.first - r.arrival <= ttft_slo_s and percentile(r.gaps or [0.0], 99) <= itl_slo_s
    )
    ttft_p99 = percentile(ttfts, 99)
    itl_p99 = percentile(gaps, 99)
    span = window_end - window_start
    hit_rate = round(core.stats.prefix_cache_hits / max(1, core.stats.prefix_cache_queries), 4)
    return {
        "concurrency": concurrency,
        "input_len": input_len,
        "output_len": output_len,
        "shared_prefix_len": shared_prefix_len,
        "requests": len(records),
        "completed": sum(1 for r in records.values() if r.done is not None),
        "measured": len(measured),
        "ttft_p50_ms": round(percentile(ttfts, 50), 2),
        "ttft_p99_ms": round(ttft_p99, 2),
        "itl_p50_ms": round(percentile(gaps, 50), 2),
        "itl_p99_ms": round(itl_p99, 2),
        "output_tokens_per_s": round(tokens / span, 1) if span > 0 else 0.0,
        "slo_attainment": round(within / len(measured), 4),
        "meets_slo": ttft_p99 <= ttft_slo_ms and itl_p99 <= itl_slo_ms,
        "prefix_cache_hit_rate": hit_rate,
        # The cluster metrics of ``gateway sim`` for this one-engine "cluster": routing has no choice to
        # make, so the pooled-cache ceiling is this engine's own cache.
        "rejected": 0,
        "prefix_hit_ratio": hit_rate,
        "oracle_hit_ratio": round(lru_hit_ratio(loop.prompts, core.profile.num_blocks, core.block_size), 4),
        "infinite_hit_ratio": round(lru_hit_ratio(loop.prompts, math.inf, core.block_size), 4),
        "load_imbalance": 1.0,
        "goodput_rps": round(within / span, 4) if span > 0 else 0.0,
        "preemptions": core.stats.preemptions,
        "virtual_seconds": round(trace.end, 3),
    }


@dataclass(slots=True)
class _ClosedLoop:
    """The clients of one level: each request drawn as it is sent, the next sent when one finishes,
    until ``total`` were sent; every request's timings in ``records``."""

    core: EngineCore
    profile: Profile
    rng: random.Random
    total: int
    input_len: int
    output_len: int
    spread: float
    shared_prefix_len: int
    records: dict[str, _Record] = field(default_factory=dict)
    prompts: list[tuple[int, list[int]]] = field(default_factory=list)
    issued: int = 0

    def _draw(self, mean: int) -> int:
        return max(1, round(mean * self.rng.uniform(1.0 - self.spread, 1.0 + self.spread)))

    def new_request(self, now: float) -> tuple[float, EngineRequest]:
        core, bs = self.core, self.core.block_size
        index = self.issued
        self.issued += 1
        prompt = min(
            max(self._draw(self.input_len), self.shared_prefix_len + 1), core.max_model_len - self.output_len * 2
        )
        out = min(self._draw(self.output_len), core.max_model_len - prompt - 1)
        shared_blocks = self.shared_prefix_len // bs
        ids = list(range(shared_blocks)) + [(index + 1) << 32 | j for j in range(prompt // bs - shared_blocks + 1)]
        hashes = block_hashes_for_trace(ids, prompt, trace_block_tokens=bs, block_size=bs)
        self.prompts.append((prompt, hashes))
        rid = f"r{index}"
        self.records[rid] = _Record(index, now, out)
        # The API server's share reaches the scheduler later; TTFT counts from the send.
        ready = now + self.profile.timing.request_s(prompt)
        return ready, EngineRequest(rid, prompt, hashes, max_tokens=out, ignore_eos=True)

    def on_output(self, now: float, out: StepOutput) -> list[tuple[float, EngineRequest]]:
        rec = self.records[out.request_id]
        if out.first_token:
            rec.first = now
        elif rec.last is not None:
            rec.gaps.append(now - rec.last)
        rec.last = now
        if out.finished:
            rec.done = now
            if self.issued < self.total:
                return [self.new_request(now)]
        return []


def run_sweep(
    profile: Profile,
    levels: Sequence[int] = DEFAULT_LEVELS,
    input_len: int = 1000,
    output_len: int = 128,
    **options: Any,
) -> dict[str, dict[str, Any]]:
    """``run_level`` for every level, keyed by the level as a string (JSON-ready)."""
    return {str(c): run_level(profile, c, input_len, output_len, **options) for c in levels}
