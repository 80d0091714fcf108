"""Admission: which request starts where and when, in one sans-I/O state machine.

Rules:
- Every call that decides something (``submit``, ``retry``, ``finish``, ``poll``, ``cancel``) returns
  all of it in one ``Decisions`` (``decisions``); every ``Dispatch`` is paired with exactly one
  ``finish``, which keeps in-flight counts, and so routing and admission, honest.
- A class goes to its home pool when that serves the request's model, else to the first pool that
  does; inside it, the pool's policy picks among the healthy engines that serve the model and have
  room (``capacity``: the one gate, whatever the channel to other replicas is doing).
- A request with a TTFT budget starts on an engine only while its first token can come in time there:
  the prefill queued on the engine (this replica's and the others') and its own uncached part, at the
  pace the pool's first tokens showed (``ttft_model``: its line predicts a typical first token, times the
  margin that its late first tokens steer, since the budget bounds a p99); engines where it would be
  late are passed over.
- With admission on, a request that finds no room waits in its pool's queue, classes by rank, tenants
  by weighted fair queueing (``queue``, ``fair_queue``), until it can start; an interactive-kind
  request that cannot get a slot within its TTFT budget (the slots' predicted ends, ``slots``) is
  refused at once (``slo_budget_exceeded``), and a queued one is refused when its start deadline
  passes, never started late. While the pool has room for the request, those ahead of it wait for
  the prefill queued on the engines (the first-token check), not for slots: it is queued, and its
  start deadline answers it.
- Tenants (``fairness``, ``tenant_room``): one at its cap starts nothing more; one over its share
  starts only where an engine keeps the backfill reserve free.
- A drain starts what can start, in queue order: an entry that cannot be placed now (its model's
  engines are full, its tenant must leave the reserve alone) does not hold back those behind it that
  can. Once nothing of the pool has room it stops; it tries at most ``MAX_PASSED_OVER`` entries that
  do not start, so its cost stays bounded whatever the queue holds.
- Batch requests may also start on engines of the interactive pool (backfill) while those keep their
  reserve free and no interactive request waits there; an interactive request that finds no room
  stops a restartable backfilled one (``preemption``). Interactive requests may overflow into a pool
  that accepts them; such pools run vLLM's priority scheduling and get ``priority`` written.
- When a queue is full, the newest batch request of the heaviest batch tenant is shed to make room;
  a batch request that finds the queue full of interactive work is refused.
- A started request's charge (predicted prompt + decode tokens) is settled when it ends with the real
  count the caller reports, generated tokens at most ``max_tokens``; a preempted or retried attempt's
  charge is refunded, since it is charged again when it starts again.
- Agent sessions (``turns``): a request naming a session is a turn of it; a continuing one queues in
  the continuing lane and may wait for its session's engine, holding back nobody behind it meanwhile.
- What this replica shares with others, and hears from them, is the fleet's (``fleet``): the
  dispatcher reads it only through ``Capacity``, ``TenantFairness`` and ``TenantRoom``, and tells it which engines'
  load changed.
- A pool declared to share its devices with another (``PoolSpec.shares_hardware_with``) learns its
  engines' limits from that pool's gaps, against that pool's ITL budget: its steps stall the other's
  decoding, and its limit is what keeps them within budget.
- Time is always an argument: the HTTP layer passes the wall clock, the simulator a virtual one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import partial

from priority_gateway.core.capacity import Capacity, pool_limit_settings
from priority_gateway.core.classes import DEFAULT_CLASSES, ClassTable
from priority_gateway.core.decisions import (
    Answer,
    Decisions,
    Dispatch,
    LimitChange,
    Notice,
    Outcome,
    Preempted,
    Queued,
    Rejection,
)
from priority_gateway.core.engines import EngineMetrics, EngineState
from priority_gateway.core.fairness import TenantFairness
from priority_gateway.core.fleet import Fleet, FleetSettings
from priority_gateway.core.kv_events import KVEvent
from priority_gateway.core.limiter import ConcurrencyLimit, LimitSettings
from priority_gateway.core.pools import Pool, PoolSpec
from priority_gateway.core.preemption import Backfill
from priority_gateway.core.queue import DEFAULT_DECODE_TOKENS, Entry
from priority_gateway.core.readings import Readings
from priority_gateway.core.reasons import Refusal
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.routing import Choice
from priority_gateway.core.sessions import SessionSettings
from priority_gateway.core.slots import FullEngine
from priority_gateway.core.tenant_room import TenantRoom
from priority_gateway.core.turns import SessionTurns

__all__ = [
    "AdmissionSettings",
    "Answer",
    "Decisions",
    "Dispatch",
    "Dispatcher",
    "LimitChange",
    "Notice",
    "Outcome",
    "PoolSpec",
    "Preempted",
    "Queued",
    "Rejection",
]


class _Waits(Enum):
    SESSION = "waits for its session's engine"
    SLOT = "waits for a slot where one replica alone would start it"


WAITS_FOR_SESSION = _Waits.SESSION
"""What ``_place`` says of a continuing turn that waits for its session's engine (``turns.waits``)."""
WAITS_FOR_SLOT = _Waits.SLOT
"""What ``_place`` says of a request that waits for a slot on a less loaded engine (``Capacity.waits_for_slot``)."""

