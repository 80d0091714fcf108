"""How long an engine takes from a request's start to its first token, by prompt length.

An exponentially weighted least-squares line ``ttft = a + b * prompt_tokens`` over recent
requests: prefill time grows with the uncached prompt, on top of a fixed cost per request.
Admission uses it to know how late a request may start and still meet its TTFT budget, which
a single average would get wrong for long prompts (too optimistic) and short ones (too
pessimistic).
"""

from __future__ import annotations


class TTFTModel:
    __slots__ = ("_n", "_sx", "_sxx", "_sxy", "_sy", "decay")

    def __init__(self, decay: float = 0.98) -> None:
        self.decay = decay
        self._n = self._sx = self._sy = self._sxx = self._sxy = 0.0

    def observe(self, prompt_tokens: int, seconds: float) -> None:
        d = self.decay
        x = float(prompt_tokens)
        self._n = d * self._n + 1.0
        self._sx = d * self._sx + x
        self._sy = d * self._sy + seconds
        self._sxx = d * self._sxx + x * x
        self._sxy = d * self._sxy + x * seconds

    def predict(self, prompt_tokens: int) -> float | None:
        n = self._n
        if n < 1.0:
            return None
        mean_x, mean_y = self._sx / n, self._sy / n
        var_x = self._sxx / n - mean_x * mean_x
        slope = (self._sxy / n - mean_x * mean_y) / var_x if var_x > 1e-9 else 0.0
        slope = max(0.0, slope)
        return max(0.0, mean_y + slope * (prompt_tokens - mean_x))
