"""When the slots of a pool's full engines free up, for a request that would wait for one.

A request waiting behind full engines starts when enough of the requests running there end. How
long a request holds its slot follows from what it asks for: its first token (the pool's TTFT
line, by prompt length), then up to ``max_tokens`` tokens at the pool's pace between tokens. Most
answers stop before ``max_tokens``, so the prediction is scaled by how long requests really held
their slots against what was predicted for them. A single average of slot times would make a
request queued behind an 8-token answer wait as long as behind a 500-token one.

Rules:
- ``observe_gap`` takes every relayed inter-token gap (the pace); ``observe_done`` every request
  that ended well, with its prediction (the scale) or, without ``max_tokens``, its slot time (the
  average used for such requests).
- A running request is predicted to end at its start plus its predicted slot time; one already
  past that is taken to end now.
- An engine frees its first slot when its load falls below its limit, after ``floor(load - limit)
  + 1`` of the requests running there end, then one with each further end. Only requests this
  gateway runs there are timed; other replicas' are not known.
- The wait of the request at queue ``position`` (0: next) is when the ``position + 1``-th slot
  frees; where the running requests cannot tell (none timed, or too few), ``position + 1``
  average slot times shared over the pool's slots.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class Running:
    started: float
    first_token_s: float
    """Predicted time to first token from ``started``."""
    max_tokens: int | None


@dataclass(slots=True)
class FullEngine:
    load: float
    limit: float
    running: Iterable[Running]


class SlotTimes:
    __slots__ = ("gap_s", "mean_s", "scale")

    def __init__(self) -> None:
        self.gap_s: float | None = None
        self.scale = 1.0
        self.mean_s: float | None = None

    def observe_gap(self, seconds: float, times: int = 1) -> None:
        """``times`` gaps of ``seconds``: the moving average as after that many observations."""
        kept = 0.99**times
        self.gap_s = seconds if self.gap_s is None else kept * self.gap_s + (1 - kept) * seconds

    def observe_done(self, run: Running, seconds: float) -> None:
        self.mean_s = seconds if self.mean_s is None else 0.95 * self.mean_s + 0.05 * seconds
        predicted = self._raw(run)
        if predicted is not None and predicted > 0:
            self.scale = 0.95 * self.scale + 0.05 * min(2.0, seconds / predicted)

    def _raw(self, run: Running) -> float | None:
        if run.max_tokens is None or self.gap_s is None:
            return None
        return run.first_token_s + max(0, run.max_tokens - 1) * self.gap_s

    def predict(self, run: Running) -> float | None:
        """How long ``run`` holds its slot from its start."""
        raw = self._raw(run)
        return self.mean_s if raw is None else raw * self.scale

    def wait(self, position: int, engines: Sequence[FullEngine], now: float) -> float | None:
        """Time until the request at queue ``position`` gets a slot on one of ``engines``."""
        frees: list[float] = []
        for engine in engines:
            ends = [self._remaining(run, now) for run in engine.running]
            if any(end is None for end in ends):
                frees = []
                break
            frees.extend(_slots_free_at(engine, sorted(e for e in ends if e is not None)))
        if len(frees) > position:
            return sorted(frees)[position]
        if self.mean_s is None:
            return None
        slots = sum(engine.limit for engine in engines)
        return (position + 1) * self.mean_s / max(1.0, slots)

    def _remaining(self, run: Running, now: float) -> float | None:
        held = self.predict(run)
        return None if held is None else max(0.0, run.started + held - now)


def _slots_free_at(engine: FullEngine, ends: list[float]) -> list[float]:
    """When each slot of ``engine`` is free, given when its running requests end (sorted)."""
    out: list[float] = []
    free = max(0, math.ceil(engine.limit - engine.load))
    out.extend([0.0] * free)
    for n, end in enumerate(ends, 1):
        now_free = max(0, math.ceil(engine.limit - engine.load + n))
        out.extend([end] * (now_free - free))
        free = now_free
    return out
