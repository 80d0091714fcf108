from priority_gateway.engines.sim.core import EngineCore
from priority_gateway.engines.sim.profile import Speculative

from .helpers import request, run, small_profile, tokens_of

MTP = Speculative(num_speculative_tokens=4, acceptance_rate=0.7, verify_cost_factor=1.5)


def bursts(seed: int, max_tokens: int = 400) -> list[int]:
    core = EngineCore(small_profile(speculative=MTP), seed=seed)
    core.add_request(request("r", max_tokens=max_tokens), 0.0)
    outputs = run(core)
    assert tokens_of(outputs, "r") == max_tokens
    return [o.new_tokens for _, o in outputs]


def test_decoding_steps_yield_bursts_of_one_to_k_plus_one_tokens():
    sizes = bursts(seed=1)[1:]  # the prefill step gives the first token alone
    assert all(1 <= n <= 5 for n in sizes)
    assert {1, 5} <= set(sizes)
    mean = sum(sizes[:-1]) / len(sizes[:-1])
    # 1 + 0.7 + 0.7^2 + 0.7^3 + 0.7^4 = 2.77 tokens per step expected
    assert 2.4 < mean < 3.1


def test_bursts_are_reproducible_from_the_seed():
    assert bursts(seed=3) == bursts(seed=3)
    assert bursts(seed=3) != bursts(seed=4)


def test_verification_makes_steps_dearer_and_reserves_lookahead_blocks():
    plain = EngineCore(small_profile())
    spec = EngineCore(small_profile(speculative=MTP))
    for core in (plain, spec):
        core.add_request(request("r", prompt=8, max_tokens=50), 0.0)
        core.step(0.0)
    plain_step, spec_step = plain.step(1.0), spec.step(1.0)
    assert spec_step.scheduled_tokens == 5 and plain_step.scheduled_tokens == 1
    base = small_profile().timing.step_s(0, 5, 1, 8 + 5)
    assert spec_step.duration_s == base * 1.5
    # 8 prompt + 1 sampled + 4 drafts = 13 tokens = 4 blocks of 4, where plain decoding holds 3.
    assert spec.kv_cache_usage > plain.kv_cache_usage


def test_bursts_stop_at_max_tokens_exactly():
    for max_tokens in (1, 2, 3, 7):
        assert sum(bursts(seed=5, max_tokens=max_tokens)) == max_tokens
