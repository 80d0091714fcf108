"""Agent sessions in the core: continuing turns, learned gaps, holds bounded by KV capacity and expiring,
continuing turns admitted first, and cold prompts placed where they evict no paused session."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from priority_gateway.core.classes import Budget
from priority_gateway.core.decisions import Dispatch, Queued
from priority_gateway.core.dispatcher import AdmissionSettings, Dispatcher, PoolSpec
from priority_gateway.core.engines import EngineMetrics, EngineState
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.core.prefix_policy import PrefixAffinity
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.sessions import SessionBook, SessionSettings, retained
from tests.support.examples import examples

ids = itertools.count()


def book(**options: object) -> SessionBook:
    return SessionBook(SessionSettings(**options))  # type: ignore[arg-type]


def test_a_turn_within_the_hold_continues_its_session_and_teaches_it_its_gap():
    b = book(default_hold_s=30.0, gap_factor=2.0, gap_weight=0.5, min_hold_s=1.0)
    assert b.arrived("s", 0.0)[0] is False  # a session's first turn is a new one
    assert b.ended("s", "e0", 1000, 1.0) == {"e0"}
    assert b.held("e0") == 1000
    continuing, changed = b.arrived("s", 6.0)
    assert continuing and changed == {"e0"} and b.held("e0") == 0  # its blocks are the turn's now
    session = b.get("s")
    assert session is not None and session.gap == 5.0
    b.ended("s", "e0", 1500, 7.0)
    assert b.hold_s(session) == 10.0  # twice the learned gap
    b.arrived("s", 8.0)  # a 1 s pause: the EWMA moves half way
    assert session.gap == 3.0


def test_a_hold_expires_after_its_learned_gap_and_the_next_turn_is_a_new_session():
    b = book(default_hold_s=30.0, gap_factor=2.0, min_hold_s=1.0)
    b.arrived("s", 0.0)
    b.ended("s", "e0", 800, 1.0)
    b.arrived("s", 3.0)  # learns a 2 s gap: holds last 4 s from now on
    b.ended("s", "e0", 900, 4.0)
    assert b.expire(7.9) == set() and b.held("e0") == 900
    assert b.expire(8.1) == {"e0"} and b.held("e0") == 0
    assert b.arrived("s", 9.0)[0] is False


def test_parallel_turns_of_one_session_hold_only_once_the_last_ends():
    b = book()
    b.arrived("s", 0.0)
    assert b.arrived("s", 0.1)[0] is True  # the session is running: this call continues it
    b.ended("s", "e0", 500, 1.0)
    assert b.held("e0") == 0
    b.ended("s", "e1", 700, 2.0)
    assert b.held("e1") == 700 and b.held("e0") == 0


def test_the_book_remembers_at_most_max_sessions_and_forgets_their_holds_with_them():
    b = book(max_sessions=3)
    for i in range(5):
        b.arrived(f"s{i}", float(i))
        b.ended(f"s{i}", "e0", 100, float(i) + 0.5)
    assert len(b) == 3
    assert b.held("e0") == 300
    assert b.get("s0") is None and b.get("s4") is not None


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["arrive", "end", "abandon", "expire"]), st.integers(0, 9), st.integers(0, 4)),
        max_size=80,
    )
)
def test_held_totals_are_always_the_sum_of_the_live_holds(ops):
    b = book(max_sessions=6, default_hold_s=3.0, min_hold_s=0.5, max_hold_s=5.0)
    now = 0.0
    for kind, session, engine in ops:
        now += 0.7
        key = f"s{session}"
        if kind == "arrive":
            b.arrived(key, now)
        elif kind == "end" and (s := b.get(key)) is not None and s.inflight:
            b.ended(key, f"e{engine}", 100 * (session + 1), now)
        elif kind == "abandon":
            b.abandoned(key)
        else:
            b.expire(now)
        for e in range(5):
            live = [
                s
                for k in (f"s{i}" for i in range(10))
                if (s := b.get(k)) is not None and s.holding and s.engine == f"e{e}"
            ]
            assert b.held(f"e{e}") == sum(s.tokens for s in live)
            if kind == "expire":
                assert all(s.expires_at >= now for s in live), "a hold outlived its time"


def test_what_routing_counts_as_held_is_bounded_by_the_engines_free_kv_cache():
    engine = EngineState("e0", "p", block_size=16, num_blocks=1000)  # 16,000 tokens of KV cache
    engine.held_kv, engine.peer_held_kv = 9000, 9000
    assert retained(engine) == 16_000  # never more than the engine can keep
    engine.kv_usage = 0.75  # running requests use three quarters of it
    assert retained(engine) == 4000
    engine.num_blocks = 0  # cache size unknown (not scraped yet): nothing can be said
    assert retained(engine) == 0


# -- the dispatcher ----------------------------------------------------------------------


def dispatcher(engines=1, limit=1.0, policy="least_loaded", **session_options: object) -> Dispatcher:
    admission = AdmissionSettings(
        enabled=True,
        limits=LimitSettings(initial=limit, unbudgeted=limit),
        sessions=SessionSettings(**session_options),  # type: ignore[arg-type]
    )
    pools = [PoolSpec("p", [f"e{i}" for i in range(engines)], policy=policy)]
    return Dispatcher(pools, budgets={"interactive": None, "batch": None}, admission=admission)


def turn(session: str | None, now: float, prompt: int = 100, prefix: list[int] | None = None) -> RouteRequest:
    return RouteRequest(
        f"r{next(ids)}",
        "batch",
        "m",
        now,
        prompt_tokens=prompt,
        max_tokens=10,
        session=session,
        prefix=prefix or [],
        budget=Budget(),
    )


def test_a_continuing_turn_is_admitted_before_new_sessions_that_queued_first():
    d = dispatcher()
    first = d.submit(turn("agent", 0.0), 0.0).answer
    assert isinstance(first, Dispatch)
    d.finish(first, 1.0, generated=10)  # the agent pauses for its tool
    assert d.engine("e0").held_kv == 110
    busy = d.submit(turn(None, 1.1), 1.1).answer
    assert isinstance(busy, Dispatch)
    queued = [d.submit(turn(f"new{i}", 1.2), 1.2).answer for i in range(3)]
    nxt = turn("agent", 3.0)
    assert isinstance(d.submit(nxt, 3.0).answer, Queued) and nxt.continuing
    assert not any(q.request.continuing for q in queued if isinstance(q, Queued))
    started = [o for o in d.finish(busy, 4.0, generated=10).others if isinstance(o, Dispatch)]
    assert [s.request.id for s in started] == [nxt.id]


def test_a_retried_turn_is_one_turn_and_a_refused_one_holds_nothing():
    d = dispatcher(engines=2, limit=2.0)
    r = turn("agent", 0.0)
    dispatch = d.submit(r, 0.0).answer
    assert isinstance(dispatch, Dispatch)
    again = d.retry(dispatch, 0.1).answer
    assert isinstance(again, Dispatch)
    session = d.turns.book.get("agent")
    assert session is not None and session.turns == 1 and session.inflight == 1
    d.finish(again, 1.0, generated=5)
    assert session.gap is None and d.engine(again.engine.id).held_kv == 105
    d.cancel(turn("agent", 2.0), 2.0)  # not queued: nothing to cancel, nothing changes
    assert session.inflight == 0


def test_holds_expire_on_poll_and_the_engine_state_follows():
    d = dispatcher(default_hold_s=5.0)
    dispatch = d.submit(turn("agent", 0.0), 0.0).answer
    assert isinstance(dispatch, Dispatch)
    d.finish(dispatch, 1.0, generated=20)
    d.poll(5.9)
    assert d.engine("e0").held_kv == 120
    d.poll(6.1)
    assert d.engine("e0").held_kv == 0


def test_a_cold_prompt_goes_where_it_evicts_no_paused_session():
    policy = PrefixAffinity(load_factor=4.0)
    holding = EngineState("e0", "p", block_size=16, num_blocks=1000, kv_usage=0.1)
    other = EngineState("e1", "p", block_size=16, num_blocks=1000, kv_usage=0.1)
    # A cold prompt of 6,000 tokens fits either engine's free blocks (14,400 tokens) ...
    cold = RouteRequest("c", "interactive", "m", 0.0, prompt_tokens=6000, max_tokens=100, prefix=[1, 2, 3])
    chosen = {policy.choose(cold, [holding, other], 0.0).engine.id for _ in range(1)}
    # ... but while e0's paused sessions hold 12,000 of them, it would push them out there.
    holding.held_kv = 12_000
    assert policy.choose(cold, [holding, other], 0.0).engine is other
    assert policy._retention_cost(cold, holding, 0) > 0 and policy._retention_cost(cold, other, 0) == 0
    # Off (retention_weight 0), it goes where rendezvous hashing sends it, as before.
    plain = PrefixAffinity(load_factor=4.0, retention_weight=0.0)
    assert {plain.choose(cold, [holding, other], 0.0).engine.id} == chosen


def test_the_engines_kv_capacity_bounds_the_holds_routing_weighs():
    d = dispatcher(engines=2, limit=4.0, policy="prefix")
    for engine in ("e0", "e1"):
        d.apply_scrape(engine, EngineMetrics(block_size=16, num_blocks=100, kv_usage=0.5), 0.0)
    dispatch = d.submit(turn("agent", 0.0, prompt=5000, prefix=[7, 8]), 0.0).answer
    assert isinstance(dispatch, Dispatch)
    d.finish(dispatch, 1.0, generated=100)
    engine = d.engine(dispatch.engine.id)
    assert engine.held_kv == 5100  # what the session holds, as the book says
    assert retained(engine) == 800  # what the engine can keep of it: half of its 1,600 tokens are in use


def paused_on_a_full_engine(**session_options: object) -> tuple[Dispatcher, str, Dispatch]:
    """Two engines of one seat each; an agent's turn ran on one (its first token took 0.5 s) and
    paused; unrelated work now fills that engine, the other one is free. Returns the dispatcher, the
    agent's engine and the request running there."""
    d = dispatcher(engines=2, limit=1.0, policy="prefix", **session_options)
    first = d.submit(turn("agent", 0.0, prompt=4000, prefix=[5, 6]), 0.0).answer
    assert isinstance(first, Dispatch)
    d.observe_ttft(first, 0.5)
    d.finish(first, 1.0, generated=10)
    busy = [d.submit(turn(None, 1.1), 1.1).answer for _ in range(2)]
    assert all(isinstance(b, Dispatch) for b in busy)
    home = first.engine.id
    on_home = next(b for b in busy if isinstance(b, Dispatch) and b.engine.id == home)
    other = next(b for b in busy if isinstance(b, Dispatch) and b.engine.id != home)
    d.finish(other, 1.5, generated=10)
    return d, home, on_home


