"""What replicas tell each other about their tenants: the wire format, the fleet's table, and fair shares
that hold across replicas (hypothesis: no tenant over its share, none starved, the pool kept full)."""

import math
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from priority_gateway.core.classes import Budget
from priority_gateway.core.dispatcher import PEER_HOLD_S, AdmissionSettings, Dispatch, Dispatcher, PoolSpec
from priority_gateway.core.engines import EngineMetrics
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.sharing import Batch
from priority_gateway.core.tenant_share import (
    MAX_NAME_BYTES,
    FleetTenants,
    TenantBatch,
    TenantShare,
    TenantShares,
    decode,
    encode,
    is_tenant_batch,
)
from tests.gateway.core.fleet import Fleet as Channel

names = st.text(min_size=0, max_size=20)
shares = st.builds(
    TenantShare,
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0.5, 1.0, 2.0, 3.0]),
)


def publisher(n: int) -> bytes:
    return n.to_bytes(16, "big")


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.tuples(names, names), shares, max_size=20), st.booleans(), st.integers(0, 2**64 - 1))
def test_a_batch_decodes_to_what_was_encoded(told, full, sequence):
    batch = TenantBatch(publisher(7), sequence, TenantShares(told, full))
    data = encode(batch)
    assert is_tenant_batch(data)
    assert decode(data) == batch


def test_a_routing_batch_is_not_a_tenant_batch_and_garbage_is_refused():
    from priority_gateway.core.sharing import Learned
    from priority_gateway.core.sharing import encode as encode_routing

    assert not is_tenant_batch(encode_routing(Batch(publisher(1), 1, 0.0, 64, Learned())))
    good = encode(TenantBatch(publisher(1), 1, TenantShares({("p", "t"): TenantShare(1, 2, 1.0)})))
    for bad in (good[:-1], good + b"\0", good[:10], bytes([good[0], 99]) + good[2:]):
        with pytest.raises(ValueError):
            decode(bad)
    zero_weight = good[:-4] + struct.pack("<f", 0.0)
    with pytest.raises(ValueError):
        decode(zero_weight)


def test_a_tenant_name_too_long_to_share_is_left_out_not_cut():
    long = "t" * (MAX_NAME_BYTES + 1)
    told = TenantShares({("p", long): TenantShare(1), ("p", "short"): TenantShare(2)})
    assert decode(encode(TenantBatch(publisher(1), 1, told))).told.shares == {("p", "short"): TenantShare(2)}


def test_counts_are_absolute_a_full_batch_is_everything_and_silence_forgets():
    fleet = FleetTenants()
    fleet.report(TenantBatch(publisher(1), 1, TenantShares({("p", "a"): TenantShare(3, 1, 2.0)})), 0.0)
    fleet.report(
        TenantBatch(publisher(2), 1, TenantShares({("p", "a"): TenantShare(1), ("p", "b"): TenantShare(2)})), 0.0
    )
    assert fleet.of("p") == {"a": (4, 1, 1.0), "b": (2, 0, 1.0)}
    # A repeated or late batch changes nothing: values, not increments.
    fleet.report(TenantBatch(publisher(1), 2, TenantShares({("p", "a"): TenantShare(3, 1, 2.0)})), 1.0)
    assert fleet.of("p")["a"][0] == 4
    fleet.report(TenantBatch(publisher(2), 2, TenantShares({("p", "b"): TenantShare(0, 1)}, full=True)), 2.0)
    assert fleet.of("p") == {"a": (3, 1, 2.0), "b": (0, 1, 1.0)}, (
        "a full batch leaves out what its publisher no longer has"
    )
    fleet.expire(4.5, silent_s=3.0)
    assert fleet.of("p") == {"b": (0, 1, 1.0)} and len(fleet) == 1
    fleet.clear()
    assert fleet.of("p") == {} and len(fleet) == 0


def test_the_table_is_bounded_by_its_publishers():
    fleet = FleetTenants(max_peers=3)
    for n in range(10):
        fleet.report(TenantBatch(publisher(n), 1, TenantShares({("p", f"t{n}"): TenantShare(1)})), float(n))
    assert len(fleet) == 3
    assert set(fleet.of("p")) == {"t7", "t8", "t9"}


# -- fair shares across replicas ---------------------------------------------------------------


