"""The opt-in step costs real vLLM shows beyond the isolated parts: serial host time, mixed steps, a tail."""

import statistics
from dataclasses import replace

import pytest

from priority_gateway.engines.sim.core import EngineCore, SharedDevice
from priority_gateway.engines.sim.profile import Profile, Timing, load_profile, profile_from_dict

from .helpers import request

EAGER = Timing(overhead_ms=15, prefill_ms_per_token=0.02, weights_ms=3, host_overlaps_device=True)


def profile(timing: Timing) -> Profile:
    return Profile("costs", timing=timing, block_size=4, num_blocks=1024, max_num_batched_tokens=2048)


def test_a_step_that_mixes_prefill_with_decodes_costs_more_than_its_parts():
    timing = replace(EAGER, mixed_ms=4, mixed_ms_per_decode_seq=0.5)
    # Decodes only, prefill only: as before (launch-bound 15 ms; 1000 prefill tokens 20 ms on the device).
    assert timing.step_s(0, 8, 8, 8000) == pytest.approx(0.015)
    assert timing.step_s(1000, 0, 1, 1000) == pytest.approx(0.020)
    # 1000 prefill tokens beside 8 decodes: the parts (20 ms) and 4 + 8 * 0.5 ms for mixing them.
    assert timing.step_s(1000, 8, 9, 9000) == pytest.approx(0.028)


def test_serial_host_time_never_overlaps_and_prefill_tokens_cost_host_time():
    timing = replace(EAGER, serial_ms=5, host_ms_per_prefill_token=0.01)
    assert timing.step_s(0, 1, 1, 100) == pytest.approx(0.020)  # 5 + max(15, 3)
    assert timing.step_s(1000, 0, 1, 1000) == pytest.approx(0.030)  # 5 + max(15 + 10, 20)
    assert timing.step_s(0, 0, 0, 0) == 0.0


def test_a_steps_prefill_grows_with_the_square_of_its_tokens_not_only_of_each_prompts():
    timing = replace(EAGER, prefill_ms_per_ktoken2=2.0, prefill_attention_ms_per_mpair=1.0)
    # 4000 tokens: 80 ms linear + 2 * 16 ms; one prompt adds 8M attention pairs, four of 1000 only 2M.
    assert timing.step_s(4000, 0, 1, 4000, 8e6) == pytest.approx((80 + 32 + 8) / 1000)
    assert timing.step_s(4000, 0, 4, 4000, 2e6) == pytest.approx((80 + 32 + 2) / 1000)


def test_the_engine_charges_a_mixed_step_once_a_prefill_joins_running_decodes():
    core = EngineCore(profile(replace(EAGER, mixed_ms=6)))
    core.add_request(request("decoding", prompt=8, max_tokens=20), 0.0)
    now = 0.0
    for _ in range(3):  # its prefill, then decode steps
        now += core.step(now).duration_s
    assert core.step(now).duration_s == pytest.approx(0.015)
    core.add_request(request("joining", prompt=1000, max_tokens=2), now)
    mixed = core.step(now)
    assert (mixed.prefill_tokens, mixed.decode_seqs) == (1000, 1)
    assert mixed.duration_s == pytest.approx(0.020 + 0.006)


def test_engines_sharing_a_device_pay_serial_time_before_taking_their_turn():
    timing = Timing(overhead_ms=1.0, prefill_ms_per_token=0.5, host_overlaps_device=True, serial_ms=2.0)
    shared = Profile("shared", timing=timing, block_size=4, num_blocks=64, max_num_batched_tokens=64)
    device = SharedDevice()
    a, b = EngineCore(shared, device=device), EngineCore(shared, device=device)
    for core in (a, b):
        core.add_request(request("r", prompt=20), 0.0)
    assert a.step(0.0).duration_s == pytest.approx(0.002 + 0.010)
    assert b.step(0.0).duration_s == pytest.approx(0.002 + 0.020)  # its device part after A's


def decode_steps(core: EngineCore, n: int) -> list[float]:
    core.add_request(request("long", prompt=8, max_tokens=n + 2), 0.0)
    now = 0.0
    now += core.step(now).duration_s
    durations = []
    for _ in range(n):
        durations.append(core.step(now).duration_s)
        now += durations[-1]
    return durations


def test_a_step_tail_is_drawn_from_its_quantiles_and_the_same_for_the_same_seed():
    tailed = profile(replace(EAGER, tail_quantiles_ms=(0, 0, 10)))
    durations = decode_steps(EngineCore(tailed, seed=3), 4000)
    extra_ms = [(d - 0.015) * 1000 for d in durations]
    assert min(extra_ms) >= -1e-9 and max(extra_ms) <= 10 + 1e-9
    # Half the steps at 0, the other half spread evenly up to 10 ms: mean 2.5 ms, p75 5 ms.
    assert statistics.fmean(extra_ms) == pytest.approx(2.5, abs=0.25)
    assert sum(e < 1e-9 for e in extra_ms) / len(extra_ms) == pytest.approx(0.5, abs=0.03)
    assert decode_steps(EngineCore(tailed, seed=3), 200) == durations[:200]
    assert decode_steps(EngineCore(tailed, seed=4), 200) != durations[:200]
    assert decode_steps(EngineCore(profile(EAGER), seed=3), 200) == pytest.approx([0.015] * 200)


def test_a_tail_must_be_ascending_non_negative_quantiles():
    for bad in ([5], [3, 1], [-1, 2]):
        with pytest.raises(ValueError, match="tail_quantiles_ms"):
            profile_from_dict({"timing": {"tail_quantiles_ms": bad}})
    assert profile_from_dict({"timing": {"tail_quantiles_ms": [0, 1.5]}}).timing.tail_s(0.5) == pytest.approx(0.00075)


def test_shipped_profiles_that_do_not_opt_in_keep_their_step_times():
    for name in ("default", "tiny-cpu", "h200-32b-fp8", "gemma4-nvfp4-mtp4"):
        timing = load_profile(name).timing
        assert (timing.serial_ms, timing.host_ms_per_prefill_token, timing.mixed_ms) == (0, 0, 0)
        assert timing.prefill_ms_per_ktoken2 == 0
        assert timing.mixed_ms_per_decode_seq == 0 and timing.tail_quantiles_ms == ()
