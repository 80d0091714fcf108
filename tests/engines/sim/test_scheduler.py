import pytest

from priority_gateway.engines.sim.core import FCFS, PRIORITY, EngineCore, SharedDevice
from priority_gateway.engines.sim.profile import Profile, Timing

from .helpers import completion_order, request, run, shared_hashes, small_profile, tokens_of


def test_a_step_spends_at_most_the_token_budget_and_chunks_the_rest():
    core = EngineCore(small_profile(max_num_batched_tokens=64))
    core.add_request(request("a", prompt=40), 0.0)
    core.add_request(request("b", prompt=40), 0.0)
    first = core.step(0.0)
    assert first.scheduled_tokens == 64 and first.prefill_tokens == 64
    assert [(o.request_id, o.first_token) for o in first.outputs] == [("a", True)]
    second = core.step(1.0)
    assert second.scheduled_tokens == 1 + 16
    assert {o.request_id for o in second.outputs} == {"a", "b"}


def test_a_long_prompt_is_prefilled_over_several_steps():
    core = EngineCore(small_profile(max_num_batched_tokens=64))
    core.add_request(request("long", prompt=150, max_tokens=2), 0.0)
    steps = [core.step(float(i)) for i in range(3)]
    assert [s.prefill_tokens for s in steps] == [64, 64, 22]
    assert [len(s.outputs) for s in steps] == [0, 0, 1]
    assert steps[2].outputs[0].first_token


def test_no_more_than_max_num_seqs_run_at_once():
    core = EngineCore(small_profile(max_num_seqs=3))
    for i in range(10):
        core.add_request(request(f"r{i}", max_tokens=5), 0.0)
    now = 0.0
    seen = 0
    while core.has_work:
        result = core.step(now)
        now += result.duration_s
        assert core.num_running <= 3
        seen = max(seen, core.num_running)
    assert seen == 3 and core.stats.finished["length"] == 10


def test_a_cached_prompt_reuses_whole_blocks_but_computes_its_last_token():
    core = EngineCore(small_profile(block_size=4))
    hashes = shared_hashes(40)
    core.add_request(request("cold", prompt=40, max_tokens=1, hashes=hashes), 0.0)
    run(core)
    core.add_request(request("warm", prompt=40, max_tokens=1, hashes=hashes), 1.0)
    step = core.step(1.0)
    # 10 full blocks cached, but the last token must be computed: 9 blocks hit, 4 tokens computed.
    assert step.scheduled_tokens == 4
    assert core.stats.prefix_cache_queries == 80 and core.stats.prefix_cache_hits == 36
    core.add_request(request("longer", prompt=41, max_tokens=1, hashes=hashes), 2.0)
    assert core.step(2.0).scheduled_tokens == 1
    assert core.stats.prefix_cache_hits == 36 + 40
    assert core.stats.prompt_tokens_cached == 76 and core.stats.prompt_tokens == 121


def test_shared_prefix_counts_only_matching_leading_blocks():
    core = EngineCore(small_profile(block_size=4))
    core.add_request(request("a", prompt=16, max_tokens=1, hashes=shared_hashes(16)), 0.0)
    run(core)
    other = shared_hashes(8) + request("x", prompt=8).block_hashes
    core.add_request(request("b", prompt=16, max_tokens=1, hashes=other), 1.0)
    run(core, 1.0)
    assert core.stats.prefix_cache_hits == 8


def test_block_pressure_preempts_the_last_admitted_request_and_both_still_finish():
    core = EngineCore(small_profile(block_size=4, num_blocks=12))
    core.add_request(request("a", prompt=16, max_tokens=20), 0.0)
    core.add_request(request("b", prompt=16, max_tokens=20), 0.0)
    preempted = []
    now = 0.0
    outputs = []
    while core.has_work:
        result = core.step(now)
        now += result.duration_s
        preempted += result.preempted
        outputs += [(now, o) for o in result.outputs]
        assert core.kv_cache_usage <= 1.0
    assert preempted and preempted[0] == "b"
    assert core.stats.preemptions == len(preempted)
    assert tokens_of(outputs, "a") == 20 and tokens_of(outputs, "b") == 20
    assert completion_order(outputs) == ["a", "b"]


def test_priority_policy_preempts_the_lowest_priority_not_the_latest():
    core = EngineCore(small_profile(block_size=4, num_blocks=12), scheduling_policy=PRIORITY)
    core.add_request(request("low", prompt=16, max_tokens=20, priority=5), 0.0)
    core.add_request(request("high", prompt=16, max_tokens=20, priority=0), 0.0)
    preempted = []
    now = 0.0
    while core.has_work:
        result = core.step(now)
        now += result.duration_s
        preempted += result.preempted
    assert preempted and set(preempted) == {"low"}


@pytest.mark.parametrize(("policy", "expected"), [(PRIORITY, ["l1", "h", "l2"]), (FCFS, ["l1", "l2", "h"])])
def test_waiting_queue_order_follows_the_policy(policy, expected):
    core = EngineCore(small_profile(max_num_seqs=1), scheduling_policy=policy)
    core.add_request(request("l1", priority=10), 0.0)
    core.step(0.0)
    core.add_request(request("l2", priority=10), 0.1)
    core.add_request(request("h", priority=-10), 0.2)
    assert completion_order(run(core, 1.0)) == expected


