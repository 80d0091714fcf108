"""The dispatcher under any sequence of calls (hypothesis, stateful): every decision it returns is
one a caller can carry out, and its books (engines' in-flight counts, queues) match the caller's.

The caller here is a model of the scheduler: it applies each ``Decisions`` whole, answer first, and
knows each request as queued, running or closed. Whatever the order of submissions, finishes,
failed connections, cancellations, health changes, discovery and polls:
- a request is dispatched only while queued (or as the answer to its own submission), refused only
  once and never while running, preempted only while running; nothing decided is lost;
- every engine's in-flight count is the number of dispatches running on it, per class too;
- the queues hold exactly the requests the caller was told are queued.
Requests may be turns of two agent sessions, so continuing turns queue first and wait for their
sessions' engines while engines come, go and fail.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from priority_gateway.core.classes import BATCH, INTERACTIVE, Budget
from priority_gateway.core.dispatcher import (
    AdmissionSettings,
    Decisions,
    Dispatch,
    Dispatcher,
    Outcome,
    PoolSpec,
    Preempted,
    Queued,
    Rejection,
)
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.core.request import RouteRequest
from tests.support.examples import examples

ENGINES = ("i0", "i1", "b0")


def dispatcher(overflow: bool, max_queue: int) -> Dispatcher:
    admission = AdmissionSettings(
        enabled=True, limits=LimitSettings(initial=2.0, unbudgeted=2.0), max_queue=max_queue, backfill_reserve=0.0
    )
    pools = [
        PoolSpec("interactive", ["i0", "i1"], policy="least_loaded"),
        PoolSpec("batch", ["b0"], policy="least_loaded", takes_priority=True, accept_overflow=overflow),
    ]
    return Dispatcher(pools, budgets={INTERACTIVE: 0.05, BATCH: None}, admission=admission)


class Caller(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dispatcher: Dispatcher | None = None
        self.now = 0.0
        self.count = 0
        self.running: dict[str, Dispatch] = {}
        self.queued: dict[str, RouteRequest] = {}
        self.closed: set[str] = set()

    @property
    def core(self) -> Dispatcher:
        assert self.dispatcher is not None
        return self.dispatcher

    @precondition(lambda self: self.dispatcher is None)
    @rule(overflow=st.booleans(), max_queue=st.integers(1, 4))
    def start(self, overflow: bool, max_queue: int) -> None:
        self.dispatcher = dispatcher(overflow, max_queue)

    # -- carrying decisions out, as the scheduler does ----------------------------------

    def apply(self, decided: Decisions, subject: RouteRequest | None) -> None:
        if subject is None:
            assert decided.answer is None
        else:
            assert decided.answer is not None and decided.answer.request is subject
            self.answered(decided.answer)
        for notice in decided.others:
            self.noticed(notice)

    def answered(self, outcome: Outcome) -> None:
        rid = outcome.request.id
        assert rid not in self.running and rid not in self.queued and rid not in self.closed
        if isinstance(outcome, Dispatch):
            self.running[rid] = outcome
        elif isinstance(outcome, Queued):
            self.queued[rid] = outcome.request
        else:
            assert isinstance(outcome, Rejection)
            self.closed.add(rid)

    def noticed(self, outcome: Outcome) -> None:
        rid = outcome.request.id
        if isinstance(outcome, Preempted):
            assert self.running.get(rid) is outcome.dispatch, "preempted what was not running"
            assert outcome.dispatch.done
            del self.running[rid]
            self.queued[rid] = outcome.request
            return
        assert rid in self.queued, f"a decision for {rid}, which was not waiting for one"
        del self.queued[rid]
        if isinstance(outcome, Dispatch):
            self.running[rid] = outcome
        else:
            assert isinstance(outcome, Rejection)
            self.closed.add(rid)

    # -- what callers do ---------------------------------------------------------------

    @precondition(lambda self: self.dispatcher is not None)
    @rule(
        cls=st.sampled_from([INTERACTIVE, BATCH]),
        restartable=st.booleans(),
        prompt=st.integers(1, 4000),
        ttft_ms=st.one_of(st.none(), st.integers(50, 3000)),
        session=st.sampled_from([None, "s1", "s2"]),
    )
    def submit(self, cls: str, restartable: bool, prompt: int, ttft_ms: int | None, session: str | None) -> None:
        self.count += 1
        budget = Budget(ttft_s=ttft_ms / 1000, itl_s=0.05) if cls == INTERACTIVE and ttft_ms else Budget()
        req = RouteRequest(
            f"r{self.count}", cls, "m", self.now, prompt, budget=budget, restartable=restartable, session=session
        )
        self.apply(self.core.submit(req, self.now), req)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), seconds=st.floats(0.01, 2.0))
    def first_token(self, data: st.DataObject, seconds: float) -> None:
        # What the pool's first tokens teach it: how long a turn would take elsewhere (a session's turn
        # waits for its own engine against that).
        self.core.observe_ttft(self.running[data.draw(st.sampled_from(sorted(self.running)))], seconds)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), ok=st.booleans())
    def finish(self, data: st.DataObject, ok: bool) -> None:
        rid = data.draw(st.sampled_from(sorted(self.running)))
        dispatch = self.running.pop(rid)
        self.closed.add(rid)
        self.apply(self.core.finish(dispatch, self.now, ok), None)
        # Finishing again gives nothing back twice.
        self.apply(self.core.finish(dispatch, self.now, ok), None)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def connection_refused(self, data: st.DataObject) -> None:
        dispatch = self.running.pop(data.draw(st.sampled_from(sorted(self.running))))
        self.apply(self.core.retry(dispatch, self.now), dispatch.request)

    @precondition(lambda self: self.queued)
    @rule(data=st.data())
    def client_left(self, data: st.DataObject) -> None:
        req = self.queued.pop(data.draw(st.sampled_from(sorted(self.queued))))
        self.closed.add(req.id)
        self.apply(self.core.cancel(req, self.now), None)

    @precondition(lambda self: self.dispatcher is not None)
    @rule(engine=st.sampled_from(ENGINES), healthy=st.booleans())
    def health(self, engine: str, healthy: bool) -> None:
        self.core.set_health(engine, healthy)

    @precondition(lambda self: self.dispatcher is not None)
    @rule(engines=st.lists(st.sampled_from(["i0", "i1", "i2"]), min_size=1, max_size=3, unique=True))
    def discovery(self, engines: list[str]) -> None:
        # DNS discovery changes the interactive pool; requests running on a removed engine finish there.
        self.core.set_pool_engines("interactive", engines, self.now)
        self.apply(self.core.poll(self.now), None)

    @precondition(lambda self: self.dispatcher is not None)
    @rule(seconds=st.floats(0.0, 3.0))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self.apply(self.core.poll(self.now), None)

    # -- the books -----------------------------------------------------------------------

    @invariant()
    def engines_count_what_runs_on_them(self) -> None:
        if self.dispatcher is None:
            return
        engines = {d.engine.id: d.engine for d in self.running.values()}
        engines.update((e.id, e) for e in self.core.engines())
        for engine in engines.values():
            mine = [d for d in self.running.values() if d.engine is engine]
            assert engine.inflight == len(mine), engine.id
            for cls in (INTERACTIVE, BATCH):
                assert engine.inflight_by_class.get(cls, 0) == sum(d.request.cls == cls for d in mine)
            assert engine.pending_prefill >= 0

    @invariant()
    def the_queues_hold_what_the_caller_was_told(self) -> None:
        if self.dispatcher is None:
            return
        assert sum(len(pool.queue) for pool in self.core.pools.values()) == len(self.queued)
        assert not (set(self.running) & set(self.queued))


Caller.TestCase.settings = settings(
    max_examples=examples(60), stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_dispatcher_under_any_sequence_of_calls = Caller.TestCase
