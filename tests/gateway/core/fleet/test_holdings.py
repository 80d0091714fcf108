"""Holdings of an engine's slots: the same on every replica from the channel's one order, never more
than the slots together, and granted on to whoever waits."""

from __future__ import annotations

from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from priority_gateway.core.classes import INTERACTIVE, Budget
from priority_gateway.core.dispatcher import AdmissionSettings, Dispatch, Dispatcher, PoolSpec, Queued
from priority_gateway.core.fleet.holdings import Holdings, claims
from priority_gateway.core.fleet.table import FleetTable
from priority_gateway.core.fleet.wire import EngineReport, Report
from priority_gateway.core.limiter import Evidence, LimitSettings
from priority_gateway.core.request import RouteRequest
from tests.support.examples import examples
from tests.support.fleet import Channel, inflight, settings

E = "e0"
A, B, C = b"a" * 16, b"b" * 16, b"c" * 16


def fixed(_engine: str) -> float:
    return 4.0


class Book:
    """One replica's table and holdings (its own id ``own``), fed batches by hand."""

    def __init__(self, own: bytes = b"z" * 16) -> None:
        self.table = FleetTable(own)
        self.holdings = Holdings(self.table)

    def tell(self, publisher: bytes, engines: dict[str, EngineReport], full: bool = False) -> None:
        row, _ = self.table.heard(publisher, 0, 0.0)
        named = set(engines) | (set(row.held) if full else set())
        self.table.apply(publisher, Report([], engines, {}, full))
        self.holdings.apply(publisher, named, fixed)

    def held(self, publisher: bytes) -> int:
        return self.table.rows[publisher].held.get(E, 0)


def test_claims_are_granted_in_the_order_they_come_and_releases_free_at_once():
    h = Book()
    h.tell(A, {E: EngineReport(claim=3)})
    h.tell(B, {E: EngineReport(claim=3)})
    assert (h.held(A), h.held(B)) == (3, 1)  # b waits for two more
    assert h.holdings.waiters(E) == (1,)
    h.tell(A, {E: EngineReport(inflight=2, claim=2)})
    assert (h.held(A), h.held(B)) == (2, 2)  # a's release went to b at once
    h.tell(A, {E: EngineReport(inflight=1, claim=1)})
    assert h.held(B) == 3 and h.holdings.waiters(E) == ()


def test_what_a_holder_runs_stays_taken_even_beyond_its_holding():
    h = Book()
    h.tell(A, {E: EngineReport(inflight=3)})  # a runs 3 holding nothing (its safe share)
    h.tell(B, {E: EngineReport(claim=4)})
    assert h.held(B) == 1


def test_a_stated_holding_catches_up_but_never_lowers_one():
    late = Book()  # joined after a's claim was granted: a says what it holds
    late.tell(A, {E: EngineReport(claim=3, held=3)})
    late.tell(B, {E: EngineReport(claim=4)})
    assert late.held(B) == 1
    late.tell(A, {E: EngineReport(claim=3, held=0)})  # stale: changes nothing
    assert late.held(A) == 3


def test_slots_are_the_leaders_limit_and_a_full_batch_releases_what_it_leaves_out():
    h = Book()
    h.tell(A, {E: EngineReport(limit=3.0, claim=2, evidence=Evidence())}, full=True)
    h.tell(B, {E: EngineReport(limit=5.0, claim=2, evidence=Evidence())}, full=True)
    assert h.holdings.slots(E, 9.0) == 3  # a has the lowest id of those that learn the limit
    h.tell(A, {}, full=True)
    assert h.held(A) == 0 and h.holdings.slots(E, 9.0) == 5  # b leads now
    h.tell(B, {E: EngineReport(claim=2)}, full=True)  # nobody learns it: the replica's own limit
    assert h.holdings.slots(E, 9.0) == 9


def test_silent_replicas_leave_their_slots_to_the_next_batch():
    h = Book()
    h.tell(A, {E: EngineReport(claim=4)})
    h.tell(B, {E: EngineReport(claim=2)})
    assert h.held(B) == 0
    h.table.rows[A].heard_at = -10.0
    changed = h.table.silence(0.0, silent_s=3.0, window_s=30.0)
    h.holdings.released(changed)
    assert changed == {E}
    h.tell(C, {})
    assert h.held(B) == 2


def test_spare_slots_are_kept_only_from_free_ones_and_never_waited_for():
    h = Book()
    h.tell(A, {E: EngineReport(claim=3)})
    h.tell(B, {E: EngineReport(spare=2)})
    assert h.held(B) == 1 and h.holdings.waiters(E) == ()  # the one free slot; b waits for nothing
    h.tell(A, {E: EngineReport(claim=4)})
    assert h.held(A) == 3  # a waits for b's spare slot ...
    h.tell(B, {E: EngineReport()})  # ... which b gives up once it sees a wait
    assert h.held(A) == 4


def test_a_replica_claims_what_it_runs_and_waits_for_keeps_it_while_nobody_waits_and_yields_to_who_has_less():
    def wants(inflight: int, demand: int, held: int = 0, waiters: tuple[int, ...] = (), over: bool = False) -> tuple:
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


def replica(i: int, limit: float = LIMIT, engines: tuple[str, ...] = (E,)) -> Dispatcher:
    return Dispatcher(
        [PoolSpec("interactive", list(engines), policy="least_loaded")],
        budgets={INTERACTIVE: 0.05},
        admission=AdmissionSettings(
            enabled=True, limits=LimitSettings(initial=limit, minimum=limit, maximum=limit), backfill_reserve=0.0
        ),
        fleet=settings(i),
    )


