import pytest

from priority_gateway.engines.sim.profile import Timing, available_profiles, load_profile, profile_from_dict


def test_every_shipped_profile_loads():
    names = available_profiles()
    assert {"default", "instant", "tiny-cpu", "gemma4-bf16", "gemma4-fp8", "gemma4-nvfp4", "gemma4-nvfp4-mtp4"} <= set(
        names
    )
    for name in names:
        profile = load_profile(name)
        assert profile.name == name
        assert profile.max_model_len <= profile.num_blocks * profile.block_size


def test_tiny_cpu_has_vllm_cpu_defaults():
    profile = load_profile("tiny-cpu")
    assert (profile.block_size, profile.max_num_batched_tokens, profile.max_model_len) == (128, 2048, 2048)


def test_unknown_fields_and_profiles_are_refused():
    with pytest.raises(ValueError):
        profile_from_dict({"engine": {"block_sizes": 16}})
    with pytest.raises(ValueError):
        profile_from_dict({"timing": {"overhead": 1}})
    with pytest.raises(ValueError):
        load_profile("no-such-profile")


def test_step_time_is_the_slower_of_compute_and_memory_plus_overheads():
    timing = Timing(
        overhead_ms=2,
        per_seq_ms=0.5,
        prefill_ms_per_token=0.1,
        decode_ms_per_token=0.2,
        weights_ms=10,
        kv_read_ms_per_ktoken=1.0,
        attention_ms_per_ktoken=0.5,
    )
    assert timing.step_s(0, 0, 0, 0) == 0.0
    # 4 decoding sequences, 4000 tokens of context: memory 10 + 4 = 14 beats compute 0.8 + 2.
    assert timing.step_s(0, 4, 4, 4000) == pytest.approx((2 + 2 + 14) / 1000)
    # A 1000-token prefill: compute 100 + 0.5 beats memory 11.
    assert timing.step_s(1000, 0, 1, 1000) == pytest.approx((2 + 0.5 + 100.5) / 1000)


def test_overrides_and_constant_step():
    profile = load_profile("gemma4-nvfp4-mtp4")
    assert profile.with_overrides(block_size=32, num_blocks=None).block_size == 32
    flat = profile.with_constant_step(7)
    assert flat.timing.step_s(5000, 10, 10, 10**6) == pytest.approx(0.007)
    assert flat.speculative.num_speculative_tokens == 0


def test_a_host_that_overlaps_the_device_costs_the_slower_of_the_two():
    timing = Timing(overhead_ms=15, prefill_ms_per_token=0.02, weights_ms=3)
    assert timing.split_s(1000, 0, 1, 1000) == pytest.approx((0.015, 0.020))
    assert timing.step_s(1000, 0, 1, 1000) == pytest.approx(0.035)  # launched, then run: the sum
    overlapped = Timing(overhead_ms=15, prefill_ms_per_token=0.02, weights_ms=3, host_overlaps_device=True)
    assert overlapped.step_s(1000, 0, 1, 1000) == pytest.approx(0.020)
    assert overlapped.step_s(0, 1, 1, 100) == pytest.approx(0.015)  # a decode step: launches dominate


def test_the_api_servers_share_grows_with_the_prompt_not_the_steps():
    timing = Timing(overhead_ms=5, request_overhead_ms=20, request_ms_per_prompt_token=0.002)
    assert timing.request_s(1000) == pytest.approx(0.022)
    assert timing.step_s(0, 1, 1, 1000) == pytest.approx(0.005)
    assert load_profile("h200-7b-bf16").timing.request_s(0) > 0


def test_a_scaled_tail_scales_every_quantile_and_nothing_else():
    profile = load_profile("h200-7b-bf16")
    scaled = profile.with_tail_scaled(0.7)
    assert scaled.timing.tail_quantiles_ms == pytest.approx([0.7 * q for q in profile.timing.tail_quantiles_ms])
    assert max(scaled.timing.tail_quantiles_ms) < max(profile.timing.tail_quantiles_ms)
    assert scaled.timing.overhead_ms == profile.timing.overhead_ms and scaled.num_blocks == profile.num_blocks
