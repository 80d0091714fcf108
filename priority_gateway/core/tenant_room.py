"""Where a tenant's request may start: its fair share (``fairness``) weighed against the room on the
pool's engines (``capacity``).

Rules:
- A tenant over its share of the pool takes only engines that keep the backfill reserve free (the
  slots a reserve leaves go to the tenants under their share); one under it, any engine with room. A
  tenant alone in the pool, with no other replica's tenants heard, is never over its share.
- A queued request of a tenant may start when the tenant is under its cap and there is room as
  above.
- Ahead of a request waits whatever of a tenant under its cap, except, when the request's tenant is
  under its share, tenants over theirs (slots freed then go to those under).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from priority_gateway.core.capacity import Capacity
from priority_gateway.core.engines import EngineState
from priority_gateway.core.fairness import TenantFairness
from priority_gateway.core.pools import Pool


class TenantRoom:
    def __init__(self, tenants: TenantFairness, capacity: Capacity) -> None:
        self.tenants = tenants
        self.capacity = capacity

    def over(self, pool: Pool, now: float | None) -> Callable[[str], bool]:
        return self.tenants.over(pool.name, pool.queue, self.capacity.slots(pool), now)

    def engines(
        self, tenant: str, pool: Pool, now: float, exclude: Sequence[str] = (), model: str | None = None
    ) -> list[EngineState]:
        """Engines of ``pool`` where ``tenant`` may start a request now."""
        # A tenant alone in the pool is never over its share: the shares need not be weighed.
        alone = not len(pool.queue) and not self.tenants.fleet.has_tenants and self.tenants.alone(pool.name, tenant)
        if not alone and self.over(pool, now)(tenant):
            return self.capacity.spare_in(pool, exclude, model)
        return self.capacity.with_room(pool, exclude, model)

    def may_start(self, pool: Pool, now: float | None) -> Callable[[str], bool]:
        """Whether a tenant's queued request could start in ``pool`` now (its cap, its share, the room)."""
        over = self.over(pool, now)
        spare = bool(self.capacity.spare_in(pool, ()))
        room = bool(self.capacity.with_room(pool, ()))
        has_room = self.tenants.has_room
        return lambda tenant: has_room(tenant) and (spare if over(tenant) else room)

    def ahead_of(self, tenant: str, pool: Pool, now: float) -> Callable[[str], bool]:
        """Whether a tenant's queued requests may start before a request of ``tenant``."""
        over = self.over(pool, now)
        has_room = self.tenants.has_room
        if over(tenant):
            return has_room
        return lambda other: has_room(other) and not over(other)
