import pytest

from priority_gateway.engines.sim.lora import RUNNING_EVENT, WAITING_EVENT, LoraAdapter, LoraRequestStates, LoraSlots

A, B, C, D = (LoraAdapter(name, i, f"/adapters/{name}") for i, name in enumerate("abcd", start=1))


def names(adapters: list[LoraAdapter]) -> list[str]:
    return [a.name for a in adapters]


def test_a_step_swaps_in_what_is_missing_and_evicts_the_least_recently_used_slot():
    slots = LoraSlots(max_loras=2, max_cpu_loras=4)
    first = slots.apply([A, B])
    assert names(first.loaded) == ["a", "b"] and names(first.swapped_in) == ["a", "b"]
    assert slots.apply([A]).swapped_in == []  # a is now the most recently used
    third = slots.apply([C])
    assert names(third.swapped_in) == ["c"]
    assert names(slots.active) == ["a", "c"]  # b was the least recently used
    assert (slots.swaps, slots.loads) == (3, 3)


def test_an_adapter_still_in_the_cpu_cache_is_swapped_in_without_a_load():
    slots = LoraSlots(max_loras=1, max_cpu_loras=2)
    slots.apply([A])
    slots.apply([B])
    again = slots.apply([A])
    assert names(again.swapped_in) == ["a"] and again.loaded == []
    assert names(slots.cached) == ["b", "a"]


def test_leaving_the_cpu_cache_also_leaves_the_slot():
    slots = LoraSlots(max_loras=2, max_cpu_loras=2)
    slots.apply([A, B])
    slots.apply([B])
    applied = slots.apply([C])
    assert names(applied.loaded) == ["c"]
    assert names(slots.cached) == ["b", "c"]
    assert names(slots.active) == ["b", "c"]


def test_a_step_never_evicts_an_adapter_it_needs():
    slots = LoraSlots(max_loras=2)
    slots.apply([A])
    slots.apply([B])
    # a is the least recently used slot, but the step needs it: only c comes in, and it evicts b.
    applied = slots.apply([C, A])
    assert names(applied.swapped_in) == ["c"]
    assert sorted(names(slots.active)) == ["a", "c"]


def test_preload_takes_a_slot_and_a_reload_in_place_swaps_again():
    slots = LoraSlots(max_loras=1)
    assert names(slots.preload(A).swapped_in) == ["a"]
    assert slots.apply([A]).swapped_in == []
    moved = LoraAdapter("a", 1, "/adapters/a-v2")
    reloaded = slots.preload(moved, replace=True)
    assert names(reloaded.loaded) == ["a"] and slots.active == [moved]


def test_limits_are_vllm_s():
    with pytest.raises(ValueError, match=r"max_cpu_loras \(1\) must be >= max_loras \(2\)"):
        LoraSlots(max_loras=2, max_cpu_loras=1)
    with pytest.raises(RuntimeError):
        LoraSlots(max_loras=1).apply([A, B])


def test_request_states_follow_the_events_delivered():
    states = LoraRequestStates()
    states.update("r1", "a", WAITING_EVENT)
    states.update("r1", "a", RUNNING_EVENT)
    states.update("r2", "b", WAITING_EVENT)
    assert states.counts() == {"a": (0, 1), "b": (1, 0)}
    assert states.labels() == ("a,b", "a,b")
    states.update("r1", "a", None)
    assert states.labels() == ("b", "b")
    states.update("r2", "b", None)
    assert states.labels() == ("", "")
