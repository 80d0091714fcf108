"""The engine with a CPU KV tier (``kv_offloading_blocks``): stores, lookups after the GPU hit, loads."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from priority_gateway.core.engines import EngineState
from priority_gateway.core.kv_events import BlockRemoved, BlockStored, KVEvent
from priority_gateway.core.precise import token_block_hashes
from priority_gateway.core.prefix_policy import PrefixAffinity
from priority_gateway.core.request import RouteRequest
from priority_gateway.engines.sim.cli import build_parser, offloading_blocks
from priority_gateway.engines.sim.core import EngineCore
from priority_gateway.engines.sim.cpu_tier import CPU
from priority_gateway.engines.sim.kv_events import encode_batch
from priority_gateway.engines.sim.metrics import MetricsPage
from priority_gateway.engines.sim.profile import load_profile
from priority_gateway.upstream.kv_events import decode_message

from .helpers import request, run, small_profile, unique_hashes

BLOCK = 4
PROMPT = 40  # ten blocks
BYTES_PER_TOKEN = 2_000_000  # 8 MB a block: 0.25 ms a copy at the default link, long enough to see


def engine(cpu_blocks: int | None, kv_events: bool = False) -> EngineCore:
    profile = small_profile(num_blocks=16, kv_bytes_per_token=BYTES_PER_TOKEN)
    return EngineCore(profile, kv_offloading_blocks=cpu_blocks, kv_events=kv_events)


def evict_then_return(core: EngineCore) -> tuple[list[int], float]:
    """``a`` runs, unrelated ``b`` takes most of the GPU's 16 blocks, then ``a`` comes back with one
    more block: the hashes of ``a`` and the time ``a``'s second turn arrives."""
    a = unique_hashes("a", PROMPT)
    core.add_request(request("a1", PROMPT, max_tokens=1, hashes=a), 0.0)
    end = run(core)[-1][0]
    core.add_request(request("b", 48, max_tokens=1), end + 1.0)
    end = run(core, end + 1.0)[-1][0]
    return a, end + 1.0


def prompt_tokens_by_source(core: EngineCore) -> dict[str, float]:
    page = MetricsPage(core, created=1.0).render().decode()
    family = next(f for f in text_string_to_metric_families(page) if f.name == "vllm:prompt_tokens_by_source")
    return {s.labels["source"]: s.value for s in family.samples if s.name.endswith("_total")}


def test_a_block_evicted_from_the_gpu_is_found_in_the_cpu_tier():
    core = engine(cpu_blocks=64)
    a, _ = evict_then_return(core)
    assert core.offload is not None
    gpu = len(core.cache.find_prefix(a, len(a)))
    assert 0 < gpu < len(a)  # b evicted the tail of a's prompt from the GPU
    assert core.offload.tier.lookup(a) == len(a)


def test_a_returning_prompt_re_prefills_fewer_tokens_with_the_tier():
    computed = {}
    for cpu_blocks in (None, 64):
        core = engine(cpu_blocks)
        a, back = evict_then_return(core)
        before = prompt_tokens_by_source(core)
        core.add_request(request("a2", PROMPT + BLOCK, max_tokens=1, hashes=[*a, 999]), back)
        run(core, back)
        after = prompt_tokens_by_source(core)
        computed[cpu_blocks] = after["local_compute"] - before["local_compute"]
        if cpu_blocks:
            loaded = after["external_kv_transfer"] - before["external_kv_transfer"]
            gpu_hit = after["local_cache_hit"] - before["local_cache_hit"]
            assert loaded > 0 and gpu_hit > 0  # the lookup went on into the tier after the GPU hit
            assert gpu_hit + loaded == PROMPT
    assert computed[64] == BLOCK
    assert computed[None] > computed[64]


def test_the_load_is_charged_before_the_request_runs():
    core = engine(cpu_blocks=64)
    a, back = evict_then_return(core)
    assert core.offload is not None
    gpu_blocks = len(core.cache.find_prefix(a, len(a)))
    core.add_request(request("a2", PROMPT + BLOCK, max_tokens=1, hashes=[*a, 999]), back)
    waiting = core.step(back)
    load_s = (len(a) - gpu_blocks) * core.offload.s_per_block
    assert waiting.scheduled_tokens == 0 and not waiting.outputs
    assert waiting.duration_s == pytest.approx(load_s)
    assert core.num_waiting == 1 and core.num_waiting_deferred == 1 and core.num_running == 0
    ran = core.step(back + waiting.duration_s)
    assert ran.prefill_tokens == BLOCK and ran.outputs[0].first_token
    assert ran.outputs[0].cached_tokens == PROMPT


def test_stored_and_evicted_cpu_blocks_are_reported_as_the_cpus():
    core = engine(cpu_blocks=12, kv_events=True)
    a = unique_hashes("a", PROMPT)
    events: list[KVEvent] = []
    now = 0.0
    for rid, prompt, hashes in (("a1", PROMPT, a), ("b", 24, None), ("c", 24, None)):
        core.add_request(request(rid, prompt, max_tokens=1, hashes=hashes), now)
        while core.has_work:
            result = core.step(now)
            now += result.duration_s
            events += result.kv_events
        now += 1.0
        events += core.step(now).kv_events  # an idle step: copies that ended meanwhile report their blocks
        assert core.offload is not None and len(core.offload.tier) <= 12
    cpu_stored = [h for e in events if isinstance(e, BlockStored) and e.medium == CPU for h in e.block_hashes]
    cpu_removed = [h for e in events if isinstance(e, BlockRemoved) and e.medium == CPU for h in e.block_hashes]
    assert set(a) <= set(cpu_stored)
    # 10 + 6 + 6 blocks through a tier of 12: a's went, least recently used first, a chain's tail first.
    assert cpu_removed == a[::-1]