def fleet(n: int, limit: float = LIMIT, engines: tuple[str, ...] = (E,)) -> Channel:
    channel = Channel([replica(i, limit, engines) for i in range(n)])
    channel.warm()
    return channel


ids = iter(range(10**9))


def request() -> RouteRequest:
    return RouteRequest(f"r{next(ids)}", INTERACTIVE, "m", 0.0, 100, budget=Budget())


def submit(d: Dispatcher, n: int) -> list[Dispatch]:
    out = []
    for _ in range(n):
        decided = d.submit(request(), 0.0)
        assert isinstance(decided.answer, Dispatch | Queued)
        out += [x for x in decided if isinstance(x, Dispatch)]
    return out


def running(channel: Channel, engine: str = E) -> int:
    return sum(inflight(d, engine) for d in channel.replicas)


def test_replicas_that_start_requests_at_once_never_fill_more_than_the_limit():
    channel = fleet(2)
    assert [len(submit(d, 6)) for d in channel.replicas] == [2, 2]  # without holdings: 4 each
    for _ in range(4):
        channel.round()
        assert running(channel) == LIMIT


def test_a_replica_alone_fills_the_whole_limit_at_once():
    channel = fleet(1)
    assert len(submit(channel.replicas[0], 6)) == LIMIT


def test_an_idle_replica_gives_a_busy_one_its_slots_within_two_rounds():
    channel = fleet(3)
    busy = channel.replicas[0]
    assert len(submit(busy, 4)) == 1  # its even share: floor(4 / 3)
    started = sum(len(s) for s in channel.round())  # its claim waits; the others see it
    started += sum(len(s) for s in channel.round())  # they release what they do not use: granted
    assert started == 3 and inflight(busy, E) == LIMIT


def busy_a_and_waiting_b() -> tuple[Channel, list[Dispatch], list[RouteRequest]]:
    """a runs the whole limit with 2 more queued; b's 2 wait for slots."""
    channel = fleet(2)
    a, b = channel.replicas
    runs = submit(a, 6)
    for _ in range(3):
        runs += [d for started in channel.round() for d in started]
    assert len(runs) == LIMIT and inflight(b, E) == 0
    waiting = [request(), request()]
    assert all(isinstance(b.submit(r, 0.0).answer, Queued) for r in waiting)
    channel.round()  # a sees b waiting
    return channel, runs, waiting


def test_a_replica_over_its_fair_share_passes_what_it_frees_to_one_that_waits():
    channel, runs, _ = busy_a_and_waiting_b()
    a, b = channel.replicas
    for d in runs[:2]:
        assert not [x for x in a.finish(d, 0.0) if isinstance(x, Dispatch)]  # its own queue does not refill them
    channel.round()
    assert (inflight(a, E), inflight(b, E)) == (2, 2)


def test_a_release_is_not_filled_again_before_it_is_heard():
    channel = fleet(3, limit=3.0)  # each holds 1
    a, _, c = channel.replicas
    assert len(submit(c, 3)) == 1
    channel.publish(2)  # c claims 3
    channel.deliver(0)
    channel.publish(0)  # a, idle, sees c wait and releases its slot ...
    assert isinstance(a.submit(request(), 0.0).answer, Queued)  # ... and does not fill it before that is heard
    channel.deliver(0)  # its release heard: c was granted it
    for i in (1, 2):
        while channel.behind(i):
            channel.deliver(i)
    assert running(channel) == 2 and inflight(c, E) == 2


class Replicas(RuleBasedStateMachine):
    """Three replicas, two engines of 3 slots, requests that wait as long as it takes; any order of
    submissions, finishes, batches sent and batches read, each replica reading at its own pace."""

    def __init__(self) -> None:
        super().__init__()
        self.channel = fleet(3, 3.0, ("e0", "e1"))
        self.runs: list[list[Dispatch]] = [[], [], []]

    @rule(i=st.integers(0, 2), n=st.integers(1, 4))
    def submit(self, i: int, n: int) -> None:
        self.runs[i] += submit(self.channel.replicas[i], n)

    @rule(i=st.integers(0, 2), k=st.integers(0, 20))
    def finish(self, i: int, k: int) -> None:
        if self.runs[i]:
            done = self.runs[i].pop(k % len(self.runs[i]))
            self.runs[i] += [x for x in self.channel.replicas[i].finish(done, 0.0) if isinstance(x, Dispatch)]

    @rule(i=st.integers(0, 2), full=st.booleans())
    def publish(self, i: int, full: bool) -> None:
        self.channel.publish(i, full)

    @rule(i=st.integers(0, 2), n=st.integers(1, 5))
    def read(self, i: int, n: int) -> None:
        for _ in range(min(n, self.channel.behind(i))):
            self.runs[i] += self.channel.deliver(i)

    @invariant()
    def never_over_the_slots(self) -> None:
        for engine in ("e0", "e1"):
            assert running(self.channel, engine) <= 3

    def teardown(self) -> None:
        # Quiet now: a few rounds grant every slot someone waits for.
        for _ in range(4):
            for i, started in enumerate(self.channel.round()):
                self.runs[i] += started
        waiting = sum(len(d.pools["interactive"].queue) for d in self.channel.replicas)
        busy = sum(running(self.channel, e) for e in ("e0", "e1"))
        assert busy == 6 or waiting == 0, (busy, waiting)


TestReplicas = Replicas.TestCase
TestReplicas.settings = hypothesis_settings(
    max_examples=examples(300), stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
