"""Adaptive concurrency limit of one engine: AIMD steered by ITL p99 measured per load level.

Why AIMD, and why per level: under continuous batching ITL does not grow like a queue
(smoothly with load) but in steps, when more sequences share each decode step and when new
prompts' prefills interrupt decoding; its p99 crosses the budget at a cliff (the article's
NVFP4 engine holds the SLO at 4 and misses at 8). A gradient method fitted to a smooth
curve overshoots such a cliff. AIMD probes one slot at a time and backs off hard, and by
keeping the ITL window of each load level separately it knows, from what it measured,
where the cliff is, instead of rediscovering it by crossing it over and over.

Rules:
- Each ITL observation goes to the engine's window and to the window of the load level
  (requests in flight, rounded) at which it was seen.
- Every ``interval_s`` the limit is reconsidered:
  - shrink when the p99 measured at the current limit is above ``high * budget``, or the
    engine's whole-window p99 is far above it (a safety net once that window holds enough
    samples to trust a p99): to the highest lower level measured within ``high * budget``,
    else multiplicatively (at most halving); then no further shrink for ``cooldown_s``;
  - grow by one when the limit was reached since the last decision and the p99 at the
    current limit is within ``low * budget``, unless the next level was measured above the
    budget within the level window (the known cliff: hold);
  - otherwise hold. A limit that was not reached proves nothing and does not grow.
- Level windows are ``level_window_s`` long, so a cliff measured long ago is probed again.
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
    low: float = 0.9
    high: float = 1.0
    min_samples: int = 100
    window_s: float = 20.0
    level_window_s: float = 120.0
    unbudgeted: float = 64.0


class ConcurrencyLimit:
    __slots__ = (
        "_last_decrease",
        "_next_update",
        "_peak",
        "budget_s",
        "itl",
        "last_p99",
        "levels",
        "limit",
        "settings",
        "ttft",
    )

    def __init__(self, budget_s: float | None, settings: LimitSettings, now: float = 0.0) -> None:
        self.settings = settings
        self.budget_s = budget_s
        self.limit = settings.initial if budget_s is not None else settings.unbudgeted
        self.itl = LatencyWindow(settings.window_s)
        self.ttft = LatencyWindow(settings.window_s)
        self.levels: dict[int, LatencyWindow] = {}
        self.last_p99: float | None = None
        self._peak = 0.0
        self._next_update = now + settings.interval_s
        self._last_decrease = -math.inf

    def observe_itl(self, seconds: float, load: float, now: float) -> None:
        self.itl.observe(seconds, now)
        level = max(1, round(load))
        window = self.levels.get(level)
        if window is None:
            window = self.levels[level] = LatencyWindow(self.settings.level_window_s)
        window.observe(seconds, now)

    def note_load(self, load: float) -> None:
        if load > self._peak:
            self._peak = load

    def level_p99(self, level: int, now: float) -> float | None:
        window = self.levels.get(level)
        if window is None:
            return None
        window.expire(now)
        if window.count < self.settings.min_samples:
            return None
        return window.quantile(0.99, now)

    def update(self, now: float, load: float) -> bool:
        """Reconsider the limit if an interval has passed; True when it changed."""
        if now < self._next_update:
            return False
        s = self.settings
        self._next_update = now + s.interval_s
        peak, self._peak = max(self._peak, load), load
        budget = self.budget_s
        if budget is None:
            return False
        old = self.limit
        current = max(1, math.floor(self.limit))
        overall = self.itl.quantile(0.99, now) if self.itl.count >= s.min_samples else None
        self.last_p99 = overall
        at_limit = self.level_p99(current, now)
        # The short whole-engine window is noisy (a few prefill stalls swing a p99 of a few hundred
        # samples), so it only acts once well filled; the per-level windows are the main evidence.
        overall_bad = overall is not None and self.itl.count >= 5 * s.min_samples and overall > 1.5 * budget
        too_slow = overall_bad or (at_limit is not None and at_limit > s.high * budget)
        if too_slow:
            if now - self._last_decrease >= s.cooldown_s:
                self.limit = self._safe_level(current, budget, now)
                self._last_decrease = now
        elif peak >= self.limit - 0.5 and at_limit is not None and at_limit <= s.low * budget:
            above = self.level_p99(current + 1, now)
            if above is None or above <= budget:
                self.limit = min(s.maximum, current + 1)
        return self.limit != old

    def _safe_level(self, current: int, budget: float, now: float) -> float:
        s = self.settings
        for level in range(current - 1, 0, -1):
            p99 = self.level_p99(level, now)
            if p99 is not None and p99 <= s.high * budget:
                return max(s.minimum, float(level))
        return max(s.minimum, float(math.floor(current * 0.7)))
