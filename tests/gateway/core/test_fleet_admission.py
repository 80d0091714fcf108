"""Admission across replicas: everyone's in-flight against the mean of the limits the replicas learned, and the
safe share of it while the channel is down."""

import math

import pytest

from priority_gateway.core.classes import INTERACTIVE, Budget
from priority_gateway.core.dispatcher import AdmissionSettings, Dispatch, Dispatcher, PoolSpec, Queued
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.sharing import Batch, EngineLoad, Learned, decode, encode
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


def test_the_others_in_flight_count_against_the_limit():
    a, b = replica(), replica()
    assert started(start(a, 3)) == 3
    b.learn(Channel(b"a").batch(a.take_learned()), 0.0)
    assert started(start(b, 3)) == 1  # a's 3 and b's 1 fill the engine's 4


def test_every_replica_admits_against_the_mean_of_the_limits_learned():
    a, b, c = replica(), replica(), replica()
    learned(a, 2.0)
    learned(b, 6.0, "itl_within_budget")
    learned(c, 3.0)
    b.learn(Channel(b"a").batch(a.take_learned(full=True)), 0.0)
    b.learn(Channel(b"c").batch(c.take_learned(full=True)), 0.0)
    assert b.concurrency_limits() == {ENGINE: 11 / 3}
    assert b.limits[ENGINE].limit == 6.0  # what b learned itself is kept, to share and to grow from
    assert started(start(b, 6)) == 4  # while under 3.67


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
    a, b, c = replica(initial=6.0), replica(initial=6.0), replica(initial=6.0)
    ca, cc = Channel(b"a"), Channel(b"c")
    start(a, 1)
    b.learn(ca.batch(a.take_learned(full=True)), 0.0)
    b.learn(cc.batch(c.take_learned(full=True)), 0.0)
    assert b.lost_peers(1.0)  # the safe share began
    assert not b.lost_peers(2.0)  # once
    assert b.concurrency_limits() == {ENGINE: 2.0}  # 6 over the 3 replicas heard
    assert started(start(b, 4, 2.0)) == 2
    b.share_resumed(5.0)
    assert not b.settle_share(5.5)
    b.learn(ca.batch(a.take_learned(full=True)), 5.8)
    assert b.settle_share(6.0)
    assert b.concurrency_limits() == {ENGINE: 6.0}
    # a's 1 and b's 2 of the fleet's 6 were in flight: b's 2 queued start, then one more
    assert sum(isinstance(n, Dispatch) for n in b.poll(6.0)) == 2
    assert started(start(b, 2, 6.0)) == 1


def test_a_replica_that_never_heard_another_keeps_the_whole_limit_without_the_channel():
    alone = replica()
    alone.lost_peers(0.0)
    assert alone.concurrency_limits() == {ENGINE: 4.0}


def test_learned_limits_cross_the_wire_and_impossible_ones_are_refused():
    load = {ENGINE: EngineLoad(2, 100, 3.5), "http://e1:8000": EngineLoad(limit=7.0)}
    batch = decode(encode(Batch(b"p" * 16, 1, 0.0, 64, Learned([], load, True))))
    assert batch.learned.load == load
    for bad in (-1.0, math.inf, math.nan):
        raw = encode(Batch(b"p" * 16, 1, 0.0, 64, Learned([], {ENGINE: EngineLoad(1, 0, bad)})))
        with pytest.raises(ValueError, match="load entry"):
            decode(raw)