MAX_PASSED_OVER = 32
"""Queued entries a drain tries and cannot start before it stops looking further (per pool)."""


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
    sessions: SessionSettings = field(default_factory=SessionSettings)

    def retry_after(self, wait: float | None) -> float:
        """What a refusal's ``Retry-After`` asks: the expected wait, at least ``min_retry_after_s``."""
        return max(self.min_retry_after_s, wait or 0.0)


class Dispatcher:
    def __init__(
        self,
        pools: Sequence[PoolSpec],
        home: Mapping[str, str] | None = None,
        budgets: Mapping[str, float | None] | None = None,
        admission: AdmissionSettings | None = None,
        classes: ClassTable = DEFAULT_CLASSES,
        fleet: FleetSettings | None = None,
    ) -> None:
        if not pools:
            raise ValueError("at least one pool is needed")
        self.classes = classes
        self.admission = admission = admission or AdmissionSettings(enabled=False)
        burst = admission.sessions.first_burst
        self.pools: dict[str, Pool] = {
            spec.name: Pool(spec, classes, admission.fair, admission.decode_tokens, burst) for spec in pools
        }
        first = pools[0].name
        self.home: dict[str, str] = {
            cls: (home or {}).get(cls) or (cls if cls in self.pools else first) for cls in classes.names
        }
        self.itl_budgets: dict[str, float | None] = dict(budgets or {})
        self._engines: dict[str, EngineState] = {}
        self.fleet = Fleet(self, fleet)
        self.turns = SessionTurns(admission.sessions, self.fleet)
        self.capacity = Capacity(self.fleet, admission.limits, admission.enabled, admission.backfill_reserve)
        self.tenants = TenantFairness(self.fleet, admission.fair)
        self.room = TenantRoom(self.tenants, self.capacity)
        self.backfill = Backfill()
        self.readings = Readings(self)
        self._queued_pool: dict[str, Pool] = {}
        # What the call under way decided for other requests: handed out when it returns.
        self._notices: list[Notice] = []
        self._running: dict[str, set[Dispatch]] = {}
        self.drained_at: float | None = None
        self._reindex(0.0)

    @property
    def limits(self) -> dict[str, ConcurrencyLimit]:
        return self.capacity.limits

    @property
    def admitting(self) -> bool:
        return self.admission.enabled

    # -- topology and health -------------------------------------------------

    def _reindex(self, now: float) -> None:
        self._engines = {e.id: e for pool in self.pools.values() for e in pool.engines}
        self._neighbours: dict[str, list[Pool]] = {}
        for pool in self.pools.values():
            if pool.shares_hardware_with in self.pools:
                self._neighbours.setdefault(pool.shares_hardware_with, []).append(pool)
        self.capacity.reindex(self._engines, self._engine_budget, now, self._limit_settings)
        for gone in set(self._running) - set(self._engines):
            del self._running[gone]
        self.turns.reindex(self._engines)

    def _limit_settings(self, pool: str) -> LimitSettings:
        spec = self.pools.get(pool)
        if spec is None:
            return self.admission.limits
        return pool_limit_settings(self.admission.limits, spec.seats, spec.shares_hardware_with in self.pools)

    def _engine_budget(self, pool: str) -> float | None:
        """The tightest ITL budget among the classes whose home is this pool, or the pool it shares its
        hardware with."""
        homes = {pool, self.pools[pool].shares_hardware_with} if pool in self.pools else {pool}
        budgets = [self.itl_budgets.get(cls) for cls, home in self.home.items() if home in homes]
        present = [b for b in budgets if b is not None]
        return min(present) if present else None

    @property
    def engine_states(self) -> Mapping[str, EngineState]:
        return self._engines

    def engines(self) -> list[EngineState]:
        return list(self._engines.values())

    def engine(self, engine_id: str) -> EngineState | None:
        return self._engines.get(engine_id)

    def set_pool_engines(self, pool: str, urls: Sequence[str], now: float = 0.0) -> None:
        self.pools[pool].set_engines(urls)
        self._reindex(now)

    def set_health(self, engine_id: str, healthy: bool) -> None:
        engine = self._engines.get(engine_id)
        if engine is not None:
            engine.healthy = healthy

    def scrape_sent(self, engine_id: str) -> None:
        """A scrape of the engine was sent: its reply is compared with what was in flight now."""
        engine = self._engines.get(engine_id)
        if engine is not None:
            engine.mark_scrape_start()

    def apply_scrape(self, engine_id: str, metrics: EngineMetrics, now: float) -> None:
        engine = self._engines.get(engine_id)
        if engine is not None:
            engine.apply_scrape(metrics, now)
            self.pools[engine.pool].policy.scraped(engine)
            if metrics.itl_buckets:
                self.capacity.limits[engine_id].observe_engine_itl(metrics.itl_buckets, now)

    def apply_kv_events(self, engine_id: str, events: Sequence[KVEvent], restarted: bool = False) -> None:
        """An engine's KV cache events (precise prefix mode)."""
        engine = self._engines.get(engine_id)
        if engine is not None:
            self.pools[engine.pool].policy.kv_events(engine_id, events, restarted)

    def ready(self) -> dict[str, bool]:
        return {name: any(e.healthy for e in pool.engines) for name, pool in self.pools.items()}

    # -- the request path ----------------------------------------------------

    def pool_for(self, cls: str, model: str | None = None) -> Pool:
        home = self.pools[self.home[cls]]
        if model is None or home.serves(model):
            return home
        return next((p for p in self.pools.values() if p.serves(model)), home)

    def submit(self, req: RouteRequest, now: float, exclude: Sequence[str] = ()) -> Decisions:
        if not exclude:
            self.turns.arrived(req, now)
        answer = self._submit(req, now, exclude)
        if isinstance(answer, Rejection):
            self.turns.abandoned(req.id)
        return Decisions(answer, self._take_notices(now))

    def _submit(self, req: RouteRequest, now: float, exclude: Sequence[str] = ()) -> Answer:
        pool = self.pool_for(req.cls, req.model)
        if not self.admission.enabled:
            choice = pool.policy.choose(req, pool.healthy(exclude, req.model), now)
            if choice is None:
                return self._unservable(req, pool, exclude)
            return self._start(req, pool, choice, now, exclude)
        if not pool.healthy((), req.model) and not any(p.healthy((), req.model) for p in self._overflow_pools(req)):
            # Nothing could ever start it from the queue: answered now, never left to wait.
            return self._unservable(req, pool, exclude)
        self.tenants.note(req.tenant, req.max_concurrency, req.weight)
        # An empty queue has nobody ahead: the tenants' shares (what ``_ahead_of`` weighs) are not needed.
        queue = pool.queue
        if self.tenants.has_room(req.tenant) and (
            not len(queue) or queue.position(req, math.inf, self.room.ahead_of(req.tenant, pool, now)) == 0
        ):
            placed = self._place(req, pool, now, exclude)
            if isinstance(placed, Dispatch):
                placed.charge = pool.queue.charge(req)
                return placed
        answer = self._enqueue(req, pool, now)
        if isinstance(answer, Queued) and self.capacity.with_room(pool, (), req.model):
            # Those ahead of it cannot start (their model's engines are full), this one could: a drain
            # starts what can start, in queue order, and it may be among them.
            self._drain(pool, now)
            mine = next((n for n in self._notices if isinstance(n, Dispatch) and n.request is req), None)
            if mine is not None:
                self._notices.remove(mine)
                return mine
        return answer

    def admit_anyway(self, req: RouteRequest, now: float) -> Dispatch | None:
        """Start ``req`` where its pool's policy would, past any limit or queue (what-if experiments)."""
        pool = self.pool_for(req.cls, req.model)
        choice = pool.policy.choose(req, pool.healthy((), req.model), now)
        return None if choice is None else self._start(req, pool, choice, now, ())

    def _unservable(self, req: RouteRequest, pool: Pool, exclude: Sequence[str]) -> Rejection:
        """No healthy engine may serve ``req``: 404 when no engine of any pool lists its model at all
        (an alias to a model nobody serves), else the pool's engines are down."""
        model = req.model
        if not any(model in p.loadable or any(e.serves(model) for e in p.engines) for p in self.pools.values()):
            return Rejection(req, Refusal.MODEL_NOT_SERVED, f"no engine serves the model {model!r}", None)
        after = " after a failed attempt" if exclude else ""
        serving = f" serves {model!r}" if any(e.healthy for e in pool.engines) else ""
        return Rejection(
            req, Refusal.NO_HEALTHY_ENGINE, f"no healthy engine in pool {pool.name!r}{serving}{after}", 1.0
        )

    def _place(
        self, req: RouteRequest, pool: Pool, now: float, exclude: Sequence[str] = ()
    ) -> Dispatch | _Waits | None:
        """Start ``req`` on an engine with room; else whether it waits for its session's engine or a slot."""
        model = req.model
        candidates = self.room.engines(req.tenant, pool, now, exclude, model)
        if req.continuing and self.turns.waits(req, pool, candidates, now, pool.start_deadline(req), exclude):
            return WAITS_FOR_SESSION
        choice = self._choose(req, pool, candidates, now)
        if choice is not None:
            wider = partial(self._choose, req, pool, now=now)
            if self.capacity.waits_for_slot(req, pool, choice, candidates, now, exclude, wider):
                return WAITS_FOR_SLOT
            return self._start(req, pool, choice, now, exclude)
        if self.classes.is_batch(req.cls):
            for other in self.pools.values():
                if other is pool or not other.backfill or other.queue.depth_of(self.classes.interactive_like):
                    continue
                choice = self._choose(req, other, self.capacity.spare_in(other, exclude, model), now)
                if choice is not None:
                    return self._start(req, other, choice, now, exclude, reason="backfill")
            return None
        for other in self._overflow_pools(req):
            choice = self._choose(req, other, self.capacity.with_room(other, exclude, model), now)
            if choice is not None:
                return self._start(req, other, choice, now, exclude, reason="overflow")
        if pool.policy.holds(req):  # held for its prefill (prefix_policy): stopping backfill would not place it
            return None
        if self._preempt_backfill(pool, exclude, now, model):
            choice = self._choose(req, pool, self.capacity.with_room(pool, exclude, model), now)
            if choice is not None:
                return self._start(req, pool, choice, now, exclude, reason="preempted_backfill")
        return None

    def _choose(self, req: RouteRequest, pool: Pool, candidates: list[EngineState], now: float) -> Choice | None:
        """The pool's policy's choice among ``candidates``, passing over an engine where a request with a TTFT
        budget would not get its first token in time: the prefill the engine has to get through before it
        (``queued_prefill``) and its own uncached part, at the pace the pool's first tokens showed."""
        choice = pool.policy.choose(req, candidates, now)
        ttft = req.budget.ttft_s
        if choice is None or ttft is None:
            return choice
        left = ttft - (now - req.arrival)
        model = pool.ttft_model
        for _ in range(len(candidates)):
            ahead = choice.engine.queued_prefill + max(0, req.prompt_tokens - choice.predicted_cached_tokens)
            expected = model.predict(ahead)
            if expected is None or model.margin * expected <= left:  # a typical first token, against a p99 budget
                return choice
            candidates = [e for e in candidates if e is not choice.engine]
            choice = pool.policy.choose(req, candidates, now)
            if choice is None:
                return None
        return None

    def _overflow_pools(self, req: RouteRequest) -> list[Pool]:
        if self.classes.is_batch(req.cls):
            return []
        home = self.pool_for(req.cls, req.model).name
        return [p for p in self.pools.values() if p.name != home and p.accept_overflow and p.serves(req.model)]

    def _preempt_backfill(self, pool: Pool, exclude: Sequence[str], now: float, model: str | None) -> bool:
        """Free a slot in ``pool`` by stopping the youngest restartable batch request backfilled there."""
        victim = self.backfill.victim(pool.healthy(exclude, model), self.capacity.room)
        if victim is None:
            return False
        self._release(victim, ok=False)
        self._notices.append(Preempted(victim))
        home = self.pool_for(victim.request.cls, victim.request.model)
        # It is charged again when it restarts from scratch: the first charge is refunded.
        self._settle(victim, 0)
        home.queue.push(victim.request, home.start_deadline(victim.request), now)
        self._queued_pool[victim.request.id] = home
        return True

    def _enqueue(self, req: RouteRequest, pool: Pool, now: float) -> Answer:
        deadline = pool.start_deadline(req)
        ahead = self.room.ahead_of(req.tenant, pool, now)
        wait = None
        if req.budget.ttft_s is not None:
            wait = self._expected_wait(pool, pool.queue.position(req, deadline, ahead), now)
            # With room for it now, what holds the queue is the prefill ahead, not slots: its deadline answers it.
            late = wait is not None and now + wait > deadline and not self.room.may_start(pool, now)(req.tenant)
            if deadline <= now or late:
                return self._refuse_slo(req, wait)
        if len(pool.queue) >= self.admission.max_queue:
            if wait is None:
                wait = self._expected_wait(pool, pool.queue.position(req, deadline, ahead), now)
            if self.classes.is_batch(req.cls) or pool.queue.depth_of(self.classes.batch_like) == 0:
                full = f"the {pool.name!r} queue is full"
                return Rejection(req, Refusal.QUEUE_FULL, full, self.admission.retry_after(wait))
            victim = pool.queue.shed()
            assert victim is not None
            self._queued_pool.pop(victim.request.id, None)
            shed = "shed to make room for interactive work"
            self._notices.append(Rejection(victim.request, Refusal.SHED, shed, self.admission.retry_after(wait)))
        pool.queue.push(req, deadline, now)
        self._queued_pool[req.id] = pool
        return Queued(req, pool.name)

    def _expected_wait(self, pool: Pool, position: int, now: float) -> float | None:
        """Time until ``position`` requests ahead have started, from when the running ones end."""
        engines = [
            FullEngine(*self.capacity.counted(e), [pool.running(d) for d in self._running.get(e.id, ())])
            for e in pool.healthy()
        ]
        return pool.slots.wait(position, engines, now)

    def _refuse_slo(self, req: RouteRequest, wait: float | None) -> Rejection:
        budget_ms = int((req.budget.ttft_s or 0) * 1000)
        message = f"cannot start within the {budget_ms} ms time-to-first-token budget; retry later"
        return Rejection(req, Refusal.SLO_BUDGET_EXCEEDED, message, self.admission.retry_after(wait))

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
        self.fleet.load_changed(engine.id)
        pool.policy.routed(req, choice)
        self.capacity.note_load(engine)
        dispatch = Dispatch(
            req,
            engine,
            pool.name,
            priority=self.classes.priority(req.cls) if pool.takes_priority else None,
            predicted_cached_tokens=choice.predicted_cached_tokens,
            reason=reason or choice.reason,
            excluded=tuple(exclude),
            dispatched_at=now,
            prefill_tokens=prefill,
            preemptible=reason == "backfill" and req.restartable,
            backlog=engine.queued_prefill,
        )
        self.backfill.started(dispatch)
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
            self.fleet.load_changed(dispatch.engine.id)

    def _release(self, dispatch: Dispatch, ok: bool = True) -> None:
        dispatch.done = True
        dispatch.engine.finished(dispatch.request.cls, dispatch.request.adapter)
        self.fleet.load_changed(dispatch.engine.id)
        self.tenants.finished(dispatch.request.tenant, dispatch.pool)
        self._prefilled(dispatch, ok)
        self.backfill.ended(dispatch)
        running = self._running.get(dispatch.engine.id)
        if running is not None:
            running.discard(dispatch)

    def _settle(self, dispatch: Dispatch, actual: float) -> None:
        charge, dispatch.charge = dispatch.charge, None
        if charge is not None:
            req = dispatch.request
            self.pool_for(req.cls, req.model).queue.settle(req, charge, actual)

    def finish(
        self,
        dispatch: Dispatch,
        now: float,
        ok: bool = True,
        generated: int | None = None,
        prompt: int | None = None,
        retrying: bool = False,
    ) -> Decisions:
        """The dispatched request ended (``ok``: the engine answered); idempotent.

        ``generated``: the tokens it generated and ``prompt`` its prompt's tokens, as the engine counted
        them (unknown: the estimate): its tenant's charge is settled to that real cost, generated
        tokens at most ``max_tokens`` (a broken engine's count must not starve the tenant). Without
        ``generated`` the predicted cost stands. A session's turn ends here, unless it is ``retrying``."""
        if not dispatch.done:
            if not retrying:
                self.turns.ended(dispatch, now, generated, prompt)
            if generated is not None:
                req = dispatch.request
                if req.max_tokens is not None:
                    generated = min(generated, req.max_tokens)
                self._settle(dispatch, (req.prompt_tokens if prompt is None else prompt) + generated)
            self._release(dispatch, ok)
            if ok and self.admission.enabled:
                pool = self.pools[dispatch.engine.pool]
                pool.slots.observe_done(pool.running(dispatch), now - dispatch.dispatched_at)
        return self.drain(now)

    def retry(self, dispatch: Dispatch, now: float) -> Decisions:
        """The engine refused the connection before any byte: try another of the pool once."""
        # Nothing was served, and the new attempt is charged again: the first charge is refunded.
        released = self.finish(dispatch, now, ok=False, generated=0, prompt=0, retrying=True)
        decided = self.submit(dispatch.request, now, exclude=(*dispatch.excluded, dispatch.engine.id))
        decided.others[:0] = released.others
        return decided

    def poll(self, now: float) -> Decisions:
        """Refuse what can no longer start in time, update limits, start what now fits."""
        self.turns.expire(now)
        if not self.admission.enabled:
            return Decisions()
        self._expire(now)
        changes = self.capacity.update(now, self._engines)
        for change in changes:
            self.fleet.load_changed(change.engine)
        decided = self.drain(now)
        decided.limit_changes = changes
        return decided

    def cancel(self, req: RouteRequest, now: float) -> Decisions:
        """The client left: free its place in the queue (a place freed may let others start)."""
        pool = self._queued_pool.pop(req.id, None)
        if pool is not None:
            pool.queue.remove(req)
            self.turns.abandoned(req.id)
            return self.drain(now)
        return Decisions(None, self._take_notices(now))

    def _expire(self, now: float) -> None:
        """Refuse the queued requests whose start deadline has passed."""
        for pool in self.pools.values():
            for entry in pool.queue.expired(now):
                self._queued_pool.pop(entry.request.id, None)
                req = entry.request
                if req.budget.ttft_s is not None:
                    self._notices.append(self._refuse_slo(req, None))
                else:
                    message = "the request's deadline passed while queued"
                    retry = self.admission.min_retry_after_s
                    self._notices.append(Rejection(req, Refusal.DEADLINE_EXCEEDED, message, retry))

    def drain(self, now: float) -> Decisions:
        """Start queued requests while they fit (see the rules); what that decided."""
        if self.admission.enabled:
            self.drained_at = now
            for pool in self.pools.values():
                self._drain(pool, now)
        return Decisions(None, self._take_notices(now))

    def _drain(self, pool: Pool, now: float) -> None:
        queue = pool.queue
        if not len(queue):  # most finishes leave an empty queue: nothing to weigh
            self.tenants.giving_way(pool.name, False, now)
            return
        rank = self.classes.rank
        blocked: set[tuple[str, str, str]] = set()  # (class, model, tenant) found no room in this drain
        waiting: set[str] = set()  # continuing turns waiting for their sessions' engines
        models: dict[str, int] = {}  # each such model's best class rank

        def passed_over(entry: Entry) -> bool:
            """Its class, model and tenant found no room, or a higher class waits for its model (a lower
            class must not take the slot the higher one waits for)."""
            req = entry.request
            above = models.get(req.model)
            return (
                (req.cls, req.model, req.tenant) in blocked
                or (above is not None and above < rank[req.cls])
                or req.id in waiting
            )

        # What may start is weighed only when something waits: most finishes leave an empty queue.
        while len(queue) and (
            entry := queue.peek(self.room.may_start(pool, now), passed_over if blocked or waiting else None)
        ):
            if entry.deadline < now:
                # Its deadline passed since the last poll: refused, never started late.
                self._expire(now)
                continue
            # A placement may preempt someone: that notice goes out before any later dispatch of
            # the same request, since both land in the notices in order.
            req = entry.request
            placed = self._place(req, pool, now)
            if isinstance(placed, _Waits):
                waiting.add(req.id)  # waits for its session's engine or a slot: those behind it go on
                if len(blocked) + len(waiting) >= MAX_PASSED_OVER:
                    break
                continue
            if not isinstance(placed, Dispatch):
                blocked.add((req.cls, req.model, req.tenant))
                models[req.model] = min(models.get(req.model, rank[req.cls]), rank[req.cls])
                if len(blocked) >= MAX_PASSED_OVER or not self.capacity.with_room(pool, ()):
                    break
                continue
            taken = queue.take(req)
            placed.charge = taken.charge if taken is not None else None
            self._queued_pool.pop(req.id, None)
            self._notices.append(placed)
        held = (
            bool(len(queue))
            and queue.peek(self.room.may_start(pool, None)) is not None
            and bool(self.capacity.with_room(pool, ()))
        )
        self.tenants.giving_way(pool.name, held, now)

    def _take_notices(self, now: float | None = None) -> list[Notice]:
        notices, self._notices = self._notices, []
        if now is not None:
            self.turns.refused(notices)
        return notices

    # -- observations from the relay -----------------------------------------

    def observe_ttft(self, dispatch: Dispatch, seconds: float) -> None:
        self._prefilled(dispatch)
        if dispatch.engine.id not in self.capacity.limits:
            return
        engine_side = max(0.0, seconds - (dispatch.dispatched_at - dispatch.request.arrival))
        budget = dispatch.request.budget.ttft_s
        late = None if budget is None else seconds > budget
        self.pools[dispatch.engine.pool].ttft_model.observe(dispatch.backlog, engine_side, late)

    def observe_itl(self, dispatch: Dispatch, seconds: float, now: float, times: int = 1) -> None:
        """``times`` gaps of ``seconds`` each (events that arrived together, a step apart each)."""
        limit = self.capacity.limits.get(dispatch.engine.id)
        if limit is not None:
            limit.observe_itl(seconds, dispatch.engine.load, now, times)
            self.pools[dispatch.engine.pool].slots.observe_gap(seconds, times)
            for neighbour in self._neighbours.get(dispatch.engine.pool, ()):
                # A pool on the same devices learns from this pool's gaps: its steps made them too.
                for engine in neighbour.engines:
                    self.capacity.limits[engine.id].observe_itl(seconds, engine.load, now, times)

    def demand(self) -> dict[str, int]:
        """Requests waiting at this replica that each pool's engines are there for: its own queue (of
        tenants that may take slots: not at their cap, nor over their share, or a slot claimed for them
        would sit free while a tenant under its share waits at another replica), and interactive work
        other pools overflow into it. Batch work that could backfill is left out: it fills only slots a
        replica holds anyway, never claims any (the reserve kept free for interactive work would
        otherwise be held by whoever has batch work queued)."""
        out = {
            name: self.tenants.may_take_slots(name, pool.queue, self.capacity.slots(pool), self.drained_at)
            for name, pool in self.pools.items()
        }
        interactive = {name: p.queue.depth_of(self.classes.interactive_like) for name, p in self.pools.items()}
        for name, pool in self.pools.items():
            if pool.accept_overflow:
                out[name] += sum(n for other, n in interactive.items() if other != name)
        return out
