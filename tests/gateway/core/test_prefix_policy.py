import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from priority_gateway.core.dispatcher import Dispatch, Dispatcher, PoolSpec
from priority_gateway.core.engines import EngineMetrics
from priority_gateway.core.prefix import chain_seed, estimate_tokens, hash_blocks
from priority_gateway.core.request import RouteRequest
from tests.support.examples import examples

ENGINES = [f"http://e{i}:8000" for i in range(4)]


def request(i: int, text: str, session: str | None = None) -> RouteRequest:
    return RouteRequest(
        f"r{i}",
        "interactive",
        "m",
        float(i),
        prompt_tokens=estimate_tokens(text),
        prefix=hash_blocks(text, chain_seed("m")),
        session=session,
    )


def conversation(c: int, turns: int) -> str:
    return "".join(f"<user {c} turn {t}> " + f"words of conversation {c} " * 12 for t in range(turns))


def dispatcher(load_factor: float = 1.25) -> Dispatcher:
    return Dispatcher([PoolSpec("interactive", ENGINES, policy="prefix", policy_options={"load_factor": load_factor})])


def test_follow_up_turns_go_where_the_conversation_is_cached():
    d = dispatcher()
    first = {}
    for c in range(8):
        out = d.submit(request(c, conversation(c, 1)), 0.0).answer
        assert isinstance(out, Dispatch)
        first[c] = out.engine.id
        d.finish(out, 0.1)
    for c in range(8):
        out = d.submit(request(100 + c, conversation(c, 3)), 1.0).answer
        assert isinstance(out, Dispatch)
        assert out.engine.id == first[c]
        assert out.predicted_cached_tokens > 0
        d.finish(out, 1.1)


def test_two_routers_that_share_nothing_agree_on_new_prefixes():
    a, b = dispatcher(), dispatcher()
    # Router a has seen other traffic; router b has seen nothing.
    for i in range(20):
        out = a.submit(request(1000 + i, conversation(500 + i, 2)), 0.0).answer
        a.finish(out, 0.0)
    for c in range(30):
        out_a = a.submit(request(c, conversation(c, 1)), 1.0).answer
        out_b = b.submit(request(c, conversation(c, 1)), 1.0).answer
        assert out_a.engine.id == out_b.engine.id
        assert out_a.reason == out_b.reason == "rendezvous"
        a.finish(out_a, 1.0)
        b.finish(out_b, 1.0)


def test_same_sequence_same_choices_across_instances():
    runs = []
    for _ in range(2):
        d = dispatcher()
        choices = []
        live = []
        for i in range(200):
            out = d.submit(request(i, conversation(i % 13, 1 + i % 4)), float(i)).answer
            choices.append(out.engine.id)
            live.append(out)
            if i % 3 == 0:
                d.finish(live.pop(0), float(i))
        runs.append(choices)
    assert runs[0] == runs[1]


def test_hot_prefix_spreads_instead_of_piling_up():
    d = dispatcher()
    system = "You are a helpful assistant. " * 40
    live = []
    for i in range(64):
        live.append(d.submit(request(i, system + f"question {i}"), 0.0).answer)
    loads = [e.inflight for e in d.engines()]
    assert max(loads) <= math.ceil(1.25 * 64 / 4)
    assert min(loads) > 0


@settings(max_examples=examples(60), deadline=None)
@given(
    ops=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4), st.booleans()), min_size=1, max_size=150),
    factor=st.sampled_from([1.0, 1.1, 1.25, 1.5, 2.0]),
)
def test_no_engine_is_chosen_above_the_load_bound(ops, factor):
    d = dispatcher(factor)
    live: list[Dispatch] = []
    for i, (conv, turns, finish_one) in enumerate(ops):
        engines = d.engines()
        total = sum(e.load for e in engines)
        bound = math.ceil(factor * (total + 1) / len(engines) - 1e-9)
        out = d.submit(request(i, conversation(conv, turns)), float(i)).answer
        assert isinstance(out, Dispatch)
        assert out.engine.load <= bound  # its load after taking this request
        live.append(out)
        if finish_one and live:
            d.finish(live.pop(0), float(i))


def test_session_pin_holds_then_releases_on_overload_and_death():
    d = dispatcher(load_factor=1.0)
    pinned = d.submit(request(0, "short", session="s1"), 0.0).answer
    d.finish(pinned, 0.0)
    home = pinned.engine
    again = d.submit(request(1, "a different prompt entirely " * 5, session="s1"), 1.0).answer
    assert again.engine is home and again.reason == "session"
    # Overload the pinned engine: the pin is released, the request goes elsewhere.
    # (A turn of a session whose other turn still runs continues it: it stays within twice the bound.)
    extra = [d.submit(request(10 + i, "x"), 1.0).answer for i in range(12)]
    for out in extra:
        if out.engine is not home:
            d.finish(out, 1.0)
    moved = d.submit(request(2, "more", session="s1"), 2.0).answer
    assert moved.engine is not home
    # The pin followed the request; now kill that engine.
    d.set_health(moved.engine.id, False)
    after = d.submit(request(3, "again", session="s1"), 3.0).answer
    assert after.engine is not moved.engine and after.engine.healthy


