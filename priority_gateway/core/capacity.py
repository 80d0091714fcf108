"""How many more requests this replica may start on each engine: the limits, and the one gate on them.

Rules:
- Each engine has a concurrency limit (``limiter.ConcurrencyLimit``: learned from ITL against the
  tightest budget of the classes whose home is its pool; fixed without a budget). Several replicas
  learn one limit: the engine's leader (``fleet``) moves it, the others follow what it publishes.
- The gate (``room``), one per channel state:
  - alone, or the channel up with nobody else heard: the limit less the engine's load (this
    replica's requests in flight and whatever else the engine reported at its last scrape);
  - sharing with other replicas: the slots this replica holds (``fleet.holdings``, the least of its
    holding and its claims in transit), less its own requests in flight; while another replica waits
    there below its fair share, no more than that share;
    a request with a TTFT budget whose policy would choose a less loaded engine where this replica
    holds no free slot but the fleet has room waits there for up to a tenth of its budget
    (``SLOT_WAIT_SHARE``): its queued request claims a slot, the others give up what they
    hold unused, and it starts where one replica alone would have started it (``waits_for_slot``);
  - the safe share (channel starting or down): ``limit / replicas`` less this replica's own requests,
    and less what the engine reports beyond the others' shares.
- The backfill reserve is headroom, not a limit: batch work may take an engine of another class's
  pool only while the engine's load (everyone's, as reported) stays a reserve (``backfill_reserve`` of
  the limit, at least one slot) under the limit, and only within the gate.
- A pool that declares its engines' seats (vLLM's ``--max-num-seqs``) keeps every limit within them: a
  request above them would wait inside the engine, for a running one to end, where nothing orders it,
  sheds it or counts its wait against its TTFT budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from priority_gateway.core.decisions import LimitChange
from priority_gateway.core.engines import EngineState
from priority_gateway.core.limiter import ConcurrencyLimit, Evidence, LimitSettings
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.routing import Choice

if TYPE_CHECKING:
    from priority_gateway.core.pools import Pool


SLOT_WAIT_SHARE = 0.1
"""Of its TTFT budget, what a request may wait for a slot where one replica alone would start it."""


class FleetGate(Protocol):
    """What the gate needs to know of the other replicas (``fleet.Fleet``)."""

    @property
    def within_holdings(self) -> bool:
        """Fill engines within the slots this replica holds: it shares with replicas it hears."""
        ...

    @property
    def safe_replicas(self) -> int:
        """Replicas the safe share splits each limit among (1: no safe share)."""
        ...

    def cap(self, engine: str) -> int: ...

    def yield_share(self, engine: str) -> int | None: ...

    def leads(self, engine: str) -> bool: ...

    def peer_evidence(self, engine: str) -> list[Evidence]: ...


def pool_limit_settings(base: LimitSettings, seats: int | None, beside: bool) -> LimitSettings:
    """An engine's limit settings, by its pool: ``beside``, its engines share another pool's devices, so it
    starts at the unbudgeted limit and gives up what that pool's gaps ask for (it has no budget of its
    own to probe from); ``seats``, declared, bound every limit."""
    settings = replace(base, initial=base.unbudgeted) if beside else base
    if seats is None:
        return settings
    cap = float(seats)
    return replace(
        settings,
        maximum=min(settings.maximum, cap),
        initial=min(settings.initial, cap),
        minimum=min(settings.minimum, cap),
        unbudgeted=min(settings.unbudgeted, cap),
        seats=cap,
    )


class Capacity:
    def __init__(
        self, fleet: FleetGate, settings: LimitSettings, enabled: bool = True, backfill_reserve: float = 0.25
    ) -> None:
        self.fleet = fleet
        self.settings = settings
        self.enabled = enabled
        self.backfill_reserve = backfill_reserve
        self.limits: dict[str, ConcurrencyLimit] = {}

    def reindex(
        self,
        engines: Mapping[str, EngineState],
        budget: Callable[[str], float | None],
        now: float,
        settings: Callable[[str], LimitSettings] | None = None,
    ) -> None:
        """Limits for the engines not yet known, each with its pool's ``settings`` (default: the same for
        every pool)."""
        for engine_id, engine in engines.items():
            if engine_id not in self.limits:
                chosen = settings(engine.pool) if settings is not None else self.settings
                self.limits[engine_id] = ConcurrencyLimit(budget(engine.pool), chosen, now)
        for gone in set(self.limits) - set(engines):
            del self.limits[gone]

    def limit(self, engine: str) -> float:
        limit = self.limits.get(engine)
        return limit.limit if limit is not None else 0.0

    def counted(self, engine: EngineState) -> tuple[float, float]:
        """(load, limit) as admission sees the engine: everyone's load against its limit, or in the safe
        share this replica's own against its share and what the engine holds beyond the others' shares."""
        limit = self.limits[engine.id].limit
        replicas = self.fleet.safe_replicas
        if replicas > 1:
            share = max(1.0, math.floor(limit / replicas))
            return max(float(engine.inflight), engine.load - (limit - share)), share
        return engine.load, limit

    def room(self, engine: EngineState) -> float:
        """What this replica may still start on ``engine`` (see the rules)."""
        if self.fleet.within_holdings:
            cap = self.fleet.cap(engine.id)
            share = self.fleet.yield_share(engine.id)
            return (cap if share is None else min(cap, share)) - engine.inflight
        load, limit = self.counted(engine)
        return limit - load

    def spare(self, engine: EngineState) -> bool:
        """``engine`` keeps the backfill reserve free after one more request (and the gate lets it start)."""
        load, limit = self.counted(engine)
        return load < limit - max(1.0, self.backfill_reserve * limit) and self.room(engine) >= 1

    def with_room(self, pool: Pool, exclude: Sequence[str], model: str | None = None) -> list[EngineState]:
        """The healthy engines of ``pool`` serving ``model`` that the gate lets take one more."""
        room = self.room
        return [e for e in pool.healthy(exclude, model) if room(e) > 0]

    def unheld(self, pool: Pool, exclude: Sequence[str], model: str | None = None) -> list[EngineState]:
        """Sharing holdings: the healthy engines of ``pool`` where the fleet has room (everyone's load under
        the limit) but this replica holds no free slot; else none."""
        if not self.fleet.within_holdings:
            return []
        room = self.room
        return [e for e in pool.healthy(exclude, model) if room(e) <= 0 and e.load < self.limit(e.id)]

    def waits_for_slot(
        self,
        req: RouteRequest,
        pool: Pool,
        choice: Choice,
        candidates: list[EngineState],
        now: float,
        exclude: Sequence[str],
        choose: Callable[[list[EngineState]], Choice | None],
    ) -> bool:
        """Whether ``req``, which ``choose`` (the pool's policy) would start on ``choice`` among ``candidates``,
        rather waits for a slot on a less loaded engine that ``choose`` prefers among those and the
        ``unheld`` ones (see the rules)."""
        ttft = req.budget.ttft_s
        if ttft is None or now - req.arrival >= SLOT_WAIT_SHARE * ttft:
            return False
        unheld = self.unheld(pool, exclude, req.model)
        if not unheld or min(e.load for e in unheld) >= choice.engine.load:
            return False
        wider = choose([*candidates, *unheld])
        return wider is not None and wider.engine in unheld and wider.engine.load < choice.engine.load

    def spare_in(self, pool: Pool, exclude: Sequence[str], model: str | None = None) -> list[EngineState]:
        """Engines of ``pool`` with room to spare beyond the reserve kept for their own class."""
        spare = self.spare
        return [e for e in pool.healthy(exclude, model) if spare(e)]

    def slots(self, pool: Pool) -> float:
        """The limits of the pool's healthy engines together (what tenants' shares divide)."""
        return sum(self.counted(e)[1] for e in pool.healthy())

    def note_load(self, engine: EngineState) -> None:
        if self.enabled:
            self.limits[engine.id].note_load(engine.load)

    def update(self, now: float, engines: Mapping[str, EngineState]) -> list[LimitChange]:
        """Reconsider every limit (the leader's on everyone's evidence); the changes, for the log."""
        changes = []
        for engine_id, limit in self.limits.items():
            before, why = limit.limit, limit.reason
            fleet = self.fleet
            engine = engines[engine_id]
            limit.note_engine_queue(engine.running, engine.waiting, engine.scraped_at)
            limit.update(now, engine.load, fleet.peer_evidence(engine_id), fleet.leads(engine_id))
            if limit.limit != before or limit.reason != why:
                changes.append(LimitChange(engine_id, before, limit.limit, limit.reason))
        return changes

    def follow(self, engine: str, learned: float, now: float) -> LimitChange | None:
        """Take the limit the engine's leader published."""
        limit = self.limits.get(engine)
        if limit is None or not self.enabled:
            return None
        before = limit.limit
        return LimitChange(engine, before, limit.limit, limit.reason) if limit.follow(learned, now) else None

    def evidence(self, now: float) -> dict[str, Evidence]:
        """This replica's own gaps on every engine that learns a limit, for the other replicas."""
        return {i: limit.evidence(now) for i, limit in self.limits.items() if limit.budget_s is not None}

    def learned(self, engine: str) -> float:
        """The limit this replica applies for ``engine`` as it tells the others (0: nothing learned yet)."""
        limit = self.limits.get(engine) if self.enabled else None
        return limit.limit if limit is not None and limit.learned else 0.0

    def limits_applied(self, engines: Sequence[EngineState]) -> dict[str, float]:
        """Each engine's limit as admission applies it (the fleet's, or this replica's safe share of it)."""
        if not self.enabled:
            return {}
        return {engine.id: self.counted(engine)[1] for engine in engines}
