"""Sliding-window latency quantiles, cheap enough to feed from every streamed chunk.

Rules:
- Observations fall into fixed log-spaced buckets (about 4 % apart), so an observation
  is a bisect and an increment, and a quantile is one pass over a few hundred counters.
- The window is ``slices`` time slices of ``slice_s`` seconds; a slice older than the
  window is dropped whole, so the window covers between (slices-1) and slices slices.
- Quantiles are estimates: the upper edge of the bucket holding the rank, never below
  the true value by more than one bucket's width. Whether a quantile is within a bound can also
  be told from counts alone (``count_at_most`` and ``within``), which windows of several
  replicas can add up.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right

_MIN = 1e-4
_MAX = 600.0
_STEP = 1.04
EDGES: tuple[float, ...] = tuple(_MIN * _STEP**i for i in range(int(math.log(_MAX / _MIN, _STEP)) + 2))


class LatencyWindow:
    __slots__ = (
        "_counts",
        "_current",
        "_current_end",
        "_current_start",
        "_slice_counts",
        "_starts",
        "count",
        "slice_s",
        "slices",
    )

    def __init__(self, window_s: float = 30.0, slices: int = 10) -> None:
        self.slices = slices
        self.slice_s = window_s / slices
        self._slice_counts: list[dict[int, int]] = [{} for _ in range(slices)]
        self._starts: list[float] = [-math.inf] * slices
        self._counts: dict[int, int] = {}
        self.count = 0
        self._current: dict[int, int] = self._slice_counts[0]
        self._current_start = math.inf
        self._current_end = -math.inf

    def _advance(self, now: float) -> dict[int, int]:
        index = int(now // self.slice_s) % self.slices
        start = (now // self.slice_s) * self.slice_s
        if self._starts[index] != start:
            old = self._slice_counts[index]
            counts = self._counts
            for bucket, n in old.items():
                left = counts[bucket] - n
                if left:
                    counts[bucket] = left
                else:
                    del counts[bucket]
                self.count -= n
            old.clear()
            self._starts[index] = start
        self._current = self._slice_counts[index]
        self._current_start = start
        self._current_end = start + self.slice_s
        return self._current

    def observe(self, value: float, now: float, times: int = 1) -> None:
        """``times`` observations of ``value`` (events a stream's read delivered together)."""
        bucket = bisect_left(EDGES, value)
        current = self._current if self._current_start <= now < self._current_end else self._advance(now)
        current[bucket] = current.get(bucket, 0) + times
        self._counts[bucket] = self._counts.get(bucket, 0) + times
        self.count += times

    def expire(self, now: float) -> None:
        """Drop slices that fell out of the window (quantiles call this themselves)."""
        horizon = now - self.slice_s * self.slices
        for index, start in enumerate(self._starts):
            if start <= horizon and self._slice_counts[index]:
                for bucket, n in self._slice_counts[index].items():
                    left = self._counts[bucket] - n
                    if left:
                        self._counts[bucket] = left
                    else:
                        del self._counts[bucket]
                    self.count -= n
                self._slice_counts[index].clear()

    def quantile(self, q: float, now: float) -> float | None:
        self.expire(now)
        if self.count == 0:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for bucket in sorted(self._counts):
            seen += self._counts[bucket]
            if seen >= rank:
                return EDGES[min(bucket, len(EDGES) - 1)]
        return EDGES[-1]

    def count_above(self, value: float, now: float) -> int:
        """Observations surely above ``value`` (the bucket that straddles it not counted)."""
        self.expire(now)
        first = bisect_left(EDGES, value) + 1
        return sum(n for bucket, n in self._counts.items() if bucket >= first)

    def count_at_most(self, value: float, now: float) -> int:
        """Observations whose bucket lies wholly at or below ``value``: the q-quantile is at most ``value``
        exactly when they are at least ``ceil(q * count)`` of the window (``within``)."""
        self.expire(now)
        last = bisect_right(EDGES, value)
        return sum(n for bucket, n in self._counts.items() if bucket < last)

    def reset(self) -> None:
        for counts in self._slice_counts:
            counts.clear()
        self._counts.clear()
        self._starts = [-math.inf] * self.slices
        self.count = 0
        self._current_start = math.inf
        self._current_end = -math.inf


def within(q: float, count: int, at_most: int) -> bool:
    """The q-quantile of ``count`` observations is within a bound that ``at_most`` of them are within
    (``count_at_most``): what ``quantile(q) <= bound`` says of one window, for counts summed over several."""
    return count > 0 and at_most >= max(1, math.ceil(q * count))
