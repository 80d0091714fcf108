import pytest
from hypothesis import given
from hypothesis import strategies as st

from priority_gateway.core.kv_events import BlockRemoved, BlockStored, KVEvent
from priority_gateway.engines.sim.cpu_tier import (
    CPU,
    CpuTier,
    Offloader,
    blocks_for_size,
    transfer_s_per_block,
)


def stored_tier(capacity: int, hashes: list[int], events: list[KVEvent] | None = None) -> CpuTier:
    tier = CpuTier(capacity, 16, events)
    for h in hashes:
        assert tier.prepare_store([h]) == [h]
        tier.complete_store([h])
    return tier


def test_a_block_is_a_hit_only_once_its_copy_has_ended():
    events: list[KVEvent] = []
    tier = CpuTier(8, 16, events)
    assert tier.prepare_store([1, 2]) == [1, 2]
    assert tier.lookup([1, 2]) == 0 and events == []
    tier.complete_store([1, 2])
    assert tier.lookup([1, 2, 3]) == 2
    # As vLLM's connector reports it: the hashes alone, no parent, no token ids.
    assert events == [BlockStored([1, 2], None, [], 16, medium=CPU)]


def test_blocks_already_held_are_not_stored_again():
    tier = stored_tier(8, [1, 2])
    assert tier.prepare_store([1, 2, 3]) == [3]


def test_the_least_recently_used_block_is_evicted_with_a_cpu_block_removed():
    events: list[KVEvent] = []
    tier = stored_tier(3, [1, 2, 3], events)
    tier.touch([1])
    events.clear()
    assert tier.prepare_store([4]) == [4]
    assert events == [BlockRemoved([2], medium=CPU)]
    assert 2 not in tier and 1 in tier


def test_touch_keeps_a_chains_head_longer_than_its_tail():
    tier = stored_tier(4, [7, 8, 9, 10])
    tier.touch([7, 8, 9])  # a request whose prompt is this chain
    tier.prepare_store([11, 12])
    assert [h in tier for h in (7, 8, 9, 10)] == [True, True, False, False]


def test_a_block_being_loaded_is_not_evicted_and_a_store_without_room_is_refused_whole():
    events: list[KVEvent] = []
    tier = stored_tier(2, [1, 2], events)
    tier.prepare_load([1, 2])
    events.clear()
    assert tier.prepare_store([3]) is None
    assert len(tier) == 2 and events == []
    tier.complete_load([1])
    assert tier.prepare_store([3]) == [3]
    assert events == [BlockRemoved([1], medium=CPU)]


@given(st.lists(st.tuples(st.sampled_from(["store", "done", "load", "unload", "touch"]), st.lists(st.integers(0, 30)))))
def test_the_tier_never_holds_more_than_its_capacity(ops: list[tuple[str, list[int]]]) -> None:
    tier = CpuTier(5, 16)
    loaded: list[list[int]] = []
    for op, hashes in ops:
        if op == "store":
            tier.prepare_store(hashes)
        elif op == "done":
            tier.complete_store(hashes)
        elif op == "load":
            ready = hashes[: tier.lookup(hashes)]
            tier.prepare_load(ready)
            loaded.append(ready)
        elif op == "unload" and loaded:
            tier.complete_load(loaded.pop())
        else:
            tier.touch(hashes)
        assert len(tier) <= 5


def test_size_in_gib_becomes_whole_blocks_of_the_gpus_size():
    # h200-7b-bf16: 57,344 bytes per token, 16-token blocks (896 KiB): 4 GiB hold 4,681 blocks.
    assert blocks_for_size(4.0, 57_344, 16) == 4681
    with pytest.raises(ValueError):
        blocks_for_size(4.0, 0, 16)


def test_a_blocks_copy_takes_its_bytes_over_the_link():
    assert transfer_s_per_block(57_344, 16, bytes_per_s=1e9) == pytest.approx(16 * 57_344 / 1e9)
    assert transfer_s_per_block(0, 16, bytes_per_s=1e9) == pytest.approx(16 * 131_072 / 1e9)


def test_copies_queue_one_after_another_and_stores_end_in_time():
    offloader = Offloader(CpuTier(10, 16), s_per_block=0.5)
    assert offloader.store([1, 2], start=1.0)
    assert offloader.store([3], start=1.0)
    offloader.finish_stores(1.9)
    assert offloader.tier.lookup([1, 2, 3]) == 0
    offloader.finish_stores(2.0)  # the first copy: 2 blocks from 1.0
    assert offloader.tier.lookup([1, 2, 3]) == 2
    offloader.finish_stores(2.5)
    assert offloader.tier.lookup([1, 2, 3]) == 3
    assert offloader.load([1, 2], now=3.0) == 4.0
    assert offloader.load([3], now=3.0) == 4.5
