"""How long an engine takes from a request's start to its first token, by the prefill ahead of it.

An exponentially weighted least-squares line ``ttft = a + b * tokens`` over recent first tokens, where
``tokens`` is the prefill the engine has to compute before the first token: the uncached prompt
tokens queued there when the request started, its own included (``b`` is then one over the engine's
prefill pace, ``a`` its fixed cost per request). Admission uses it to know how late a request may
start and still meet its TTFT budget, and whether an engine's queued prefill would make it late
there, which a single average would get wrong for long prompts and long queues (too optimistic)
and short ones (too pessimistic).

Why the margin is steered by the misses themselves: the line predicts a typical first token and the
budget bounds a p99, and how far one lies above the other depends on the engine (chunked prefill
beside many decoders, a prefill that queues behind another started just after it, other replicas'
starts not yet known here). A fixed factor is too loose on one engine and too tight on another (on one
H200 the admitted requests' TTFT p99 was 540-620 ms against 500 with 1.2). The p99 of observed over
predicted, tried before, grows with rare slow first tokens on short predictions that had time to
spare (through 4 replicas sharing a pool it reached 1.8-2.9 and refused a quarter of the well-behaved
tenants' requests, which 1.2 had all served in time). What the budget asks is that few admitted first
tokens come late, so that is what moves the margin.

Rules:
- ``predict`` is the line's typical first token; ``margin`` is what admission multiplies it by for a
  p99. It starts at ``DEFAULT_MARGIN``; each first token that came after its request's TTFT budget
  raises it by ``MISS_STEP`` (a factor), each one in time lowers it by the factor that makes
  ``TARGET_LATE_SHARE`` of first tokens late where the two balance (half of what a p99 budget
  allows); it stays between ``MIN_MARGIN`` and ``MAX_MARGIN``. First tokens without a budget move
  only the line.
- Nothing observed yet: no prediction (None).
"""

from __future__ import annotations

DEFAULT_MARGIN = 1.2
MIN_MARGIN = 1.05
MAX_MARGIN = 3.0
TARGET_LATE_SHARE = 0.005
MISS_STEP = 1.05
_IN_TIME_STEP = MISS_STEP ** (-TARGET_LATE_SHARE / (1.0 - TARGET_LATE_SHARE))


class TTFTModel:
    __slots__ = ("_n", "_sx", "_sxx", "_sxy", "_sy", "decay", "margin")

    def __init__(self, decay: float = 0.98) -> None:
        self.decay = decay
        self._n = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self.margin = DEFAULT_MARGIN

    def observe(self, tokens: int, seconds: float, late: bool | None = None) -> None:
        """A first token ``seconds`` after its start with ``tokens`` of prefill ahead; ``late``: whether it
        came after its request's TTFT budget (None: the request had none)."""
        if late is not None:
            step = MISS_STEP if late else _IN_TIME_STEP
            self.margin = min(MAX_MARGIN, max(MIN_MARGIN, self.margin * step))
        d = self.decay
        x = float(tokens)
        self._n = d * self._n + 1.0
        self._sx = d * self._sx + x
        self._sy = d * self._sy + seconds
        self._sxx = d * self._sxx + x * x
        self._sxy = d * self._sxy + x * seconds

    def predict(self, tokens: int) -> float | None:
        fit = self._fit()
        if fit is None:
            return None
        mean_x, mean_y, slope = fit
        return max(0.0, mean_y + slope * (tokens - mean_x))

    def line(self) -> tuple[float, float] | None:
        """The line's (seconds at no prefill ahead, seconds per token of prefill ahead); None before any
        first token."""
        fit = self._fit()
        if fit is None:
            return None
        mean_x, mean_y, slope = fit
        return mean_y - slope * mean_x, slope

    def _fit(self) -> tuple[float, float, float] | None:
        """The weighted means of prefill ahead and first token, and the line's slope (never below 0)."""
        n = self._n
        if n < 1.0:
            return None
        mean_x, mean_y = self._sx / n, self._sy / n
        var_x = self._sxx / n - mean_x * mean_x
        slope = (self._sxy / n - mean_x * mean_y) / var_x if var_x > 1e-9 else 0.0
        return mean_x, mean_y, max(0.0, slope)
