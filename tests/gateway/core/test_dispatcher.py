"""Admission and placement in the core: queues, budgets, backfill, preemption, overflow."""

import math

import pytest

from priority_gateway.core.classes import BATCH, INTERACTIVE, Budget
from priority_gateway.core.dispatcher import (
    AdmissionSettings,
    Dispatch,
    Dispatcher,
    PoolSpec,
    Preempted,
    Queued,
    Rejection,
)
from priority_gateway.core.engines import EngineMetrics
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.core.reasons import Refusal
from priority_gateway.core.request import RouteRequest

SLO = Budget(ttft_s=0.5, itl_s=0.05)


def make(interactive=2, batch=1, limit=2.0, overflow=False, reserve=0.0, max_queue=100):
    settings = AdmissionSettings(
        enabled=True,
        limits=LimitSettings(initial=limit, unbudgeted=limit),
        max_queue=max_queue,
        backfill_reserve=reserve,
    )
    pools = [
        PoolSpec("interactive", [f"i{n}" for n in range(interactive)], policy="least_loaded"),
        PoolSpec(
            "batch",
            [f"b{n}" for n in range(batch)],
            policy="least_loaded",
            takes_priority=True,
            accept_overflow=overflow,
        ),
    ]
    return Dispatcher(pools, budgets={INTERACTIVE: 0.05, BATCH: None}, admission=settings)


counter = iter(range(10**6))


def req(cls=INTERACTIVE, now=0.0, budget=None, restartable=True):
    if budget is None:
        budget = SLO if cls == INTERACTIVE else Budget()
    return RouteRequest(f"r{next(counter)}", cls, "m", now, prompt_tokens=100, budget=budget, restartable=restartable)


def test_requests_wait_for_room_and_interactive_goes_first():
    d = make(interactive=1, batch=0 + 1, limit=1)
    first = d.submit(req(), 0.0).answer
    assert isinstance(first, Dispatch)
    b = d.submit(req(BATCH), 0.0).answer
    assert isinstance(b, Dispatch) and b.pool == "batch"
    waiting_batch = d.submit(req(BATCH), 0.0).answer
    waiting_interactive = d.submit(req(), 0.01).answer
    assert isinstance(waiting_batch, Queued) and isinstance(waiting_interactive, Queued)
    assert d.readings.queue_depths()[("interactive", INTERACTIVE)] == 1
    started = d.finish(first, 0.1)
    assert [o.request for o in started if isinstance(o, Dispatch)] == [waiting_interactive.request]


def test_interactive_that_cannot_start_in_time_is_refused_with_retry_after():
    d = make(interactive=1, limit=1)
    busy = d.submit(req(), 0.0).answer
    assert isinstance(busy, Dispatch)
    queued = d.submit(req(now=0.0), 0.0).answer
    assert isinstance(queued, Queued)
    out = d.poll(0.6)  # past the 500 ms TTFT budget: refused, not left to time out
    refusals = [o for o in out if isinstance(o, Rejection)]
    assert len(refusals) == 1
    assert refusals[0].reason == Refusal.SLO_BUDGET_EXCEEDED
    assert refusals[0].retry_after_s >= 1


def test_a_request_whose_deadline_passed_is_refused_not_started_late():
    d = make(interactive=1, limit=1)
    running = d.submit(req(), 0.0).answer
    queued = d.submit(req(now=0.0), 0.0).answer
    assert isinstance(queued, Queued)
    out = d.finish(running, 0.7).others  # the slot frees past the 500 ms budget, before any poll
    assert [(type(o), o.request) for o in out] == [(Rejection, queued.request)]
    assert out[0].reason == Refusal.SLO_BUDGET_EXCEEDED
    assert d.engine("i0").inflight == 0


def test_refused_at_once_when_the_expected_wait_exceeds_the_budget():
    d = make(interactive=1, limit=1)
    running = d.submit(req(), 0.0).answer
    d.finish(running, 10.0)  # the pool learns that a request holds a slot for 10 s
    d.submit(req(now=10.0), 10.0)
    out = d.submit(req(now=10.0), 10.0).answer
    assert isinstance(out, Rejection) and out.reason == Refusal.SLO_BUDGET_EXCEEDED


