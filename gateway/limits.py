"""What a client may send and hold, and how long an engine may take: every limit with its default.

Two sections of the configuration: ``limits:`` (bytes, seconds and connections a client
controls) and the deadlines in ``upstream:`` (how long one engine attempt may run).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from gateway.core.classes import Budget

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """The ``limits:`` section."""

    max_body_bytes: int = 10 * MIB
    """Request bodies on every route (``/v1/files`` uploads: ``batch.max_file_bytes``)."""
    max_header_bytes: int = 64 * 1024
    """The request line and headers of one request."""
    max_headers: int = 256
    """Header fields in one request."""
    header_timeout_s: float = 10.0
    """From a connection's first byte (or its opening) to the end of the request's headers."""
    body_timeout_s: float = 60.0
    """From the end of the headers to the end of the body."""
    upload_timeout_s: float = 600.0
    """The same for ``/v1/files`` uploads, which may be large."""
    keepalive_timeout_s: float = 30.0
    """An idle keep-alive connection is closed after this long."""
    max_connections: int = 4096
    """Open client connections; lowered at start when the descriptor limit cannot hold them."""
    max_queued_bytes: int = 256 * MIB
    """Bodies of requests waiting in one pool's queue, together."""
    metrics_public: bool = True
    """``/metrics`` without a key even when keys are required (Prometheus scrapes it)."""
    openapi_public: bool = False
    """``/openapi.json`` without a key even when keys are required."""


@dataclass(frozen=True, slots=True)
class Deadlines:
    """How long one engine attempt may take (``upstream:`` section), beyond the idle read timeout."""

    first_byte_timeout_s: float = 30.0
    """Streamed requests: until the engine's first response byte. A non-streamed answer comes
    whole at the end, so only the total deadline bounds it."""
    deadline_factor: float = 4.0
    """Interactive: the total deadline is this many times (TTFT budget + max_tokens x ITL budget)..."""
    min_deadline_s: float = 10.0
    """... but at least this ..."""
    max_interactive_s: float = 300.0
    """... and at most this (also the deadline of a request without max_tokens). Batch requests
    have their class's ``deadline_s``."""

    def attempt_s(self, budget: Budget, max_tokens: int | None, arrival: float, now: float) -> float:
        """Seconds an attempt starting ``now`` may take, for a request with ``budget`` that arrived at ``arrival``."""
        if budget.ttft_s is None and budget.itl_s is None:
            if budget.deadline_s is None:
                return self.max_interactive_s
            return max(0.0, arrival + budget.deadline_s - now)
        if max_tokens is None:
            return self.max_interactive_s
        derived = self.deadline_factor * ((budget.ttft_s or 0.0) + max_tokens * (budget.itl_s or 0.0))
        return min(self.max_interactive_s, max(self.min_deadline_s, derived))


Settings = TypeVar("Settings", ClientLimits, Deadlines)


def settings_from(cls: type[Settings], section: Mapping[str, Any], where: str) -> Settings:
    """``cls`` from the keys of ``section`` that it knows; every value typed and positive."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        if section.get(f.name) is None:
            continue
        raw = section[f.name]
        kind = type(getattr(cls(), f.name))
        if kind is bool:
            if not isinstance(raw, bool):
                raise ValueError(f"{where}.{f.name} must be true or false, got {raw!r}")
            values[f.name] = raw
            continue
        try:
            value = kind(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{where}.{f.name} must be a {kind.__name__}, got {raw!r}") from None
        if not value > 0:
            raise ValueError(f"{where}.{f.name} must be positive, got {raw!r}")
        values[f.name] = value
    return cls(**values)
