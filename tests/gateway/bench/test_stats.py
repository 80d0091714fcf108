"""The numbers of a run from hand-made samples (times in seconds)."""

from __future__ import annotations

import pytest

from priority_gateway.bench.loadgen import Sample
from priority_gateway.bench.stats import meets_slo, summarize


def sample(sent, chunks, tokens=None, error=None, **flags):
    s = Sample("g", sent, chunks=list(chunks), output_tokens=tokens, error=error, **flags)
    s.done = (chunks[-1] if chunks else sent) + 0.001
    return s


def test_ttft_itl_and_tokens_from_chunks():
    s = sample(0.0, [0.2, 0.22, 0.24, 0.30], tokens=4)
    out = summarize([s], ttft_budget_ms=500, itl_budget_ms=50)
    assert out["ttft_p50_ms"] == pytest.approx(200.0)
    assert out["itl_p50_ms"] == pytest.approx(20.0)
    assert out["itl_p99_ms"] == pytest.approx(59.2)
    assert out["output_tokens"] == 4
    assert out["completed"] == 1 and out["errors"] == 0


def test_slo_takes_each_request_own_itl_p99():
    fast = sample(0.0, [0.1, 0.12, 0.14])
    slow_gap = sample(0.0, [0.1, 0.12, 0.30])
    late = sample(0.0, [0.6, 0.62])
    failed = sample(0.0, [], error="429 slo_budget_exceeded")
    assert meets_slo(fast, 500, 50)
    assert not meets_slo(slow_gap, 500, 50)
    assert not meets_slo(late, 500, 50)
    assert not meets_slo(failed, 500, 50)
    out = summarize([fast, slow_gap, late, failed], 500, 50)
    assert out["slo_attainment"] == 0.25
    assert out["errors_by_code"] == {"429 slo_budget_exceeded": 1}
    assert out["goodput_requests_per_s"] == pytest.approx(1 / out["window_s"], rel=1e-3)


def test_warmup_and_cooldown_are_load_but_not_latency():
    warm = sample(0.0, [5.0, 5.1], tokens=4, warmup=True, measured=False)
    measured = sample(1.0, [1.1, 1.2, 1.3, 2.0], tokens=8)
    cool = sample(1.5, [1.6, 1.7, 3.0], measured=False, cancelled=True)
    out = summarize([warm, measured, cool], 500, 50)
    assert out["requests"] == 1
    assert out["ttft_p50_ms"] == pytest.approx(100.0)
    assert out["window_s"] == pytest.approx(1.001)
    # In the window [1.0, 2.001]: the measured request's 8 tokens (2 per event) and the two
    # cool-down events, counted at the mean of 2 tokens per event of requests with usage.
    assert out["output_tokens_per_s"] == pytest.approx(12 / 1.001, rel=1e-3)
    # Completed inside the window: the measured request only (the warm-up ends after it).
    assert out["request_throughput"] == pytest.approx(1 / 1.001, rel=1e-3)


def test_goodput_is_throughput_when_every_request_meets_the_slo():
    measured = [sample(0.1 * i, [0.1 * i + 0.1, 0.1 * i + 0.12], tokens=3) for i in range(5)]
    warm = sample(0.0, [0.05, 0.3], tokens=2, warmup=True, measured=False)
    out = summarize([warm, *measured], 500, 50)
    assert out["slo_attainment"] == 1.0
    assert out["goodput_tokens_per_s"] == out["output_tokens_per_s"]
    assert out["goodput_requests_per_s"] == out["request_throughput"]
    # The warm-up's late event and its completion fall inside the window: load, not latency.
    assert out["request_throughput"] == pytest.approx(6 / out["window_s"], rel=1e-3)


def test_warmup_stands_in_when_nothing_was_measured():
    warm = sample(0.0, [0.3, 0.4], tokens=2, warmup=True, measured=False)
    out = summarize([warm], 500, 50)
    assert out["warmup_only"] is True
    assert out["completed"] == 1


def test_without_usage_each_content_event_is_a_token():
    s = sample(0.0, [0.1, 0.2, 0.3])
    assert summarize([s], 500, 50)["output_tokens"] == 3


def test_open_loop_lag_is_reported():
    s = sample(0.0, [0.1])
    s.lag = 0.004
    assert summarize([s], 500, 50)["send_lag_p99_ms"] == pytest.approx(4.0)


def test_refusals_are_counted_apart_from_errors_and_against_attainment():
    ok = sample(0.0, [0.1, 0.12], tokens=2)
    refused = sample(0.0, [])
    refused.refused, refused.retry_after = "429 slo_budget_exceeded", 1.0
    failed = sample(0.0, [], error="502 upstream_error")
    out = summarize([ok, refused, failed], 500.0, 50.0)
    assert out["requests"] == 3 and out["completed"] == 1
    assert (out["refused"], out["refused_by_code"]) == (1, {"429 slo_budget_exceeded": 1})
    assert (out["errors"], out["errors_by_code"]) == (1, {"502 upstream_error": 1})
    assert out["slo_attainment"] == round(1 / 3, 4)
    assert not out["meets_slo"]
    assert summarize([ok, refused], 500.0, 50.0)["meets_slo"]
