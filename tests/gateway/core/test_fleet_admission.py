"""Admission across replicas: everyone's in-flight against the mean of the limits the replicas learned, within the
slots each holds (``test_holdings.py``), and the safe share of it while the channel is down or a replica joins."""

import math

import pytest

from priority_gateway.core.classes import INTERACTIVE, Budget
from priority_gateway.core.dispatcher import AdmissionSettings, Dispatch, Dispatcher, PoolSpec, Queued
from priority_gateway.core.engines import EngineMetrics
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.sharing import Batch, EngineLoad, Learned, decode, encode, fleet_limit
from tests.gateway.core.fleet import Fleet, engine_of, inflight
from tests.gateway.core.test_holdings import warm
from tests.gateway.core.test_sharing import Channel

ENGINE = "http://e0:8000"


def replica(initial: float = 4.0) -> Dispatcher:
    d = Dispatcher(
        [PoolSpec("interactive", [ENGINE], policy="least_loaded")],
        budgets={INTERACTIVE: 0.05},
        admission=AdmissionSettings(enabled=True, limits=LimitSettings(initial=initial)),
    )
    d.share_learning()
    return d


counter = iter(range(10**6))


def start(d: Dispatcher, n: int, now: float = 0.0) -> list[Dispatch | Queued]:
    out = []
    for _ in range(n):
        answer = d.submit(RouteRequest(f"r{next(counter)}", INTERACTIVE, "m", now, 100, budget=Budget()), now).answer
        assert isinstance(answer, Dispatch | Queued)
        out.append(answer)
    return out


def started(answers: list[Dispatch | Queued]) -> int:
    return sum(isinstance(a, Dispatch) for a in answers)


def learned(d: Dispatcher, limit: float, reason: str = "itl_over_budget") -> None:
    d.limits[ENGINE].limit = limit
    d.limits[ENGINE].reason = reason


def rounds(fleet: Fleet, n: int = 3) -> int:
    """Batches back and forth; the requests they started."""
    return sum(len(s) for _ in range(n) for s in fleet.round())


def test_the_others_in_flight_count_against_the_limit():
    fleet = Fleet([replica(), replica()])
    warm(fleet)
    a, b = fleet.replicas
    assert started(start(a, 3)) + rounds(fleet) == 3
    assert started(start(b, 3)) + rounds(fleet) == 1  # a's 3 and b's 1 fill the engine's 4


def test_every_replica_admits_against_the_mean_of_the_limits_learned():
    a, b, c = replica(), replica(), replica()
    learned(a, 2.0)
    learned(b, 6.0, "itl_within_budget")
    learned(c, 3.0)
    fleet = Fleet([a, b, c])
    warm(fleet)
    assert b.concurrency_limits() == {ENGINE: 4.0}  # 11 / 3 rounded to the nearest
    assert b.limits[ENGINE].limit == 6.0  # what b learned itself is kept, to share and to grow from
    assert started(start(b, 6)) + rounds(fleet) == 4


def fleet_of(*limits: float) -> Fleet:
    replicas = [replica() for _ in limits]
    for d, limit in zip(replicas, limits, strict=True):
        learned(d, limit)
    fleet = Fleet(replicas)
    warm(fleet)
    fleet.round(full=True)  # every replica's limit heard (full batches go out every second)
    rounds(fleet)
    return fleet


@pytest.mark.parametrize(
    ("limits", "runs"),
    [
        ((2.0, 2.0, 2.0, 3.0), 2),  # one replica's step up alone adds no slot (it did: 2.25 let a 3rd run)
        ((3.0, 3.0, 2.0, 2.0), 2),  # a tie goes to the budget (2.5 let a 3rd run)
        ((3.0, 3.0, 3.0, 2.0), 3),  # one replica's step down alone takes none
        ((3.0, 3.0, 3.0, 4.0), 3),  # (3.25 let a 4th run)
    ],
)
def test_the_fleet_runs_the_mean_limit_rounded_to_the_nearest_request(limits, runs):
    """Replicas that learn apart (the channel back after a break, before the leader's limit is heard)
    step out of phase: a fleet that ran the mean rounded up grew whenever any one replica stepped up
    and shrank only once all had stepped down, so on real engines it ran a request more than one
    replica learns (ITL p99 269 ms against 49 ms; ``benchmarks/results/gpu/fleet/itl``)."""
    assert fleet_limit(limits) == float(runs)
    fleet = fleet_of(*limits)
    first = fleet.replicas[0]
    # Heard at once, the lowest id's limit is everyone's: one replica's, whatever the others had.
    applied = first.concurrency_limits()[ENGINE]
    assert applied in limits
    assert all(d.concurrency_limits() == {ENGINE: applied} for d in fleet.replicas)
    assert started(start(first, 6)) + rounds(fleet) == applied
    assert all(d.holdings.slots(ENGINE, 0.0) == applied for d in fleet.replicas)


