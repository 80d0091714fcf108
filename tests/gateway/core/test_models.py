"""Which pool serves a model, aliases and weighted splits, and routing by model in the dispatcher."""

from collections import Counter

import pytest

from priority_gateway.core.classes import Budget
from priority_gateway.core.dispatcher import Dispatch, Dispatcher, PoolSpec, Queued, Rejection
from priority_gateway.core.models import Aliases, Split, cache_key, engine_tag, serves
from priority_gateway.core.reasons import Refusal
from priority_gateway.core.request import RouteRequest


def test_a_declared_model_is_served_even_before_engines_answer():
    assert serves(frozenset({"a"}), [None, None], "a")
    assert not serves(frozenset({"a"}), [None], "b")


def test_a_pool_that_declares_nothing_serves_anything_until_its_engines_answer():
    assert serves(frozenset(), [None], "anything")
    assert not serves(frozenset(), [frozenset({"a"})], "anything")
    assert serves(frozenset(), [frozenset({"a"}), frozenset({"b"})], "b")


@pytest.mark.parametrize("weights", [(90, 10), (1, 1, 1), (7, 0, 3), (1, 99)])
def test_a_split_is_within_one_request_of_its_weights_over_any_run(weights):
    split = Split(tuple(f"m{i}" for i in range(len(weights))), weights)
    total = sum(weights)
    seen: Counter[str] = Counter()
    for n in range(1, 3 * total + 1):
        seen[split.next()] += 1
        for i, w in enumerate(weights):
            assert abs(seen[f"m{i}"] - n * w / total) < 1.0 + 1e-9


def test_a_split_interleaves_rather_than_runs_in_blocks():
    split = Split(("a", "b"), (90, 10))
    first = [split.next() for _ in range(20)]
    assert first.count("b") == 2
    assert first.index("b") < 10


@pytest.mark.parametrize(("targets", "weights"), [((), ()), (("a",), (0,)), (("a", "b"), (1,)), (("a",), (-1,))])
def test_a_split_refuses_impossible_weights(targets, weights):
    with pytest.raises(ValueError):
        Split(targets, weights)


def test_aliases_resolve_only_their_public_names():
    aliases = Aliases({"chat": "llama", "one": [("x", 5)], "canary": [("a", 1), ("b", 1)]})
    assert aliases.resolve("chat") == "llama"
    assert aliases.resolve("one") == "x"
    assert {aliases.resolve("canary"), aliases.resolve("canary")} == {"a", "b"}
    assert aliases.resolve("llama") is None
    assert not Aliases({})


def test_cache_keys_differ_by_adapter_not_by_served_name():
    assert cache_key("/models/base", None) == cache_key("/models/base", None)
    assert cache_key("/models/base", "sql") != cache_key("/models/base", None)
    assert cache_key("/models/base", "sql") != cache_key("/models/base", "chat")


def test_engine_tags_are_opaque_and_stable():
    tag = engine_tag("http://10.0.0.1:8000")
    assert tag == engine_tag("http://10.0.0.1:8000") != engine_tag("http://10.0.0.2:8000")
    assert "10.0.0.1" not in tag


def _req(i: int, model: str, cls: str = "interactive") -> RouteRequest:
    return RouteRequest(f"r{i}", cls, model, 0.0)


def _two_models(admission: bool = False) -> Dispatcher:
    from priority_gateway.core.dispatcher import AdmissionSettings

    d = Dispatcher(
        [
            PoolSpec("llama", ["http://l0", "http://l1"], policy="round_robin"),
            PoolSpec("qwen", ["http://q0"], policy="round_robin", models=("qwen",)),
        ],
        home={"interactive": "llama", "batch": "llama"},
        admission=AdmissionSettings(enabled=admission),
    )
    for e in d.pools["llama"].engines:
        e.models = frozenset({"llama"})
    return d


@pytest.mark.parametrize("admission", [False, True])
def test_a_request_goes_to_the_pool_that_serves_its_model(admission):
    d = _two_models(admission)
    for i in range(6):
        out = d.submit(_req(i, "qwen"), 0.0).answer
        assert isinstance(out, Dispatch) and out.pool == "qwen"
        out = d.submit(_req(100 + i, "llama"), 0.0).answer
        assert isinstance(out, Dispatch) and out.pool == "llama"


