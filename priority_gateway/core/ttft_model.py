"""How long an engine takes from a request's start to its first token, by the prefill ahead of it.

An exponentially weighted least-squares line ``ttft = a + b * tokens`` over recent first tokens, where
``tokens`` is the prefill the engine has to compute before the first token: the uncached prompt
tokens queued there when the request started, its own included (``b`` is then one over the engine's
prefill pace, ``a`` its fixed cost per request). Admission uses it to know how late a request may
start and still meet its TTFT budget, and whether an engine's queued prefill would make it late
there, which a single average would get wrong for long prompts and long queues (too optimistic)
and short ones (too pessimistic).

Why a measured margin: the line predicts a typical first token and the budget bounds a p99. How far
the p99 lies above the typical one depends on the engine (chunked prefill beside many decoders, a
prefill that queues behind others started just after it), so a fixed factor is too loose on one
engine and too tight on another (docs/report.md, "Real GPU": the budgets on one H200).

Rules:
- ``predict`` is the line's typical first token; ``margin`` is what to multiply it by for a p99: the
  99th percentile of observed over predicted of the last ``RATIOS`` first tokens, between
  ``MIN_MARGIN`` and ``MAX_MARGIN``; ``DEFAULT_MARGIN`` until ``MIN_RATIOS`` were seen. Each ratio is
  taken against the line as it stood before that first token was added to it.
- Nothing observed yet: no prediction (None).
"""

from __future__ import annotations

import math
from collections import deque

RATIOS = 512
MIN_RATIOS = 50
DEFAULT_MARGIN = 1.2
MIN_MARGIN = 1.1
MAX_MARGIN = 3.0
_FLOOR_S = 0.001  # a prediction below a millisecond says nothing a ratio could use
_REFRESH = 16  # the percentile is sorted again after this many new ratios


class TTFTModel:
    __slots__ = ("_fresh", "_margin", "_n", "_ratios", "_sx", "_sxx", "_sxy", "_sy", "decay")

    def __init__(self, decay: float = 0.98) -> None:
        self.decay = decay
        self._n = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self._ratios: deque[float] = deque(maxlen=RATIOS)
        self._margin = DEFAULT_MARGIN
        self._fresh = 0

    def observe(self, tokens: int, seconds: float) -> None:
        expected = self.predict(tokens)
        if expected is not None:
            self._ratios.append(seconds / max(expected, _FLOOR_S))
            self._fresh += 1
        d = self.decay
        x = float(tokens)
        self._n = d * self._n + 1.0
        self._sx = d * self._sx + x
        self._sy = d * self._sy + seconds
        self._sxx = d * self._sxx + x * x
        self._sxy = d * self._sxy + x * seconds

    def predict(self, tokens: int) -> float | None:
        n = self._n
        if n < 1.0:
            return None
        mean_x, mean_y = self._sx / n, self._sy / n
        var_x = self._sxx / n - mean_x * mean_x
        slope = (self._sxy / n - mean_x * mean_y) / var_x if var_x > 1e-9 else 0.0
        slope = max(0.0, slope)
        return max(0.0, mean_y + slope * (tokens - mean_x))

    @property
    def margin(self) -> float:
        """What a typical first token (``predict``) is multiplied by to bound a p99 one."""
        if self._fresh >= _REFRESH and len(self._ratios) >= MIN_RATIOS:
            self._fresh = 0
            ordered = sorted(self._ratios)
            p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
            self._margin = min(MAX_MARGIN, max(MIN_MARGIN, p99))
        return self._margin