def gaps(d: Dispatcher, n: int, load: int, seconds: float, now: float) -> None:
    """``n`` gaps of ``seconds`` relayed by ``d`` with ``load`` requests on the engine."""
    limit = d.limits[ENGINE]
    for _ in range(n):
        limit.observe_itl(seconds, load, now)


def test_the_lowest_id_learns_each_limit_for_the_fleet_on_everyones_gaps_and_the_others_take_it():
    fleet = Fleet([replica(initial=2.0) for _ in range(3)])
    warm(fleet)
    a, b, c = fleet.replicas
    # Each relayed 60 gaps at 2 requests in flight, well within budget: too few for one replica to judge
    # (``min_samples`` 100), enough together.
    for d in fleet.replicas:
        gaps(d, 60, 2, 0.01, 1.0)
        d.limits[ENGINE].note_load(2)
    fleet.round(now=1.5, full=True)
    for d in fleet.replicas:
        d.poll(2.0)
    assert a.limits[ENGINE].limit == 3.0 and a.limits[ENGINE].reason == "itl_within_budget"
    fleet.round(now=2.0)
    for d in (b, c):
        assert d.limits[ENGINE].limit == 3.0 and d.limits[ENGINE].reason == "learned_by_peers"
    assert all(d.concurrency_limits() == {ENGINE: 3.0} for d in fleet.replicas)


def test_a_replica_that_learned_nothing_does_not_drag_the_fleets_limit():
    a, b = replica(initial=2.0), replica(initial=2.0)
    learned(a, 9.0, "itl_within_budget")
    fleet = Fleet([a, b])
    fleet.introduce()
    fleet.publish(0, full=True)
    fleet.deliver(0)
    assert b.take_learned(full=True).load[ENGINE].limit == 0.0  # its probe level is not the fleet's to count
    assert a.concurrency_limits() == {ENGINE: 9.0}


def test_when_the_leader_goes_silent_the_next_lowest_learns_from_where_the_fleet_was():
    fleet = Fleet([replica(initial=2.0) for _ in range(3)])
    warm(fleet)
    a, b, c = fleet.replicas
    learned(a, 6.0, "itl_within_budget")
    fleet.round(now=0.5, full=True)
    fleet.round(now=0.6)
    assert b.limits[ENGINE].limit == c.limits[ENGINE].limit == 6.0
    rest = Fleet([b, c])  # a stopped
    rest.ids = fleet.ids[1:]
    for d in (b, c):
        d.expire_peers(10.0, silent_s=3.0)
        gaps(d, 60, 6, 0.01, 10.0)
        d.limits[ENGINE].note_load(6)
    rest.round(now=10.5, full=True)
    b.poll(12.0)
    c.poll(12.0)
    assert b.limits[ENGINE].limit == 7.0 and c.limits[ENGINE].limit == 6.0  # b leads now, from 6
    rest.round(now=12.1)
    assert c.limits[ENGINE].limit == 7.0


def test_a_limit_change_goes_out_in_the_next_batch():
    a = replica()
    a.take_learned()
    learned(a, 3.0)
    assert not a.take_learned().load
    a.poll(40.0)  # no shrink or step for longer than recover_s: back up towards the probe level
    assert a.limits[ENGINE].reason == "recovering"
    assert a.take_learned().load[ENGINE].limit == 4.0


def test_a_replica_that_learned_nothing_takes_the_fleets_limit():
    a, newcomer = replica(), replica(initial=2.0)
    learned(a, 9.0, "itl_within_budget")
    newcomer.learn(Channel(b"a").batch(a.take_learned(full=True)), 0.0)
    assert newcomer.limits[ENGINE].limit == 9.0 and newcomer.limits[ENGINE].reason == "learned_by_peers"


