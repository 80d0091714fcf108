"""Batch work started in another class's pool (backfill), and which of it to stop for that class.

Rules:
- Only a restartable (not streamed) batch request started by backfill may be stopped; it is
  queued again at its old place and restarts from scratch, as vLLM preempts by recomputation.
- The victim is the youngest such request on an engine where stopping one is enough to make room:
  it has done the least work that stopping it throws away.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from priority_gateway.core.decisions import Dispatch
from priority_gateway.core.engines import EngineState


class Backfill:
    def __init__(self) -> None:
        self._on: dict[str, list[Dispatch]] = {}

    def started(self, dispatch: Dispatch) -> None:
        if dispatch.preemptible:
            self._on.setdefault(dispatch.engine.id, []).append(dispatch)

    def ended(self, dispatch: Dispatch) -> None:
        backfilled = self._on.get(dispatch.engine.id)
        if backfilled and dispatch in backfilled:
            backfilled.remove(dispatch)

    def victim(self, engines: Iterable[EngineState], room: Callable[[EngineState], float]) -> Dispatch | None:
        """The request to stop so that one more can start on one of ``engines``, if any."""
        victims = [
            d
            for e in engines
            if room(e) + 1 > 0  # one stop must be enough to make room
            for d in self._on.get(e.id, ())
            if not d.done and d.preemptible
        ]
        return max(victims, key=lambda d: d.dispatched_at) if victims else None
