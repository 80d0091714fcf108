"""Replicas sharing one fleet through the product's ``Fleet``: routing facts, load, the leader's limit,
admission within holdings and the safe share, tenants' shares fleet-wide."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from priority_gateway.core.classes import INTERACTIVE, Budget
from priority_gateway.core.decisions import Decisions
from priority_gateway.core.dispatcher import AdmissionSettings, Dispatch, Dispatcher, PoolSpec, Queued
from priority_gateway.core.engines import EngineMetrics
from priority_gateway.core.fairness import PEER_HOLD_S
from priority_gateway.core.fleet import FleetSettings
from priority_gateway.core.fleet.replica import Dropped, Heard, Missed, Rejected, SafeShareBegan, SafeShareEnded
from priority_gateway.core.fleet.wire import Batch, EngineReport, Report, TenantShare, decode, encode
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.core.prefix import chain_seed, estimate_tokens, hash_blocks
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.routing import RoutedBlocks
from tests.support.examples import examples
from tests.support.fleet import Channel, engine_of, inflight, replica_id
from tests.support.fleet import settings as fleet_settings

ENGINES = [f"http://e{i}:8000" for i in range(4)]
SYSTEM = "<system> You answer questions about the shared handbook. " * 20


class Peer:
    """Batches of a replica that is only its bytes, numbered as a publisher numbers them."""

    def __init__(self, name: bytes, secret: bytes | None = None) -> None:
        self.id = name.ljust(16, b"\0")
        self.sequence = 0
        self.secret = secret

    def batch(self, report: Report, sent_at: float = 0.0) -> bytes:
        self.sequence += 1
        return encode(Batch(self.id, self.sequence, sent_at, 64, report), self.secret)


def request(rid: str, text: str) -> RouteRequest:
    return RouteRequest(
        rid, "interactive", "m", 0.0, prompt_tokens=estimate_tokens(text), prefix=hash_blocks(text, chain_seed("m"))
    )


def turns(c: int, n: int) -> str:
    return SYSTEM + "".join(f"<user {c} turn {t}> " + f"words of conversation {c} " * 12 for t in range(n))


def routing_replica(i: int = 0, share: bool = True, **options: object) -> Dispatcher:
    spec = PoolSpec("interactive", ENGINES, policy="prefix", policy_options=options)
    return Dispatcher([spec], fleet=fleet_settings(i) if share else None)


def told(d: Dispatcher, full: bool = False, now: float = 0.0) -> bytes | None:
    return d.fleet.outgoing(now, full).send


def route(d: Dispatcher, rid: str, text: str) -> str:
    out = d.submit(request(rid, text), 0.0).answer
    assert isinstance(out, Dispatch)
    d.finish(out, 0.0)
    return out.engine.id


# -- routing facts --------------------------------------------------------------------------------


def test_turns_split_between_replicas_stay_on_one_engine_once_they_share():
    """Replica a has the system prompt on every engine (a busy moment spread it), so it places each
    conversation by its own text; replica b has seen the system prompt on one engine only. Without
    a's facts, b's partial match pulls the conversations' next turns there; with them each stays
    where a put it."""
    for share in (False, True):
        a, b = routing_replica(0, load_factor=1.0), routing_replica(1, load_factor=1.0)
        busy = [a.submit(request(f"w{i}", SYSTEM + f"<user warm {i}> hello " * 10), 0.0).answer for i in range(8)]
        for out in busy:
            assert isinstance(out, Dispatch)
            a.finish(out, 0.0)
        route(b, "b", SYSTEM + "<user other> a question of its own " * 10)
        told(a), told(b)  # only what a routes from here on is shared
        moved = 0
        for c in range(20):
            where = route(a, f"a{c}", turns(c, 1))
            data = told(a)
            if share and data is not None:
                b.fleet.receive(data, 0.0)
            moved += route(b, f"b-turn2-{c}", turns(c, 2)) != where
            told(b)
        if share:
            assert moved == 0
        else:
            assert moved > 0  # the defect sharing removes: the test can tell the two apart


def test_a_fact_applied_twice_or_late_changes_no_choice():
    a, b, c = routing_replica(0), routing_replica(1), routing_replica(2)
    for i in range(12):
        route(a, f"a{i}", turns(i, 2))
    data = told(a)
    assert data is not None
    for replica in (b, c):
        heard = replica.fleet.receive(data, 0.0).events
        assert [e.facts for e in heard if isinstance(e, Heard)] == [12]
    again = b.fleet.receive(data, 1.0).events  # a duplicate: nothing counted missing
    assert not [e for e in again if isinstance(e, Missed)]
    for i in range(12):
        assert route(b, f"b{i}", turns(i, 3)) == route(c, f"c{i}", turns(i, 3))


def test_facts_and_reports_about_unknown_engines_are_ignored():
    b = routing_replica(1)
    fact = RoutedBlocks("http://elsewhere:8000", tuple(range(50)), 800, 16)
    data = Peer(b"a").batch(Report([fact], {"http://elsewhere:8000": EngineReport(5, 100)}))
    heard = b.fleet.receive(data, 0.0).events
    assert [e.facts for e in heard if isinstance(e, Heard)] == [0]
    assert "http://elsewhere:8000" not in b.pools["interactive"].policy.index._bit
    assert b.fleet.table.peer_inflight("http://elsewhere:8000") == 0


@settings(max_examples=examples(20), deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_memory_stays_bounded_whatever_arrives(seed):
    rng = random.Random(seed)
    b = routing_replica(1, default_capacity_tokens=4096)
    peer = Peer(b"a")
    for _ in range(40):
        facts = [
            RoutedBlocks(rng.choice(ENGINES), tuple(rng.getrandbits(64) for _ in range(rng.randint(1, 64))), 2048, 16)
            for _ in range(rng.randint(1, 20))
        ]
        b.fleet.receive(peer.batch(Report(facts)), 0.0)
    index = b.pools["interactive"].policy.index
    for engine in ENGINES:
        assert index.used(engine) <= index.capacity(engine)
    assert sum(len(lru) for lru in index._lru.values()) <= 4 * 4096 // 16


def test_the_outbox_keeps_the_newest_facts_when_nobody_takes_them():
    a = Dispatcher(
        [PoolSpec("interactive", ENGINES, policy="prefix")], fleet=FleetSettings(replica_id(0), max_pending=5)
    )
    a.fleet.channel_up(0.0)
    for i in range(8):
        route(a, f"a{i}", turns(i, 1))
    data = told(a)
    assert data is not None
    facts = decode(data).report.facts
    assert len(facts) == 5
    assert a.pools["interactive"].policy.learned_dropped == 3
    assert [f.prompt_tokens for f in facts] == [estimate_tokens(turns(i, 1)) for i in range(3, 8)]


def test_a_replica_alone_tells_nothing_and_hears_nothing():
    a = routing_replica(0, share=False)
    route(a, "r", turns(1, 2))
    assert told(a, full=True) is None
    assert a.fleet.receive(Peer(b"b").batch(Report(engines={ENGINES[0]: EngineReport(3)})), 0.0).events == []
    assert engine_of(a, ENGINES[0]).load == 0


def test_precise_mode_shares_load_but_no_blocks():
    a = routing_replica(0, precise=True)
    out = a.submit(RouteRequest("r", "interactive", "m", 0.0, prompt_tokens=100, prefix=[1, 2, 3]), 0.0).answer
    assert isinstance(out, Dispatch)
    data = told(a)
    assert data is not None
    report = decode(data).report
    assert report.facts == [] and report.engines == {out.engine.id: EngineReport(1, 100)}


def test_a_batch_the_replica_cannot_trust_is_refused_whole_and_said():
    secret = b"fleet secret"
    b = Dispatcher(
        [PoolSpec("interactive", ENGINES, policy="least_loaded")], fleet=FleetSettings(replica_id(1), secret=secret)
    )
    forged = Peer(b"a").batch(Report(engines={ENGINES[0]: EngineReport(7)}))
    rejected = [e.reason for e in b.fleet.receive(forged, 0.0).events if isinstance(e, Rejected)]
    assert rejected == ["unsigned batch, and this replica requires the fleet secret"]
    assert engine_of(b, ENGINES[0]).load == 0
    b.fleet.receive(Peer(b"a", secret).batch(Report(engines={ENGINES[0]: EngineReport(7)})), 0.0)
    assert engine_of(b, ENGINES[0]).load == 7
    wrong = encode(Batch(b"c" * 16, 1, 0.0, 128, Report()), secret)
    assert [e for e in b.fleet.receive(wrong, 0.0).events if isinstance(e, Rejected)]


# -- load ---------------------------------------------------------------------------------------


def test_other_replicas_requests_count_as_load_until_they_finish():
    a, b = routing_replica(0), routing_replica(1)
    out = a.submit(request("r", turns(1, 3)), 0.0).answer
    assert isinstance(out, Dispatch)
    b.fleet.receive(told(a) or b"", 0.0)
    seen = engine_of(b, out.engine.id)
    assert seen.peer_inflight == 1 and seen.load == 1
    assert seen.peer_prefill == out.prefill_tokens > 0
    a.observe_ttft(out, 0.5)  # its first token: no prefill pending any more
    b.fleet.receive(told(a) or b"", 0.5)
    assert seen.peer_prefill == 0 and seen.peer_inflight == 1
    a.finish(out, 1.0)
    b.fleet.receive(told(a) or b"", 1.0)
    assert seen.load == 0


def test_a_full_batch_corrects_what_was_lost_and_silence_forgets():
    a, b = routing_replica(0), routing_replica(1)
    b.fleet.receive(told(a, full=True) or b"", 0.0)
    outs = [a.submit(request(f"r{i}", turns(i, 2)), 0.0).answer for i in range(4)]
    assert told(a)  # this batch never arrives
    for out in outs[:2]:
        assert isinstance(out, Dispatch)
        a.finish(out, 1.0)
    assert told(a)  # nor this one
    events = b.fleet.receive(told(a, full=True) or b"", 2.0).events
    assert [e.batches for e in events if isinstance(e, Missed)] == [2]
    assert sum(engine_of(b, e).peer_inflight for e in ENGINES) == 2
    assert {e for e in ENGINES if engine_of(b, e).peer_inflight} == {
        o.engine.id for o in outs[2:] if isinstance(o, Dispatch)
    }
    b.fleet.outgoing(10.0, full=True)  # a silent for longer than silent_s
    assert all(engine_of(b, e).peer_inflight == 0 and engine_of(b, e).peer_prefill == 0 for e in ENGINES)


def test_losing_the_channel_keeps_what_the_others_ran_only_until_the_engines_say_otherwise():
    a, b = routing_replica(0), routing_replica(1)
    out = a.submit(request("r", turns(1, 2)), 0.0).answer
    assert isinstance(out, Dispatch)
    b.fleet.receive(told(a) or b"", 0.0)
    assert sum(engine_of(b, e).load for e in ENGINES) == 1
    b.fleet.channel_lost(0.0)
    assert all(engine_of(b, e).peer_inflight == 0 for e in ENGINES)
    assert sum(engine_of(b, e).load for e in ENGINES) == 1  # a's request still runs, as far as b knows
    b.scrape_sent(out.engine.id)
    b.apply_scrape(out.engine.id, EngineMetrics(running=0, waiting=0), 1.0)  # it has ended
    assert sum(engine_of(b, e).load for e in ENGINES) == 0


def test_a_scrape_does_not_count_other_replicas_requests_twice():
    a, b = routing_replica(0), routing_replica(1)
    out = a.submit(request("r", turns(1, 2)), 0.0).answer
    assert isinstance(out, Dispatch)
    b.fleet.receive(told(a) or b"", 0.0)
    b.scrape_sent(out.engine.id)
    b.apply_scrape(out.engine.id, EngineMetrics(running=3, waiting=0), 1.0)  # a's request and 2 from elsewhere
    assert engine_of(b, out.engine.id).load == 3


def test_nothing_goes_out_while_the_channel_does_not_work():
    a = Dispatcher([PoolSpec("interactive", ENGINES, policy="least_loaded")], fleet=FleetSettings(replica_id(0)))
    a.submit(request("r", "hello"), 0.0)
    out = a.fleet.outgoing(0.0, full=True)
    assert out.send is None and [e for e in out.events if isinstance(e, Dropped)]
    a.fleet.channel_up(0.0)
    assert a.fleet.outgoing(0.1, full=True).send is not None


# -- admission across replicas --------------------------------------------------------------------

ENGINE = "http://e0:8000"


def admitting(i: int, initial: float = 4.0, **options: object) -> Dispatcher:
    return Dispatcher(
        [PoolSpec("interactive", [ENGINE], policy="least_loaded")],
        budgets={INTERACTIVE: 0.05},
        admission=AdmissionSettings(enabled=True, limits=LimitSettings(initial=initial)),
        fleet=fleet_settings(i, **options),
    )


counter = iter(range(10**6))


def start(d: Dispatcher, n: int, now: float = 0.0) -> list[Dispatch | Queued]:
    out = []
    for _ in range(n):
        answer = d.submit(RouteRequest(f"r{next(counter)}", INTERACTIVE, "m", now, 100, budget=Budget()), now).answer
        assert isinstance(answer, Dispatch | Queued)
        out.append(answer)
    return out


def started(answers: list[Dispatch | Queued] | Decisions) -> int:
    return sum(isinstance(a, Dispatch) for a in answers)


def learned(d: Dispatcher, limit: float, reason: str = "itl_over_budget") -> None:
    d.limits[ENGINE].limit = limit
    d.limits[ENGINE].reason = reason


def fleet_of(*limits: float) -> Channel:
    replicas = [admitting(i) for i in range(len(limits))]
    for d, limit in zip(replicas, limits, strict=True):
        learned(d, limit)
    channel = Channel(replicas)
    channel.warm()
    channel.round(full=True)  # every replica's limit heard (full batches go out every second)
    channel.rounds()
    return channel


def test_the_others_in_flight_count_against_the_limit_through_the_holdings():
    channel = Channel([admitting(0), admitting(1)])
    channel.warm()
    a, b = channel.replicas
    assert started(start(a, 3)) + channel.rounds() == 3
    assert started(start(b, 3)) + channel.rounds() == 1  # a's 3 and b's 1 fill the engine's 4


def two_engines_four_replicas() -> tuple[Channel, str, str]:
    """Four replicas, two engines of limit 4 (one slot each of each): ``a`` runs one request on the first,
    the other three one each on the second. ``a`` holds a free slot only where three run."""
    spec = PoolSpec("interactive", ENGINES[:2], policy="least_loaded")
    replicas = [
        Dispatcher(
            [spec],
            budgets={INTERACTIVE: 0.05},
            admission=AdmissionSettings(enabled=True, limits=LimitSettings(initial=4.0)),
            fleet=fleet_settings(i),
        )
        for i in range(4)
    ]
    channel = Channel(replicas)
    channel.warm()
    quiet, busy = ENGINES[:2]
    for d, engine in zip(replicas, (quiet, busy, busy, busy), strict=True):
        other = busy if engine == quiet else quiet
        answer = d.submit(RouteRequest(f"run-{d.fleet.own[0]}", INTERACTIVE, "m", 0.0, 100), 0.0, (other,)).answer
        assert isinstance(answer, Dispatch) and answer.engine.id == engine
    channel.rounds()
    return channel, quiet, busy


def test_a_replica_waits_for_a_slot_where_one_replica_alone_would_start_the_request():
    """Slots held unused by the others do not push a request onto a busier engine: it waits (a fraction of
    its TTFT budget) while its claim takes one of them back, then starts where one replica would."""
    channel, quiet, busy = two_engines_four_replicas()
    a = channel.replicas[0]
    assert [engine_of(a, e).load for e in (quiet, busy)] == [1, 3]
    req = RouteRequest("next", INTERACTIVE, "m", 0.1, 100, budget=Budget(ttft_s=0.5))
    assert isinstance(a.submit(req, 0.1).answer, Queued)
    dispatched = [d for _ in range(3) for got in channel.round(now=0.11) for d in got if d.request is req]
    assert [d.engine.id for d in dispatched] == [quiet]
    assert inflight(a, quiet) == 2 and inflight(a, busy) == 0


def test_a_request_waits_for_such_a_slot_only_a_tenth_of_its_ttft_budget():
    channel, _, busy = two_engines_four_replicas()
    a = channel.replicas[0]
    channel.up = False  # its claim never reaches the others
    req = RouteRequest("next", INTERACTIVE, "m", 0.1, 100, budget=Budget(ttft_s=0.5))
    assert isinstance(a.submit(req, 0.1).answer, Queued)
    assert not [d for d in a.poll(0.14).others if isinstance(d, Dispatch)]
    assert [d.engine.id for d in a.poll(0.16).others if isinstance(d, Dispatch)] == [busy]


def test_a_request_without_a_ttft_budget_does_not_wait_for_such_a_slot():
    channel, _, busy = two_engines_four_replicas()
    answer = channel.replicas[0].submit(RouteRequest("plain", INTERACTIVE, "m", 0.1, 100), 0.1).answer
    assert isinstance(answer, Dispatch) and answer.engine.id == busy


def test_every_replica_applies_the_limit_its_leader_learned():
    """One rule: the fleet's limit of an engine is the one its leader (the lowest id among those that
    learned one) publishes; the others follow it, whatever they learned apart."""
    channel = fleet_of(2.0, 6.0, 3.0, 5.0)
    assert all(d.readings.concurrency_limits() == {ENGINE: 2.0} for d in channel.replicas)
    assert all(d.limits[ENGINE].reason == "learned_by_peers" for d in channel.replicas[1:])
    assert started(start(channel.replicas[1], 6)) + channel.rounds() == 2
    assert all(d.fleet.holdings.slots(ENGINE, 0.0) == 2 for d in channel.replicas)


def gaps(d: Dispatcher, n: int, load: int, seconds: float, now: float) -> None:
    """``n`` gaps of ``seconds`` relayed by ``d`` with ``load`` requests on the engine."""
    limit = d.limits[ENGINE]
    for _ in range(n):
        limit.observe_itl(seconds, load, now)


def test_the_leader_learns_each_limit_for_the_fleet_on_everyones_gaps_and_the_others_take_it():
    channel = fleet_of(2.0, 2.0, 2.0)
    a, b, c = channel.replicas
    # Each relayed 60 gaps at 2 requests in flight, well within budget: too few for one replica to judge
    # (``min_samples`` 100), enough together.
    for d in channel.replicas:
        gaps(d, 60, 2, 0.01, 1.0)
        d.limits[ENGINE].note_load(2)
    channel.round(now=1.5, full=True)
    for d in channel.replicas:
        d.poll(2.0)
    assert a.limits[ENGINE].limit == 3.0 and a.limits[ENGINE].reason == "itl_within_budget"
    assert b.limits[ENGINE].limit == 2.0, "b does not lead: it judged, and waits for a's word"
    channel.round(now=2.0)
    for d in (b, c):
        assert d.limits[ENGINE].limit == 3.0 and d.limits[ENGINE].reason == "learned_by_peers"
    assert all(d.readings.concurrency_limits() == {ENGINE: 3.0} for d in channel.replicas)


def test_a_replica_that_learned_nothing_takes_the_fleets_limit_and_does_not_restart_it():
    a, newcomer = admitting(1), admitting(0, initial=2.0)  # the newcomer has the lower id
    learned(a, 9.0, "itl_within_budget")
    channel = Channel([a, newcomer])
    channel.introduce()
    channel.round(full=True)
    channel.round(full=True)
    assert newcomer.limits[ENGINE].limit == 9.0 and newcomer.limits[ENGINE].reason == "learned_by_peers"
    assert newcomer.fleet.leads(ENGINE), "having taken the fleet's limit it leads from there, not from its probe"
    assert a.readings.concurrency_limits() == {ENGINE: 9.0}


def test_when_the_leader_goes_silent_the_next_lowest_learns_from_where_the_fleet_was():
    channel = fleet_of(6.0, 6.0, 6.0)
    _, b, c = channel.replicas
    rest = Channel([b, c])  # a stopped
    for d in (b, c):
        d.fleet.outgoing(10.0, full=True)  # a silent for longer than silent_s
        gaps(d, 60, 6, 0.01, 10.0)
        d.limits[ENGINE].note_load(6)
    rest.round(now=10.5, full=True)
    b.poll(12.0)
    c.poll(12.0)
    assert b.limits[ENGINE].limit == 9.0 and c.limits[ENGINE].limit == 6.0  # b leads now, from 6 (half again)
    rest.round(now=12.1)
    assert c.limits[ENGINE].limit == 9.0


def test_a_limit_change_goes_out_in_the_next_batch():
    channel = fleet_of(3.0)
    (a,) = channel.replicas
    assert not decode(a.fleet.outgoing(1.0).send or encode(Batch(a.fleet.own, 0, 0.0, 64, Report()))).report.engines
    a.poll(40.0)  # no shrink or step for longer than recover_s: back up towards the probe level
    assert a.limits[ENGINE].reason == "recovering"
    assert decode(a.fleet.outgoing(40.0).send or b"").report.engines[ENGINE].limit == 4.0


def test_without_the_channel_each_replica_fills_its_share_and_counts_again_once_back():
    channel = Channel([admitting(i, initial=6.0) for i in range(3)])
    channel.warm()
    a, b, _ = channel.replicas
    assert started(start(a, 1)) == 1
    assert [e for e in b.fleet.channel_lost(1.0).events if isinstance(e, SafeShareBegan)] == [SafeShareBegan(3)]
    assert not b.fleet.channel_lost(2.0).events, "began once"
    assert b.readings.concurrency_limits() == {ENGINE: 2.0}  # 6 over the 3 replicas heard
    assert started(start(b, 4, 2.0)) == 2
    channel.restore(5.0)
    assert SafeShareEnded() not in channel.publish(1, now=5.5).events
    channel.round(now=5.6, full=True)  # everyone's full batch: b knows again what each holds
    assert SafeShareEnded() in channel.publish(1, now=6.0).events
    assert b.readings.concurrency_limits() == {ENGINE: 6.0}
    # a's 1 and b's 2 of the fleet's 6 were in flight: b's 2 queued start once it holds slots, then one more
    assert channel.rounds(now=6.0) == 2
    assert started(start(b, 2, 6.0)) + channel.rounds(now=6.0) == 1


def test_what_the_others_ran_before_the_channel_broke_still_counts_until_the_next_scrape():
    channel = Channel([admitting(0), admitting(1)])
    channel.warm()
    a, b = channel.replicas
    assert started(start(a, 3)) + channel.rounds() == 3
    b.fleet.channel_lost(1.0)
    assert started(start(b, 2, 1.0)) == 1  # its share is 2, but a's 3 of the 4 still run
    b.scrape_sent(ENGINE)
    b.apply_scrape(ENGINE, EngineMetrics(running=2), 2.0)  # 1 of b's, 1 left of a's
    assert started(b.poll(2.0)) == 1  # b's second starts: its share, 2 of 4


def test_the_safe_share_yields_to_what_the_engine_holds_beyond_the_others_shares():
    for scraped, may_start in ((4, 2), (5, 1)):
        b = admitting(1, initial=6.0)
        b.fleet.receive(Peer(b"a").batch(Report(full=True)), 0.0)
        b.fleet.receive(Peer(b"c").batch(Report(full=True)), 0.0)
        b.fleet.channel_lost(1.0)
        # The engine runs ``scraped`` requests b did not send: within the others' 2 + 2, b takes its 2;
        # beyond them (a replica that never heard of the split, or clients past the gateway), less.
        b.scrape_sent(ENGINE)
        b.apply_scrape(ENGINE, EngineMetrics(running=scraped), 1.0)
        assert started(start(b, 3, 1.0)) == may_start, scraped


def test_a_replica_that_just_started_takes_its_safe_share_until_it_has_heard_everyone():
    a, newcomer = admitting(0), admitting(1, settled=False)
    channel = Channel([a, newcomer])
    newcomer.fleet.channel_up(0.0)  # the channel works: settled after settle_s (1 s)
    assert started(start(a, 3)) == 3  # alone so far: the whole limit
    channel.round(full=True)
    assert newcomer.readings.concurrency_limits() == {ENGINE: 2.0}  # two replicas heard so far
    assert started(start(newcomer, 3)) == 1  # its share is 2, but a's 3 of 4 are heard
    assert SafeShareEnded() not in newcomer.fleet.outgoing(1.0).events, "settled silently: nothing was lost"
    channel.rounds(now=1.0)
    assert newcomer.readings.concurrency_limits() == {ENGINE: 4.0}
    assert inflight(a, ENGINE) + inflight(newcomer, ENGINE) == 4


def test_a_replica_that_never_heard_another_keeps_the_whole_limit_without_the_channel():
    alone = admitting(0)
    alone.fleet.channel_lost(0.0)
    assert alone.readings.concurrency_limits() == {ENGINE: 4.0}


# -- tenants' shares across replicas ----------------------------------------------------------------


class Tenants:
    """Replicas of one pool on one channel, whose batches carry their tenants with their load."""

    def __init__(self, replicas: int, engines: int, limit: int, share_tenants: bool = True) -> None:
        admission = AdmissionSettings(enabled=True, limits=LimitSettings(initial=limit, unbudgeted=limit))
        self.replicas = [
            Dispatcher(
                [PoolSpec("p", [f"e{i}" for i in range(engines)], policy="least_loaded")],
                admission=admission,
                fleet=fleet_settings(n, tenants=share_tenants),
            )
            for n in range(replicas)
        ]
        self.slots = engines * limit
        self.running: list[Dispatch] = []
        self.owner: dict[str, int] = {}
        self.now = 0.0
        self.started: list[str] = []
        self.channel = Channel(self.replicas)
        self.channel.introduce()
        self.channel.round(full=True)

    def exchange(self) -> None:
        """A round of batches (the slots they grant start queued requests)."""
        for started in self.channel.round(self.now):
            self.handle(started)

    def handle(self, outcomes: Decisions | list[Dispatch]) -> None:
        for outcome in outcomes:
            if isinstance(outcome, Dispatch):
                self.running.append(outcome)
                self.started.append(outcome.request.tenant)

    def submit(self, replica: int, tenant: str, weight: float, n: int, cap: int | None = None) -> None:
        req = RouteRequest(
            f"{tenant}-{n}-{replica}",
            "interactive",
            "m",
            self.now,
            prompt_tokens=100,
            max_tokens=100,
            budget=Budget(deadline_s=1e9),
            tenant=tenant,
            weight=weight,
            max_concurrency=cap,
        )
        self.owner[req.id] = replica
        self.handle(self.replicas[replica].submit(req, self.now))

    def backlog(self, replica: int, tenant: str, n: int) -> None:
        """``n`` requests of ``tenant`` (weight 1) through ``replica``, then the fleet settles."""
        for k in range(n):
            self.submit(replica, tenant, 1.0, k)
        self.settle()

    def finish(self, index: int) -> None:
        dispatch = self.running.pop(index)
        self.handle(self.replicas[self.owner[dispatch.request.id]].finish(dispatch, self.now))

    def settle(self) -> None:
        """Every replica polls in turn, the channel delivering what each did before the next polls (the
        channel's delay, in which two replicas may both take one free slot, is not what this tests),
        until the slots granted on the way have been taken."""
        for _ in range(3):
            self.exchange()
            for d in self.replicas:
                self.now += 0.01
                self.handle(d.poll(self.now))
                self.exchange()

    def inflight(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for dispatch in self.running:
            out[dispatch.request.tenant] = out.get(dispatch.request.tenant, 0) + 1
        return out


weights = st.lists(st.sampled_from([1.0, 2.0, 3.0]), min_size=2, max_size=4)


@pytest.mark.untraced
@settings(max_examples=examples(400), deadline=None)
@given(
    st.integers(1, 4),
    weights,
    st.lists(st.integers(-1, 3), min_size=4, max_size=4),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(0, 2**32),
)
def test_backlogged_tenants_hold_their_weighted_share_of_the_fleets_slots(
    replicas, weights, homes, engines, limit, seed
):
    """Every tenant backlogged, each spread over the replicas or all through one (``homes``: -1 spread).
    Once the requests started before everyone queued have ended (the oldest end first), requests end
    in random order, and then: every start goes to a tenant below its weighted share of the fleet's
    slots, the pool stays full, every tenant holds at least what the others' shares leave it, and
    none stays below its whole share for long (none starves)."""
    fleet = Tenants(replicas, engines, limit)
    names = [f"t{n}" for n in range(len(weights))]
    total = sum(weights)
    share = {name: fleet.slots * w / total for name, w in zip(names, weights, strict=True)}
    most = {name: math.ceil(share[name] - 1e-9) for name in names}
    for k in range(6 * fleet.slots + 10):
        for n, (name, weight) in enumerate(zip(names, weights, strict=True)):
            fleet.submit(homes[n] % replicas if homes[n] >= 0 else k % replicas, name, weight, k)
            fleet.exchange()
    fleet.settle()
    rng = random.Random(seed)
    below = dict.fromkeys(names, 0)
    for step in range(5 * fleet.slots):
        fleet.finish(0 if step < fleet.slots else rng.randrange(len(fleet.running)))
        before = len(fleet.started)
        fleet.settle()
        held = fleet.inflight()
        assert sum(held.values()) == fleet.slots, "work-conserving: a free slot and queued work never coexist"
        if step >= fleet.slots:
            for name in fleet.started[before:]:
                assert held[name] <= most[name], (name, held, share)
            for name in names:
                left = fleet.slots - sum(most[o] for o in names if o != name)
                assert held.get(name, 0) >= left, (name, held, share)
                # Below its whole share only briefly: the others each end a few requests meanwhile, at most.
                below[name] = below[name] + 1 if held.get(name, 0) < math.floor(share[name] + 1e-9) else 0
                assert below[name] <= len(names) * fleet.slots, (name, below[name], held, share)


def test_without_sharing_tenants_a_tenant_alone_on_its_replica_takes_more_than_its_share():
    """The defect sharing removes: the noisy tenant's replica sees nobody else, so the slots it holds
    (half of the engine's, as fleet admission splits them) are all its, while three other tenants
    share the other half on the other replica. Shared, the noisy one keeps to its quarter."""
    for share_tenants, noisy in ((True, 2), (False, 4)):
        fleet = Tenants(2, 1, 8, share_tenants=share_tenants)
        fleet.backlog(0, "noisy", 20)
        for tenant in ("q1", "q2", "q3"):
            fleet.backlog(1, tenant, 20)
        for _ in range(16):
            fleet.finish(0)
            fleet.settle()
        held = fleet.inflight()
        assert held.get("noisy", 0) == noisy, (share_tenants, held)
        assert sum(held.values()) == 8, (share_tenants, held)


def test_a_replica_that_loses_the_channel_falls_back_to_its_own_tenants():
    fleet = Tenants(2, 1, 4)
    fleet.backlog(1, "quiet", 2)
    fleet.backlog(0, "noisy", 4)
    assert fleet.inflight() == {"quiet": 2, "noisy": 2}
    a = fleet.replicas[0]
    pool = a.pools["p"]
    assert a.fleet.tenants_of("p") == {"quiet": (2, 0, 1.0)}
    assert a.tenants.over("p", pool.queue, 4, None)("noisy"), "half of the fleet's four slots, with quiet on b"
    a.fleet.channel_lost(fleet.now)
    assert a.fleet.tenants_of("p") == {}
    assert not a.tenants.over("p", pool.queue, 4, None)("noisy"), "alone now: the other replica's no longer count"


def test_room_left_to_another_replicas_tenant_goes_to_whoever_is_here_after_a_while():
    """Another replica says its tenant waits, further below its share than ours; but it never starts it
    (its request went, or that replica is stuck): the room is left free for ``PEER_HOLD_S``, then filled."""
    fleet = Tenants(1, 1, 4)
    (d,) = fleet.replicas
    # Three of the four slots run requests of another replica, whose tenant "there" then waits.
    other = Peer(b"other")
    d.fleet.receive(other.batch(Report(engines={"e0": EngineReport(inflight=3)})), 0.0)
    fleet.exchange()
    for k in range(3):
        fleet.submit(0, "here", 1.0, k)
    assert fleet.inflight() == {"here": 1}
    d.fleet.receive(other.batch(Report(tenants={("p", "there"): TenantShare(0, 3, 2.0)})), 0.0)
    fleet.finish(0)
    assert fleet.inflight() == {}, "the room is left to the other replica's tenant, at 0 of its share of 2.67"
    fleet.handle(d.poll(PEER_HOLD_S / 2))
    assert fleet.inflight() == {}
    fleet.handle(d.poll(PEER_HOLD_S))
    assert fleet.inflight() == {"here": 1}, "nobody took it: work-conserving again"


def test_a_tenants_cap_counts_its_requests_on_every_replica():
    fleet = Tenants(2, 2, 4)
    for replica in (0, 1):
        fleet.submit(replica, "capped", 1.0, replica)
        fleet.exchange()
    assert fleet.inflight() == {"capped": 2}
    fleet.submit(0, "capped", 1.0, 9, cap=2)
    assert fleet.inflight() == {"capped": 2}, "its cap of two is reached across the replicas: it waits"
    fleet.finish(0)
    fleet.settle()
    assert fleet.inflight() == {"capped": 2}, "one of its two ended: the waiting one starts"
