"""Requests in flight per tenant, against each tenant's concurrency cap.

Rules:
- A tenant is named by the key store (the key's ``tenant``, else its id), never by the request.
- ``started`` and ``finished`` pair up, as dispatches and finishes do; a tenant with nothing in
  flight is forgotten, so the state is bounded by the tenants with work running.
- The cap is the one the tenant's latest request carried (keys change; the newest word wins).
  A tenant at its cap starts nothing more; its queued requests are passed over, not refused.
"""

from __future__ import annotations


class TenantLoad:
    def __init__(self) -> None:
        self.inflight: dict[str, int] = {}
        self._caps: dict[str, int] = {}

    def has_room(self, tenant: str) -> bool:
        cap = self._caps.get(tenant)
        return cap is None or self.inflight.get(tenant, 0) < cap

    def note_cap(self, tenant: str, cap: int | None) -> None:
        if cap is None:
            self._caps.pop(tenant, None)
        else:
            self._caps[tenant] = cap

    def started(self, tenant: str, cap: int | None) -> None:
        self.note_cap(tenant, cap)
        self.inflight[tenant] = self.inflight.get(tenant, 0) + 1

    def finished(self, tenant: str) -> None:
        left = self.inflight.get(tenant, 0) - 1
        if left > 0:
            self.inflight[tenant] = left
        else:
            self.inflight.pop(tenant, None)
            self._caps.pop(tenant, None)
