"""The gateway's decisions for every request, in one sans-I/O state machine.

Rules:
- Every call that decides something (``submit``, ``retry``, ``finish``, ``poll``, ``cancel``)
  returns all of it in one ``Decisions``: its ``answer`` about the request the call was for
  (``submit``, ``retry``), and in ``others``, in the order they must be carried out, what it
  decided for other requests: queued ones dispatched or refused, running ones preempted,
  queued ones shed. Nothing is left behind for a later call to collect.
- ``submit`` answers with a ``Dispatch`` (go to this engine), a ``Queued`` (wait: a later
  call's ``others`` holds its ``Dispatch`` or ``Rejection``), or a ``Rejection`` (with the
  ``Refusal`` reason that the HTTP layer turns into a status and an error code).
- Every ``Dispatch`` must be paired with exactly one ``finish``; that is what keeps the
  in-flight counts, and therefore routing and admission, honest.
- Only healthy engines that serve the request's model are candidates (``models``). A class goes
  to its home pool when that serves the model, else to the first pool that does.
- With admission on, an engine takes a request only while its load is under its
  adaptive concurrency limit (see ``limiter``). Otherwise the request waits in its pool's
  queue, classes by rank (their vLLM ``priority``), until it can start; an interactive-kind
  request that cannot start within its TTFT budget is refused at once with ``slo_budget_exceeded``.
- Inside a class, tenants share the queue by weighted fair queueing (``fair_queue``). A tenant
  at its concurrency cap (counting its requests on the other replicas) starts nothing more; one
  at or over its weighted share of a pool's slots, while other tenants are active there, starts
  only where an engine keeps the backfill reserve free, unless nobody under its share waits and
  another tenant holds more per weight (``TenantLoad.over_share``; alone, it may take every slot).
  Its prefills do not stall the others' decoding beyond their ITL budget when the engines
  prefill in chunks of a bounded token budget per step (``--max-num-batched-tokens``), as the
  interactive pool's do.
  Replicas that share their tenants (``core/tenant_share.py``) count every replica's requests in
  those shares; and when another replica has a tenant waiting that is further below its share than
  one here, this replica leaves it the free room for ``PEER_HOLD_S`` (the other's next poll), then
  takes it: so a tenant whose requests all come through one replica neither takes more than its
  share nor starves.
  A started request's charge (predicted prompt + decode tokens) is settled when it ends with the
  real count the caller reports (``finish(generated=...)``); a preempted or retried attempt's
  charge is refunded, since it is charged again when it starts again.
- Batch requests may also start on engines of the interactive pool (backfill) while those
  keep a reserve of free slots and no interactive request waits. When an interactive
  request finds no room, a restartable (not streamed) backfilled batch request is stopped
  to make room (``Preempted``) and queued again at its old place, as vLLM preempts by
  recomputation. Interactive requests may overflow into a pool that accepts them; such
  pools run vLLM's priority scheduling and get ``priority`` written, so interactive work
  preempts batch there.
- When a queue is full, the newest batch request of the heaviest batch tenant is shed to make
  room; a batch request that finds the queue full of interactive work is refused.
- Replicas sharing their load (``core/sharing.py``) admit fleet-wide: an engine's room is its
  limit, the mean of those this replica and the others heard learned for it (a replica that has
  learned none yet not counted) rounded to the nearest whole request (``fleet_limit``), less
  everyone's in-flight requests there. The fleet learns one limit per engine, as one replica seeing
  every gap would: every replica publishes what its own requests' gaps showed, as counts, in its
  full batches; the replica with the lowest id among those that learn the engine's limit (this one,
  by the id its own batches come back with) decides on the sum of everyone's counts and at the
  fleet's load, and the others take its limit as they hear it (``limiter``: ``lead``, ``follow``).
  Each replica learning from its own requests' gaps alone, a share of the engine's, found the load
  level where stalls break the budget far later than one replica seeing every gap, and replicas
  stepping out of phase moved the mean rounded up with any one's step up. While the channel is down
  each replica learns alone again. Counting the others' in-flight is not enough when replicas start
  requests within the same few ms (each counts only what it has heard of), so a replica that hears
  others also fills an engine only within the slots it holds (``core/holdings.py``): it claims
  slots for what
  it runs and what waits at it in every batch (with fair queueing, only what its tenants may start:
  one at its share or giving way to another replica's tenant claims nothing, so the room reaches
  the replica whose tenant takes it), and every replica applies the claims in the order
  the channel delivers them (its own batches included: ``heard_own``), so all agree on who holds
  what; slots granted start queued requests at once (``admit_granted``). Alone, a replica holds
  the whole limit. While the channel is down (``lost_peers``), each replica fills at most its safe
  share of the limit with its own requests (``safe_share``), until it is back (``share_resumed``)
  and settled (``settle_share``); a replica that has just started does the same until it has
  heard everyone (``share_joining``). The safe share also yields to what the engine reports
  (scraped) beyond the others' shares.
- Time is always an argument: the HTTP layer passes the wall clock, the simulator a
  virtual one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from priority_gateway.core.classes import DEFAULT_CLASSES, ClassTable
from priority_gateway.core.engines import EngineMetrics, EngineState
from priority_gateway.core.fair_queue import Charge
from priority_gateway.core.holdings import SELF, Holdings, claims, yield_to
from priority_gateway.core.kv_events import KVEvent
from priority_gateway.core.limiter import ConcurrencyLimit, LimitSettings
from priority_gateway.core.models import serves
from priority_gateway.core.queue import DEFAULT_DECODE_TOKENS, WaitQueue
from priority_gateway.core.reasons import Refusal
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.routing import Choice, Policy, make_policy
from priority_gateway.core.safe_share import SafeShare
from priority_gateway.core.sharing import Batch, EngineLoad, Learned, Peers, fleet_limit
from priority_gateway.core.slots import FullEngine, Running, SlotTimes
from priority_gateway.core.tenant_share import FleetTenants, Key, TenantBatch, TenantShare, TenantShares
from priority_gateway.core.tenants import TenantLoad
from priority_gateway.core.ttft_model import TTFTModel

PEER_HOLD_S = 0.1
"""How long a replica leaves free room to another replica's waiting tenant that is further below its
share than any of its own: two of the other's polls (every 50 ms) and the channel's few ms. Past it,
the room goes to whoever is here (work-conserving when the other cannot start it after all)."""


@dataclass(slots=True)
class PoolSpec:
    name: str
    engines: list[str]
    policy: str = "prefix"
    takes_priority: bool = False
    backfill: bool = True
    accept_overflow: bool = False
    policy_options: dict[str, object] = field(default_factory=dict)
    models: tuple[str, ...] = ()
    """Models the pool is declared to serve, besides what its engines list."""
    loadable: tuple[str, ...] = ()
    """LoRA adapters any of its engines may be asked to load on demand."""


@dataclass(slots=True)
class AdmissionSettings:
    enabled: bool = True
    limits: LimitSettings = field(default_factory=LimitSettings)
    max_queue: int = 4096
    backfill_reserve: float = 0.25
    min_retry_after_s: float = 1.0
    fair: bool = True
    """Tenants of a class share its queue by weighted fair queueing (off: one line by deadline)."""
    decode_tokens: int = DEFAULT_DECODE_TOKENS


@dataclass(slots=True, eq=False)
class Dispatch:
    request: RouteRequest
    engine: EngineState
    pool: str
    priority: int | None = None
    predicted_cached_tokens: int = 0
    reason: str = ""
    excluded: tuple[str, ...] = ()
    dispatched_at: float = 0.0
    prefill_tokens: int = 0
    """Uncached prompt tokens counted in the engine's ``pending_prefill`` until the first token."""
    preemptible: bool = False
    done: bool = False
    started: bool = False
    """The engine has scheduled it (first token, or the end): its cache hits are counted."""
    charge: Charge | None = None
    """What starting it charged its tenant in its class's fair queue, settled when it ends."""


