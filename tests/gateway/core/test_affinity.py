from priority_gateway.core.affinity import AffinityIndex


def test_match_counts_leading_blocks_per_engine():
    index = AffinityIndex()
    index.record("a", [1, 2, 3, 4], 64, 16)
    index.record("b", [1, 2, 9], 48, 16)
    assert index.match([1, 2, 3, 4, 5], ["a", "b", "c"]) == [4, 2, 0]
    assert index.match([7, 1, 2], ["a", "b"]) == [0, 0]


def test_lru_forgets_least_recently_used_blocks():
    index = AffinityIndex()
    index.set_capacity("a", 64)
    index.record("a", [1, 2], 32, 16)
    index.record("a", [10, 11], 32, 16)
    index.record("a", [1, 2], 32, 16)  # touch: now 10, 11 are the oldest
    index.record("a", [20, 21], 32, 16)
    assert index.match([1, 2], ["a"]) == [2]
    assert index.match([10, 11], ["a"]) == [0]
    assert index.used("a") == 64


def test_capacity_counts_the_whole_prompt_not_just_hashed_blocks():
    index = AffinityIndex()
    index.set_capacity("a", 1000)
    index.record("a", [1, 2], 600, 16)  # a long prompt: each hashed block stands for 300 tokens
    index.record("a", [3, 4], 600, 16)
    assert index.match([1, 2], ["a"]) == [0]
    assert index.match([3, 4], ["a"]) == [2]
    assert index.extent(4) == 600


def test_remove_clear_and_forget():
    index = AffinityIndex()
    index.record("a", [1, 2, 3], 48, 16)
    index.record("b", [1, 2, 3], 48, 16)
    index.remove("a", [2])
    assert index.match([1, 2, 3], ["a", "b"]) == [1, 3]
    index.clear("b")
    assert index.match([1, 2, 3], ["a", "b"]) == [1, 0]
    index.forget("a")
    index.record("c", [1], 16, 16)
    assert index.match([1], ["a", "c"]) == [0, 1]
