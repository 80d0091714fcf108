"""Adaptive concurrency limit of one engine: AIMD on its live ITL p99.

Why AIMD and not a gradient method: under continuous batching ITL does not grow like a
queue (smoothly with load) but in steps, when more sequences share each decode step and
when new prompts' prefills interrupt decoding; the p99 crosses the budget at a cliff
(the article's NVFP4 engine holds it at 4 and misses at 8). A gradient method fitted to a
smooth curve overshoots such a cliff; AIMD probes one slot at a time and backs off hard.

Rules:
- Every ``interval_s`` the limit is reconsidered from the engine's ITL window.
- Above ``high * budget`` it shrinks multiplicatively, by the overshoot (at most halving),
  then waits ``cooldown_s`` before shrinking again, so the window can refill with samples
  taken at the new limit.
- Below ``low * budget`` it grows, but only if the limit was actually reached since the last
  decision (an unused limit proves nothing): doubling until the first sign of pressure
  (slow start), one slot at a time after.
- With too few samples to estimate a p99 it holds.
- An engine without a budget keeps a fixed limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.core.window import LatencyWindow


@dataclass(slots=True)
class LimitSettings:
    initial: float = 2.0
    minimum: float = 1.0
    maximum: float = 256.0
    interval_s: float = 2.0
    cooldown_s: float = 10.0
    low: float = 0.75
    high: float = 0.95
    min_samples: int = 100
    window_s: float = 20.0
    unbudgeted: float = 64.0


class ConcurrencyLimit:
    __slots__ = (
        "_last_decrease",
        "_next_update",
        "_peak",
        "budget_s",
        "itl",
        "last_p99",
        "limit",
        "settings",
        "slow_start",
        "ttft",
    )

    def __init__(self, budget_s: float | None, settings: LimitSettings, now: float = 0.0) -> None:
        self.settings = settings
        self.budget_s = budget_s
        self.limit = settings.initial if budget_s is not None else settings.unbudgeted
        self.itl = LatencyWindow(settings.window_s)
        self.ttft = LatencyWindow(settings.window_s)
        self.slow_start = True
        self.last_p99: float | None = None
        self._peak = 0.0
        self._next_update = now + settings.interval_s
        self._last_decrease = -math.inf

    def room(self, load: float) -> float:
        return self.limit - load

    def note_load(self, load: float) -> None:
        if load > self._peak:
            self._peak = load

    def update(self, now: float, load: float) -> bool:
        """Reconsider the limit if an interval has passed; True when it changed."""
        if now < self._next_update:
            return False
        s = self.settings
        self._next_update = now + s.interval_s
        peak, self._peak = max(self._peak, load), load
        if self.budget_s is None:
            return False
        reached = peak >= self.limit - 0.5
        p99 = self.itl.quantile(0.99, now) if self.itl.count >= s.min_samples else None
        self.last_p99 = p99
        old = self.limit
        if p99 is not None and p99 > s.high * self.budget_s:
            self.slow_start = False
            if now - self._last_decrease >= s.cooldown_s:
                factor = max(0.5, min(0.9, s.high * self.budget_s / p99))
                self.limit = max(s.minimum, math.floor(self.limit * factor))
                self._last_decrease = now
        elif reached and p99 is not None and p99 < s.low * self.budget_s:
            if self.slow_start and p99 < 0.5 * self.budget_s:
                self.limit = min(s.maximum, self.limit * 2)
            else:
                self.slow_start = False
                self.limit = min(s.maximum, self.limit + 1)
        return self.limit != old
