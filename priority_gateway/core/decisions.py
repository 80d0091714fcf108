"""What the core decides, as plain data: the answer about a request, and what one call decided for others.

Rules:
- Every call that decides something returns all of it in one ``Decisions``: its ``answer`` about the
  request the call was for (``submit``, ``retry``), and in ``others``, in the order they must be
  carried out, what it decided for other requests: queued ones dispatched or refused, running ones
  preempted, queued ones shed. Nothing is left behind for a later call to collect.
- A ``Dispatch`` (go to this engine) is paired with exactly one ``finish``; a ``Queued`` request's
  ``Dispatch`` or ``Rejection`` comes in a later call's ``others``; a ``Rejection`` carries the
  ``Refusal`` the HTTP layer turns into a status and an error code.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from priority_gateway.core.engines import EngineState
from priority_gateway.core.fair_queue import Charge
from priority_gateway.core.reasons import Refusal
from priority_gateway.core.request import RouteRequest


@dataclass(slots=True, eq=False)
class Dispatch:
    request: RouteRequest
    engine: EngineState
    pool: str
    priority: int | None = None
    predicted_cached_tokens: int = 0
    reason: str = ""
    excluded: tuple[str, ...] = ()
    dispatched_at: float = 0.0
    prefill_tokens: int = 0
    """Uncached prompt tokens counted in the engine's ``pending_prefill`` until the first token."""
    preemptible: bool = False
    done: bool = False
    started: bool = False
    """The engine has scheduled it (first token, or the end): its cache hits are counted."""
    charge: Charge | None = None
    """What starting it charged its tenant in its class's fair queue, settled when it ends."""
    backlog: int = 0
    """Prefill tokens the engine had to compute before its first token: what was queued there, and its own."""


@dataclass(slots=True, eq=False)
class Rejection:
    request: RouteRequest
    reason: Refusal
    message: str
    retry_after_s: float | None = None


@dataclass(slots=True, eq=False)
class Queued:
    request: RouteRequest
    pool: str


@dataclass(slots=True, eq=False)
class Preempted:
    """Stop this backfilled batch request now; it has been queued again and will restart."""

    dispatch: Dispatch

    @property
    def request(self) -> RouteRequest:
        return self.dispatch.request


Outcome = Dispatch | Queued | Rejection | Preempted
Answer = Dispatch | Queued | Rejection
Notice = Dispatch | Rejection | Preempted


@dataclass(slots=True, frozen=True)
class LimitChange:
    engine: str
    old: float
    new: float
    reason: str


@dataclass(slots=True, eq=False)
class Decisions:
    """Everything one call decided (see the module's rules)."""

    answer: Answer | None = None
    others: list[Notice] = field(default_factory=list)
    limit_changes: list[LimitChange] = field(default_factory=list)
    """Engines' limits that moved, or held for a new reason, for the log."""

    def __iter__(self) -> Iterator[Outcome]:
        """The answer, then the others, in order."""
        if self.answer is not None:
            yield self.answer
        yield from self.others
