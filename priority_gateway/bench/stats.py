"""The numbers of one run (a concurrency level or a trace) from its samples.

Rules:
- Latencies are of the measured requests (closed loop: not the warm-up, not the cool-down; if a
  run was too short to measure any, its warm-up requests stand in and ``warmup_only`` says so).
- The window runs from the first measured request's sending to the last one's end. Throughput
  is what the endpoint delivered inside it, whichever request it was for (a closed loop's
  warm-up and cool-down streams are load on the server too): requests completed, and output
  tokens (each request's count spread evenly over its content events), per second.
- A request meets the SLO when it completed, its TTFT is within the TTFT budget and the p99 of
  its own inter-token gaps is within the ITL budget. SLO attainment is the share of measured
  requests that meet it (errors and refusals count against it). Goodput is throughput times the
  share of the measured requests' completions (requests/s) or output tokens (tokens/s) that met
  the SLO.
- Refusals (429: the endpoint keeping its budgets or limits) are counted by code apart from
  errors; a run meets its SLO when nothing failed and the p99s are within budget, whatever it
  refused.
- Prefix hits are the engine's own word, per request: ``cached_tokens`` of its usage. The cached
  token ratio is cached over prompt tokens of the completed requests that reported them (token
  weighted); the per-request ratios' mean and median weigh every request alike. Absent when no
  request reported cached tokens (engines without ``--enable-prompt-tokens-details``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from priority_gateway.bench.loadgen import Sample
from priority_gateway.engines.sim.sweep import percentile

QUANTILES = (50, 90, 99)


def gaps(sample: Sample) -> list[float]:
    c = sample.chunks
    return [c[i] - c[i - 1] for i in range(1, len(c))]


def completed(sample: Sample) -> bool:
    return sample.error is None and sample.refused is None and not sample.cancelled and sample.done is not None


def tokens(sample: Sample) -> int:
    return sample.output_tokens if sample.output_tokens is not None else len(sample.chunks)


def meets_slo(sample: Sample, ttft_ms: float, itl_ms: float) -> bool:
    if not completed(sample) or not sample.chunks:
        return False
    if (sample.chunks[0] - sample.sent) * 1000.0 > ttft_ms:
        return False
    own = gaps(sample)
    return not own or percentile(own, 99) * 1000.0 <= itl_ms


def _round(value: float, digits: int = 2) -> float | None:
    return None if math.isnan(value) else round(value, digits)


def _quantiles(name: str, values: Sequence[float]) -> dict[str, float | None]:
    out = {f"{name}_p{q}_ms": _round(percentile(values, q)) for q in QUANTILES}
    out[f"{name}_mean_ms"] = _round(sum(values) / len(values)) if values else None
    return out


def _tokens_in(samples: Sequence[Sample], start: float, end: float) -> float:
    """Output tokens delivered in [start, end], each request's count spread over its events."""
    known = [s for s in samples if s.output_tokens is not None and s.chunks]
    per_event = sum(tokens(s) for s in known) / sum(len(s.chunks) for s in known) if known else 1.0
    total = 0.0
    for s in samples:
        if not s.chunks:
            continue
        weight = tokens(s) / len(s.chunks) if s.output_tokens is not None else per_event
        total += weight * sum(1 for t in s.chunks if start <= t <= end)
    return total


def summarize(samples: Sequence[Sample], ttft_budget_ms: float, itl_budget_ms: float) -> dict[str, Any]:
    measured = [s for s in samples if s.measured and not s.warmup]
    warmup_only = not measured
    if warmup_only:
        measured = [s for s in samples if s.warmup and not s.cancelled]
    done = [s for s in measured if completed(s)]
    errors = Counter(s.error for s in measured if s.error is not None)
    refused = Counter(s.refused for s in measured if s.refused is not None)
    ends = [s.done for s in measured if s.done is not None]
    start = min((s.sent for s in measured), default=0.0)
    window = max(ends) - start if ends else 0.0
    meeting = [s for s in measured if meets_slo(s, ttft_budget_ms, itl_budget_ms)]
    end = start + window
    completions = sum(1 for s in samples if completed(s) and s.done is not None and start <= s.done <= end)
    token_rate = _tokens_in(samples, start, end) / window if window > 0 else 0.0
    request_rate = completions / window if window > 0 else 0.0
    done_tokens = sum(tokens(s) for s in done)

    out: dict[str, Any] = {
        "requests": len(measured),
        "completed": len(done),
        "errors": sum(errors.values()),
        "errors_by_code": dict(errors.most_common()),
        "refused": sum(refused.values()),
        "refused_by_code": dict(refused.most_common()),
        "warmup_only": warmup_only,
        "window_s": round(window, 3),
        **_quantiles("ttft", [(s.chunks[0] - s.sent) * 1000.0 for s in done if s.chunks]),
        **_quantiles("itl", [g * 1000.0 for s in done for g in gaps(s)]),
        **_quantiles("e2e", [(s.done - s.sent) * 1000.0 for s in done if s.done is not None]),
        "output_tokens": sum(tokens(s) for s in done),
        "output_tokens_per_s": round(token_rate, 3),
        "request_throughput": round(request_rate, 3),
        "slo_attainment": round(len(meeting) / len(measured), 4) if measured else 0.0,
        "goodput_requests_per_s": round(request_rate * len(meeting) / len(done), 3) if done else 0.0,
        "goodput_tokens_per_s": round(token_rate * sum(tokens(s) for s in meeting) / done_tokens, 3)
        if done_tokens
        else 0.0,
    }
    out["meets_slo"] = bool(
        done
        and out["errors"] == 0
        and (out["ttft_p99_ms"] or 0.0) <= ttft_budget_ms
        and (out["itl_p99_ms"] or 0.0) <= itl_budget_ms
    )
    out.update(cache_hits(done))
    lags = [s.lag * 1000.0 for s in measured]
    if any(lags):
        out["send_lag_p99_ms"] = _round(percentile(lags, 99))
    return out


def cache_hits(done: Sequence[Sample]) -> dict[str, Any]:
    reported = [s for s in done if s.cached_tokens is not None and s.prompt_tokens]
    if not reported:
        return {}
    prompt = sum(s.prompt_tokens or 0 for s in reported)
    cached = sum(s.cached_tokens or 0 for s in reported)
    ratios = [(s.cached_tokens or 0) / (s.prompt_tokens or 1) for s in reported]
    return {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_token_ratio": round(cached / prompt, 4),
        "request_cached_ratio_mean": round(sum(ratios) / len(ratios), 4),
        "request_cached_ratio_p50": round(percentile(ratios, 50), 4),
        "requests_with_cache_hit": round(sum(1 for r in ratios if r > 0) / len(ratios), 4),
    }
