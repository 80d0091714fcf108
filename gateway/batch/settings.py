"""The ``batch:`` section of the configuration."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

# Settings where 0 is meaningful: "never" (keep files until deleted).
_ZERO_MEANS_NEVER = frozenset({"file_retention_s"})


@dataclass(frozen=True, slots=True)
class BatchSettings:
    max_file_bytes: int = 200 * 1024 * 1024
    max_lines: int = 50_000
    concurrency: int = 64
    """Lines in flight per replica, across all batches."""
    lease_s: float = 30.0
    """A claimed line goes back to the others when its claimant has not renewed it for this long."""
    poll_s: float = 0.5
    prefix_chars: int = 512
    """Lines are dispatched in the order of the first ``prefix_chars`` of their prompt."""
    completion_window_s: float = 86400.0
    """What the only completion window, ``24h``, stands for."""
    retry_base_s: float = 0.5
    retry_max_s: float = 30.0
    max_attempts: int = 3
    """Attempts of a line whose engine failed (5xx) before it is written as failed."""
    files_dir: str | None = None
    """Keep file bodies on this (shared) directory instead of in the store."""
    file_retention_s: int = 30 * 86400
    """Lifetime of ``purpose=batch`` uploads and of batch output and error files unless the
    request sets ``expires_after`` / ``output_expires_after`` (OpenAI's default: 30 days);
    0 keeps them until deleted. Other purposes are kept until deleted."""
    sweep_s: float = 60.0
    """How often a replica deletes expired files."""
    file_quota_bytes: int = 1024**3
    """What one API key's files (uploads and batch outputs) may take together; uploads and new
    batches are refused at this size."""
    file_quota_files: int = 1000
    """How many files one API key may keep."""

    @classmethod
    def from_config(cls, section: dict[str, Any]) -> BatchSettings:
        known = {f.name: f for f in fields(cls)}
        unknown = set(section) - set(known)
        if unknown:
            raise ValueError(f"batch: unknown keys {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
        values: dict[str, Any] = {}
        for name, value in section.items():
            if value is None:
                continue
            kind = type(getattr(cls(), name)) if name != "files_dir" else str
            try:
                values[name] = kind(value)
            except (TypeError, ValueError):
                raise ValueError(f"batch.{name} must be a {kind.__name__}, got {value!r}") from None
            if kind in (int, float) and values[name] < 0:
                raise ValueError(f"batch.{name} must not be negative, got {value!r}")
            if kind in (int, float) and values[name] == 0 and name not in _ZERO_MEANS_NEVER:
                raise ValueError(f"batch.{name} must be positive, got {value!r}")
        return cls(**values)
