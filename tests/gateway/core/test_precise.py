from priority_gateway.core.dispatcher import Dispatch, Dispatcher, PoolSpec
from priority_gateway.core.kv_events import AllBlocksCleared, BlockStored
from priority_gateway.core.precise import ROOT, PreciseIndex, token_block_hashes
from priority_gateway.core.request import RouteRequest

TOKENS = list(range(1000, 1000 + 64))  # four blocks of 16


def test_request_and_event_hash_the_same_tokens_alike():
    index = PreciseIndex()
    index.stored("a", [11, 12], None, TOKENS[:32], 16)
    index.stored("a", [13], 12, TOKENS[32:48], 16)
    assert index.index.match(token_block_hashes(TOKENS, 16), ["a"]) == [3]
    assert token_block_hashes(TOKENS[:15], 16) == []
    assert token_block_hashes(TOKENS, 16)[0] != ROOT


def test_removed_and_cleared_blocks_stop_matching():
    index = PreciseIndex()
    index.stored("a", [1, 2, 3, 4], None, TOKENS, 16)
    index.removed("a", [3])
    assert index.index.match(token_block_hashes(TOKENS, 16), ["a"]) == [2]
    index.cleared("a")
    assert index.index.match(token_block_hashes(TOKENS, 16), ["a"]) == [0]


def test_a_block_whose_parent_was_never_seen_is_not_guessed():
    index = PreciseIndex()
    index.stored("a", [7], 999, TOKENS[16:32], 16)
    assert index.blocks("a") == 0 and index.unplaced == 1


def request(i, tokens):
    return RouteRequest(
        f"r{i}",
        "interactive",
        "m",
        0.0,
        prompt_tokens=len(tokens),
        prefix=token_block_hashes(tokens, 16),
        block_tokens=16,
    )


def test_precise_pool_routes_by_events_not_by_its_own_history():
    d = Dispatcher([PoolSpec("interactive", ["a", "b"], policy="prefix", policy_options={"precise": True})])
    first = d.submit(request(0, TOKENS), 0.0).answer
    assert isinstance(first, Dispatch)
    d.finish(first, 0.1)
    other = "b" if first.engine.id == "a" else "a"
    # Routing recorded nothing: until an engine reports the blocks, there is no affinity.
    again = d.submit(request(1, TOKENS), 0.2).answer
    assert again.predicted_cached_tokens == 0
    d.finish(again, 0.3)
    d.apply_kv_events(other, [BlockStored([1, 2, 3, 4], None, TOKENS, 16)])
    third = d.submit(request(2, TOKENS), 0.5).answer
    assert third.engine.id == other and third.reason == "affinity"
    assert third.predicted_cached_tokens == 48  # whole blocks, never the last prompt token
    d.finish(third, 0.6)
    d.apply_kv_events(other, [AllBlocksCleared()])
    assert d.submit(request(3, TOKENS), 0.8).answer.predicted_cached_tokens == 0


def test_an_adapters_blocks_match_only_that_adapters_prompts():
    index = PreciseIndex()
    tokens = list(range(64))
    index.stored("e1", ["h1", "h2", "h3", "h4"], None, tokens, 16, "sql")
    for_sql = token_block_hashes(tokens, 16, lora_name="sql")
    assert index.index.match(for_sql, ["e1"]) == [4]
    assert index.index.match(token_block_hashes(tokens, 16), ["e1"]) == [0]
    assert index.index.match(token_block_hashes(tokens, 16, lora_name="chat"), ["e1"]) == [0]


def test_a_block_offloaded_to_cpu_scores_between_a_gpu_hit_and_a_miss():
    from priority_gateway.core.engines import EngineState
    from priority_gateway.core.kv_events import BlockRemoved, BlockStored
    from priority_gateway.core.precise import token_block_hashes
    from priority_gateway.core.prefix_policy import PrefixAffinity
    from priority_gateway.core.request import RouteRequest

    tokens = list(range(16 * 8))
    prefix = token_block_hashes(tokens, 16)
    req = RouteRequest("r", "interactive", "m", 0.0, prompt_tokens=len(tokens) + 1, prefix=prefix)
    policy = PrefixAffinity(precise=True, load_factor=4.0)
    gpu, cpu, cold = (EngineState(name, "p") for name in ("gpu", "cpu", "cold"))
    stored = [BlockStored(list(range(100, 108)), None, tokens, 16)]
    policy.kv_events("gpu", stored)
    policy.kv_events("cpu", stored)
    # The engine offloaded the blocks to its CPU tier, then evicted them from the GPU.
    policy.kv_events("cpu", [BlockStored(list(range(100, 108)), None, tokens, 16, medium="CPU")])
    policy.kv_events("cpu", [BlockRemoved(list(range(100, 108)), medium="GPU")])
    scores = {e.id: policy.choose(req, [e], 0.0).predicted_cached_tokens for e in (gpu, cpu, cold)}
    assert scores["gpu"] == 128 and scores["cold"] == 0 and scores["cpu"] == 64
    assert policy.choose(req, [cold, cpu], 0.0).engine is cpu
    # Gone from the CPU tier too: a miss.
    policy.kv_events("cpu", [BlockRemoved(list(range(100, 108)), medium="CPU")])
    assert policy.choose(req, [cpu], 0.0).predicted_cached_tokens == 0
    assert policy.precise is not None and policy.precise.blocks("cpu") == 0


def test_a_block_stored_by_its_hash_alone_goes_to_the_tier_the_event_names():
    # vLLM's offloading connector reports a CPU store with the hashes only: no parent, no token ids.
    index = PreciseIndex()
    index.stored("a", [1, 2, 3, 4], None, TOKENS, 16)
    index.stored("a", [3, 4, 99], None, [], 16, medium="CPU")
    ours = token_block_hashes(TOKENS, 16)
    assert [index.lower.holds("a", h) for h in ours] == [False, False, True, True]
    assert index.unplaced == 1  # a hash the engine never named is not guessed
    index.removed("a", [3, 4], medium="GPU")
    assert index.lower.holds("a", ours[3]) and not index.index.holds("a", ours[3])
