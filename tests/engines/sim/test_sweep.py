from priority_gateway.engines.sim import virtual
from priority_gateway.engines.sim.core import EngineCore
from priority_gateway.engines.sim.profile import load_profile
from priority_gateway.engines.sim.sweep import percentile, run_level, run_sweep

from .helpers import request, small_profile


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 99) == 5
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 99) == 9.91


def test_a_sweep_completes_every_request_and_scales_throughput():
    result = run_sweep(load_profile("tiny-cpu"), (1, 8), 600, 16, num_requests=24)
    one, eight = result["1"], result["8"]
    assert one["completed"] == one["requests"] == 24 and eight["completed"] == 24
    assert eight["output_tokens_per_s"] > 2 * one["output_tokens_per_s"]
    assert eight["ttft_p99_ms"] >= one["ttft_p50_ms"]
    assert 0.0 <= eight["slo_attainment"] <= 1.0


def test_shared_prefixes_hit_the_cache_only_when_caching_is_on():
    profile = load_profile("gemma4-nvfp4")
    options = {"num_requests": 24, "shared_prefix_len": 1536}
    on = run_level(profile, 4, 2048, 16, enable_prefix_caching=True, **options)
    off = run_level(profile, 4, 2048, 16, enable_prefix_caching=False, **options)
    assert off["prefix_cache_hit_rate"] == 0.0
    assert 0.5 < on["prefix_cache_hit_rate"] < 0.8
    assert on["ttft_p50_ms"] < off["ttft_p50_ms"]


def test_virtual_time_jumps_over_idle_gaps():
    core = EngineCore(small_profile())
    trace = virtual.run(core, [(5.0, request("late", max_tokens=2)), (0.0, request("early", max_tokens=2))])
    times = {o.request_id: t for t, o in trace.deliveries if o.finished}
    assert times["early"] < 1.0 < 5.0 < times["late"] < 6.0
    assert [o.request_id for _, o in trace.deliveries] == ["early", "early", "late", "late"]