def test_a_continuing_turn_waits_for_its_sessions_engine_without_holding_back_those_behind_it():
    d, home, on_home = paused_on_a_full_engine()
    nxt = turn("agent", 2.0, prompt=4200, prefix=[5, 6, 7])
    assert isinstance(d.submit(nxt, 2.0).answer, Queued) and nxt.continuing
    # A new session's turn behind it in the same line starts on the free engine at once.
    cold = d.submit(turn("new", 2.01), 2.01).answer
    assert isinstance(cold, Dispatch) and cold.engine.id != home
    d.finish(cold, 2.1, generated=10)
    assert not [o for o in d.poll(2.2).others if isinstance(o, Dispatch)]  # still waiting: 0.2 s < 0.5 s
    # Its engine's seat frees within the time it would take to compute its context elsewhere.
    started = [o for o in d.finish(on_home, 2.3, generated=10).others if isinstance(o, Dispatch)]
    assert [(s.request.id, s.engine.id) for s in started] == [(nxt.id, home)]


@pytest.mark.parametrize("factor", [1.0, 3.0])
def test_a_continuing_turn_moves_once_it_has_waited_wait_factor_times_its_first_token_elsewhere(factor: float):
    d, home, _ = paused_on_a_full_engine(wait_factor=factor)
    nxt = turn("agent", 2.0, prompt=4200, prefix=[5, 6, 7])
    assert isinstance(d.submit(nxt, 2.0).answer, Queued)
    # Its first token elsewhere is predicted at about 0.5 s (the pool's only one took 0.5 s).
    assert not [o for o in d.poll(2.0 + 0.45 * factor).others if isinstance(o, Dispatch)]
    moved = [o for o in d.poll(2.0 + 0.55 * factor).others if isinstance(o, Dispatch)]
    assert [(m.request.id, m.engine.id != home) for m in moved] == [(nxt.id, True)]


def test_a_continuing_turn_starts_elsewhere_at_once_when_waiting_is_off_or_unweighable():
    d, home, _ = paused_on_a_full_engine(wait_for_engine=False)
    started = d.submit(turn("agent", 2.0, prompt=4200, prefix=[5, 6, 7]), 2.0).answer
    assert isinstance(started, Dispatch) and started.engine.id != home
    # No first token seen yet in the pool: nothing to weigh waiting against, so it does not wait.
    d = dispatcher(engines=2, limit=1.0, policy="prefix")
    first = d.submit(turn("agent", 0.0), 0.0).answer
    assert isinstance(first, Dispatch)
    d.finish(first, 1.0, generated=10)
    busy = [d.submit(turn(None, 1.1), 1.1).answer for _ in range(2)]
    d.finish(next(b for b in busy if isinstance(b, Dispatch) and b.engine.id != first.engine.id), 1.5)
    assert isinstance(d.submit(turn("agent", 2.0), 2.0).answer, Dispatch)