@dataclass(slots=True, eq=False)
class Rejection:
    request: RouteRequest
    reason: Refusal
    message: str
    retry_after_s: float | None = None


@dataclass(slots=True, eq=False)
class Queued:
    request: RouteRequest
    pool: str


@dataclass(slots=True, eq=False)
class Preempted:
    """Stop this backfilled batch request now; it has been queued again and will restart."""

    dispatch: Dispatch

    @property
    def request(self) -> RouteRequest:
        return self.dispatch.request


Outcome = Dispatch | Queued | Rejection | Preempted
Answer = Dispatch | Queued | Rejection
Notice = Dispatch | Rejection | Preempted


@dataclass(slots=True, frozen=True)
class LimitChange:
    engine: str
    old: float
    new: float
    reason: str


@dataclass(slots=True, eq=False)
class Decisions:
    """Everything one call decided (see the module's rules)."""

    answer: Answer | None = None
    others: list[Notice] = field(default_factory=list)
    limit_changes: list[LimitChange] = field(default_factory=list)
    """Engines' limits that moved, or held for a new reason (``poll`` only), for the log."""

    def __iter__(self) -> Iterator[Outcome]:
        """The answer, then the others, in order."""
        if self.answer is not None:
            yield self.answer
        yield from self.others


class Pool:
    def __init__(self, spec: PoolSpec, classes: ClassTable, admission: AdmissionSettings) -> None:
        self.name = spec.name
        self.takes_priority = spec.takes_priority
        self.backfill = spec.backfill
        self.accept_overflow = spec.accept_overflow
        self.policy: Policy = make_policy(spec.policy, **spec.policy_options)
        self.engines: list[EngineState] = [EngineState(url, spec.name) for url in spec.engines]
        self.models = frozenset(spec.models) | frozenset(spec.loadable)
        self.loadable = frozenset(spec.loadable)
        self.queue = WaitQueue(classes, admission.fair, admission.decode_tokens)
        self.ttft_model = TTFTModel()
        self.slots = SlotTimes()

    def healthy(self, exclude: Iterable[str] = (), model: str | None = None) -> list[EngineState]:
        if model is not None and self.models and model not in self.models:
            return [e for e in self.healthy(exclude) if e.models is not None and model in e.models]
        if exclude:
            excluded = set(exclude)
            engines = [e for e in self.engines if e.healthy and e.id not in excluded]
        else:
            engines = [e for e in self.engines if e.healthy]
        if model is not None and model not in self.loadable:
            return [e for e in engines if e.serves(model)]
        return engines

    def serves(self, model: str) -> bool:
        return serves(self.models, [e.models for e in self.engines], model)

    def set_engines(self, urls: Sequence[str]) -> None:
        known = {e.id: e for e in self.engines}
        self.engines = [known.get(url) or EngineState(url, self.name) for url in urls]
        for gone in set(known) - set(urls):
            self.policy.forget(gone)


