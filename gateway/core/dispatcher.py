"""The gateway's decisions for every request, in one sans-I/O state machine.

Rules:
- ``submit`` answers at once with a ``Dispatch`` (go to this engine), a ``Queued``
  (wait; a later ``finish`` or ``poll`` returns its ``Dispatch`` or ``Rejection``), or a
  ``Rejection`` (answer the client with this status and error code).
- Every ``Dispatch`` must be paired with exactly one ``finish``; that is what keeps the
  in-flight counts, and therefore routing and admission, honest.
- Only healthy engines are candidates. A class goes to its home pool.
- Time is always an argument: the HTTP layer passes the wall clock, the simulator a
  virtual one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gateway.core.classes import CLASS_RANK
from gateway.core.engines import EngineMetrics, EngineState
from gateway.core.request import RouteRequest
from gateway.core.routing import Choice, Policy, make_policy


@dataclass(slots=True)
class PoolSpec:
    name: str
    engines: list[str]
    policy: str = "least_loaded"
    takes_priority: bool = False
    policy_options: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class Dispatch:
    request: RouteRequest
    engine: EngineState
    pool: str
    priority: int | None = None
    predicted_cached_tokens: int = 0
    reason: str = ""
    excluded: tuple[str, ...] = ()


@dataclass(slots=True, eq=False)
class Rejection:
    request: RouteRequest
    status: int
    code: str
    message: str
    retry_after_s: float | None = None


@dataclass(slots=True, eq=False)
class Queued:
    request: RouteRequest
    pool: str


Outcome = Dispatch | Queued | Rejection


class Pool:
    def __init__(self, spec: PoolSpec) -> None:
        self.name = spec.name
        self.takes_priority = spec.takes_priority
        self.policy: Policy = make_policy(spec.policy, **spec.policy_options)
        self.engines: list[EngineState] = [EngineState(url, spec.name) for url in spec.engines]

    def healthy(self, exclude: Iterable[str] = ()) -> list[EngineState]:
        excluded = set(exclude)
        return [e for e in self.engines if e.healthy and e.id not in excluded]

    def set_engines(self, urls: Sequence[str]) -> None:
        known = {e.id: e for e in self.engines}
        self.engines = [known.get(url) or EngineState(url, self.name) for url in urls]
        for gone in set(known) - set(urls):
            self.policy.forget(gone)


class Dispatcher:
    def __init__(self, pools: Sequence[PoolSpec], home: Mapping[str, str] | None = None) -> None:
        if not pools:
            raise ValueError("at least one pool is needed")
        self.pools: dict[str, Pool] = {spec.name: Pool(spec) for spec in pools}
        first = pools[0].name
        self.home: dict[str, str] = {
            cls: (home or {}).get(cls) or (cls if cls in self.pools else first) for cls in CLASS_RANK
        }
        self._engines: dict[str, EngineState] = {}
        self._reindex()

    # -- topology and health -------------------------------------------------

    def _reindex(self) -> None:
        self._engines = {e.id: e for pool in self.pools.values() for e in pool.engines}

    def engines(self) -> list[EngineState]:
        return list(self._engines.values())

    def engine(self, engine_id: str) -> EngineState | None:
        return self._engines.get(engine_id)

    def set_pool_engines(self, pool: str, urls: Sequence[str]) -> None:
        self.pools[pool].set_engines(urls)
        self._reindex()

    def set_health(self, engine_id: str, healthy: bool, now: float) -> None:
        engine = self._engines.get(engine_id)
        if engine is not None:
            engine.healthy = healthy

    def apply_scrape(self, engine_id: str, metrics: EngineMetrics, now: float) -> None:
        engine = self._engines.get(engine_id)
        if engine is not None:
            engine.apply_scrape(metrics, now)
            self.pools[engine.pool].policy.scraped(engine)

    def queue_depths(self) -> dict[tuple[str, str], int]:
        return {}

    def prefix_hit_estimates(self) -> dict[str, float]:
        return {name: pool.policy.hit_ratio_estimate() for name, pool in self.pools.items()}

    def concurrency_limits(self) -> dict[str, float]:
        return {}

    def ready(self) -> dict[str, bool]:
        return {name: any(e.healthy for e in pool.engines) for name, pool in self.pools.items()}

    # -- the request path ----------------------------------------------------

    def pool_for(self, cls: str) -> Pool:
        return self.pools[self.home[cls]]

    def submit(self, req: RouteRequest, now: float, exclude: Sequence[str] = ()) -> Outcome:
        pool = self.pool_for(req.cls)
        candidates = pool.healthy(exclude)
        choice = pool.policy.choose(req, candidates, now)
        if choice is None:
            return Rejection(
                req,
                503,
                "no_healthy_engine",
                f"no healthy engine in pool {pool.name!r}" + (" after a failed attempt" if exclude else ""),
                retry_after_s=1.0,
            )
        return self._start(req, pool, choice, now, exclude)

    def _start(self, req: RouteRequest, pool: Pool, choice: Choice, now: float, exclude: Sequence[str]) -> Dispatch:
        engine = choice.engine
        engine.started(req.cls)
        pool.policy.routed(req, choice, now)
        priority = CLASS_RANK[req.cls] if pool.takes_priority else None
        return Dispatch(req, engine, pool.name, priority, choice.predicted_cached_tokens, choice.reason, tuple(exclude))

    def finish(self, dispatch: Dispatch, now: float, ok: bool = True) -> list[Outcome]:
        dispatch.engine.finished(dispatch.request.cls)
        return []

    def retry(self, dispatch: Dispatch, now: float) -> Outcome:
        """The engine refused the connection before any byte: try another of the pool once."""
        self.finish(dispatch, now, ok=False)
        return self.submit(dispatch.request, now, exclude=(*dispatch.excluded, dispatch.engine.id))

    def poll(self, now: float) -> list[Outcome]:
        return []

    def cancel(self, req: RouteRequest, now: float) -> None:
        return None

    # -- observations from the relay -----------------------------------------

    def observe_ttft(self, dispatch: Dispatch, seconds: float, now: float) -> None:
        return None

    def observe_itl(self, dispatch: Dispatch, seconds: float, now: float) -> None:
        return None
