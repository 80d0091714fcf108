from priority_gateway.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from priority_gateway.engines.sim.kv_cache import KVCache


def fill(cache: KVCache, hashes: list[int]) -> list[int]:
    blocks = cache.allocate(len(hashes))
    cache.cache_blocks(blocks, hashes, 0, len(hashes))
    return blocks


def test_freed_blocks_stay_hittable_until_reused():
    cache = KVCache(num_blocks=8, block_size=4)
    blocks = fill(cache, [11, 12, 13])
    cache.free(blocks)
    assert cache.num_free == 8 and cache.usage == 0.0
    assert cache.find_prefix([11, 12, 13, 14], max_blocks=10) == blocks
    assert cache.find_prefix([11, 99, 13], max_blocks=10) == blocks[:1]
    assert cache.find_prefix([11, 12, 13], max_blocks=2) == blocks[:2]


def test_a_hit_on_a_free_block_takes_it_out_of_the_free_queue():
    cache = KVCache(num_blocks=4, block_size=4)
    blocks = fill(cache, [1, 2])
    cache.free(blocks)
    hit = cache.find_prefix([1, 2], 2)
    assert cache.can_allocate(2, hit) and not cache.can_allocate(3, hit)
    cache.touch(hit)
    assert cache.num_free == 2 and cache.ref_count(hit[0]) == 1
    cache.touch(hit)
    cache.free(hit)
    assert cache.num_free == 2  # still held once


def test_eviction_takes_least_recently_freed_blocks_tail_first():
    events: list = []
    cache = KVCache(num_blocks=6, block_size=4, events=events)
    a = fill(cache, [1, 2, 3])
    b = fill(cache, [7, 8, 9])
    cache.free(a)
    cache.free(b)
    events.clear()
    cache.allocate(2)
    # a was freed first; its tail (3) goes before its head (2, then 1).
    assert events == [BlockRemoved([3]), BlockRemoved([2])]
    assert cache.find_prefix([1, 2, 3], 3) == a[:1]
    assert cache.find_prefix([7, 8, 9], 3) == b


def test_cache_events_report_stored_blocks_with_their_parent():
    events: list = []
    cache = KVCache(num_blocks=4, block_size=4, events=events)
    blocks = cache.allocate(3)
    cache.cache_blocks(blocks, [5, 6, 7], 0, 1, lambda i, _h: [i] * 4)
    cache.cache_blocks(blocks, [5, 6, 7], 1, 3, lambda i, _h: [i] * 4)
    assert events == [BlockStored([5], None, [0] * 4, 4), BlockStored([6, 7], 5, [1] * 4 + [2] * 4, 4)]


def test_without_prefix_caching_nothing_is_hit():
    cache = KVCache(num_blocks=4, block_size=4, enable_prefix_caching=False)
    cache.free(fill(cache, [1, 2]))
    assert cache.find_prefix([1, 2], 2) == []


def test_reset_clears_every_hash_only_when_idle():
    events: list = []
    cache = KVCache(num_blocks=4, block_size=4, events=events)
    blocks = fill(cache, [1])
    assert not cache.reset_prefix_cache()
    cache.free(blocks)
    assert cache.reset_prefix_cache()
    assert cache.find_prefix([1], 1) == [] and isinstance(events[-1], AllBlocksCleared)
