"""Drives an ``EngineCore`` in virtual time: a tiny discrete-event loop for one engine.

Rules (the same as ``realtime.RealtimeDriver``, with a virtual clock):
- A step starts at ``now`` and its tokens are delivered at ``now + duration``; the next step
  starts at that instant. Requests that arrive during a step enter the engine at their arrival
  time and are scheduled from the next step on.
- With no work, time jumps to the next arrival.
- ``on_output(time, output)`` is called for every delivery; it may return new arrivals (a closed
  loop of clients answers a finished request with its next one), which must not be in the past.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from priority_gateway.engines.sim.core import EngineCore, EngineRequest, StepOutput

OnOutput = Callable[[float, StepOutput], Iterable[tuple[float, EngineRequest]] | None]


@dataclass(slots=True)
class Trace:
    """What a virtual run produced: every delivery, in order."""

    deliveries: list[tuple[float, StepOutput]] = field(default_factory=list)
    steps: int = 0
    end: float = 0.0


def run(
    core: EngineCore,
    arrivals: Iterable[tuple[float, EngineRequest]],
    on_output: OnOutput | None = None,
    until: float = float("inf"),
) -> Trace:
    order = itertools.count()
    pending: list[tuple[float, int, EngineRequest]] = [(t, next(order), r) for t, r in arrivals]
    heapq.heapify(pending)
    trace = Trace()
    now = 0.0
    while (pending or core.has_work) and now < until:
        if not core.has_work:
            now = max(now, pending[0][0])
        while pending and pending[0][0] <= now:
            t, _, req = heapq.heappop(pending)
            core.add_request(req, t)
        if not core.has_work:
            continue
        result = core.step(now)
        trace.steps += 1
        end = now + result.duration_s
        while pending and pending[0][0] < end:
            t, _, req = heapq.heappop(pending)
            core.add_request(req, t)
        for output in result.outputs:
            trace.deliveries.append((end, output))
            if on_output is not None:
                for t, req in on_output(end, output) or ():
                    heapq.heappush(pending, (max(t, end), next(order), req))
        if result.duration_s == 0 and not result.outputs and not result.scheduled_tokens:
            if not pending:
                raise RuntimeError("engine is stuck: work that can never be scheduled")
            now = max(end, pending[0][0])
        else:
            now = end
    trace.end = now
    return trace
