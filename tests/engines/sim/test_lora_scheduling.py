"""LoRA in the engine model: the slot budget, swap costs, LRU slots, per-adapter prefix caching."""

import random
from dataclasses import replace

import msgpack
import pytest

from priority_gateway.core.kv_events import BlockStored
from priority_gateway.engines.sim import virtual
from priority_gateway.engines.sim.core import PRIORITY, EngineCore
from priority_gateway.engines.sim.kv_events import encode_batch
from priority_gateway.engines.sim.lora import LoraAdapter
from priority_gateway.engines.sim.profile import LoraCosts

from .helpers import request, run, shared_hashes, small_profile

A, B, C = (LoraAdapter(name, i, f"/adapters/{name}", rank=16) for i, name in enumerate("abc", start=1))
COSTS = LoraCosts(swap_in_ms=3.0, load_ms=10.0, step_overhead_ms=0.0, ms_per_lora_token=0.0)


def lora_core(max_loras: int = 2, costs: LoraCosts = COSTS, **kw: object) -> EngineCore:
    profile = replace(small_profile(), lora=costs)
    return EngineCore(profile, enable_lora=True, max_loras=max_loras, **kw)  # type: ignore[arg-type]


def step_time(core: EngineCore, now: float = 0.0) -> float:
    return core.step(now).duration_s


def test_a_batch_holds_at_most_max_loras_adapters_and_the_rest_wait_deferred():
    core = lora_core(max_loras=2)
    for rid, adapter in (("ra", A), ("rb", B), ("rc", C), ("base", None)):
        core.add_request(request(rid, prompt=8, max_tokens=20, lora=adapter), 0.0)
    core.step(0.0)
    running = {s.req.id for s in core._running}
    # c is skipped for the budget; the base-model request behind it is still admitted.
    assert running == {"ra", "rb", "base"}
    assert core.num_waiting == 1 and core.num_waiting_deferred == 1
    outputs = run(core, 0.1)
    first_tokens = {o.request_id: t for t, o in outputs if o.first_token}
    done = {o.request_id: t for t, o in outputs if o.finished}
    assert first_tokens["rc"] > min(done["ra"], done["rb"])
    assert core.num_waiting_deferred == 0


def test_a_waiting_request_of_a_scheduled_adapter_joins_the_batch():
    core = lora_core(max_loras=1)
    core.add_request(request("a1", max_tokens=20, lora=A), 0.0)
    core.add_request(request("b1", max_tokens=20, lora=B), 0.0)
    core.add_request(request("a2", max_tokens=20, lora=A), 0.0)
    core.step(0.0)
    assert [s.req.id for s in core._running] == ["a1", "a2"]
    assert [s.req.id for s in core._fcfs] == ["b1"]


def test_skipped_requests_keep_their_place_under_the_priority_policy():
    core = lora_core(max_loras=1, scheduling_policy=PRIORITY)
    core.add_request(request("a1", max_tokens=20, lora=A, priority=0), 0.0)
    core.add_request(request("b1", max_tokens=20, lora=B, priority=1), 0.0)
    core.add_request(request("c1", max_tokens=20, lora=C, priority=2), 0.0)
    core.step(0.0)
    assert [s.req.id for s in core._running] == ["a1"]
    assert sorted(s.req.id for s in core._heap) == ["b1", "c1"]
    assert core.num_waiting_deferred == 2


def test_a_swap_in_adds_its_cost_to_the_step_once():
    core = lora_core()
    core.add_request(request("base", max_tokens=5), 0.0)
    base_step = step_time(core)
    core.abort("base", 0.0)
    core.add_request(request("ra", max_tokens=5, lora=A), 0.0)
    first = core.step(0.0)
    assert (first.lora_loads, first.lora_swaps) == (1, 1)
    assert first.duration_s == pytest.approx(base_step + (COSTS.load_ms + COSTS.swap_in_ms) / 1000)
    second = core.step(first.duration_s)
    assert (second.lora_loads, second.lora_swaps) == (0, 0)


