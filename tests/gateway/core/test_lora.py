"""LoRA slots and residency, and how the prefix policy weighs them."""

from priority_gateway.core.dispatcher import Dispatch, Dispatcher, PoolSpec
from priority_gateway.core.engines import EngineMetrics
from priority_gateway.core.lora import AdapterSlots, LoraInfo
from priority_gateway.core.models import cache_key
from priority_gateway.core.prefix import chain_seed, estimate_tokens, hash_blocks
from priority_gateway.core.request import RouteRequest

ENGINES = [f"http://e{i}:8000" for i in range(4)]


def test_slots_count_scraped_and_inflight_adapters():
    slots = AdapterSlots()
    slots.scraped(LoraInfo(("a",), ("b",), 2))
    assert slots.busy() == {"a", "b"}
    assert slots.has_room("a") and not slots.has_room("c")
    slots.scraped(LoraInfo((), (), 2))
    slots.started("c")
    assert slots.has_room("d")
    slots.started("d")
    assert not slots.has_room("e")
    slots.finished("c")
    assert slots.has_room("e")


def test_the_most_recent_adapters_stay_resident_after_they_finish():
    slots = AdapterSlots(max_lora=2)
    for name in ("a", "b", "c"):
        slots.started(name)
        slots.finished(name)
    assert not slots.resident("a")
    assert slots.resident("b") and slots.resident("c")


def test_unknown_max_lora_always_has_room():
    slots = AdapterSlots()
    for name in "abcdef":
        slots.started(name)
    assert slots.has_room("z")


def request(i: int, adapter: str | None, text: str | None = None) -> RouteRequest:
    text = text or f"prompt {i} " * 40
    model = adapter or "base"
    return RouteRequest(
        f"r{i}",
        "interactive",
        model,
        float(i),
        prompt_tokens=estimate_tokens(text),
        prefix=hash_blocks(text, chain_seed(cache_key("base", adapter))),
        adapter=adapter,
    )


def dispatcher(**options) -> Dispatcher:
    d = Dispatcher([PoolSpec("interactive", ENGINES, policy="prefix", policy_options=options)])
    for engine in d.pools["interactive"].engines:
        engine.apply_scrape(EngineMetrics(lora=LoraInfo((), (), 2)), 0.0)
    return d


def test_an_adapter_follows_the_engine_that_holds_it():
    d = dispatcher()
    first = d.submit(request(0, "sql"), 0.0).answer
    assert isinstance(first, Dispatch)
    d.finish(first, 0.1)
    for i in range(1, 8):
        out = d.submit(request(i, "sql"), float(i)).answer
        assert isinstance(out, Dispatch)
        assert out.engine is first.engine
        d.finish(out, float(i) + 0.1)


def test_adapter_blind_routing_scatters_the_adapter():
    d = dispatcher(lora_aware=False)
    engines = set()
    for i in range(16):
        out = d.submit(request(i, "sql"), float(i)).answer
        assert isinstance(out, Dispatch)
        engines.add(out.engine.id)
        d.finish(out, float(i) + 0.1)
    assert len(engines) > 1


def test_no_engine_gets_more_distinct_adapters_than_its_slots_while_another_has_room():
    d = dispatcher(load_factor=100.0)
    running = []
    for i in range(8):
        out = d.submit(request(i, f"a{i}"), 0.0).answer
        assert isinstance(out, Dispatch)
        running.append(out)
    for engine in d.pools["interactive"].engines:
        assert len(engine.adapters.busy()) <= 2
    # Every slot is taken now: a ninth adapter goes somewhere (it waits there, as vLLM queues it).
    assert isinstance(d.submit(request(9, "a9"), 0.0).answer, Dispatch)


def test_the_slot_rule_outranks_a_cached_prefix():
    d = dispatcher(load_factor=100.0)
    text = "shared system prompt " * 40
    warm = d.submit(request(0, "x", text), 0.0).answer
    assert isinstance(warm, Dispatch)
    d.finish(warm, 0.1)
    busy = [d.submit(request(i, f"b{i}"), 1.0).answer for i in (1, 2)]
    # Fill the warm engine's two slots with other adapters.
    for out in busy:
        assert isinstance(out, Dispatch)
    engine = warm.engine
    engine.adapters.scraped(LoraInfo(("b1", "b2"), (), 2))
    out = d.submit(request(3, "x", text), 2.0).answer
    assert isinstance(out, Dispatch)
    assert out.engine is not engine
