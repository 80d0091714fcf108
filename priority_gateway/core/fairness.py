"""Tenants sharing a pool: their caps, their weighted shares of its slots, and giving way across replicas.

The order in which queued requests of one class start is the fair queue's (``fair_queue``: start-time
fair queueing charged in predicted tokens); this module decides which tenants may take slots at all.

Rules:
- A tenant is named by the key store (the key's ``tenant``, else its id), never by the request.
  ``started`` and ``finished`` pair up, as dispatches and finishes do; a tenant with nothing in flight
  is forgotten, so the state is bounded by the tenants with work running.
- Caps: a tenant's cap is the one its requests carry (the key store gives every key of a tenant the
  tenant's cap; the newest word wins). A tenant at its cap, counting its requests in flight here and,
  as they report them, on the other replicas, starts nothing more; its queued requests are passed
  over, not refused.
- Shares: a tenant's weighted share of a pool's slots is its weight over the total weight of the
  tenants active there (in flight in that pool, or queued), counting the other replicas' (``fleet``).
  A tenant must leave the pool's reserve alone (``over``) when it is at or over its share while a
  tenant under its share waits, or while it holds the most per weight of all (so a tenant that bursts
  to its share while another holds more than its own is not held back in that other's favour); never
  a tenant that is alone.
- Giving way across replicas: when another replica has a tenant waiting that is further below its
  share than a tenant here, this replica leaves it the free room for ``PEER_HOLD_S`` (the other's
  next poll), then takes it: so a tenant whose requests all come through one replica neither takes
  more than its share nor starves.
- With fairness off, no tenant is ever over its share; caps still hold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from priority_gateway.core.fleet.wire import TenantKey, TenantShare
from priority_gateway.core.queue import WaitQueue

PEER_HOLD_S = 0.1
"""How long a replica leaves free room to another replica's waiting tenant that is further below its
share than any of its own: two of the other's polls (every 50 ms) and the channel's few ms. Past it,
the room goes to whoever is here (work-conserving when the other cannot start it after all)."""

Others = Mapping[str, tuple[int, int, float]]
"""The other replicas' tenants active in a pool: requests running there, queued, weight."""


class FleetTenants(Protocol):
    """What the other replicas report of their tenants."""

    def tenants_of(self, pool: str) -> dict[str, tuple[int, int, float]]: ...

    def tenant_running(self, tenant: str) -> int: ...

    @property
    def has_tenants(self) -> bool: ...


def never(_tenant: str) -> bool:
    return False


