"""Engine choice inside one pool.

A policy sees only healthy candidates and returns one of them (or ``None`` when the
list is empty). Policies learn from what they routed through ``routed``; they never
mutate engine state themselves (the dispatcher does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from priority_gateway.core.engines import EngineState
from priority_gateway.core.kv_events import KVEvent
from priority_gateway.core.request import RouteRequest


@dataclass(slots=True, frozen=True)
class Choice:
    engine: EngineState
    predicted_cached_tokens: int = 0
    reason: str = "least_loaded"


class Policy(Protocol):
    name: str

    def choose(self, req: RouteRequest, candidates: Sequence[EngineState], now: float) -> Choice | None: ...

    def routed(self, req: RouteRequest, choice: Choice, now: float) -> None: ...

    def started(self, engine_id: str, predicted_cached_tokens: int, prompt_tokens: int) -> None: ...

    def scraped(self, engine: EngineState) -> None: ...

    def forget(self, engine_id: str) -> None: ...

    def hit_ratio_estimate(self) -> float: ...

    def kv_events(self, engine_id: str, events: Sequence[KVEvent], restarted: bool = False) -> None: ...


class _Stateless:
    """Policies that learn nothing from what they route."""

    def routed(self, req: RouteRequest, choice: Choice, now: float) -> None:
        return None

    def started(self, engine_id: str, predicted_cached_tokens: int, prompt_tokens: int) -> None:
        return None

    def scraped(self, engine: EngineState) -> None:
        return None

    def forget(self, engine_id: str) -> None:
        return None

    def hit_ratio_estimate(self) -> float:
        return 0.0

    def kv_events(self, engine_id: str, events: Sequence[KVEvent], restarted: bool = False) -> None:
        return None


class RoundRobin(_Stateless):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, req: RouteRequest, candidates: Sequence[EngineState], now: float) -> Choice | None:
        if not candidates:
            return None
        engine = candidates[self._next % len(candidates)]
        self._next += 1
        return Choice(engine, 0, "round_robin")


class LeastLoaded(_Stateless):
    """Fewest requests in flight; ties go round robin so idle pools spread evenly."""

    name = "least_loaded"

    def __init__(self) -> None:
        self._tiebreak = 0

    def choose(self, req: RouteRequest, candidates: Sequence[EngineState], now: float) -> Choice | None:
        if not candidates:
            return None
        n = len(candidates)
        self._tiebreak += 1
        best = candidates[self._tiebreak % n]
        best_load = best.load
        for engine in candidates:
            load = engine.load
            if load < best_load:
                best, best_load = engine, load
        return Choice(best, 0, "least_loaded")


def make_policy(name: str, **options: object) -> Policy:
    from priority_gateway.core.prefix_policy import PrefixAffinity

    policies: dict[str, Callable[..., Policy]] = {
        "round_robin": RoundRobin,
        "least_loaded": LeastLoaded,
        "prefix": PrefixAffinity,
    }
    try:
        factory = policies[name]
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(sorted(policies))}") from None
    return factory(**options)