# The query counter at successive scrapes; the last went back: the engine restarted, empty.
# The second case restarts while a sample is still too small to judge.
@pytest.mark.parametrize("queries", [(5000, 10), (0, 5000, 10)])
def test_engine_restart_clears_what_the_index_believed(queries):
    d = dispatcher()
    out = d.submit(request(0, conversation(1, 2)), 0.0).answer
    d.finish(out, 0.0)
    for i, count in enumerate(queries):
        d.apply_scrape(out.engine.id, EngineMetrics(prefix_queries=count, prefix_hits=count // 5), 1.0 + i)
    follow = d.submit(request(1, conversation(1, 3)), 10.0).answer
    assert follow.reason != "affinity"


def _cache_of(d: Dispatcher, engine_id: str) -> int:
    return d.pools["interactive"].policy.modelled_capacity(engine_id)


def _scrape_all(d: Dispatcher, now: float, queries: int = 0, hits: int = 0) -> None:
    # 100 blocks of 16: a cache of 1,600 tokens, so a judgement needs 800 started prompt tokens.
    metrics = EngineMetrics(prefix_queries=queries, prefix_hits=hits, block_size=16, num_blocks=100)
    for engine in ENGINES:
        d.apply_scrape(engine, metrics, now)


def _repeat_turns(d: Dispatcher, start: int, count: int, finish: bool = True) -> tuple[set[str], int]:
    """Route the same conversation again and again; returns where it went and the prompt tokens sent."""
    engines, tokens = set(), 0
    for i in range(start, start + count):
        out = d.submit(request(i, conversation(7, 3)), float(i)).answer
        engines.add(out.engine.id)
        tokens += out.request.prompt_tokens
        if finish:
            d.finish(out, float(i))
    return engines, tokens


def test_index_shrinks_when_the_engine_keeps_less_than_predicted():
    d = dispatcher()
    _scrape_all(d, 0.0)
    engines, tokens = _repeat_turns(d, 1, 12)
    assert len(engines) == 1 and tokens >= 800
    engine = engines.pop()
    # The engine served every one of those prompts without a single cache hit.
    _scrape_all(d, 20.0, queries=tokens, hits=0)
    assert _cache_of(d, engine) < 1600
    assert all(_cache_of(d, other) == 1600 for other in ENGINES if other != engine)


def test_index_keeps_its_capacity_on_too_small_a_sample_or_requests_not_yet_started():
    d = dispatcher()
    _scrape_all(d, 0.0)
    _repeat_turns(d, 1, 2)  # well under half the cache: too few to judge
    _scrape_all(d, 5.0, queries=200, hits=0)
    assert all(_cache_of(d, engine) == 1600 for engine in ENGINES)
    # Routed but still queued on the engine: the engine has not counted their hits yet,
    # so their predictions do not count against it either.
    _repeat_turns(d, 10, 12, finish=False)
    _scrape_all(d, 30.0, queries=200, hits=0)
    assert all(_cache_of(d, engine) == 1600 for engine in ENGINES)


def test_prompts_the_engine_has_not_computed_yet_take_no_room_in_the_modelled_cache():
    d = Dispatcher([PoolSpec("interactive", ENGINES[:1], policy="prefix")])
    _scrape_all(d, 0.0)  # a cache of 1,600 tokens
    index = d.pools["interactive"].policy.index
    texts = [f"<prompt {i}> " + f"distinct words of prompt {i} " * 200 for i in range(5)]
    queued = [d.submit(request(i, texts[i]), 1.0).answer for i in range(4)]
    assert sum(out.request.prompt_tokens for out in queued) > 2 * 1600
    # Queued behind each other, none computed yet: the engine still holds whatever it held, and will
    # hold each of them once computed, so the index forgets none of them.
    for i, out in enumerate(queued):
        assert index.match(out.request.prefix, ENGINES[:1]) == [len(out.request.prefix)], i
    for out in queued:
        d.observe_ttft(out, 0.5)
    later = d.submit(request(4, texts[4]), 2.0).answer
    assert index.used(ENGINES[0]) <= 1600 + later.prefill_tokens
    assert index.match(queued[0].request.prefix, ENGINES[:1]) == [0]