class Dispatcher:
    def __init__(
        self,
        pools: Sequence[PoolSpec],
        home: Mapping[str, str] | None = None,
        budgets: Mapping[str, float | None] | None = None,
        admission: AdmissionSettings | None = None,
        classes: ClassTable = DEFAULT_CLASSES,
    ) -> None:
        if not pools:
            raise ValueError("at least one pool is needed")
        self.classes = classes
        self.admission = admission or AdmissionSettings(enabled=False)
        self.pools: dict[str, Pool] = {spec.name: Pool(spec, classes, self.admission) for spec in pools}
        first = pools[0].name
        self.home: dict[str, str] = {
            cls: (home or {}).get(cls) or (cls if cls in self.pools else first) for cls in classes.names
        }
        self.itl_budgets: dict[str, float | None] = dict(budgets or {})
        self.tenants = TenantLoad()
        self.limits: dict[str, ConcurrencyLimit] = {}
        self._engines: dict[str, EngineState] = {}
        self._queued_pool: dict[str, Pool] = {}
        # What the call under way decided for other requests: handed out when it returns.
        self._notices: list[Notice] = []
        self._backfilled: dict[str, list[Dispatch]] = {}
        self._running: dict[str, set[Dispatch]] = {}
        # Sharing with other replicas (off until ``share_learning``).
        self._load_changed: set[str] | None = None
        self.peers = Peers()
        self.safe_share = SafeShare()
        self.fleet_tenants = FleetTenants()
        self._told_tenants: dict[Key, TenantShare] | None = None
        # Per pool, since when a start here has given way to another replica's tenant (``PEER_HOLD_S``).
        self._holding: dict[str, float] = {}
        self._drained_at: float | None = None
        self.holdings = Holdings()
        self._serial = 0
        self._in_transit: deque[tuple[int, dict[str, int]]] = deque()  # claims sent, not yet heard back
        self._claims_sent: dict[str, tuple[int, int]] = {}
        self._claims_stale: set[str] = set()  # engines whose claim may have changed
        self._claim_inputs: tuple[int, bool, dict[str, int]] = (1, False, {})  # replicas, safe, demand per pool
        self._granted = False
        self._own_id: bytes | None = None  # as this replica's own batches come back
        self._leaders: dict[str, bytes | None] = {}  # per engine, the replica whose limit this one follows
        self._reindex(0.0)

    # -- topology and health -------------------------------------------------

    def _reindex(self, now: float) -> None:
        self._engines = {e.id: e for pool in self.pools.values() for e in pool.engines}
        for engine_id, engine in self._engines.items():
            if engine_id not in self.limits:
                self.limits[engine_id] = ConcurrencyLimit(self._engine_budget(engine.pool), self.admission.limits, now)
        for gone in set(self.limits) - set(self._engines):
            del self.limits[gone]
        for gone in set(self._running) - set(self._engines):
            del self._running[gone]

    def _engine_budget(self, pool: str) -> float | None:
        """The tightest ITL budget among the classes whose home is this pool."""
        budgets = [self.itl_budgets.get(cls) for cls, home in self.home.items() if home == pool]
        present = [b for b in budgets if b is not None]
        return min(present) if present else None

    def engines(self) -> list[EngineState]:
        return list(self._engines.values())

    def engine(self, engine_id: str) -> EngineState | None:
        return self._engines.get(engine_id)

    def set_pool_engines(self, pool: str, urls: Sequence[str], now: float = 0.0) -> None:
        self.pools[pool].set_engines(urls)
        self._reindex(now)

    def set_health(self, engine_id: str, healthy: bool, now: float) -> None:
        engine = self._engines.get(engine_id)
        if engine is not None:
            engine.healthy = healthy

    def apply_scrape(self, engine_id: str, metrics: EngineMetrics, now: float) -> None:
        engine = self._engines.get(engine_id)
        if engine is not None:
            engine.apply_scrape(metrics, now)
            self.pools[engine.pool].policy.scraped(engine)
            if metrics.itl_buckets:
                self.limits[engine_id].observe_engine_itl(metrics.itl_buckets, now)

    def apply_kv_events(self, engine_id: str, events: Sequence[KVEvent], now: float, restarted: bool = False) -> None:
        """An engine's KV cache events (precise prefix mode)."""
        engine = self._engines.get(engine_id)
        if engine is not None:
            self.pools[engine.pool].policy.kv_events(engine_id, events, restarted)

    # -- what replicas tell each other (``core/sharing.py``) -----------------------------------

    def share_learning(self, max_pending: int = 10_000) -> None:
        """Keep routing facts and load changes for other replicas (``take_learned``)."""
        if self._load_changed is None:
            self._load_changed = set()
        if self._told_tenants is None:
            self._told_tenants = {}
        for pool in self.pools.values():
            share = getattr(pool.policy, "share", None)
            if share is not None:
                share(max_pending)

    def take_learned(self, full: bool = False, now: float | None = None) -> Learned:
        """What to tell the other replicas since the last call; ``full``: this replica's load on every engine
        and, given ``now``, what its requests' gaps showed on each (``limiter.Evidence``)."""
        facts = [fact for pool in self.pools.values() for fact in getattr(pool.policy, "take_learned", list)()]
        changed, self._load_changed = self._load_changed or set(), set()
        engines = self._engines
        wants = self._claims(changed, full) if self.admission.enabled else {}
        if full:
            load = {e.id: own for e in engines.values() if (own := self._own_load(e, wants.get(e.id, (0, 0))))}
        else:
            load = {i: self._own_load(engines[i], wants.get(i, (0, 0))) for i in changed | set(wants) if i in engines}
        self._serial += 1
        if wants:
            self._in_transit.append((self._serial, {i: max(entry.claim, entry.spare) for i, entry in load.items()}))
        evidence = {}
        if full and now is not None and self.admission.enabled:
            evidence = {i: limit.evidence(now) for i, limit in self.limits.items() if limit.budget_s is not None}
        return Learned(facts, load, full, self._serial, evidence)

    def _own_load(self, engine: EngineState, wants: tuple[int, int]) -> EngineLoad:
        limit = self.limits.get(engine.id) if self.admission.enabled else None
        learned = limit.limit if limit is not None and limit.learned else 0.0
        return EngineLoad(engine.inflight, engine.pending_prefill, learned, *wants, self._cap(engine.id))

    def _claims(self, changed: set[str], full: bool) -> dict[str, tuple[int, int]]:
        """This replica's (claim, spare) on each engine where they changed or whose load goes out anyway."""
        inputs = (1 + len(self.peers), self.safe_share.safe, self._demand())
        replicas, safe, demand = inputs
        last, self._claim_inputs = self._claim_inputs, inputs
        if full or last[:2] != inputs[:2]:
            stale: Iterable[str] = self._engines
        else:
            moved = {name for name, n in demand.items() if last[2].get(name) != n}
            stale = self._claims_stale | changed | {e.id for name in moved for e in self.pools[name].engines}
        self._claims_stale = set()
        out = {}
        for engine_id in stale:
            engine = self._engines.get(engine_id)
            if engine is None:
                continue
            wanted = (0, 0)
            if not safe:
                slots, free, held, waiting = self.holdings.view(engine_id, self._fixed_limit(engine_id))
                wanted = claims(engine.inflight, demand[engine.pool], held, slots, replicas, waiting, free < 0)
            if full or engine_id in changed or wanted != self._claims_sent.get(engine_id, (0, 0)):
                out[engine_id] = self._claims_sent[engine_id] = wanted
        return out

    def _demand(self) -> dict[str, int]:
        """Requests waiting at this replica that each pool's engines are there for: its own queue, and
        interactive work other pools overflow into it. Batch work that could backfill is left out: it
        fills only slots a replica holds anyway, never claims any (the backfill reserve kept free for
        interactive work would otherwise be held by whoever has batch work queued). Nor do requests of
        tenants that may not take the slots: at their cap, or over their share (a slot claimed for
        them would sit free while a tenant under its share waits at another replica)."""
        out = {name: self._may_take_slots(pool) for name, pool in self.pools.items()}
        interactive = {name: p.queue.depth_of(self.classes.interactive_like) for name, p in self.pools.items()}
        for name, pool in self.pools.items():
            if pool.accept_overflow:
                out[name] += sum(n for other, n in interactive.items() if other != name)
        return out

    def _may_take_slots(self, pool: Pool) -> int:
        """Requests waiting in ``pool`` whose tenants may take its free slots: not at their cap nor over their share."""
        if not self.admission.fair or not len(pool.queue):
            return len(pool.queue)
        # As the last drain saw it: a tenant held back for another replica's claims no slot either,
        # so that replica can claim the one this replica leaves it.
        over = self._over_share(pool, self._drained_at)
        return sum(n for t, (n, _) in pool.queue.backlog().items() if self._has_room(t) and not over(t))

    def _fixed_limit(self, engine_id: str) -> float:
        limit = self.limits.get(engine_id)
        return limit.limit if limit is not None else 0.0

    def learn(self, batch: Batch, now: float) -> tuple[int, int]:
        """Apply another replica's batch: its routing facts teach the prefix policy which blocks the
        engines hold, its load adds to this replica's view. Engines this replica does not know are
        ignored. Returns the facts applied and the publisher's batches missed before this one."""
        missed = self.peers.heard(batch.publisher, batch.sequence, now)
        self.safe_share.heard(batch.publisher, now)
        # Load first: the facts' prompts are in it, and the index makes room for them by it.
        known = {e: load for e, load in batch.learned.load.items() if e in self._engines}
        if batch.learned.full:
            evidence = batch.learned.evidence
            self.peers.report_evidence(batch.publisher, {e: v for e, v in evidence.items() if e in self._engines})
        self._peer_load_changed(self.peers.report(batch.publisher, known, batch.learned.full), now, batch.learned.full)
        self._apply_holdings(batch.publisher, known, batch.learned.full)
        applied = 0
        for fact in batch.learned.facts:
            engine = self._engines.get(fact.engine)
            learn = engine is not None and getattr(self.pools[engine.pool].policy, "learn", None)
            if learn:
                learn(fact, engine)
                applied += 1
        return applied, missed

    def take_tenant_shares(self, full: bool = False) -> TenantShares:
        """This replica's tenants per pool (running, queued, weight) that changed since the last call,
        or all of them (``full``), for the other replicas (``core/tenant_share.py``); nothing to tell
        without fair queueing."""
        told = self._told_tenants
        if told is None or not self.shares_tenants:
            return TenantShares()
        now = self._told_tenants = self._own_tenant_shares()
        if full:
            return TenantShares(dict(now), full=True)
        changed = {key: share for key, share in now.items() if told.get(key) != share}
        for key in told.keys() - now.keys():
            changed[key] = TenantShare(0, 0, told[key].weight)
        return TenantShares(changed)

    @property
    def shares_tenants(self) -> bool:
        """Tenants' requests go to the other replicas (sharing on, and fair queueing to use them)."""
        return self._told_tenants is not None and self.admission.enabled and self.admission.fair

    def _own_tenant_shares(self) -> dict[Key, TenantShare]:
        out: dict[Key, TenantShare] = {}
        for name, pool in self.pools.items():
            backlog = pool.queue.backlog()
            running = self.tenants.running(name)
            for tenant in running.keys() | backlog.keys():
                queued, weight = backlog.get(tenant, (0, self.tenants.weight(tenant)))
                out[(name, tenant)] = TenantShare(running.get(tenant, 0), queued, weight)
        return out

    def learn_tenants(self, batch: TenantBatch, now: float) -> None:
        """Another replica's tenants: their requests count in every tenant's share of a pool from now on."""
        self.fleet_tenants.report(batch, now)

    def heard_own(self, batch: Batch, serial: int) -> None:
        """This replica's own batch came back through the channel (``serial``: its ``Learned.serial``):
        its claims take their place in the order every replica applies them."""
        self._own_id = batch.publisher  # who leads is reconsidered with the next full batch heard
        ending = [sent for sent_serial, sent in self._in_transit if sent_serial <= serial]
        if ending:
            caps = {e: self._cap(e) for e in set().union(*ending)}
            for _ in ending:
                self._in_transit.popleft()
            self._granted = self._granted or any(self._cap(e) > cap for e, cap in caps.items())
        known = {e: load for e, load in batch.learned.load.items() if e in self._engines}
        self._apply_holdings(SELF, known, batch.learned.full)

    def _apply_holdings(self, publisher: bytes, load: dict[str, EngineLoad], full: bool) -> None:
        if not self.admission.enabled:
            return
        self._claims_stale |= self.holdings.apply(publisher, load, full, self._fixed_limit)
        # Queued requests may start only where this replica's holding grew.
        self._granted = self._granted or self.holdings.grew
        self.holdings.grew = False

    def admit_granted(self, now: float) -> Decisions:
        """Start what the slots granted since the last call let start."""
        if self._granted and self.admission.enabled:
            self._granted = False
            self._drain(now)
        return Decisions(None, self._take_notices())

    def expire_peers(self, now: float, silent_s: float) -> None:
        """Forget what replicas not heard from within ``silent_s`` said (they stopped, or the channel broke)."""
        self._peer_load_changed(self.peers.expire(now, silent_s), now)
        self.fleet_tenants.expire(now, silent_s)
        self._claims_stale |= self.holdings.keep(self.peers.__contains__)

    def share_joining(self) -> None:
        """This replica has just started: admit the safe share until it has heard every other replica."""
        if self.admission.enabled:
            self.safe_share.join()

    def lost_peers(self, now: float | None = None) -> bool:
        """The channel is down: route on this replica's own knowledge (and the engines' scrapes) alone,
        tenants' shares counted on its own requests alone, and admit at most the safe share of each
        limit. What the others last reported in flight is still running as far as anyone knows: it
        counts as the engines' own load until their next scrape says what is left. True when the
        safe share began now."""
        for engine in self._engines.values():
            engine.external_load += engine.peer_inflight
        self._peer_load_changed(self.peers.clear(), 0.0 if now is None else now)
        self.fleet_tenants.clear()
        self.holdings.clear()
        self._in_transit.clear()
        return self.admission.enabled and self.safe_share.lost(math.inf if now is None else now)

    def share_resumed(self, now: float) -> None:
        """The channel works again: the safe share ends once the others' loads are back (``settle_share``)."""
        self.safe_share.resumed(now)

    def settle_share(self, now: float) -> bool:
        """True when the safe share ended now: admission counts the others' in-flight again."""
        return self.safe_share.settle(now)

    def _peer_load_changed(self, engines: set[str], now: float, leaders_moved: bool = True) -> None:
        """``leaders_moved``: who learns the limits may have changed (full batches, replicas forgotten)."""
        if leaders_moved:
            leaders = {engine_id: self._leader(engine_id) for engine_id in self.limits}
            # A new leader's limit is taken whether or not its load moved.
            engines = engines | {e for e, leader in leaders.items() if self._leaders.get(e) != leader}
            self._leaders = leaders
        for engine_id in engines:
            engine = self._engines.get(engine_id)
            if engine is not None:
                engine.peer_inflight = self.peers.inflight(engine_id)
                engine.peer_prefill = self.peers.prefill(engine_id)
                engine.peer_limits = self.peers.limits(engine_id)
                own = self.limits.get(engine_id)
                if own is None or not self.admission.enabled:
                    continue
                own.note_load(engine.load)  # the others' requests bring the fleet's load to the limit too
                leader = self._leaders.get(engine_id)
                if leader is not None:
                    limit = self.peers.limit_of(leader, engine_id)
                    if limit > 0 and own.follow(limit, now):
                        self._load_change(engine)
                elif engine.peer_limits:
                    own.adopt(sum(engine.peer_limits) / len(engine.peer_limits))

    def _leader(self, engine_id: str) -> bytes | None:
        """The replica that learns ``engine_id``'s limit for the fleet, when it is another (None: this one):
        the lowest id of those that learn it. Until its own batches come back this one does not know
        its id, and leads only while it hears nobody who learns it."""
        lowest = self.peers.lowest(engine_id)
        if lowest is None or (self._own_id is not None and self._own_id < lowest):
            return None
        return lowest

    def _load_change(self, engine: EngineState) -> None:
        if self._load_changed is not None:
            self._load_changed.add(engine.id)

    def queue_depths(self) -> dict[tuple[str, str], int]:
        return {(name, cls): pool.queue.depth(cls) for name, pool in self.pools.items() for cls in self.classes.names}

    def tenant_inflight(self) -> dict[str, int]:
        return dict(self.tenants.inflight)

    def tenant_queued(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for pool in self.pools.values():
            for cls in self.classes.names:
                for tenant, n in pool.queue.tenants(cls).items():
                    out[(tenant, cls)] = out.get((tenant, cls), 0) + n
        return out

    def prefix_hit_estimates(self) -> dict[str, float]:
        return {name: pool.policy.hit_ratio_estimate() for name, pool in self.pools.items()}

    def concurrency_limits(self) -> dict[str, float]:
        """Each engine's limit as admission applies it (the fleet's, or this replica's safe share of it)."""
        if not self.admission.enabled:
            return {}
        return {engine_id: self._capacity(engine)[1] for engine_id, engine in self._engines.items()}

    def held_slots(self) -> dict[str, int]:
        """The slots this replica may fill on each engine while it fills them within its holdings."""
        if not self._within_holdings():
            return {}
        return {engine_id: self._cap(engine_id) for engine_id in self._engines}

    def _within_holdings(self) -> bool:
        """Whether admission fills engines within this replica's holdings: it shares with other replicas
        it hears, outside the safe share."""
        sharing = self._load_changed is not None and self.admission.enabled
        return sharing and not self.safe_share.safe and bool(self.peers)

    def _fleet_limit(self, engine: EngineState) -> float:
        own = self.limits[engine.id]
        peers = engine.peer_limits
        if not peers:
            return own.limit
        return fleet_limit((own.limit, *peers) if own.learned else peers)

    def _capacity(self, engine: EngineState) -> tuple[float, float]:
        """(load counted, limit) for admission: everyone's load against the fleet's limit, or in the
        safe share this replica's own in-flight against its share, and what the engine holds beyond
        the others' shares (its scraped load, or the others' in-flight heard) on top of it."""
        limit = self._fleet_limit(engine)
        if self.safe_share.safe and self.safe_share.replicas > 1:
            share = self.safe_share.share(limit)
            return max(float(engine.inflight), engine.load - (limit - share)), share
        return engine.load, limit

    def _cap(self, engine_id: str) -> int:
        """The slots this replica may fill on an engine: the least of its holding and its claims in transit
        (also what it states it holds: a release in transit must not come back with a later batch)."""
        cap = self.holdings.held(engine_id)
        for _, sent in self._in_transit:
            cap = min(cap, sent.get(engine_id, cap))
        return cap

    def _held_room(self, engine: EngineState) -> float:
        """What this replica may still start on ``engine`` within its cap (any number alone, or in the safe
        share); while another replica waits there below its fair share, no more than its own: slots it
        frees beyond that go to that replica with its next claim, not to its own queue."""
        if not self._within_holdings():
            return math.inf
        cap = self._cap(engine.id)
        if waiters := self.holdings.waiters(engine.id):
            share = yield_to(self.holdings.slots(engine.id, self._fixed_limit(engine.id)), waiters)
            if share is not None:
                cap = min(cap, share)
        return cap - engine.inflight

    def _room(self, engine: EngineState) -> float:
        load, limit = self._capacity(engine)
        return min(limit - load, self._held_room(engine))

    def ready(self) -> dict[str, bool]:
        return {name: any(e.healthy for e in pool.engines) for name, pool in self.pools.items()}

    # -- the request path ----------------------------------------------------

    def pool_for(self, cls: str, model: str | None = None) -> Pool:
        home = self.pools[self.home[cls]]
        if model is None or home.serves(model):
            return home
        return next((p for p in self.pools.values() if p.serves(model)), home)

    def submit(self, req: RouteRequest, now: float, exclude: Sequence[str] = ()) -> Decisions:
        answer = self._submit(req, now, exclude)
        return Decisions(answer, self._take_notices())

    def _submit(self, req: RouteRequest, now: float, exclude: Sequence[str] = ()) -> Answer:
        pool = self.pool_for(req.cls, req.model)
        if not self.admission.enabled:
            choice = pool.policy.choose(req, pool.healthy(exclude, req.model), now)
            if choice is None:
                return self._no_engine(req, pool, exclude)
            return self._start(req, pool, choice, now, exclude)
        if not any(e.healthy for e in pool.engines) and not self._overflow_pools(req):
            return self._no_engine(req, pool, exclude)
        self.tenants.note(req.tenant, req.max_concurrency, req.weight)
        room = self._has_room(req.tenant)
        if room and pool.queue.position(req, math.inf, self._ahead_of(req, pool, now)) == 0:
            placed = self._place(req, pool, now, exclude)
            if placed is not None:
                placed.charge = pool.queue.charge(req)
                return placed
        return self._enqueue(req, pool, now)

    def admit_anyway(self, req: RouteRequest, now: float) -> Dispatch | None:
        """Start ``req`` where its pool's policy would, past any limit or queue (what-if experiments)."""
        pool = self.pool_for(req.cls, req.model)
        choice = pool.policy.choose(req, pool.healthy((), req.model), now)
        return None if choice is None else self._start(req, pool, choice, now, ())

    def _no_engine(self, req: RouteRequest, pool: Pool, exclude: Sequence[str]) -> Rejection:
        after = " after a failed attempt" if exclude else ""
        return Rejection(req, Refusal.NO_HEALTHY_ENGINE, f"no healthy engine in pool {pool.name!r}{after}", 1.0)

    def _with_room(
        self, pool: Pool, exclude: Sequence[str], reserve: float = 0.0, model: str | None = None
    ) -> list[EngineState]:
        return [e for e in pool.healthy(exclude, model) if self._room(e) > reserve]

    def _backfill_room(self, pool: Pool, exclude: Sequence[str], model: str | None = None) -> list[EngineState]:
        """Engines of ``pool`` with room to spare beyond a reserve kept for their own class (at least one slot)."""
        out = []
        for engine in pool.healthy(exclude, model):
            load, limit = self._capacity(engine)
            if load < limit - max(1.0, self.admission.backfill_reserve * limit) and self._held_room(engine) >= 1:
                out.append(engine)
        return out

    def _tenant_room(
        self, tenant: str, pool: Pool, now: float, exclude: Sequence[str] = (), model: str | None = None
    ) -> list[EngineState]:
        """Engines with room for ``tenant``: one that must leave the pool's reserve to the others
        (``TenantLoad.over_share``) starts only where an engine keeps the backfill reserve free."""
        if self._over_share(pool, now)(tenant):
            return self._backfill_room(pool, exclude, model)
        return self._with_room(pool, exclude, model=model)

    def _over_share(self, pool: Pool, now: float | None) -> Callable[[str], bool]:
        """Whether a tenant may take only the backfill reserve of ``pool`` now: it is at or over its
        weighted share of the slots, or (``now`` given, for ``PEER_HOLD_S`` at most) another replica
        has a tenant waiting that is further below its own share."""
        if not self.admission.fair:
            return lambda tenant: False
        slots = sum(self._capacity(e)[1] for e in pool.healthy())
        queued = {tenant: weight for tenant, (_, weight) in pool.queue.backlog().items()}
        others = self.fleet_tenants.of(pool.name)
        over = self.tenants.over_share(pool.name, slots, queued, others)
        waiting = {tenant: w for tenant, (_, q, w) in others.items() if q}
        if not waiting or now is None or not self._yielding(pool.name, now):
            return over
        running = self.tenants.running(pool.name)
        for tenant, (n, _, _) in others.items():
            running[tenant] = running.get(tenant, 0) + n
        weights = {t: w for t, (_, _, w) in others.items()} | queued

        def after_one_more(tenant: str) -> float:
            weight = weights.get(tenant) or self.tenants.weight(tenant)
            return (running.get(tenant, 0) + 1) / weight

        # Another replica's waiting tenants that could start (under their share), least served first.
        behind = sorted((after_one_more(t), t) for t, w in waiting.items() if not over(t))
        if not behind:
            return over

        def held_back(tenant: str) -> bool:
            first = next((usage for usage, t in behind if t != tenant), None)
            return first is not None and first < after_one_more(tenant)

        return lambda tenant: over(tenant) or held_back(tenant)

    def _yielding(self, pool: str, now: float) -> bool:
        """Starts in ``pool`` still give way to other replicas' tenants: not for ``PEER_HOLD_S`` already."""
        since = self._holding.get(pool)
        return since is None or now - since < PEER_HOLD_S

    def _may_start(self, pool: Pool, now: float | None) -> Callable[[str], bool]:
        """Whether a tenant's queued request could start in ``pool`` now (its cap, its share, the room)."""
        over = self._over_share(pool, now)
        spare = bool(self._backfill_room(pool, ()))
        room = bool(self._with_room(pool, ()))
        return lambda tenant: self._has_room(tenant) and (spare if over(tenant) else room)

    def _ahead_of(self, req: RouteRequest, pool: Pool, now: float) -> Callable[[str], bool]:
        """Whether a tenant's queued requests may start before ``req``: not at its cap, and not over
        its share when ``req``'s tenant is under its own (slots freed then go to those under)."""
        over = self._over_share(pool, now)
        if over(req.tenant):
            return self._has_room
        return lambda tenant: self._has_room(tenant) and not over(tenant)

    def _has_room(self, tenant: str) -> bool:
        """``tenant`` is below its concurrency cap, counting what the other replicas run of it."""
        return self.tenants.has_room(tenant, self.fleet_tenants.running(tenant) if len(self.fleet_tenants) else 0)

    def _overflow_pools(self, req: RouteRequest) -> list[Pool]:
        if self.classes.is_batch(req.cls):
            return []
        home = self.pool_for(req.cls, req.model).name
        return [p for p in self.pools.values() if p.name != home and p.accept_overflow and p.serves(req.model)]

    def _place(self, req: RouteRequest, pool: Pool, now: float, exclude: Sequence[str] = ()) -> Dispatch | None:
        """Start ``req`` on an engine with room, or return None."""
        model = req.model
        choice = pool.policy.choose(req, self._tenant_room(req.tenant, pool, now, exclude, model), now)
        if choice is not None:
            return self._start(req, pool, choice, now, exclude)
        if self.classes.is_batch(req.cls):
            for other in self.pools.values():
                if other is pool or not other.backfill or other.queue.depth_of(self.classes.interactive_like):
                    continue
                choice = other.policy.choose(req, self._backfill_room(other, exclude, model), now)
                if choice is not None:
                    return self._start(req, other, choice, now, exclude, reason="backfill")
            return None
        for other in self._overflow_pools(req):
            choice = other.policy.choose(req, self._with_room(other, exclude, model=model), now)
            if choice is not None:
                return self._start(req, other, choice, now, exclude, reason="overflow")
        if self._preempt_backfill(pool, exclude, now, model):
            choice = pool.policy.choose(req, self._with_room(pool, exclude, model=model), now)
            if choice is not None:
                return self._start(req, pool, choice, now, exclude, reason="preempted_backfill")
        return None

    def _preempt_backfill(self, pool: Pool, exclude: Sequence[str], now: float, model: str | None = None) -> bool:
        """Free a slot in ``pool`` by stopping the youngest restartable batch request backfilled there."""
        victims = [
            d
            for e in pool.healthy(exclude, model)
            if self._room(e) + 1 > 0  # one stop must be enough to make room
            for d in self._backfilled.get(e.id, ())
            if not d.done and d.preemptible
        ]
        if not victims:
            return False
        victim = max(victims, key=lambda d: d.dispatched_at)
        self._release(victim, ok=False)
        self._notices.append(Preempted(victim))
        home = self.pool_for(victim.request.cls, victim.request.model)
        # It is charged again when it restarts from scratch: the first charge is refunded.
        self._settle(victim, 0)
        home.queue.push(victim.request, self._start_deadline(victim.request, home), now)
        self._queued_pool[victim.request.id] = home
        return True

    def _start_deadline(self, req: RouteRequest, pool: Pool) -> float:
        if req.budget.ttft_s is not None:
            # Margin: the line predicts a typical first token, the budget bounds the p99.
            expected = 1.2 * (pool.ttft_model.predict(req.prompt_tokens) or 0.0)
            return req.arrival + max(0.0, req.budget.ttft_s - expected)
        if req.budget.deadline_s is not None:
            return req.arrival + req.budget.deadline_s
        return math.inf

    def _enqueue(self, req: RouteRequest, pool: Pool, now: float) -> Answer:
        deadline = self._start_deadline(req, pool)
        ahead = self._ahead_of(req, pool, now)
        wait = None
        if req.budget.ttft_s is not None:
            wait = self._expected_wait(pool, pool.queue.position(req, deadline, ahead), now)
            if deadline <= now or (wait is not None and now + wait > deadline):
                return self._refuse_slo(req, wait)
        if len(pool.queue) >= self.admission.max_queue:
            if wait is None:
                wait = self._expected_wait(pool, pool.queue.position(req, deadline, ahead), now)
            if self.classes.is_batch(req.cls) or pool.queue.depth_of(self.classes.batch_like) == 0:
                full = f"the {pool.name!r} queue is full"
                return Rejection(req, Refusal.QUEUE_FULL, full, self._retry_after(wait))
            victim = pool.queue.shed()
            assert victim is not None
            self._queued_pool.pop(victim.request.id, None)
            self._notices.append(
                Rejection(
                    victim.request, Refusal.SHED, "shed to make room for interactive work", self._retry_after(wait)
                )
            )
        pool.queue.push(req, deadline, now)
        self._queued_pool[req.id] = pool
        return Queued(req, pool.name)

    def _expected_wait(self, pool: Pool, position: int, now: float) -> float | None:
        """Time until ``position`` requests ahead have started, from when the running ones end."""
        engines = [
            FullEngine(*self._capacity(e), [self._run(d, pool) for d in self._running.get(e.id, ())])
            for e in pool.healthy()
        ]
        return pool.slots.wait(position, engines, now)

    @staticmethod
    def _run(dispatch: Dispatch, pool: Pool) -> Running:
        first = pool.ttft_model.predict(dispatch.request.prompt_tokens) or 0.0
        return Running(dispatch.dispatched_at, first, dispatch.request.max_tokens)

    def _retry_after(self, wait: float | None) -> float:
        return max(self.admission.min_retry_after_s, wait or 0.0)

    def _refuse_slo(self, req: RouteRequest, wait: float | None) -> Rejection:
        budget_ms = int((req.budget.ttft_s or 0) * 1000)
        return Rejection(
            req,
            Refusal.SLO_BUDGET_EXCEEDED,
            f"cannot start within the {budget_ms} ms time-to-first-token budget; retry later",
            self._retry_after(wait),
        )

    def _start(
        self,
        req: RouteRequest,
        pool: Pool,
        choice: Choice,
        now: float,
        exclude: Sequence[str],
        reason: str | None = None,
    ) -> Dispatch:
        engine = choice.engine
        engine.started(req.cls, req.adapter)
        self.tenants.started(req.tenant, req.max_concurrency, req.weight, pool.name)
        prefill = max(0, req.prompt_tokens - choice.predicted_cached_tokens)
        engine.pending_prefill += prefill
        self._load_change(engine)
        pool.policy.routed(req, choice, now)
        if self.admission.enabled:
            self.limits[engine.id].note_load(engine.load)
        priority = self.classes.priority(req.cls) if pool.takes_priority else None
        dispatch = Dispatch(
            req,
            engine,
            pool.name,
            priority=priority,
            predicted_cached_tokens=choice.predicted_cached_tokens,
            reason=reason or choice.reason,
            excluded=tuple(exclude),
            dispatched_at=now,
            prefill_tokens=prefill,
            preemptible=reason == "backfill" and req.restartable,
        )
        if dispatch.preemptible:
            self._backfilled.setdefault(engine.id, []).append(dispatch)
        self._running.setdefault(engine.id, set()).add(dispatch)
        return dispatch

    def _prefilled(self, dispatch: Dispatch, ok: bool = True) -> None:
        if not dispatch.started and ok:
            dispatch.started = True
            self.pools[dispatch.engine.pool].policy.started(
                dispatch.engine.id, dispatch.predicted_cached_tokens, dispatch.request.prompt_tokens
            )
        if dispatch.prefill_tokens:
            dispatch.engine.pending_prefill -= dispatch.prefill_tokens
            dispatch.prefill_tokens = 0
            self._load_change(dispatch.engine)

    def _release(self, dispatch: Dispatch, ok: bool = True) -> None:
        dispatch.done = True
        dispatch.engine.finished(dispatch.request.cls, dispatch.request.adapter)
        self._load_change(dispatch.engine)
        self.tenants.finished(dispatch.request.tenant, dispatch.pool)
        self._prefilled(dispatch, ok)
        backfilled = self._backfilled.get(dispatch.engine.id)
        if backfilled and dispatch in backfilled:
            backfilled.remove(dispatch)
        running = self._running.get(dispatch.engine.id)
        if running is not None:
            running.discard(dispatch)

    def _settle(self, dispatch: Dispatch, actual: float) -> None:
        charge, dispatch.charge = dispatch.charge, None
        if charge is not None:
            req = dispatch.request
            self.pool_for(req.cls, req.model).queue.settle(req, charge, actual)

    def finish(
        self, dispatch: Dispatch, now: float, ok: bool = True, generated: int | None = None, prompt: int | None = None
    ) -> Decisions:
        """The dispatched request ended (``ok``: the engine answered); idempotent.

        ``generated``: the tokens it generated and ``prompt`` its prompt's tokens, as the engine counted
        them (unknown: the estimate): its tenant's charge is settled to that real cost, generated
        tokens at most ``max_tokens`` (a broken engine's count must not starve the tenant). Without
        ``generated`` the predicted cost stands."""
        if not dispatch.done:
            if generated is not None:
                req = dispatch.request
                if req.max_tokens is not None:
                    generated = min(generated, req.max_tokens)
                self._settle(dispatch, (req.prompt_tokens if prompt is None else prompt) + generated)
            self._release(dispatch, ok)
            if ok and self.admission.enabled:
                pool = self.pools[dispatch.engine.pool]
                pool.slots.observe_done(self._run(dispatch, pool), now - dispatch.dispatched_at)
        if self.admission.enabled:
            self._drain(now)
        return Decisions(None, self._take_notices())

    def _expire(self, now: float) -> None:
        """Refuse the queued requests whose start deadline has passed."""
        out = self._notices
        for pool in self.pools.values():
            for entry in pool.queue.expired(now):
                self._queued_pool.pop(entry.request.id, None)
                req = entry.request
                if req.budget.ttft_s is not None:
                    out.append(self._refuse_slo(req, None))
                else:
                    out.append(
                        Rejection(
                            req,
                            Refusal.DEADLINE_EXCEEDED,
                            "the request's deadline passed while queued",
                            self.admission.min_retry_after_s,
                        )
                    )

    def _drain(self, now: float) -> None:
        """Start queued requests while they fit, in queue order, each pool in turn."""
        self._drained_at = now
        out = self._notices
        for pool in self.pools.values():
            queue = pool.queue
            while (entry := queue.peek(self._may_start(pool, now))) is not None:
                if entry.deadline < now:
                    # Its deadline passed since the last poll: refused, never started late.
                    self._expire(now)
                    continue
                # A placement may preempt someone: that notice goes out before any later
                # dispatch of the same request, since both land in ``out`` in order.
                placed = self._place(entry.request, pool, now)
                if placed is None:
                    break
                taken = queue.take(entry.request)
                placed.charge = taken.charge if taken is not None else None
                self._queued_pool.pop(entry.request.id, None)
                out.append(placed)
            self._note_holding(pool, now)

    def _note_holding(self, pool: Pool, now: float) -> None:
        """Left room in ``pool`` to another replica's tenant (something of ours could start there were it
        not for them): since when, to stop giving way after ``PEER_HOLD_S``."""
        held = (
            len(self.fleet_tenants) > 0
            and len(pool.queue) > 0
            and pool.queue.peek(self._may_start(pool, None)) is not None
            and bool(self._with_room(pool, ()))
        )
        if held:
            self._holding.setdefault(pool.name, now)
        else:
            self._holding.pop(pool.name, None)

    def _take_notices(self) -> list[Notice]:
        notices, self._notices = self._notices, []
        return notices

    def retry(self, dispatch: Dispatch, now: float) -> Decisions:
        """The engine refused the connection before any byte: try another of the pool once."""
        # Nothing was served, and the new attempt is charged again: the first charge is refunded.
        released = self.finish(dispatch, now, ok=False, generated=0, prompt=0)
        decided = self.submit(dispatch.request, now, exclude=(*dispatch.excluded, dispatch.engine.id))
        decided.others[:0] = released.others
        return decided

    def poll(self, now: float) -> Decisions:
        """Refuse what can no longer start in time, update limits, start what now fits."""
        if not self.admission.enabled:
            return Decisions()
        self._expire(now)
        changes = []
        for engine_id, limit in self.limits.items():
            before, why = limit.limit, limit.reason
            lead = self._leaders.get(engine_id) is None
            limit.update(now, self._engines[engine_id].load, self.peers.evidence(engine_id), lead)
            if limit.limit != before or limit.reason != why:
                changes.append(LimitChange(engine_id, before, limit.limit, limit.reason))
                self._load_change(self._engines[engine_id])
        self._drain(now)
        return Decisions(None, self._take_notices(), changes)

    def cancel(self, req: RouteRequest, now: float) -> Decisions:
        """The client left: free its place in the queue (a place freed may let others start)."""
        pool = self._queued_pool.pop(req.id, None)
        if pool is not None:
            pool.queue.remove(req)
            if self.admission.enabled:
                self._drain(now)
        return Decisions(None, self._take_notices())

    # -- observations from the relay -----------------------------------------

    def observe_ttft(self, dispatch: Dispatch, seconds: float, now: float) -> None:
        self._prefilled(dispatch)
        limit = self.limits.get(dispatch.engine.id)
        if limit is None:
            return
        engine_side = max(0.0, seconds - (dispatch.dispatched_at - dispatch.request.arrival))
        pool = self.pools[dispatch.engine.pool]
        pool.ttft_model.observe(dispatch.request.prompt_tokens, engine_side)

    def observe_itl(self, dispatch: Dispatch, seconds: float, now: float) -> None:
        limit = self.limits.get(dispatch.engine.id)
        if limit is not None:
            limit.observe_itl(seconds, dispatch.engine.load, now)
            self.pools[dispatch.engine.pool].slots.observe_gap(seconds)