def test_swap_cost_scales_with_rank():
    core = lora_core(max_lora_rank=64)
    core.add_request(request("r", max_tokens=5, lora=LoraAdapter("big", 9, "/big", rank=64)), 0.0)
    small = lora_core()
    small.add_request(request("r", max_tokens=5, lora=LoraAdapter("small", 9, "/small", rank=16)), 0.0)
    extra = step_time(core) - step_time(small)
    assert extra == pytest.approx(3 * (COSTS.load_ms + COSTS.swap_in_ms) / 1000)


def test_lora_compute_costs_apply_to_steps_with_lora_tokens():
    costs = LoraCosts(swap_in_ms=0.0, load_ms=0.0, step_overhead_ms=2.0, ms_per_lora_token=0.5)
    core = lora_core(costs=costs)
    core.add_request(request("base", prompt=8, max_tokens=5), 0.0)
    core.add_request(request("ra", prompt=8, max_tokens=5, lora=A), 0.0)
    with_lora = step_time(core)
    plain = lora_core(costs=costs)
    plain.add_request(request("base", prompt=8, max_tokens=5), 0.0)
    plain.add_request(request("rb", prompt=8, max_tokens=5), 0.0)
    assert with_lora - step_time(plain) == pytest.approx((2.0 + 0.5 * 8) / 1000)


def test_least_recently_used_slot_is_evicted():
    core = lora_core(max_loras=2)
    swaps = []
    for rid, adapter in (("1", A), ("2", B), ("3", A), ("4", C), ("5", A), ("6", B)):
        core.add_request(request(rid, max_tokens=2, lora=adapter), 0.0)
        swaps.append(sum(r.lora_swaps for r in _steps(core)))
    # a, b come in; a is a hit; c evicts b (the LRU); a is a hit; b evicts c.
    assert swaps == [1, 1, 0, 1, 0, 1]
    assert core.lora_slots is not None and [a.name for a in core.lora_slots.active] == ["a", "b"]


def _steps(core: EngineCore) -> list:
    out = []
    now = 0.0
    while core.has_work:
        result = core.step(now)
        now += result.duration_s
        out.append(result)
    return out


def test_an_adapter_loaded_between_steps_is_paid_for_by_the_next_step():
    core = lora_core()
    core.add_request(request("base", max_tokens=5), 0.0)
    base_step = step_time(core)
    core.add_lora(C)
    assert step_time(core, 1.0) == pytest.approx(base_step + (COSTS.load_ms + COSTS.swap_in_ms) / 1000, rel=0.2)
    assert core.lora_slots is not None and C in core.lora_slots.active


def test_prefix_cache_hits_only_for_the_same_adapter():
    core = lora_core()
    hashes = shared_hashes(16)

    def cached(rid: str, adapter: LoraAdapter | None) -> int:
        core.add_request(request(rid, prompt=16, max_tokens=2, hashes=hashes, lora=adapter), 0.0)
        outputs = run(core)
        return next(o.cached_tokens for _, o in outputs if o.first_token)

    assert cached("a1", A) == 0
    assert cached("a2", A) == 12
    assert cached("b1", B) == 0
    assert cached("base", None) == 0
    moved = LoraAdapter("a", 1, "/adapters/a-v2")
    assert cached("a3", moved) == 0  # same name, other path: vLLM keys blocks by both


def test_kv_events_name_the_adapter_and_the_salt():
    core = lora_core(kv_events=True)
    core.add_request(request("ra", prompt=12, max_tokens=1, lora=A, cache_salt="s1"), 0.0)
    core.add_request(request("base", prompt=8, max_tokens=1, cache_salt="s2"), 0.0)
    core.add_request(request("plain", prompt=8, max_tokens=1), 0.0)
    stored = [e for e in core.step(0.0).kv_events if isinstance(e, BlockStored)]
    by_lora = {e.lora_name: e for e in stored if e.lora_name}
    assert by_lora["a"].lora_id == 1
    assert by_lora["a"].extra_keys == [["a", "s1"], ["a"], ["a"]]
    salted, plain = [e for e in stored if e.lora_name is None]
    assert (salted.lora_id, salted.extra_keys) == (None, [["s2"], None])
    assert plain.extra_keys is None