def test_without_the_channel_each_replica_fills_its_share_and_counts_again_once_back():
    fleet = Fleet([replica(initial=6.0), replica(initial=6.0), replica(initial=6.0)])
    warm(fleet)
    a, b, _ = fleet.replicas
    assert started(start(a, 1)) == 1
    assert b.lost_peers(1.0)  # the safe share began
    assert not b.lost_peers(2.0)  # once
    assert b.concurrency_limits() == {ENGINE: 2.0}  # 6 over the 3 replicas heard
    assert started(start(b, 4, 2.0)) == 2
    b.share_resumed(5.0)
    assert not b.settle_share(5.5)
    fleet.round(full=True)  # everyone's full batch: b knows again what each holds
    assert b.settle_share(6.0)
    assert b.concurrency_limits() == {ENGINE: 6.0}
    # a's 1 and b's 2 of the fleet's 6 were in flight: b's 2 queued start once it holds slots, then one more
    assert rounds(fleet) == 2
    assert started(start(b, 2, 6.0)) + rounds(fleet) == 1


def test_what_the_others_ran_before_the_channel_broke_still_counts_until_the_next_scrape():
    fleet = Fleet([replica(), replica()])
    warm(fleet)
    a, b = fleet.replicas
    assert started(start(a, 3)) + rounds(fleet) == 3
    assert b.lost_peers(1.0)
    assert started(start(b, 2, 1.0)) == 1  # its share is 2, but a's 3 of the 4 still run
    engine_of(b, ENGINE).mark_scrape_start()
    b.apply_scrape(ENGINE, EngineMetrics(running=2), 2.0)  # 1 of b's, 1 left of a's
    assert sum(isinstance(n, Dispatch) for n in b.poll(2.0)) == 1  # b's second starts: its share, 2 of 4


def test_the_safe_share_yields_to_what_the_engine_holds_beyond_the_others_shares():
    for scraped, may_start in ((4, 2), (5, 1)):
        b = replica(initial=6.0)
        b.learn(Channel(b"a").batch(Learned([], {}, True)), 0.0)
        b.learn(Channel(b"c").batch(Learned([], {}, True)), 0.0)
        b.lost_peers(1.0)
        # The engine runs ``scraped`` requests b did not send: within the others' 2 + 2, b takes its 2;
        # beyond them (a replica that never heard of the split, or clients past the gateway), less.
        engine_of(b, ENGINE).mark_scrape_start()
        b.apply_scrape(ENGINE, EngineMetrics(running=scraped), 1.0)
        assert started(start(b, 3, 1.0)) == may_start, scraped


def test_a_replica_that_just_started_takes_its_safe_share_until_it_has_heard_everyone():
    a, newcomer = replica(), replica()
    fleet = Fleet([a, newcomer])
    newcomer.share_joining()
    newcomer.share_resumed(0.0)  # the channel works: settled after full_s (1 s)
    assert started(start(a, 3)) == 3  # alone so far: the whole limit
    fleet.round(full=True)
    assert newcomer.concurrency_limits() == {ENGINE: 2.0}  # two replicas heard so far
    assert started(start(newcomer, 3)) == 1  # its share is 2, but a's 3 of 4 are heard
    assert not newcomer.settle_share(1.0)  # settled silently: it joined, nothing was lost
    rounds(fleet)
    assert newcomer.concurrency_limits() == {ENGINE: 4.0}
    assert inflight(a, ENGINE) + inflight(newcomer, ENGINE) == 4


def test_a_replica_that_never_heard_another_keeps_the_whole_limit_without_the_channel():
    alone = replica()
    alone.lost_peers(0.0)
    assert alone.concurrency_limits() == {ENGINE: 4.0}


def test_learned_limits_cross_the_wire_and_impossible_ones_are_refused():
    load = {ENGINE: EngineLoad(2, 100, 3.5, 3, 2), "http://e1:8000": EngineLoad(limit=7.0)}
    batch = decode(encode(Batch(b"p" * 16, 1, 0.0, 64, Learned([], load, True))))
    assert batch.learned.load == load
    for bad in (-1.0, math.inf, math.nan):
        raw = encode(Batch(b"p" * 16, 1, 0.0, 64, Learned([], {ENGINE: EngineLoad(1, 0, bad)})))
        with pytest.raises(ValueError, match="load entry"):
            decode(raw)
