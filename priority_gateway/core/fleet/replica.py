"""This replica's side of the fleet protocol: bytes in, decisions out, as h11 runs HTTP/1.1.

Every driver (the server's Redis channel, the simulator, the tests, the benchmarks) moves bytes and
calls this module; none re-implements a rule of it.

Rules:
- ``outgoing(now, full)`` is called every interval: what this replica has to tell since its previous
  batch (routing facts, its load, claims and holdings per engine whose state changed, its tenants'
  counts that changed), or everything (``full``: every ``full_s``, also its heartbeat, with its
  evidence). The batch is in the returned ``FleetDecisions.send`` (None: nothing to tell, or the
  channel is not working: then it is dropped and counted, and the next full batch says it all).
  Full, it also lets rows not heard within ``silent_s`` fall silent (``table``); every call ends the
  safe share once the channel has settled (``channel``).
- ``receive(data, now)``: one batch as the channel delivered it, this replica's own included (every
  replica applies every batch in the channel's one order: what makes holdings agree). A batch that
  does not decode (malformed, forged, another version or secret), or that hashes prompts by another
  block width, is refused whole and said (``Rejected``). A peer's facts teach the prefix policy what
  the engines hold, its reports its load; the engine's leader's limit is followed; slots granted to
  this replica start queued requests at once, in the returned decisions.
- ``channel_lost(now)``: the channel broke. Everyone falls silent: routing on this replica's own
  knowledge and the engines' scrapes, tenants' shares on its own requests; what the others last
  reported in flight counts as the engines' own load until their next scrape; admission the safe
  share (``SafeShareBegan``). ``channel_up(now)``: it works again; the safe share ends ``settle_s``
  later, once everyone's full batch has come (``SafeShareEnded``).
- The engine's limit is the leader's (``table.leader``): this replica moves it only while it leads;
  otherwise it follows what the leader publishes. The one admission gate is the holdings
  (``capacity``); the others' in-flight requests stay in each engine's load for routing.
- Alone (no ``FleetSettings``): nothing is sent or heard; the channel is ``UP`` with nobody in it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from priority_gateway.core.decisions import Decisions
from priority_gateway.core.engines import EngineState
from priority_gateway.core.fleet.channel import Channel
from priority_gateway.core.fleet.holdings import Holdings, claims, yield_to
from priority_gateway.core.fleet.table import FleetTable
from priority_gateway.core.fleet.wire import (
    PUBLISHER_BYTES,
    Batch,
    EngineReport,
    Report,
    TenantKey,
    TenantShare,
    WireError,
    decode,
    encode,
)
from priority_gateway.core.limiter import Evidence

if TYPE_CHECKING:  # the dispatcher's parts, which read the fleet in turn
    from priority_gateway.core.capacity import Capacity
    from priority_gateway.core.fairness import TenantFairness
    from priority_gateway.core.pools import Pool


@dataclass(frozen=True, slots=True)
class FleetSettings:
    publisher: bytes
    """This replica's id on the channel (16 bytes, random per process)."""
    silent_s: float = 3.0
    """A replica not heard from this long counts for nothing."""
    window_s: float = 30.0
    """Replicas heard within this long split each limit while the safe share holds."""
    settle_s: float = 1.0
    """The safe share ends this long after the channel works (everyone's full batch has come)."""
    max_peers: int = 1024
    max_pending: int = 10_000
    """Routing facts kept for the next batch at most."""
    block_chars: int = 64
    secret: bytes | None = None
    """With it, batches are signed and only signed batches are heard (HMAC-SHA256)."""
    tenants: bool = True
    """Tell the others this replica's tenants, so fair shares are the fleet's."""
    settled: bool = False
    """Start with the channel up and settled, not in the starting safe share: every replica of a
    simulation starts at the same instant, having heard the others."""

    def __post_init__(self) -> None:
        if len(self.publisher) != PUBLISHER_BYTES:
            raise ValueError(f"a replica's id is {PUBLISHER_BYTES} bytes")


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: str


@dataclass(frozen=True, slots=True)
class Missed:
    publisher: bytes
    batches: int


@dataclass(frozen=True, slots=True)
class Heard:
    publisher: bytes
    sent_at: float
    facts: int
    """Facts applied to the prefix index."""


@dataclass(frozen=True, slots=True)
class Sent:
    size: int
    facts: int


@dataclass(frozen=True, slots=True)
class Dropped:
    """A batch that could not go: the channel is not working."""


@dataclass(frozen=True, slots=True)
class SafeShareBegan:
    replicas: int