def test_requests_stop_at_eos_min_tokens_or_length():
    cases = {
        "eos": ({"eos_at": 5}, 5, "stop"),
        "min": ({"eos_at": 5, "min_tokens": 8}, 8, "stop"),
        "ignore": ({"eos_at": 5, "ignore_eos": True}, 10, "length"),
        "late": ({"eos_at": 50}, 10, "length"),
        "never": ({}, 10, "length"),
    }
    core = EngineCore(small_profile())
    for rid, (kw, _, _) in cases.items():
        core.add_request(request(rid, max_tokens=10, **kw), 0.0)
    outputs = run(core)
    for rid, (_, count, reason) in cases.items():
        assert tokens_of(outputs, rid) == count
        assert [o.finish_reason for _, o in outputs if o.request_id == rid and o.finished] == [reason]
    assert core.stats.finished["stop"] == 2 and core.stats.finished["length"] == 3


def test_output_is_capped_by_max_model_len():
    core = EngineCore(small_profile(max_model_len=20))
    core.add_request(request("r", prompt=16, max_tokens=100), 0.0)
    assert tokens_of(run(core), "r") == 4
    with pytest.raises(ValueError):
        core.add_request(request("too-long", prompt=20), 0.0)


def test_abort_frees_the_request_and_counts_it():
    core = EngineCore(small_profile())
    core.add_request(request("run", max_tokens=50), 0.0)
    core.add_request(request("wait", max_tokens=50), 0.0)
    core.step(0.0)
    assert core.num_running == 2
    assert core.abort("run", 0.5) and core.abort("wait", 0.5)
    assert not core.abort("run", 0.6) and not core.abort("unknown", 0.6)
    assert core.num_running == 0 and core.num_waiting == 0 and not core.has_work
    assert core.kv_cache_usage == 0.0
    assert core.stats.finished["abort"] == 2 and core.stats.e2e.count == 2


def test_waiting_request_abort_under_priority_policy():
    core = EngineCore(small_profile(max_num_seqs=1), scheduling_policy=PRIORITY)
    for rid, prio in (("a", 0), ("b", 1), ("c", 2)):
        core.add_request(request(rid, priority=prio), 0.0)
    core.step(0.0)
    assert core.abort("b", 0.1)
    assert completion_order(run(core, 0.2)) == ["a", "c"]


def test_latency_histograms_follow_the_request_timeline():
    core = EngineCore(small_profile())
    core.add_request(request("r", max_tokens=6), 0.0)
    outputs = run(core)
    stats = core.stats
    assert stats.ttft.count == 1 and stats.ttft.sum == pytest.approx(outputs[0][0])
    assert stats.itl.count == 5
    assert stats.itl.sum == pytest.approx(outputs[-1][0] - outputs[0][0])
    assert stats.e2e.sum == pytest.approx(outputs[-1][0])
    assert stats.generation_tokens == 6 and stats.prompt_tokens == 8
    assert stats.iteration_tokens.count == 6


def test_duplicate_request_ids_are_refused():
    core = EngineCore(small_profile())
    core.add_request(request("same"), 0.0)
    with pytest.raises(ValueError):
        core.add_request(request("same"), 0.0)


@pytest.mark.parametrize("overlap", [False, True])
def test_engines_sharing_a_device_take_turns_for_its_part(overlap):
    timing = Timing(overhead_ms=1.0, prefill_ms_per_token=0.5, host_overlaps_device=overlap)
    profile = Profile("shared", timing=timing, block_size=4, num_blocks=64, max_num_batched_tokens=64)
    device = SharedDevice()
    a, b, alone = EngineCore(profile, device=device), EngineCore(profile, device=device), EngineCore(profile)
    for core in (a, b, alone):
        core.add_request(request("r", prompt=20), 0.0)
    host, work = 0.001, 0.010  # 20 prefill tokens at 0.5 ms on the device
    first = host + work if not overlap else work
    assert alone.step(0.0).duration_s == pytest.approx(first)
    assert a.step(0.0).duration_s == pytest.approx(first)
    # B asked for the device while A held it: its part runs after A's.
    assert b.step(0.0).duration_s == pytest.approx(first + work)


def test_a_replys_blocks_hashed_as_the_next_turn_carries_them_are_that_turns_hits():
    from priority_gateway.engines.sim.core import EngineCore, EngineRequest
    from priority_gateway.engines.sim.profile import load_profile
    from priority_gateway.engines.sim.tokens import block_hashes_for_ids

    stream = block_hashes_for_ids(list(range(16 * 20)), 16)  # a conversation's 20 blocks
    for known, expected in ((stream[4:10], 16 * 9), ((), 16 * 4)):
        core = EngineCore(load_profile("instant"), num_blocks=100)
        core.add_request(EngineRequest("t1", 64, stream[:4], 96, ignore_eos=True, output_block_hashes=known), 0.0)
        now = 0.0
        while core.has_work:
            now += core.step(now).duration_s
        core.add_request(EngineRequest("t2", 16 * 12, stream[:12], 4, ignore_eos=True), now)
        first = [o for o in core.step(now).outputs if o.first_token]
        # With the reply's hashes the next turn hits its prompt and its reply (less the reply's last,
        # never-computed token's block); without them, only the first turn's prompt.
        assert first[0].cached_tokens == expected
