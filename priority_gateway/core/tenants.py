"""Requests in flight per tenant, against each tenant's concurrency cap.

Rules:
- A tenant is named by the key store (the key's ``tenant``, else its id), never by the request.
- ``started`` and ``finished`` pair up, as dispatches and finishes do; a tenant with nothing in
  flight is forgotten, so the state is bounded by the tenants with work running.
- The cap and weight are the ones the tenant's latest request carried (keys change; the newest
  word wins). A tenant at its cap (its requests in flight here and, as they report them, on the
  other replicas) starts nothing more; its queued requests are passed over, not refused.
- A tenant's weighted share of a pool's slots is its weight over the total weight of the
  tenants active there (in flight in that pool, or queued: the weight its queued requests carry).
  ``over_share`` says which tenants must leave the pool's reserve alone: a tenant at or over its
  share, while a tenant under its share waits, or while it holds the most per weight of all (so
  a tenant that bursts to its share while another holds more than its own is not held back in
  that other's favour); never a tenant that is alone. With other replicas' tenants (``others``, as
  they report them: ``core/tenant_share.py``), their requests count too, and their tenants are
  active: shares are the fleet's, not this replica's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping


class TenantLoad:
    def __init__(self) -> None:
        self.inflight: dict[str, int] = {}
        self._in_pool: dict[str, dict[str, int]] = {}
        self._caps: dict[str, int] = {}
        self._weights: dict[str, float] = {}

    def has_room(self, tenant: str, elsewhere: int = 0) -> bool:
        """Below its cap, with ``elsewhere`` more of its requests in flight (on the other replicas)."""
        cap = self._caps.get(tenant)
        return cap is None or self.inflight.get(tenant, 0) + elsewhere < cap

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
        others: Mapping[str, tuple[int, int, float]] | None = None,
    ) -> Callable[[str], bool]:
        """Which tenants must leave the reserve of ``pool`` alone now (see the rules); computed once, as
        the test is asked of many tenants in a row. ``queued``: the tenants waiting for the pool here
        and their weight; ``others``: the other replicas' tenants active in the pool, with their
        requests running there, queued, and weight."""
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
