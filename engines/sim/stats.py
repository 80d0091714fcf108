"""Counters and histograms an engine keeps, with vLLM's metric semantics and buckets.

Rules:
- Counters only grow. Histograms count observations into vLLM's fixed buckets (upper bounds,
  ``+Inf`` implied) and keep their sum.
- Request latencies are recorded when a request finishes (any reason, abort included), from its
  timestamps: arrival, first scheduled, first token, last token, finish.
- Inter-token latency is one observation per engine step that gave a running request new tokens
  (after its first), the gap since that request's previous tokens: a step that yields several
  tokens at once (speculative decoding) is one observation, as in vLLM.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")

TTFT_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0)
TTFT_BUCKETS += (2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75)
ITL_BUCKETS += (1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0)
REQUEST_LATENCY_BUCKETS += (40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)


def buckets_1_2_5(max_value: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


class Histogram:
    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[int]:
        out = []
        total = 0
        for c in self.counts:
            total += c
            out.append(total)
        return out


@dataclass(slots=True)
class RequestTimes:
    arrival: float
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    preemptions: int = 0
    cached_tokens: int = 0
    """Prompt tokens not computed: GPU prefix-cache hits and tokens loaded from the CPU tier."""
    external_tokens: int = 0
    """Of those, the tokens loaded from the CPU tier."""
    max_tokens: int = 0


@dataclass(slots=True)
class EngineStats:
    max_model_len: int
    prompt_tokens: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_cached: int = 0
    prompt_tokens_external: int = 0
    """Of the cached prompt tokens, those loaded from the CPU tier (``external_kv_transfer``)."""
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    ttft: Histogram = field(init=False)
    itl: Histogram = field(init=False)
    tpot: Histogram = field(init=False)
    e2e: Histogram = field(init=False)
    queue: Histogram = field(init=False)
    inference: Histogram = field(init=False)
    prefill: Histogram = field(init=False)
    decode: Histogram = field(init=False)
    request_prompt_tokens: Histogram = field(init=False)
    request_generation_tokens: Histogram = field(init=False)
    request_max_generation_tokens: Histogram = field(init=False)
    request_params_n: Histogram = field(init=False)
    request_params_max_tokens: Histogram = field(init=False)
    request_preemptions: Histogram = field(init=False)
    request_prefill_kv_computed: Histogram = field(init=False)
    iteration_tokens: Histogram = field(init=False)

    def __post_init__(self) -> None:
        tokens = buckets_1_2_5(self.max_model_len)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.tpot = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue = Histogram(REQUEST_LATENCY_BUCKETS)
        self.inference = Histogram(REQUEST_LATENCY_BUCKETS)
        self.prefill = Histogram(REQUEST_LATENCY_BUCKETS)
        self.decode = Histogram(REQUEST_LATENCY_BUCKETS)
        self.request_prompt_tokens = Histogram(tokens)
        self.request_generation_tokens = Histogram(tokens)
        self.request_max_generation_tokens = Histogram(tokens)
        self.request_params_n = Histogram(N_BUCKETS)
        self.request_params_max_tokens = Histogram(tokens)
        self.request_preemptions = Histogram(PREEMPTION_BUCKETS)
        self.request_prefill_kv_computed = Histogram(tokens)
        self.iteration_tokens = Histogram(ITERATION_TOKEN_BUCKETS)

    def record_finished(
        self, times: RequestTimes, reason: str, prompt_tokens: int, output_tokens: int, now: float
    ) -> None:
        self.finished[reason] = self.finished.get(reason, 0) + 1
        self.e2e.observe(now - times.arrival)
        self.request_prompt_tokens.observe(prompt_tokens)
        self.request_generation_tokens.observe(output_tokens)
        self.request_max_generation_tokens.observe(times.max_tokens)
        self.request_params_n.observe(1)
        self.request_params_max_tokens.observe(times.max_tokens)
        self.request_preemptions.observe(times.preemptions)
        scheduled = times.scheduled if times.scheduled is not None else now
        self.queue.observe(scheduled - times.arrival)
        if times.scheduled is None:
            return
        self.request_prefill_kv_computed.observe(max(0, prompt_tokens - times.cached_tokens))
        first = times.first_token if times.first_token is not None else now
        last = times.last_token if times.last_token is not None else now
        self.inference.observe(last - times.scheduled)
        self.prefill.observe(first - times.scheduled)
        self.decode.observe(last - first)
        if output_tokens > 1:
            self.tpot.observe((last - first) / (output_tokens - 1))