def test_a_flood_held_by_the_prefill_with_slots_free_stays_within_the_queue_bound():
    """A flood that the prefill holds while slots are free meets the queue's bound: past ``max_queue``
    it is refused (queue full), and what waited is refused at its start deadline."""
    d = make(interactive=1, limit=4, max_queue=10)
    pool = d.pools["interactive"]
    for _ in range(40):
        for tokens in (100, 2000):
            pool.ttft_model.observe(tokens, 0.1 + tokens / 10_000)
    pool.engines[0].pending_prefill = 4000  # every first token there would come too late
    answers = [d.submit(req(now=1.0), 1.0).answer for _ in range(200)]
    assert sum(isinstance(a, Queued) for a in answers) == 10 and len(pool.queue) == 10
    refused = [a for a in answers if isinstance(a, Rejection)]
    assert len(refused) == 190 and {r.reason for r in refused} == {Refusal.QUEUE_FULL}
    expired = [o for o in d.poll(1.6) if isinstance(o, Rejection)]
    assert len(expired) == 10 and len(pool.queue) == 0


def test_with_slots_free_a_queue_held_by_the_prefill_is_not_a_wait_for_a_slot():
    """Requests that the first-token check holds (prefill queued on the engine) wait for the prefill, not
    for slots: a newcomer behind them is queued while slots are free, not refused for the slot wait that
    counting them as slot-takers predicts; its start deadline answers it if the prefill never drains."""
    d = make(interactive=1, limit=4)
    pool = d.pools["interactive"]
    running = d.submit(req(), 0.0).answer
    d.finish(running, 10.0)  # the pool learns that a request holds a slot for 10 s
    for _ in range(40):  # and that a first token comes 0.1 s + 0.1 ms per prefill token ahead of it
        for tokens in (100, 2000):
            pool.ttft_model.observe(tokens, 0.1 + tokens / 10_000)
    busy = d.submit(req(now=10.0), 10.0).answer
    assert isinstance(busy, Dispatch)
    engine = pool.engines[0]
    engine.pending_prefill = 4000  # a first token there now would come at ~0.6 s: past the budget
    held = [d.submit(req(now=10.0), 10.0).answer for _ in range(4)]
    assert all(isinstance(h, Queued) for h in held), "held by the prefill, with three slots free"
    newcomer = d.submit(req(now=10.0), 10.0).answer
    assert isinstance(newcomer, Queued), "slots are free: the slot wait of 10 s is not what holds it"
    engine.pending_prefill = 0  # the prefill drained: what waited starts, up to the limit
    started = [o for o in d.poll(10.1) if isinstance(o, Dispatch)]
    assert len(started) == 3 and engine.inflight == 4
    refused = [o for o in d.poll(10.6) if isinstance(o, Rejection)]
    assert len(refused) == 2 and all(r.reason == Refusal.SLO_BUDGET_EXCEEDED for r in refused)


def test_late_first_tokens_raise_the_margin_that_admission_applies():
    """A first token after its request's TTFT budget raises the pool's margin; the first-token check and
    the start deadline then leave more room for the scatter above the line's typical first token."""
    d = make(interactive=1, limit=4)
    pool = d.pools["interactive"]
    for _ in range(200):  # a first token typically 0.1 s after the start
        pool.ttft_model.observe(100, 0.1)
    before = pool.ttft_model.margin
    deadline_before = pool.start_deadline(req(now=0.0))
    for i in range(5):
        out = d.submit(req(now=float(i)), float(i)).answer
        assert isinstance(out, Dispatch)
        d.observe_ttft(out, 0.9)  # the budget is 0.5 s
        d.finish(out, i + 0.95)
    assert pool.ttft_model.margin > 1.25 * before
    margin, line = d.readings.ttft_models()["interactive"]  # what /metrics shows
    assert margin == pool.ttft_model.margin
    assert line is not None and line == pool.ttft_model.line()
    assert pool.start_deadline(req(now=0.0)) < deadline_before
    raised = pool.ttft_model.margin
    on_time = d.submit(req(now=10.0), 10.0).answer
    assert isinstance(on_time, Dispatch)
    d.observe_ttft(on_time, 0.1)
    assert 0.99 * raised < pool.ttft_model.margin < raised  # one in time lowers it, a little


