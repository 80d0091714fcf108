"""Holdings of an engine's slots: the same on every replica from the channel's one order, never more
than the slots together, and granted on to whoever waits."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from priority_gateway.core.classes import INTERACTIVE, Budget
from priority_gateway.core.dispatcher import AdmissionSettings, Dispatch, Dispatcher, PoolSpec, Queued
from priority_gateway.core.holdings import Holdings, claims
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.sharing import EngineLoad
from tests.gateway.core.fleet import Fleet, inflight

E = "e0"
A, B, C = b"a" * 16, b"b" * 16, b"c" * 16


def fixed(engine: str) -> float:
    return 4.0


def test_claims_are_granted_in_the_order_they_come_and_releases_free_at_once():
    h = Holdings()
    h.apply(A, {E: EngineLoad(limit=4.0, claim=3)}, False, fixed)
    h.apply(B, {E: EngineLoad(limit=4.0, claim=3)}, False, fixed)
    assert (h.held(E, A), h.held(E, B)) == (3, 1)  # b waits for two more
    assert h.waiters(E) == (1,)
    h.apply(A, {E: EngineLoad(inflight=2, limit=4.0, claim=2)}, False, fixed)
    assert (h.held(E, A), h.held(E, B)) == (2, 2)  # a's release went to b at once
    h.apply(A, {E: EngineLoad(inflight=1, limit=4.0, claim=1)}, False, fixed)
    assert h.held(E, B) == 3 and h.waiters(E) == ()


def test_what_a_holder_runs_stays_taken_even_beyond_its_holding():
    h = Holdings()
    h.apply(A, {E: EngineLoad(inflight=3, limit=4.0)}, False, fixed)  # a runs 3 holding nothing (its safe share)
    h.apply(B, {E: EngineLoad(limit=4.0, claim=4)}, False, fixed)
    assert h.held(E, B) == 1


def test_a_stated_holding_catches_up_but_never_lowers_one():
    late = Holdings()  # joined after a's claim was granted: a says what it holds
    late.apply(A, {E: EngineLoad(limit=4.0, claim=3, held=3)}, False, fixed)
    late.apply(B, {E: EngineLoad(limit=4.0, claim=4)}, False, fixed)
    assert late.held(E, B) == 1
    late.apply(A, {E: EngineLoad(limit=4.0, claim=3, held=0)}, False, fixed)  # stale: changes nothing
    assert late.held(E, A) == 3


def test_slots_are_the_mean_limit_rounded_to_the_nearest_and_a_full_batch_releases_what_it_leaves_out():
    h = Holdings()
    h.apply(A, {E: EngineLoad(limit=3.0, claim=2)}, False, fixed)
    h.apply(B, {E: EngineLoad(limit=4.0, claim=2)}, False, fixed)
    assert h.slots(E, 9.0) == 3  # 3.5: a tie goes down (``fleet_limit``)
    h.apply(A, {}, True, fixed)
    assert h.held(E, A) == 0 and h.slots(E, 9.0) == 4


def test_forgotten_replicas_leave_their_slots_to_the_next_batch():
    h = Holdings()
    h.apply(A, {E: EngineLoad(limit=4.0, claim=4)}, False, fixed)
    h.apply(B, {E: EngineLoad(limit=4.0, claim=2)}, False, fixed)
    assert h.held(E, B) == 0
    assert h.keep(lambda p: p == B) == {E}
    h.apply(C, {}, False, fixed)
    assert h.held(E, B) == 2


def test_spare_slots_are_kept_only_from_free_ones_and_never_waited_for():
    h = Holdings()
    h.apply(A, {E: EngineLoad(limit=4.0, claim=3)}, False, fixed)
    h.apply(B, {E: EngineLoad(limit=4.0, spare=2)}, False, fixed)
    assert h.held(E, B) == 1 and h.waiters(E) == ()  # the one free slot; b waits for nothing
    h.apply(A, {E: EngineLoad(limit=4.0, claim=4)}, False, fixed)
    assert h.held(E, A) == 3  # a waits for b's spare slot ...
    h.apply(B, {E: EngineLoad(limit=4.0)}, False, fixed)  # ... which b gives up once it sees a wait
    assert h.held(E, A) == 4


def test_a_replica_claims_what_it_runs_and_waits_for_keeps_it_while_nobody_waits_and_yields_to_who_has_less():
    def wants(inflight: int, demand: int, held: int = 0, waiters: tuple = (), over: bool = False) -> tuple:
        return claims(inflight, demand, held, slots=6, replicas=3, waiters=waiters, over=over)

    assert wants(0, 0) == (0, 2)  # an even share spare
    assert wants(1, 9) == (6, 2)
    assert wants(1, 0, held=4) == (4, 2)  # its queue ran dry for a moment: it keeps what it held
    assert wants(1, 0, held=4, over=True) == (1, 2)  # unless the limit fell below what is held
    assert wants(1, 1, held=4, waiters=(3,)) == (2, 0)  # another waits: what it does not use goes
    assert wants(3, 9, held=3, waiters=(3,)) == (6, 0)  # both at their share of 3: both wait, nobody yields
    assert wants(1, 9, held=4, waiters=(1,)) == (3, 0)  # the other holds less than its share: at most 3
    assert wants(4, 9, held=4, waiters=(1,)) == (4, 0)  # never below what it runs


# -- replicas on one channel ---------------------------------------------------------------------

LIMIT = 4


def replica(limit: float = LIMIT, engines: tuple[str, ...] = (E,)) -> Dispatcher:
    d = Dispatcher(
        [PoolSpec("interactive", list(engines), policy="least_loaded")],
        budgets={INTERACTIVE: 0.05},
        admission=AdmissionSettings(
            enabled=True, limits=LimitSettings(initial=limit, minimum=limit, maximum=limit), backfill_reserve=0.0
        ),
    )
    d.share_learning()
    return d


ids = iter(range(10**9))


def submit(d: Dispatcher, n: int) -> list[Dispatch]:
    out = []
    for _ in range(n):
        decided = d.submit(RouteRequest(f"r{next(ids)}", INTERACTIVE, "m", 0.0, 100, budget=Budget()), 0.0)
        assert isinstance(decided.answer, Dispatch | Queued)
        out += [x for x in decided if isinstance(x, Dispatch)]
    return out


def warm(fleet: Fleet) -> None:
    """Replicas that knew of each other before they claimed slots: each holds its even share (one
    that heard nobody holds the whole limit, and keeps it until another waits for slots)."""
    fleet.introduce()
    for _ in range(3):
        fleet.round()
    assert all(not d.holdings.waiters(e) for d in fleet.replicas for e in d.limits)


def running(fleet: Fleet, engine: str = E) -> int:
    return sum(inflight(d, engine) for d in fleet.replicas)


def test_replicas_that_start_requests_at_once_never_fill_more_than_the_limit():
    fleet = Fleet([replica(), replica()])
    warm(fleet)
    assert [len(submit(d, 6)) for d in fleet.replicas] == [2, 2]  # without holdings: 4 each
    for _ in range(4):
        fleet.round()
        assert running(fleet) == LIMIT


def test_a_replica_alone_fills_the_whole_limit_at_once():
    fleet = Fleet([replica()])
    fleet.round()
    assert len(submit(fleet.replicas[0], 6)) == LIMIT


def test_an_idle_replica_gives_a_busy_one_its_slots_within_two_rounds():
    fleet = Fleet([replica(), replica(), replica()])
    warm(fleet)
    busy = fleet.replicas[0]
    assert len(submit(busy, 4)) == 1  # its even share: floor(4 / 3)
    started = sum(len(s) for s in fleet.round())  # its claim waits; the others see it
    started += sum(len(s) for s in fleet.round())  # they release what they do not use: granted
    assert started == 3 and inflight(busy, E) == LIMIT


def request() -> RouteRequest:
    return RouteRequest(f"r{next(ids)}", INTERACTIVE, "m", 0.0, 100, budget=Budget())


def busy_a_and_waiting_b() -> tuple[Fleet, list[Dispatch], list[RouteRequest]]:
    """a runs the whole limit with 2 more queued; b's 2 wait for slots."""
    fleet = Fleet([replica(), replica()])
    warm(fleet)
    a, b = fleet.replicas
    runs = submit(a, 6)
    for _ in range(3):
        runs += [d for started in fleet.round() for d in started]
    assert len(runs) == LIMIT and inflight(b, E) == 0
    waiting = [request(), request()]
    assert all(isinstance(b.submit(r, 0.0).answer, Queued) for r in waiting)
    fleet.round()  # a sees b waiting
    return fleet, runs, waiting