def test_engines_of_one_pool_that_list_different_models_get_only_theirs():
    d = _two_models()
    l1 = d.pools["llama"].engines[1]
    l1.models = frozenset({"llama", "llama-sql"})
    for i in range(6):
        out = d.submit(_req(i, "llama-sql"), 0.0).answer
        assert isinstance(out, Dispatch) and out.engine is l1


def test_overflow_only_into_pools_that_serve_the_model():
    from priority_gateway.core.dispatcher import AdmissionSettings
    from priority_gateway.core.limiter import LimitSettings

    d = Dispatcher(
        [
            PoolSpec("interactive", ["http://i0"], policy="round_robin", models=("m",)),
            PoolSpec("other", ["http://o0"], policy="round_robin", accept_overflow=True, models=("n",)),
        ],
        admission=AdmissionSettings(enabled=True, limits=LimitSettings(initial=1, minimum=1, maximum=1)),
        budgets={"interactive": 0.05},
    )
    first = d.submit(_req(0, "m"), 0.0).answer
    assert isinstance(first, Dispatch) and first.pool == "interactive"
    second = d.submit(_req(1, "m"), 0.0).answer
    assert not (isinstance(second, Dispatch) and second.pool == "other")


def test_a_model_nobody_serves_finds_no_engine():
    d = _two_models()
    out = d.submit(_req(0, "mistral"), 0.0).answer
    assert isinstance(out, Rejection) and out.reason is Refusal.NO_HEALTHY_ENGINE


def _shared_pool() -> Dispatcher:
    """One pool, one slot per engine: engine a lists model a, engine b model b; a third model c is
    declared but listed by neither."""
    from priority_gateway.core.dispatcher import AdmissionSettings
    from priority_gateway.core.limiter import LimitSettings

    d = Dispatcher(
        [PoolSpec("p", ["http://a", "http://b"], policy="round_robin", models=("a", "b", "c"))],
        admission=AdmissionSettings(enabled=True, limits=LimitSettings(initial=1, minimum=1, maximum=1)),
        budgets={"interactive": 0.05, "batch": None},
    )
    d.pools["p"].engines[0].models = frozenset({"a"})
    d.pools["p"].engines[1].models = frozenset({"b"})
    return d


def test_a_request_for_the_idle_engine_s_model_passes_those_waiting_for_the_other():
    d = _shared_pool()
    running = d.submit(_req(0, "a", "batch"), 0.0).answer
    assert isinstance(running, Dispatch)
    waiting = [d.submit(_req(i, "a", "batch"), 0.0).answer for i in (1, 2)]
    assert all(isinstance(w, Queued) for w in waiting)
    passing = d.submit(_req(3, "b", "batch"), 0.0).answer
    assert isinstance(passing, Dispatch) and passing.engine.id == "http://b"
    # Queued behind the waiting a's, a b still starts as soon as b's engine is free.
    behind = d.submit(_req(4, "b", "batch"), 0.0).answer
    assert isinstance(behind, Queued)
    started = [o for o in d.finish(passing, 1.0) if isinstance(o, Dispatch)]
    assert [o.request.id for o in started] == ["r4"]
    # And the a's start in their order when a's engine is.
    started = [o for o in d.finish(running, 2.0) if isinstance(o, Dispatch)]
    assert [o.request.id for o in started] == ["r1"]


def test_a_lower_class_does_not_pass_a_higher_one_waiting_for_its_model():
    d = _shared_pool()
    running = d.submit(_req(0, "a", "batch"), 0.0).answer
    assert isinstance(running, Dispatch)
    high = RouteRequest("hi", "interactive", "a", 0.0, budget=Budget(ttft_s=60.0))
    assert isinstance(d.submit(high, 0.0).answer, Queued)
    low = d.submit(_req(9, "a", "batch"), 0.0).answer
    assert isinstance(low, Queued)
    started = [o for o in d.finish(running, 1.0) if isinstance(o, Dispatch)]
    assert [o.request.id for o in started] == ["hi"]


def test_a_model_no_engine_lists_is_refused_at_once_never_queued():
    d = _shared_pool()
    out = d.submit(_req(0, "c", "batch"), 0.0).answer
    assert isinstance(out, Rejection) and out.reason is Refusal.MODEL_NOT_SERVED
    d.pools["p"].engines[1].healthy = False
    down = d.submit(_req(1, "b", "batch"), 0.0).answer
    assert isinstance(down, Rejection) and down.reason is Refusal.NO_HEALTHY_ENGINE