def test_a_client_tightening_its_ttft_budget_cannot_raise_everyones_margin():
    """``x-slo-ttft-ms`` tightens one request's budget. One too tight to meet is refused at once, so it
    never comes late and never raises the pool's margin; one that starts is judged by the budget it
    started under, so its first tokens move the margin only as any request's at the edge would."""
    d = make(interactive=1, limit=4)
    pool = d.pools["interactive"]
    for _ in range(200):
        pool.ttft_model.observe(100, 0.1)
    before = pool.ttft_model.margin
    tight = Budget(ttft_s=0.001, itl_s=0.05)
    answers = [d.submit(req(now=1.0, budget=tight), 1.0).answer for _ in range(50)]
    assert all(isinstance(a, Rejection) and a.reason == Refusal.SLO_BUDGET_EXCEEDED for a in answers)
    assert pool.ttft_model.margin == before
    edge = d.submit(req(now=2.0, budget=Budget(ttft_s=0.15, itl_s=0.05)), 2.0).answer
    assert isinstance(edge, Dispatch)
    d.observe_ttft(edge, 0.14)  # in time for its own budget
    assert pool.ttft_model.margin < before


def stream(d, out, now, tokens, ttft=0.05, gap=0.035):
    """Play a streamed answer of ``tokens`` tokens through the dispatcher; returns when it ended."""
    now += ttft
    d.observe_ttft(out, now - out.request.arrival)
    for _ in range(tokens - 1):
        now += gap
        d.observe_itl(out, gap, now)
    d.finish(out, now)
    return now


def learned(d, tokens=128):
    """The pool has served ten streamed requests of ``tokens`` tokens (about 4.5 s each at 128)."""
    now = 0.0
    for _ in range(10):
        r = req(now=now)
        r.max_tokens = tokens
        now = stream(d, d.submit(r, now).answer, now, tokens)
    return now


def test_a_short_wait_behind_a_short_request_is_queued_not_refused():
    d = make(interactive=1, limit=1)
    now = learned(d)  # long requests taught the pool that a slot is held for ~4.5 s
    short = req(now=now)
    short.max_tokens = 8
    assert isinstance(d.submit(short, now).answer, Dispatch)
    waiting = d.submit(req(now=now + 0.01), now + 0.01).answer
    assert isinstance(waiting, Queued)  # the 8-token answer ends in ~0.3 s: within the budget


def test_the_wait_counts_how_long_running_requests_have_held_their_slots():
    d = make(interactive=1, limit=1)
    now = learned(d)
    running = req(now=now)
    running.max_tokens = 128
    assert isinstance(d.submit(running, now).answer, Dispatch)
    assert isinstance(d.submit(req(now=now + 0.1), now + 0.1).answer, Rejection)  # ~4.4 s to go
    nearly_done = now + 4.3
    assert isinstance(d.submit(req(now=nearly_done), nearly_done).answer, Queued)  # ~0.2 s to go


def test_tighter_ttft_header_budget_shortens_the_wait():
    d = make(interactive=1, limit=1)
    d.submit(req(), 0.0)
    tight = d.submit(req(budget=Budget(0.1, 0.05)), 0.0).answer
    loose = d.submit(req(), 0.0).answer
    assert isinstance(tight, Queued) and isinstance(loose, Queued)
    refused = [o.request for o in d.poll(0.2) if isinstance(o, Rejection)]
    assert refused == [tight.request]


def test_interactive_lull_lets_batch_backfill_and_interactive_reclaims_it():
    d = make(interactive=2, batch=1, limit=3)
    in_batch_pool = [d.submit(req(BATCH), 0.0).answer for _ in range(3)]
    assert all(isinstance(o, Dispatch) and o.pool == "batch" for o in in_batch_pool)
    # Each interactive engine lends all but one of its 3 slots.
    backfilled = [d.submit(req(BATCH), 0.0).answer for _ in range(4)]
    assert all(isinstance(o, Dispatch) and o.reason == "backfill" for o in backfilled)
    assert isinstance(d.submit(req(BATCH), 0.0).answer, Queued)
    for _ in range(2):
        assert isinstance(d.submit(req(), 1.0).answer, Dispatch)  # the reserved slots
    # Interactive arrives to a pool full of batch work: a restartable batch request is stopped for it.
    decided = d.submit(req(), 1.0)
    arrival, notices = decided.answer, decided.others
    assert isinstance(arrival, Dispatch) and arrival.pool == "interactive"
    assert len(notices) == 1 and isinstance(notices[0], Preempted)
    assert notices[0].dispatch in backfilled
    assert d.readings.queue_depths()[("batch", BATCH)] == 2  # the preempted one waits again


