"""How long an engine takes from a request's start to its first token, by the prefill ahead of it.

An exponentially weighted least-squares line ``ttft = a + b * tokens`` over recent first tokens, where
``tokens`` is the prefill the engine has to compute before the first token: the uncached prompt
tokens queued there when the request started, its own included (``b`` is then one over the engine's
prefill pace, ``a`` its fixed cost per request). Admission uses it to know how late a request may
start and still meet its TTFT budget, and whether an engine's queued prefill would make it late
there, which a single average would get wrong for long prompts and long queues (too optimistic)
and short ones (too pessimistic).

Rules:
- ``predict`` is the line's typical first token (its users add their margin: the budget bounds a p99).
- Nothing observed yet: no prediction (None).
"""

from __future__ import annotations


class TTFTModel:
    __slots__ = ("_n", "_sx", "_sxx", "_sxy", "_sy", "decay")

    def __init__(self, decay: float = 0.98) -> None:
        self.decay = decay
        self._n = self._sx = self._sy = self._sxx = self._sxy = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
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