class Fleet:
    """Replicas of one pool on one channel (``tests/gateway/core/fleet.py``: every routing batch reaches
    every replica, its publisher included, in the order sent), their tenant batches delivered to the
    others with them."""

    def __init__(self, replicas: int, engines: int, limit: int, share_tenants: bool = True) -> None:
        admission = AdmissionSettings(enabled=True, limits=LimitSettings(initial=limit, unbudgeted=limit))
        self.replicas = [
            Dispatcher([PoolSpec("p", [f"e{i}" for i in range(engines)], policy="least_loaded")], admission=admission)
            for _ in range(replicas)
        ]
        for d in self.replicas:
            d.share_learning()
        self.share_tenants = share_tenants
        self.slots = engines * limit
        self.running: list[Dispatch] = []
        self.owner: dict[str, int] = {}
        self.sequence = 0
        self.now = 0.0
        self.started: list[str] = []
        self.channel = Channel(self.replicas)
        self.channel.introduce()
        self.channel.round(full=True)

    def exchange(self) -> None:
        """Tenants' batches, then a round of routing batches (the slots they grant start queued requests)."""
        self.sequence += 1
        for i, d in enumerate(self.replicas):
            told = d.take_tenant_shares()
            for j, other in enumerate(self.replicas):
                if j != i and self.share_tenants:
                    other.learn_tenants(TenantBatch(publisher(i), self.sequence, told), self.now)
        for started in self.channel.round(self.now):
            self.handle(started)

    def handle(self, outcomes) -> None:
        for outcome in outcomes:
            if isinstance(outcome, Dispatch):
                self.running.append(outcome)
                self.started.append(outcome.request.tenant)

    def submit(self, replica: int, tenant: str, weight: float, n: int) -> None:
        req = RouteRequest(
            f"{tenant}-{n}",
            "interactive",
            "m",
            self.now,
            prompt_tokens=100,
            max_tokens=100,
            budget=Budget(deadline_s=1e9),
            tenant=tenant,
            weight=weight,
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


tenants = st.lists(st.sampled_from([1.0, 2.0, 3.0]), min_size=2, max_size=4)


@settings(max_examples=400, deadline=None)
@given(
    st.integers(1, 4),
    tenants,
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
    fleet = Fleet(replicas, engines, limit)
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
        fleet = Fleet(2, 1, 8, share_tenants=share_tenants)
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
    fleet = Fleet(2, 1, 4)
    fleet.backlog(1, "quiet", 2)
    fleet.backlog(0, "noisy", 4)
    assert fleet.inflight() == {"quiet": 2, "noisy": 2}
    a = fleet.replicas[0]
    assert a.fleet_tenants.of("p") == {"quiet": (2, 0, 1.0)}
    assert a._over_share(a.pools["p"], None)("noisy"), "half of the fleet's four slots, with quiet active on b"
    a.lost_peers(fleet.now)
    assert a.fleet_tenants.of("p") == {}
    assert not a._over_share(a.pools["p"], None)("noisy"), "alone now: what the other replica runs no longer counts"


def test_room_left_to_another_replicas_tenant_goes_to_whoever_is_here_after_a_while():
    """Another replica says its tenant waits, further below its share than ours; but it never starts it
    (its request went, or that replica is stuck): the room is left free for ``PEER_HOLD_S``, then filled."""
    fleet = Fleet(1, 1, 4)
    (d,) = fleet.replicas
    d.apply_scrape("e0", EngineMetrics(running=3), 0.0)  # three of four slots taken by clients we never see
    for k in range(3):
        fleet.submit(0, "here", 1.0, k)
    assert fleet.inflight() == {"here": 1}
    told = TenantShares({("p", "there"): TenantShare(0, 3, 2.0)})
    d.learn_tenants(TenantBatch(publisher(1), 1, told), 0.0)
    fleet.finish(0)
    assert fleet.inflight() == {}, "the room is left to the other replica's tenant, at 0 of its share of 2.67"
    fleet.handle(d.poll(PEER_HOLD_S / 2))
    assert fleet.inflight() == {}
    fleet.handle(d.poll(PEER_HOLD_S))
    assert fleet.inflight() == {"here": 1}, "nobody took it: work-conserving again"


def test_a_tenants_cap_counts_its_requests_on_every_replica():
    fleet = Fleet(2, 2, 4)
    for replica in (0, 1):
        fleet.submit(replica, "capped", 1.0, replica)
        fleet.exchange()
    assert fleet.inflight() == {"capped": 2}
    req = RouteRequest(
        "capped-again", "interactive", "m", 0.0, prompt_tokens=100, max_tokens=100, tenant="capped", max_concurrency=2
    )
    fleet.owner[req.id] = 0
    fleet.handle(fleet.replicas[0].submit(req, fleet.now))
    assert fleet.inflight() == {"capped": 2}, "its cap of two is reached across the replicas: it waits"
    fleet.finish(0)
    fleet.settle()
    assert fleet.inflight() == {"capped": 2}, "one of its two ended: the waiting one starts"
