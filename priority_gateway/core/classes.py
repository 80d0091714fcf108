"""Request classes and their latency budgets.

Rules:
- Every request has exactly one class. ``interactive`` and ``batch`` always exist; a
  deployment may add more (``realtime``, ``standard``, ...) in a ``ClassTable``.
- Each class has a rank, vLLM's ``priority`` polarity: lower runs first, in the gateway's
  queue and, on pools that run priority scheduling, in the engine. Each class behaves as one
  of two kinds: ``interactive`` (TTFT budget refusals, overflow, may stop backfilled work) or
  ``batch`` (backfills spare capacity, may be stopped and restarted, shed first).
- The ``X-Priority`` header chooses it (case-insensitive). Absent, the API key's default
  applies, and without a key, ``interactive``.
- A key that may not use a class gets a refusal, never a silent change of class.
- Per-request budgets (``x-slo-ttft-ms``, ``x-slo-tpot-ms``) may only tighten the class
  budget, never loosen it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from priority_gateway.core.reasons import Refusal

INTERACTIVE = "interactive"
BATCH = "batch"
CLASSES: tuple[str, ...] = (INTERACTIVE, BATCH)
# Lower runs first, matching vLLM's `priority` field.
CLASS_RANK: dict[str, int] = {INTERACTIVE: 0, BATCH: 1}
KINDS: tuple[str, ...] = (INTERACTIVE, BATCH)


@dataclass(frozen=True, slots=True)
class ClassSpec:
    name: str
    priority: int
    """vLLM's ``priority`` for the class (lower runs first); also its rank in the gateway's queue."""
    kind: str = INTERACTIVE


class ClassTable:
    """The classes of one deployment, ordered by rank (the ``priority`` each sends to vLLM)."""

    def __init__(self, specs: Iterable[ClassSpec]) -> None:
        ordered = sorted(specs, key=lambda s: (s.priority, s.name))
        self.specs: dict[str, ClassSpec] = {s.name: s for s in ordered}
        if len(self.specs) != len(ordered):
            raise ValueError("class names must be unique")
        for required in (INTERACTIVE, BATCH):
            if required not in self.specs:
                raise ValueError(f"the {required!r} class must exist")
        for spec in ordered:
            if spec.kind not in KINDS:
                raise ValueError(f"class {spec.name!r}: kind must be one of {', '.join(KINDS)}")
        self.names: tuple[str, ...] = tuple(self.specs)
        self.rank: dict[str, int] = {s.name: s.priority for s in ordered}
        self.kinds: dict[str, str] = {s.name: s.kind for s in ordered}
        self.batch_like: tuple[str, ...] = tuple(n for n in self.names if self.kinds[n] == BATCH)
        self.interactive_like: tuple[str, ...] = tuple(n for n in self.names if self.kinds[n] == INTERACTIVE)

    def __contains__(self, name: object) -> bool:
        return name in self.specs

    def is_batch(self, name: str) -> bool:
        return self.kinds[name] == BATCH

    def priority(self, name: str) -> int:
        return self.rank[name]


DEFAULT_CLASSES = ClassTable(
    [ClassSpec(INTERACTIVE, CLASS_RANK[INTERACTIVE]), ClassSpec(BATCH, CLASS_RANK[BATCH], kind=BATCH)]
)


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


def classify(
    header: str | None,
    default: str = INTERACTIVE,
    allowed: frozenset[str] | None = None,
    known: Collection[str] = CLASSES,
) -> str:
    """The class of a request from its ``X-Priority`` header and its key's rules, among ``known`` classes."""
    if header is None or header == "":
        cls = default
    else:
        cls = header.strip().lower()
        if cls not in known:
            raise ClassificationError(
                Refusal.INVALID_PRIORITY,
                # Only a prefix of what the client sent: a header may be many kilobytes.
                f"X-Priority must be one of {', '.join(known)}, got {header[:32]!r}",
                "X-Priority",
            )
    if allowed is not None and cls not in allowed:
        raise ClassificationError(
            Refusal.CLASS_NOT_ALLOWED,
            f"this API key may not use the {cls!r} class (allowed: {', '.join(sorted(allowed))})",
            "X-Priority",
        )
    return cls