def test_streamed_batch_work_is_never_preempted():
    d = make(interactive=1, batch=1, limit=2)
    d.submit(req(BATCH, restartable=False), 0.0)
    d.submit(req(BATCH, restartable=False), 0.0)
    streamed = d.submit(req(BATCH, restartable=False), 0.0).answer
    assert isinstance(streamed, Dispatch) and streamed.reason == "backfill"
    assert isinstance(d.submit(req(now=1.0), 1.0).answer, Dispatch)  # the reserved slot
    decided = d.submit(req(now=1.0), 1.0)
    assert isinstance(decided.answer, Queued)
    assert decided.others == []


def test_backfill_never_takes_the_last_free_slot_of_an_interactive_engine():
    # The reserve is at least one slot, however small its share of the limit.
    d = make(interactive=1, batch=1, limit=1, reserve=0.25)
    assert isinstance(d.submit(req(BATCH), 0.0).answer, Dispatch)  # the batch pool's own slot
    assert isinstance(d.submit(req(BATCH), 0.0).answer, Queued)
    assert d.engine("i0").load == 0
    d = make(interactive=1, batch=1, limit=3, reserve=0.25)
    d.submit(req(BATCH), 0.0)
    d.submit(req(BATCH), 0.0)
    d.submit(req(BATCH), 0.0)
    backfilled = [d.submit(req(BATCH), 0.0).answer for _ in range(3)]
    assert [isinstance(o, Dispatch) for o in backfilled] == [True, True, False]


def test_backfill_keeps_a_reserve_and_stops_while_interactive_waits():
    d = make(interactive=1, batch=1, limit=4, reserve=0.5)
    d.submit(req(BATCH), 0.0)  # fills nothing yet: batch pool limit 4
    for _ in range(3):
        d.submit(req(BATCH), 0.0)
    backfilled = [d.submit(req(BATCH), 0.0).answer for _ in range(3)]
    assert [isinstance(o, Dispatch) for o in backfilled] == [True, True, False]


def test_a_batch_flood_cannot_starve_interactive():
    d = make(interactive=2, batch=2, limit=2, max_queue=50)
    for _ in range(200):
        d.submit(req(BATCH), 0.0)
    served = 0
    for n in range(20):
        decided = d.submit(req(now=float(n)), float(n))
        out = decided.answer
        assert all(isinstance(o, Preempted) for o in decided.others)
        if isinstance(out, Dispatch):
            served += 1
            d.finish(out, float(n) + 0.5)
    assert served == 20


def test_full_queue_sheds_the_newest_batch_for_interactive():
    # One shared pool for both classes, as in a single-pool deployment.
    settings = AdmissionSettings(enabled=True, limits=LimitSettings(initial=1), max_queue=2)
    d = Dispatcher([PoolSpec("shared", ["e0"], policy="least_loaded")], budgets={INTERACTIVE: 0.05}, admission=settings)
    d.submit(req(), 0.0)
    q1 = d.submit(req(BATCH), 0.0).answer
    q2 = d.submit(req(BATCH), 0.0).answer
    assert isinstance(q1, Queued) and isinstance(q2, Queued)
    extra_batch = d.submit(req(BATCH), 0.0).answer
    assert isinstance(extra_batch, Rejection) and extra_batch.reason == Refusal.QUEUE_FULL
    decided = d.submit(req(), 0.0)
    assert isinstance(decided.answer, Queued)
    shed = decided.others
    assert [o.request for o in shed] == [q2.request]
    assert isinstance(shed[0], Rejection) and shed[0].reason == Refusal.SHED


def test_interactive_overflows_into_a_priority_pool_that_accepts_it():
    d = make(interactive=1, batch=1, limit=1, overflow=True)
    d.submit(req(), 0.0)
    out = d.submit(req(), 0.0).answer
    assert isinstance(out, Dispatch)
    assert out.pool == "batch" and out.reason == "overflow"
    assert out.priority == 0