@dataclass(frozen=True, slots=True)
class SafeShareEnded:
    pass


FleetEvent = Rejected | Missed | Heard | Sent | Dropped | SafeShareBegan | SafeShareEnded


@dataclass(slots=True, eq=False)
class FleetDecisions(Decisions):
    events: list[FleetEvent] = field(default_factory=list)
    send: bytes | None = None
    """The batch to publish (``outgoing``)."""

    def take(self, decided: Decisions) -> None:
        self.others += decided.others
        self.limit_changes += decided.limit_changes


class Local(Protocol):
    """What the fleet reads of this replica and asks it to do (the dispatcher)."""

    pools: dict[str, Pool]
    capacity: Capacity
    tenants: TenantFairness

    @property
    def engine_states(self) -> Mapping[str, EngineState]: ...

    @property
    def admitting(self) -> bool: ...

    def demand(self) -> dict[str, int]: ...

    def drain(self, now: float) -> Decisions: ...


class Fleet:
    def __init__(self, local: Local, settings: FleetSettings | None = None) -> None:
        self.local = local
        self.settings = settings
        self.shared = settings is not None
        self.table = FleetTable(
            settings.publisher if settings else bytes(PUBLISHER_BYTES), settings.max_peers if settings else 1
        )
        self.holdings = Holdings(self.table)
        self.channel = Channel(
            settings.settle_s if settings else 1.0, shared=settings is not None and not settings.settled
        )
        self._peers = 0
        self._sequence = 0
        self._changed: set[str] = set()  # engines whose own load changed since the last batch
        self._in_transit: deque[tuple[int, dict[str, int]]] = deque()  # claims sent, not yet heard back
        self._claims_sent: dict[str, tuple[int, int]] = {}
        self._claims_stale: set[str] = set()  # engines whose claim may have changed
        self._claim_inputs: tuple[int, bool, dict[str, int]] = (1, False, {})  # replicas, safe, demand per pool
        self._told_tenants: dict[TenantKey, TenantShare] = {}
        if settings is not None:
            for pool in local.pools.values():
                pool.policy.share(settings.max_pending)

    # -- what the dispatcher reads (``capacity.FleetGate``, ``fairness.FleetTenants``) ---------

    @property
    def own(self) -> bytes:
        return self.table.own

    @property
    def block_chars(self) -> int:
        return self.settings.block_chars if self.settings else 0

    @property
    def secret(self) -> bytes | None:
        return self.settings.secret if self.settings else None

    @property
    def within_holdings(self) -> bool:
        return self.shared and self._peers > 0 and not self.channel.safe and self.local.admitting

    @property
    def safe_replicas(self) -> int:
        return self.channel.replicas if self.channel.safe else 1

    @property
    def peers(self) -> int:
        """Other replicas heard within ``silent_s``."""
        return self._peers

    def cap(self, engine: str) -> int:
        """The slots this replica may fill on an engine: the least of its holding and its claims in
        transit (also what it states it holds: a release in transit must not come back with a later batch)."""
        cap = self.holdings.held(engine)
        for _, sent in self._in_transit:
            cap = min(cap, sent.get(engine, cap))
        return cap

    def yield_share(self, engine: str) -> int | None:
        waiters = self.holdings.waiters(engine)
        if not waiters:
            return None
        return yield_to(self.holdings.slots(engine, self.local.capacity.limit(engine)), waiters)

    def leads(self, engine: str) -> bool:
        leader = self.table.leader(engine)
        return leader is None or leader == self.own

    def peer_evidence(self, engine: str) -> list[Evidence]:
        return self.table.peer_evidence(engine) if self.shared else []

    def tenants_of(self, pool: str) -> dict[str, tuple[int, int, float]]:
        return self.table.tenants_of(pool)

    def adapters_in_flight(self, engine: str) -> set[str]:
        """The LoRA adapters the other replicas' requests on ``engine`` run on, as they last said."""
        return self.table.peer_adapters(engine)

    def tenant_running(self, tenant: str) -> int:
        return self.table.tenant_running(tenant)

    @property
    def has_tenants(self) -> bool:
        return self.table.has_tenants

    @property
    def shares_tenants(self) -> bool:
        """This replica's tenants' requests go to the others (and theirs count here): fair queueing on."""
        settings = self.settings
        return settings is not None and settings.tenants and self.local.admitting and self.local.tenants.enabled

    def load_changed(self, engine: str) -> None:
        if self.shared:
            self._changed.add(engine)

    # -- the channel ---------------------------------------------------------------------------

    def outgoing(self, now: float, full: bool = False, sent_at: float | None = None) -> FleetDecisions:
        out = FleetDecisions()
        settings = self.settings
        if settings is None:
            return out
        ended = self.channel.settle(now)
        if ended:
            out.events.append(SafeShareEnded())
        if full:
            silenced = self.table.silence(now, settings.silent_s, settings.window_s)
            if silenced:
                self.holdings.released(silenced)
            self._peers = self.table.peers()
            self._refresh_peers(silenced, now, out)
        report, claimed = self._report(full, now)
        if report and not self.channel_working:
            out.events.append(Dropped())
        elif report:
            self._sequence += 1
            if claimed:
                self._in_transit.append((self._sequence, {i: max(r.claim, r.spare) for i, r in report.engines.items()}))
            batch = Batch(self.own, self._sequence, now if sent_at is None else sent_at, settings.block_chars, report)
            out.send = encode(batch, settings.secret)
            out.events.append(Sent(len(out.send), len(report.facts)))
        if ended:
            out.take(self.local.drain(now))  # the safe share ended: the holdings may let more start
        return out

    @property
    def channel_working(self) -> bool:
        return self.channel.works

    def receive(self, data: bytes, now: float) -> FleetDecisions:
        out = FleetDecisions()
        settings = self.settings
        if settings is None:
            return out
        try:
            batch = decode(data, settings.secret)
        except WireError as exc:
            out.events.append(Rejected(str(exc)))
            return out
        if batch.block_chars != settings.block_chars:
            out.events.append(
                Rejected(f"prompts hashed in blocks of {batch.block_chars} characters, ours {settings.block_chars}")
            )
            return out
        report = self._known(batch.report)
        own = batch.publisher == self.own
        row, missed = self.table.heard(batch.publisher, batch.sequence, now)
        grew = self._heard_back(batch.sequence) if own else False
        applied = self.table.apply(batch.publisher, report)
        self._peers = self.table.peers()
        if not own:
            if missed:
                out.events.append(Missed(batch.publisher, missed))
            self.channel.seen(self.table.seen(now, settings.window_s))
        if self.local.admitting:
            held = set(report.engines) | (set(row.held) if report.full else set())
            self._claims_stale |= self.holdings.apply(batch.publisher, held, self.local.capacity.limit)
            grew = grew or self.holdings.grew
            self.holdings.grew = False
        self._refresh_peers(applied.engines, now, out, leaders=report.full)
        out.events.append(Heard(batch.publisher, batch.sent_at, 0 if own else self._learn(report)))
        if grew:
            out.take(self.local.drain(now))
        return out

    def channel_lost(self, now: float) -> FleetDecisions:
        out = FleetDecisions()
        settings = self.settings
        if settings is None:
            return out
        for engine in self.local.engine_states.values():
            engine.external_load += engine.peer_inflight
        silenced = self.table.silence_all()
        self.holdings.clear()
        self._in_transit.clear()
        self._peers = 0
        self._refresh_peers(silenced, now, out)
        if self.local.admitting and self.channel.lost(self.table.seen(now, settings.window_s)):
            out.events.append(SafeShareBegan(self.channel.replicas))
        return out

    def channel_up(self, now: float) -> FleetDecisions:
        self.channel.up(now)
        return FleetDecisions()

    # -- applying what was heard -----------------------------------------------------------------

    def _known(self, report: Report) -> Report:
        """Only what concerns this replica's engines and pools: the rows stay bounded by its topology."""
        engines = self.local.engine_states
        pools = self.local.pools
        if all(e in engines for e in report.engines) and all(p in pools for p, _ in report.tenants):
            return report
        return Report(
            report.facts,
            {e: r for e, r in report.engines.items() if e in engines},
            {k: s for k, s in report.tenants.items() if k[0] in pools},
            report.full,
        )

    def _heard_back(self, sequence: int) -> bool:
        """This replica's own batch came back: its claims in transit up to it end; True when that lets it
        fill more somewhere."""
        transit = self._in_transit
        if not transit or transit[0][0] > sequence:
            return False
        ending = [sent for sent_sequence, sent in transit if sent_sequence <= sequence]
        caps = {e: self.cap(e) for e in set().union(*ending)}
        for _ in ending:
            transit.popleft()
        return any(self.cap(e) > cap for e, cap in caps.items())

    def _refresh_peers(self, engines: set[str], now: float, out: FleetDecisions, leaders: bool = True) -> None:
        """The others' totals on ``engines`` changed; ``leaders``: who leads may have changed anywhere."""
        local = self.local
        states = local.engine_states
        capacity = local.capacity
        for engine_id in set(states) if leaders else engines:
            engine = states.get(engine_id)
            if engine is None:
                continue
            engine.peer_inflight = self.table.peer_inflight(engine_id)
            engine.peer_prefill = self.table.peer_prefill(engine_id)
            engine.peer_held_kv = self.table.peer_kv_held(engine_id)
            capacity.note_load(engine)  # the others' requests bring the fleet's load to the limit too
            leader = self.table.leader(engine_id)
            if leader is not None and leader != self.own:
                change = capacity.follow(engine_id, self.table.limit_of(leader, engine_id), now)
                if change is not None:
                    out.limit_changes.append(change)
                    self.load_changed(engine_id)

    def _learn(self, report: Report) -> int:
        """A peer's routing facts: the prefix policy learns which blocks the engines hold."""
        applied = 0
        states = self.local.engine_states
        pools = self.local.pools
        for fact in report.facts:
            engine = states.get(fact.engine)
            if engine is not None:
                pools[engine.pool].policy.learn(fact, engine)
                applied += 1
        return applied

    # -- what to tell --------------------------------------------------------------------------

    def _report(self, full: bool, now: float) -> tuple[Report, bool]:
        """What to tell now, and whether it carries claims (then it is in transit until heard back)."""
        local = self.local
        facts = [fact for pool in local.pools.values() for fact in pool.policy.take_learned()]
        changed, self._changed = self._changed, set()
        engines = local.engine_states
        wants = self._claims(changed, full) if local.admitting else {}
        evidence = local.capacity.evidence(now) if full and local.admitting else {}
        reports: dict[str, EngineReport] = {}
        names = engines if full else [i for i in changed | set(wants) if i in engines]
        for engine_id in names:
            report = self._own_report(engines[engine_id], wants.get(engine_id, (0, 0)), evidence.get(engine_id))
            if report or not full:
                reports[engine_id] = report
        return Report(facts, reports, self._tenant_report(full), full), bool(wants)

    def _own_report(self, engine: EngineState, wants: tuple[int, int], evidence: Evidence | None) -> EngineReport:
        learned = self.local.capacity.learned(engine.id)
        adapters = tuple(sorted(engine.adapters.inflight))
        return EngineReport(
            engine.inflight,
            engine.pending_prefill,
            learned,
            *wants,
            self.cap(engine.id),
            engine.held_kv,
            evidence,
            adapters,
        )

    def _claims(self, changed: set[str], full: bool) -> dict[str, tuple[int, int]]:
        """This replica's (claim, spare) on each engine where they changed or whose report goes out anyway."""
        inputs = (1 + self._peers, self.channel.safe, self.local.demand())
        replicas, safe, demand = inputs
        last, self._claim_inputs = self._claim_inputs, inputs
        engines = self.local.engine_states
        stale: set[str] | Mapping[str, EngineState]
        if full or last[:2] != inputs[:2]:
            stale = engines
        else:
            pools = self.local.pools
            moved = {name for name, n in demand.items() if last[2].get(name) != n}
            stale = self._claims_stale | changed | {e.id for name in moved for e in pools[name].engines}
        self._claims_stale = set()
        out = {}
        holdings = self.holdings
        for engine_id in stale:
            engine = engines.get(engine_id)
            if engine is None:
                continue
            wanted = (0, 0)
            if not safe:
                fixed = self.local.capacity.limit(engine_id)
                slots, free = holdings.slots(engine_id, fixed), holdings.free(engine_id, fixed)
                waiting = holdings.waiters(engine_id)
                held = holdings.held(engine_id)
                wanted = claims(engine.inflight, demand[engine.pool], held, slots, replicas, waiting, free < 0)
            if full or engine_id in changed or wanted != self._claims_sent.get(engine_id, (0, 0)):
                out[engine_id] = self._claims_sent[engine_id] = wanted
        return out

    def _tenant_report(self, full: bool) -> dict[TenantKey, TenantShare]:
        local = self.local
        if not self.shares_tenants:
            return {}
        told = self._told_tenants
        now = self._told_tenants = local.tenants.shares({name: pool.queue for name, pool in local.pools.items()})
        if full:
            return dict(now)
        changed = {key: share for key, share in now.items() if told.get(key) != share}
        for key in told.keys() - now.keys():
            changed[key] = TenantShare(0, 0, told[key].weight)
        return changed
