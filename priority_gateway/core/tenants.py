"""Requests in flight per tenant, against each tenant's concurrency cap.

Rules:
- A tenant is named by the key store (the key's ``tenant``, else its id), never by the request.
- ``started`` and ``finished`` pair up, as dispatches and finishes do; a tenant with nothing in
  flight is forgotten, so the state is bounded by the tenants with work running.
- The cap and weight are the ones the tenant's latest request carried (keys change; the newest
  word wins). A tenant at its cap starts nothing more; its queued requests are passed over,
  not refused.
- A tenant's weighted share of a pool's slots is its weight over the total weight of the
  tenants active there (in flight in that pool, or queued: the weight its queued requests carry);
  a tenant at or over its share is
  ``over_share``, never a tenant that is alone. With other replicas' tenants (``others``, as they
  report them: ``core/tenant_share.py``), their requests count too, and their tenants are active:
  shares are the fleet's, not this replica's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping


class TenantLoad:
    def __init__(self) -> None:
        self.inflight: dict[str, int] = {}
        self._in_pool: dict[str, dict[str, int]] = {}
        self._caps: dict[str, int] = {}
        self._weights: dict[str, float] = {}

    def has_room(self, tenant: str) -> bool:
        cap = self._caps.get(tenant)
        return cap is None or self.inflight.get(tenant, 0) < cap

    def note(self, tenant: str, cap: int | None, weight: float = 1.0) -> None:
        if cap is None:
            self._caps.pop(tenant, None)
        else:
            self._caps[tenant] = cap
        self._weights[tenant] = weight

    def weight(self, tenant: str) -> float:
        return self._weights.get(tenant, 1.0)

    def running(self, pool: str) -> dict[str, int]:
        """This replica's requests in flight in ``pool``, per tenant."""
        return dict(self._in_pool.get(pool, {}))

    def over_share(
        self,
        pool: str,
        slots: float,
        queued: Mapping[str, float],
        others: Mapping[str, tuple[int, float]] | None = None,
    ) -> Callable[[str], bool]:
        """Whether a tenant holds at least its weighted share of the ``slots`` of ``pool`` among the
        tenants active there now (computed once: the test is asked of many tenants in a row).
        ``queued``: the tenants waiting for the pool and their weight; ``others``: the other replicas'
        tenants active in the pool, their requests running there and weight."""
        running = self._in_pool.get(pool, {})
        weights = {**queued, **self._weights}
        if others:
            running = dict(running)
            weights = {tenant: weight for tenant, (_, weight) in others.items()} | weights
            for tenant, (n, _) in others.items():
                running[tenant] = running.get(tenant, 0) + n
        active = set(running) | set(queued)

        def weight(tenant: str) -> float:
            return weights.get(tenant, 1.0)

        total = sum(weight(t) for t in active)

        def over(tenant: str) -> bool:
            if not active or active == {tenant}:
                return False
            mine = weight(tenant)
            everyone = total if tenant in active else total + mine
            return running.get(tenant, 0) >= slots * mine / everyone

        return over

    def started(self, tenant: str, cap: int | None, weight: float = 1.0, pool: str = "") -> None:
        self.note(tenant, cap, weight)
        self.inflight[tenant] = self.inflight.get(tenant, 0) + 1
        running = self._in_pool.setdefault(pool, {})
        running[tenant] = running.get(tenant, 0) + 1

    def finished(self, tenant: str, pool: str = "") -> None:
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