def test_without_a_tier_nothing_changes():
    core = engine(cpu_blocks=None)
    assert core.offload is None
    a, back = evict_then_return(core)
    core.add_request(request("a2", PROMPT + BLOCK, max_tokens=1, hashes=[*a, 999]), back)
    assert core.step(back).prefill_tokens > BLOCK


def test_an_aborted_load_gives_back_its_blocks():
    core = engine(cpu_blocks=64)
    a, back = evict_then_return(core)
    core.add_request(request("a2", PROMPT + BLOCK, max_tokens=1, hashes=[*a, 999]), back)
    core.step(back)
    assert core.abort("a2", back)
    assert core.cache.num_free == core.cache.num_blocks and not core.has_work
    assert core.offload is not None and core.offload.tier.prepare_store(list(range(1000, 1064))) is not None


def test_the_gateways_precise_index_puts_the_tiers_blocks_in_its_lower_tier():
    """The gateway's own event handling, fed what this engine reports: blocks the GPU evicted but the
    CPU tier holds score between a GPU hit and a miss."""
    profile = small_profile(block_size=16, num_blocks=16, max_num_batched_tokens=512)
    core = EngineCore(profile, kv_events=True, kv_offloading_blocks=64)
    tokens = list(range(5000, 5000 + 160))  # ten blocks
    hashes = unique_hashes("a", 160, block_size=16)
    core.add_request(request("a", 160, max_tokens=1, hashes=hashes, prompt_token_ids=tokens), 0.0)
    core.add_request(request("b", 192, max_tokens=1, hashes=unique_hashes("b", 192, block_size=16)), 1.0)
    events: list[KVEvent] = []
    now = 0.0
    while core.has_work:
        result = core.step(now)
        now = max(now + result.duration_s, 1.0)
        events += result.kv_events
    events += core.step(now + 1.0).kv_events
    policy = PrefixAffinity(precise=True)
    policy.kv_events("e", events)
    prefix = token_block_hashes(tokens, 16)
    assert policy.precise is not None
    on_gpu = [policy.precise.index.holds("e", h) for h in prefix]
    assert on_gpu == [True] * 4 + [False] * 6  # b took the GPU blocks of a's tail
    assert all(policy.precise.lower.holds("e", h) for h in prefix)
    req = RouteRequest("r", "interactive", "m", 0.0, prompt_tokens=161, prefix=prefix)
    choice = policy.choose(req, [EngineState("e", "p")], 0.0)
    assert choice is not None and 64 < choice.predicted_cached_tokens < 160


def test_the_flags_take_vllms_gib_or_a_block_count():
    profile = load_profile("h200-7b-bf16")
    parse = build_parser().parse_args
    assert offloading_blocks(parse(["--port", "1"]), profile) is None
    assert offloading_blocks(parse(["--port", "1", "--kv-offloading-size", "4"]), profile) == 4681
    assert (
        offloading_blocks(parse(["--port", "1", "--kv-offloading-size", "4", "--kv-offloading-blocks", "9"]), profile)
        == 9
    )
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        offloading_blocks(parse(["--port", "1", "--kv-offloading-size", "4"]), load_profile("default"))
    with pytest.raises(ValueError, match="not simulated"):
        offloading_blocks(
            parse(["--port", "1", "--kv-offloading-size", "4", "--kv-offloading-backend", "lmcache"]), profile
        )


def test_requests_holding_loaded_blocks_give_them_back_when_nothing_else_can_run():
    # Two loads together hold all but one GPU block; the first in line needs two more to go on.
    core = engine(cpu_blocks=64)
    x, y = unique_hashes("x", PROMPT), unique_hashes("y", 20)
    for rid, prompt, hashes in (("x1", PROMPT, x), ("y1", 20, y), ("z", 60, None)):
        core.add_request(request(rid, prompt, max_tokens=1, hashes=hashes), 0.0)
        run(core)
    core.add_request(request("x2", PROMPT + 8, max_tokens=2, hashes=[*x, 1, 2]), 10.0)
    core.add_request(request("y2", 28, max_tokens=2, hashes=[*y, 3, 4]), 10.0)
    finished = {o.request_id for _, o in run(core, 10.0, max_steps=1000) if o.finished}
    assert finished == {"x2", "y2"}


def test_the_tiers_events_cross_the_wire_as_the_cpus():
    events: list[KVEvent] = [BlockStored([7, 8], None, [], BLOCK, medium=CPU), BlockRemoved([7], medium=CPU)]
    batch = decode_message([b"", (0).to_bytes(8, "big"), encode_batch(events, 1.0)])
    stored, removed = batch.events
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    assert (list(stored.block_hashes), stored.parent_block_hash, list(stored.token_ids)) == ([7, 8], None, [])
    assert stored.medium == removed.medium == CPU and list(removed.block_hashes) == [7]