def test_finish_twice_gives_back_once():
    d = make(interactive=1, limit=2)
    out = d.submit(req(), 0.0).answer
    d.finish(out, 1.0)
    d.finish(out, 1.0)
    assert d.engine("i0").inflight == 0


def itl_histogram(fast: int, slow: int = 0) -> tuple[tuple[float, float], ...]:
    """An engine's cumulative ``inter_token_latency_seconds`` buckets: ``fast`` gaps of ~36 ms, ``slow`` of ~90."""
    return tuple((b, float(fast * (b >= 0.05) + slow * (b >= 0.1))) for b in (0.025, 0.05, 0.075, 0.1, math.inf))


@pytest.mark.untraced
def test_hammering_with_refused_requests_cannot_talk_the_limit_down():
    d = make(interactive=1, limit=2)
    running = [d.submit(req(), 0.0).answer for _ in range(2)]
    assert all(isinstance(o, Dispatch) for o in running)
    d.apply_scrape("i0", EngineMetrics(running=2, itl_buckets=itl_histogram(0)), 0.0)
    made = 0
    refused = 0
    changes = []
    t = 0.0
    while t < 60.0:
        t += 1.0 / 30
        for _ in range(50):  # a client resending at once whatever is refused
            out = d.submit(req(now=t), t).answer
            refused += isinstance(out, Rejection)
        for dispatch in running:
            d.observe_itl(dispatch, 0.09, t)  # the starved host relays every gap late
        made += 2
        if round(t * 30) % 60 == 0:
            d.apply_scrape("i0", EngineMetrics(running=2, itl_buckets=itl_histogram(made)), t)  # on time
        decided = d.poll(t)
        refused += sum(isinstance(o, Rejection) for o in decided)
        changes += decided.limit_changes
    assert refused > 10_000
    assert d.readings.concurrency_limits()["i0"] == 2
    assert {c.reason for c in changes} == {"relay_slow_engine_on_time"}


def test_a_limit_shrunk_by_an_overload_is_back_at_the_probe_level_after_idling():
    d = make(interactive=1, limit=2)
    d.apply_scrape("i0", EngineMetrics(itl_buckets=itl_histogram(0)), 0.0)
    running = [d.submit(req(), 0.0).answer for _ in range(2)]
    made = slow = 0
    changes = []
    t = 0.0
    while d.readings.concurrency_limits()["i0"] == 2 and t < 30.0:
        t += 1.0 / 30
        for dispatch in running:
            d.observe_itl(dispatch, 0.09, t)  # the engine itself is over budget at two
        slow += 2
        if round(t * 30) % 60 == 0:
            d.apply_scrape("i0", EngineMetrics(running=2, itl_buckets=itl_histogram(made, slow)), t)
        changes += d.poll(t).limit_changes
    assert d.readings.concurrency_limits()["i0"] == 1
    for dispatch in running:
        d.finish(dispatch, t)
    while t < 120.0:  # then nobody comes for a while
        t += 0.5
        changes += d.poll(t).limit_changes
    assert d.readings.concurrency_limits()["i0"] == 2
    assert [c.reason for c in changes][-1] == "recovering"


def two_model_pool(limit: float = 1.0) -> Dispatcher:
    """One pool of two engines, each serving its own model, one slot each."""
    settings = AdmissionSettings(enabled=True, limits=LimitSettings(initial=limit, unbudgeted=limit))
    d = Dispatcher([PoolSpec("batch", ["x0", "y0"], policy="least_loaded")], budgets={BATCH: None}, admission=settings)
    x, y = d.pools["batch"].engines
    x.models, y.models = frozenset({"mx"}), frozenset({"my"})
    return d


def for_model(model: str, now: float = 0.0) -> RouteRequest:
    return RouteRequest(f"r{next(counter)}", BATCH, model, now, prompt_tokens=100, budget=Budget())


