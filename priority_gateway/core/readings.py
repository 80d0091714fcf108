"""What the dispatcher's observers read (Prometheus, the simulator's reports): counts, never decisions.

Rules:
- Read-only: nothing here changes what the dispatcher decides.
- Everything is keyed by what the configuration and the key store name (pools, classes, engines,
  tenants), never by anything a request says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from priority_gateway.core.engines import EngineState

if TYPE_CHECKING:
    from priority_gateway.core.dispatcher import Dispatcher


class Readings:
    def __init__(self, dispatcher: Dispatcher) -> None:
        self._d = dispatcher

    def engines(self) -> list[EngineState]:
        return self._d.engines()

    def queue_depths(self) -> dict[tuple[str, str], int]:
        d = self._d
        return {(name, cls): pool.queue.depth(cls) for name, pool in d.pools.items() for cls in d.classes.names}

    def tenant_inflight(self) -> dict[str, int]:
        return dict(self._d.tenants.inflight)

    def tenant_queued(self) -> dict[tuple[str, str], int]:
        d = self._d
        out: dict[tuple[str, str], int] = {}
        for pool in d.pools.values():
            for cls in d.classes.names:
                for tenant, n in pool.queue.tenants(cls).items():
                    out[(tenant, cls)] = out.get((tenant, cls), 0) + n
        return out

    def prefix_hit_estimates(self) -> dict[str, float]:
        return {name: pool.policy.hit_ratio_estimate() for name, pool in self._d.pools.items()}

    def concurrency_limits(self) -> dict[str, float]:
        """Each engine's limit as admission applies it (the fleet's, or this replica's safe share of it)."""
        return self._d.capacity.limits_applied(self._d.engines())

    def ttft_models(self) -> dict[str, tuple[float, tuple[float, float] | None]]:
        """Each pool's first-token model as admission applies it (``core.ttft_model``): its margin, and its
        line (seconds at no prefill ahead, seconds per token ahead) once a first token was seen."""
        return {name: (pool.ttft_model.margin, pool.ttft_model.line()) for name, pool in self._d.pools.items()}

    def held_slots(self) -> dict[str, int]:
        """The slots this replica may fill on each engine while it fills them within its holdings."""
        fleet = self._d.fleet
        if not fleet.within_holdings:
            return {}
        return {engine.id: fleet.cap(engine.id) for engine in self._d.engines()}