def test_lora_info_counts_a_request_from_its_first_token_until_it_ends():
    core = lora_core(max_loras=2)
    core.add_request(request("long", prompt=200, max_tokens=3, lora=A), 0.0)  # 4 prefill chunks of 64
    now = 0.0
    seen = []
    while core.has_work:
        now += core.step(now).duration_s
        seen.append(core.lora_states.labels()[0])
    assert seen == ["", "", "", "a", "a", ""]
    assert list(core.lora_info) == [("", ""), ("a", "a")]
    assert core.lora_info[("", "")] == pytest.approx(now)


def test_lora_needs_enable_lora_and_a_rank_within_max_lora_rank():
    plain = EngineCore(small_profile())
    with pytest.raises(ValueError, match="LoRA is not enabled"):
        plain.add_request(request("r", lora=A), 0.0)
    core = lora_core(max_lora_rank=8)
    with pytest.raises(ValueError, match="LoRA rank 16 is greater than max_lora_rank 8"):
        core.add_request(request("r", lora=A), 0.0)
    with pytest.raises(ValueError, match="LoRA rank 16"):
        core.add_lora(A)


def test_virtual_time_runs_many_adapters_within_the_slot_budget():
    """Zipf-popular adapters on one engine, driven by the virtual-time loop the cluster simulator uses."""
    core = lora_core(max_loras=2, max_cpu_loras=4)
    adapters = [LoraAdapter(f"a{i}", i + 1, f"/adapters/a{i}") for i in range(8)]
    rng = random.Random(7)
    weights = [1 / (i + 1) for i in range(len(adapters))]
    arrivals = [
        (i * 0.002, request(f"r{i}", prompt=8, max_tokens=6, lora=rng.choices(adapters, weights)[0]))
        for i in range(200)
    ]
    widest = 0

    def check(_: float, __: object) -> None:
        nonlocal widest
        widest = max(widest, len({s.req.lora for s in core._running if s.req.lora is not None}))

    trace = virtual.run(core, arrivals, on_output=check)
    assert sum(1 for _, o in trace.deliveries if o.finished) == 200
    assert widest == 2
    assert core.lora_slots is not None
    assert 0 < core.lora_slots.swaps < 200 and core.lora_slots.loads >= 8
    assert core.lora_info[("", "")] == pytest.approx(trace.end)


def test_engine_state_reports_loaded_adapters_and_swaps():
    core = lora_core(max_loras=2)
    assert (core.loaded_loras, core.lora_swaps) == ([], 0)
    for rid, adapter in (("1", A), ("2", B), ("3", C)):
        core.add_request(request(rid, max_tokens=2, lora=adapter), 0.0)
        run(core)
    assert (core.loaded_loras, core.lora_swaps) == (["b", "c"], 3)
    assert EngineCore(small_profile()).loaded_loras == []


def test_kv_events_go_on_the_wire_with_the_adapter():
    stored = BlockStored([1, 2], None, [0] * 8, 4, 3, "sql", [["sql", "salt"], ["sql"]])
    event = msgpack.unpackb(encode_batch([stored], ts=1.0))[1][0]
    assert (event["lora_id"], event["lora_name"], event["extra_keys"]) == (3, "sql", [["sql", "salt"], ["sql"]])
    plain = msgpack.unpackb(encode_batch([BlockStored([1], None, [0] * 4, 4)], ts=1.0))[1][0]
    assert (plain["lora_id"], plain["lora_name"], plain["extra_keys"]) == (None, None, [None])