def test_a_queued_request_that_cannot_start_does_not_hold_back_one_that_can():
    """Head-of-line blocking: in a pool serving two models, a request for the idle engine's model
    waited for a slot of the other model (2.55 s in a hostile test of the server)."""
    d = two_model_pool()
    running = d.submit(for_model("mx"), 0.0).answer
    assert isinstance(running, Dispatch) and running.engine.id == "x0"
    blocked = d.submit(for_model("mx"), 0.0).answer
    assert isinstance(blocked, Queued)
    other = d.submit(for_model("my"), 0.0).answer
    assert isinstance(other, Dispatch) and other.engine.id == "y0", "it starts at once, not behind the mx request"
    d.finish(other, 1.0)
    behind = d.submit(for_model("my"), 1.0).answer
    assert isinstance(behind, Dispatch)
    again = d.submit(for_model("my"), 1.0).answer
    assert isinstance(again, Queued)
    started = [x for x in d.finish(behind, 2.0) if isinstance(x, Dispatch)]
    assert [x.request.id for x in started] == [again.request.id], "the drain passes over the mx request"
    started = [x for x in d.finish(running, 3.0) if isinstance(x, Dispatch)]
    assert [x.request.id for x in started] == [blocked.request.id], "and it starts, in its turn, once it can"


def test_a_drain_tries_a_bounded_number_of_entries_that_cannot_start():
    from priority_gateway.core.dispatcher import MAX_PASSED_OVER

    d = two_model_pool()
    d.submit(for_model("mx"), 0.0)
    for n in range(3 * MAX_PASSED_OVER):
        tenant_req = for_model("mx")
        tenant_req.tenant = f"t{n}"  # each one's own line in the fair queue
        assert isinstance(d.submit(tenant_req, 0.0).answer, Queued)
    tried = []
    place = d._place

    def counting(req, pool, now, exclude=()):
        tried.append(req.id)
        return place(req, pool, now, exclude)

    d._place = counting  # type: ignore[method-assign]
    d.poll(1.0)
    assert 0 < len(tried) <= MAX_PASSED_OVER


def test_a_request_with_a_ttft_budget_starts_where_the_queued_prefill_lets_its_first_token_come_in_time():
    d = make(interactive=2, limit=8.0)
    pool = d.pools["interactive"]
    for _ in range(40):  # first tokens that came 0.1 s + 0.1 ms per prefill token ahead of them
        for tokens in (100, 2000):
            pool.ttft_model.observe(tokens, 0.1 + tokens / 10_000)
    busy, idle = pool.engines
    busy.pending_prefill = 4000  # 0.5 s of prefill queued there: a first token at ~0.6 s
    out = d.submit(req(), 0.0).answer
    assert isinstance(out, Dispatch) and out.engine is idle
    idle.pending_prefill += 4000
    late = d.submit(req(), 0.0).answer
    assert isinstance(late, Queued | Rejection), "neither engine would give it its first token within 500 ms"


def test_a_first_token_teaches_the_pace_by_the_prefill_that_was_ahead_of_it():
    d = make(interactive=1, limit=8.0)
    first = d.submit(req(), 0.0).answer
    second = d.submit(req(), 0.0).answer
    assert isinstance(first, Dispatch) and isinstance(second, Dispatch)
    assert (first.backlog, second.backlog) == (100, 200), "its own prompt, and the first one's ahead of it"


def test_a_pool_sharing_the_devices_learns_its_limits_from_the_other_pools_gaps():
    settings = AdmissionSettings(enabled=True, limits=LimitSettings(initial=2.0, unbudgeted=8.0, cooldown_s=0.0))
    pools = [
        PoolSpec("interactive", ["i0"], policy="least_loaded", backfill=False),
        PoolSpec("batch", ["b0"], policy="least_loaded", shares_hardware_with="interactive"),
    ]
    d = Dispatcher(pools, budgets={INTERACTIVE: 0.05, BATCH: None}, admission=settings)
    assert d.limits["b0"].budget_s == 0.05, "the interactive pool's budget, not none"
    assert d.limits["b0"].limit == 8.0, "from its unbudgeted limit, not the interactive probe level"
    batch = [d.submit(req(BATCH), 0.0).answer for _ in range(8)]
    assert all(isinstance(b, Dispatch) and b.engine.id == "b0" for b in batch)
    interactive = d.submit(req(), 0.0).answer
    assert isinstance(interactive, Dispatch)
    now = 0.0
    for _ in range(400):  # the batch steps stall the interactive decoding: every gap 80 ms
        now += 0.08
        d.observe_itl(interactive, 0.08, now)
    d.poll(now)
    assert d.limits["b0"].limit < 8.0 and d.limits["b0"].reason == "itl_over_budget"
    assert isinstance(d.submit(req(BATCH), now).answer, Queued), "the batch pool is throttled"