class TenantFairness:
    def __init__(self, fleet: FleetTenants, enabled: bool = True) -> None:
        self.enabled = enabled
        self.fleet = fleet
        self.inflight: dict[str, int] = {}
        self._in_pool: dict[str, dict[str, int]] = {}
        self._caps: dict[str, int] = {}
        self._weights: dict[str, float] = {}
        self._holding: dict[str, float] = {}  # per pool, since when a start here gives way to another replica

    # -- counts and caps ---------------------------------------------------------------------

    def note(self, tenant: str, cap: int | None, weight: float = 1.0) -> None:
        if cap is None:
            self._caps.pop(tenant, None)
        else:
            self._caps[tenant] = cap
        self._weights[tenant] = weight

    def started(self, tenant: str, cap: int | None, weight: float, pool: str) -> None:
        self.note(tenant, cap, weight)
        self.inflight[tenant] = self.inflight.get(tenant, 0) + 1
        running = self._in_pool.setdefault(pool, {})
        running[tenant] = running.get(tenant, 0) + 1

    def finished(self, tenant: str, pool: str) -> None:
        running = self._in_pool.get(pool, {})
        if running.get(tenant, 0) > 1:
            running[tenant] -= 1
        else:
            running.pop(tenant, None)
        left = self.inflight.get(tenant, 0) - 1
        if left > 0:
            self.inflight[tenant] = left
        else:
            self.inflight.pop(tenant, None)
            self._caps.pop(tenant, None)
            self._weights.pop(tenant, None)

    def weight(self, tenant: str) -> float:
        return self._weights.get(tenant, 1.0)

    def alone(self, pool: str, tenant: str) -> bool:
        """Nobody but ``tenant`` has requests in flight in ``pool`` here."""
        running = self._in_pool.get(pool)
        return not running or (len(running) == 1 and tenant in running)

    def running(self, pool: str) -> dict[str, int]:
        """This replica's requests in flight in ``pool``, per tenant."""
        return dict(self._in_pool.get(pool, {}))

    def has_room(self, tenant: str) -> bool:
        """``tenant`` is below its cap, counting what the other replicas run of it."""
        cap = self._caps.get(tenant)
        if cap is None:
            return True
        elsewhere = self.fleet.tenant_running(tenant) if self.fleet.has_tenants else 0
        return self.inflight.get(tenant, 0) + elsewhere < cap

    # -- shares ------------------------------------------------------------------------------

    def over(self, pool: str, queue: WaitQueue, slots: float, now: float | None) -> Callable[[str], bool]:
        """Which tenants may take only the backfill reserve of ``pool`` now: at or over their share, or
        (``now`` given, for ``PEER_HOLD_S`` at most) giving way to another replica's tenant further
        below its own share. Computed once, as it is asked of many tenants in a row."""
        if not self.enabled:
            return never
        queued = {tenant: weight for tenant, (_, weight) in queue.backlog().items()}
        others = self.fleet.tenants_of(pool)
        over = self._over_share(pool, slots, queued, others)
        waiting = {tenant: w for tenant, (_, q, w) in others.items() if q}
        if not waiting or now is None or not self._yielding(pool, now):
            return over
        running = self.running(pool)
        for tenant, (n, _, _) in others.items():
            running[tenant] = running.get(tenant, 0) + n
        weights = {t: w for t, (_, _, w) in others.items()} | queued

        def after_one_more(tenant: str) -> float:
            weight = weights.get(tenant) or self.weight(tenant)
            return (running.get(tenant, 0) + 1) / weight

        # Another replica's waiting tenants that could start (under their share), least served first.
        behind = sorted((after_one_more(t), t) for t in waiting if not over(t))
        if not behind:
            return over

        def held_back(tenant: str) -> bool:
            first = next((usage for usage, t in behind if t != tenant), None)
            return first is not None and first < after_one_more(tenant)

        return lambda tenant: over(tenant) or held_back(tenant)

    def _over_share(
        self, pool: str, slots: float, queued: Mapping[str, float], others: Others
    ) -> Callable[[str], bool]:
        running = self._in_pool.get(pool, {})
        weights = {**queued, **self._weights}
        waiting = set(queued)
        if others:
            running = dict(running)
            weights = {tenant: weight for tenant, (_, _, weight) in others.items()} | weights
            for tenant, (n, q, _) in others.items():
                running[tenant] = running.get(tenant, 0) + n
                if q:
                    waiting.add(tenant)
        active = set(running) | set(queued)

        def weight(tenant: str) -> float:
            return weights.get(tenant, 1.0)

        total = sum(weight(t) for t in active)

        def share(tenant: str) -> float:
            mine = weight(tenant)
            return slots * mine / (total if tenant in active else total + mine)

        under_waiting = {t for t in waiting if running.get(t, 0) < share(t)}
        held = sorted(((running.get(t, 0) / weight(t), t) for t in active), reverse=True)

        def over(tenant: str) -> bool:
            if not active or active == {tenant} or running.get(tenant, 0) < share(tenant):
                return False
            if under_waiting - {tenant}:
                return True
            most = next((h for h, t in held if t != tenant), 0.0)
            return running.get(tenant, 0) / weight(tenant) >= most

        return over

    def _yielding(self, pool: str, now: float) -> bool:
        """Starts in ``pool`` still give way to other replicas' tenants: not for ``PEER_HOLD_S`` already."""
        since = self._holding.get(pool)
        return since is None or now - since < PEER_HOLD_S

    def giving_way(self, pool: str, held: bool, now: float) -> None:
        """Whether a drain of ``pool`` just left room to another replica's tenant (something here could
        start were it not for them): since when, to stop giving way after ``PEER_HOLD_S``."""
        if held and self.fleet.has_tenants:
            self._holding.setdefault(pool, now)
        else:
            self._holding.pop(pool, None)

    def may_take_slots(self, pool: str, queue: WaitQueue, slots: float, now: float | None) -> int:
        """Requests waiting in ``pool`` whose tenants may take its free slots: not at their cap nor over
        their share (as the last drain saw it: a tenant held back for another replica claims no slot
        either, so that replica can claim the one this replica leaves it)."""
        if not self.enabled or not len(queue):
            return len(queue)
        over = self.over(pool, queue, slots, now)
        return sum(n for t, (n, _) in queue.backlog().items() if self.has_room(t) and not over(t))

    def shares(self, queues: Mapping[str, WaitQueue]) -> dict[TenantKey, TenantShare]:
        """This replica's tenants per pool (running, queued, weight), for the other replicas."""
        out: dict[TenantKey, TenantShare] = {}
        for name, queue in queues.items():
            backlog = queue.backlog()
            running = self._in_pool.get(name, {})
            for tenant in running.keys() | backlog.keys():
                queued, weight = backlog.get(tenant, (0, self.weight(tenant)))
                out[(name, tenant)] = TenantShare(running.get(tenant, 0), queued, weight)
        return out
