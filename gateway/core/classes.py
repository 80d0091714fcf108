"""Request classes and their latency budgets.

Rules:
- Every request has exactly one class: ``interactive`` or ``batch``.
- The ``X-Priority`` header chooses it (case-insensitive). Absent, the API key's default
  applies, and without a key, ``interactive``.
- A key that may not use a class gets a refusal, never a silent change of class.
- Per-request budgets (``x-slo-ttft-ms``, ``x-slo-tpot-ms``) may only tighten the class
  budget, never loosen it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.reasons import Refusal

INTERACTIVE = "interactive"
BATCH = "batch"
CLASSES: tuple[str, ...] = (INTERACTIVE, BATCH)
# Lower runs first, matching vLLM's `priority` field.
CLASS_RANK: dict[str, int] = {INTERACTIVE: 0, BATCH: 1}


class ClassificationError(ValueError):
    """The request asked for a class (or a budget) it cannot have."""

    def __init__(self, reason: Refusal, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.param = param


@dataclass(frozen=True, slots=True)
class Budget:
    """Latency budget of a request. ``None`` means unbounded."""

    ttft_s: float | None = None
    itl_s: float | None = None
    deadline_s: float | None = None

    def tightened(self, ttft_ms: str | None, tpot_ms: str | None) -> Budget:
        ttft = _tighter(self.ttft_s, _parse_ms(ttft_ms, "x-slo-ttft-ms"))
        itl = _tighter(self.itl_s, _parse_ms(tpot_ms, "x-slo-tpot-ms"))
        if ttft == self.ttft_s and itl == self.itl_s:
            return self
        return Budget(ttft, itl, self.deadline_s)


def _parse_ms(value: str | None, header: str) -> float | None:
    if value is None:
        return None
    try:
        ms = float(value)
    except ValueError:
        raise ClassificationError(
            Refusal.INVALID_HEADER, f"{header} must be a number of milliseconds", header
        ) from None
    if not ms > 0 or ms != ms or ms == float("inf"):
        message = f"{header} must be a positive number of milliseconds"
        raise ClassificationError(Refusal.INVALID_HEADER, message, header)
    return ms / 1000.0


def _tighter(current: float | None, asked: float | None) -> float | None:
    if asked is None:
        return current
    if current is None:
        return asked
    return min(current, asked)


def classify(header: str | None, default: str = INTERACTIVE, allowed: frozenset[str] | None = None) -> str:
    """The class of a request from its ``X-Priority`` header and its key's rules."""
    if header is None or header == "":
        cls = default
    else:
        cls = header.strip().lower()
        if cls not in CLASS_RANK:
            raise ClassificationError(
                Refusal.INVALID_PRIORITY,
                # Only a prefix of what the client sent: a header may be many kilobytes.
                f"X-Priority must be one of {', '.join(CLASSES)}, got {header[:32]!r}",
                "X-Priority",
            )
    if allowed is not None and cls not in allowed:
        raise ClassificationError(
            Refusal.CLASS_NOT_ALLOWED,
            f"this API key may not use the {cls!r} class (allowed: {', '.join(sorted(allowed))})",
            "X-Priority",
        )
    return cls