def test_a_replica_over_its_fair_share_passes_what_it_frees_to_one_that_waits():
    fleet, runs, _ = busy_a_and_waiting_b()
    a, b = fleet.replicas
    for d in runs[:2]:
        assert not [x for x in a.finish(d, 0.0) if isinstance(x, Dispatch)]  # its own queue does not refill them
    fleet.round()
    assert (inflight(a, E), inflight(b, E)) == (2, 2)


def test_a_release_is_not_filled_again_before_it_is_heard():
    fleet = Fleet([replica(3.0), replica(3.0), replica(3.0)])
    warm(fleet)  # each holds 1
    a, _, c = fleet.replicas
    assert len(submit(c, 3)) == 1
    fleet.publish(2)  # c claims 3
    fleet.deliver(0)
    fleet.publish(0)  # a, idle, sees c wait and releases its slot ...
    assert isinstance(a.submit(request(), 0.0).answer, Queued)  # ... and does not fill it before that is heard
    fleet.deliver(0)  # its release heard: c was granted it
    for i in (1, 2):
        while fleet.behind(i):
            fleet.deliver(i)
    assert running(fleet) == 2 and inflight(c, E) == 2


class Replicas(RuleBasedStateMachine):
    """Three replicas, two engines of 3 slots, requests that wait as long as it takes; any order of
    submissions, finishes, batches sent and batches read, each replica reading at its own pace."""

    def __init__(self) -> None:
        super().__init__()
        self.fleet = Fleet([replica(3.0, ("e0", "e1")) for _ in range(3)])
        warm(self.fleet)
        self.runs: list[list[Dispatch]] = [[], [], []]

    def _started(self, i: int, started: list[Dispatch]) -> None:
        self.runs[i] += started

    @rule(i=st.integers(0, 2), n=st.integers(1, 4))
    def submit(self, i: int, n: int) -> None:
        self._started(i, submit(self.fleet.replicas[i], n))

    @rule(i=st.integers(0, 2), k=st.integers(0, 20))
    def finish(self, i: int, k: int) -> None:
        if self.runs[i]:
            done = self.runs[i].pop(k % len(self.runs[i]))
            self._started(i, [x for x in self.fleet.replicas[i].finish(done, 0.0) if isinstance(x, Dispatch)])

    @rule(i=st.integers(0, 2), full=st.booleans())
    def publish(self, i: int, full: bool) -> None:
        self.fleet.publish(i, full)

    @rule(i=st.integers(0, 2), n=st.integers(1, 5))
    def read(self, i: int, n: int) -> None:
        for _ in range(min(n, self.fleet.behind(i))):
            self._started(i, self.fleet.deliver(i))

    @invariant()
    def never_over_the_slots(self) -> None:
        for engine in ("e0", "e1"):
            assert running(self.fleet, engine) <= 3

    def teardown(self) -> None:
        # Quiet now: a few rounds grant every slot someone waits for.
        for _ in range(4):
            for i, started in enumerate(self.fleet.round()):
                self._started(i, started)
        waiting = sum(len(d.pools["interactive"].queue) for d in self.fleet.replicas)
        busy = sum(running(self.fleet, e) for e in ("e0", "e1"))
        assert busy == 6 or waiting == 0, (busy, waiting)


TestReplicas = Replicas.TestCase
TestReplicas.settings = settings(
    max_examples=300, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
