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


@dataclass(frozen=True, slots=True)
class RoutedBlocks:
    """A request went to ``engine``; it holds the leading prompt blocks ``blocks`` (none in precise mode).
    What replicas tell each other of their routing (``fleet``)."""

    engine: str
    blocks: tuple[int, ...]
    prompt_tokens: int
    block_tokens: int


@dataclass(slots=True, frozen=True)
class Choice:
    engine: EngineState
    predicted_cached_tokens: int = 0
    reason: str = "least_loaded"


class Policy(Protocol):
    name: str

    def choose(self, req: RouteRequest, candidates: Sequence[EngineState], now: float) -> Choice | None: ...

    def routed(self, req: RouteRequest, choice: Choice) -> None: ...

    def holds(self, req: RouteRequest) -> bool: ...

    def started(self, engine_id: str, predicted_cached_tokens: int, prompt_tokens: int) -> None: ...

    def scraped(self, engine: EngineState) -> None: ...

    def forget(self, engine_id: str) -> None: ...

    def hit_ratio_estimate(self) -> float: ...

    def kv_events(self, engine_id: str, events: Sequence[KVEvent], restarted: bool = False) -> None: ...

    def share(self, max_pending: int) -> None:
        """From now on keep what routing teaches for the other replicas, at most ``max_pending`` facts."""

    def take_learned(self) -> list[RoutedBlocks]:
        """What routing taught since the last call, for the other replicas."""
        ...

    def learn(self, fact: RoutedBlocks, engine: EngineState) -> None:
        """Another replica's routing fact: learn it as if this replica had routed the request."""


class _Stateless:
    """Policies that learn nothing from what they route: each hook takes the ``Policy`` protocol's
    arguments and ignores them (hence the ``noqa: ARG002``)."""

    def routed(self, req: RouteRequest, choice: Choice) -> None:  # noqa: ARG002
        return None

    def holds(self, req: RouteRequest) -> bool:  # noqa: ARG002
        return False

    def started(self, engine_id: str, predicted_cached_tokens: int, prompt_tokens: int) -> None:  # noqa: ARG002
        return None

    def scraped(self, engine: EngineState) -> None:  # noqa: ARG002
        return None

    def forget(self, engine_id: str) -> None:  # noqa: ARG002
        return None

    def hit_ratio_estimate(self) -> float:
        return 0.0

    def kv_events(self, engine_id: str, events: Sequence[KVEvent], restarted: bool = False) -> None:  # noqa: ARG002
        return None

    def share(self, max_pending: int) -> None:  # noqa: ARG002
        return None

    def take_learned(self) -> list[RoutedBlocks]:
        return []

    def learn(self, fact: RoutedBlocks, engine: EngineState) -> None:  # noqa: ARG002
        return None


class RoundRobin(_Stateless):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, req: RouteRequest, candidates: Sequence[EngineState], now: float) -> Choice | None:  # noqa: ARG002  # Policy protocol
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

    def choose(self, req: RouteRequest, candidates: Sequence[EngineState], now: float) -> Choice | None:  # noqa: ARG002  # Policy protocol
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
