"""The ``batch:`` section of the configuration (types and limits: ``priority_gateway.config.schema``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from annotated_types import Ge, Gt


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """The Files and Batches APIs: upload limits, how lines run, how long files are kept."""

    max_file_bytes: Annotated[int, Gt(0)] = 200 * 1024 * 1024
    """Largest file accepted by ``POST /v1/files`` (200 MiB, as OpenAI's Batch API)."""
    max_lines: Annotated[int, Gt(0)] = 50_000
    """Most requests (lines) in one batch input file."""
    concurrency: Annotated[int, Gt(0)] = 64
    """Lines in flight per replica, across all batches."""
    lease_s: Annotated[float, Gt(0)] = 30.0
    """A claimed line goes back to the others when its claimant has not renewed it for this long."""
    poll_s: Annotated[float, Gt(0)] = 0.5
    """How often a replica looks for lines to claim when it has room."""
    prefix_chars: Annotated[int, Gt(0)] = 512
    """Lines are dispatched in the order of the first ``prefix_chars`` of their prompt."""
    completion_window_s: Annotated[float, Gt(0)] = 86400.0
    """What the only completion window, ``24h``, stands for."""
    retry_base_s: Annotated[float, Gt(0)] = 0.5
    """First wait before a failed line is tried again; it doubles with each attempt."""
    retry_max_s: Annotated[float, Gt(0)] = 30.0
    """Longest wait between two attempts of a line."""
    max_attempts: Annotated[int, Gt(0)] = 3
    """Attempts of a line whose engine failed (5xx) before it is written as failed."""
    files_dir: str | None = None
    """Keep file bodies on this (shared) directory instead of in the store."""
    file_retention_s: Annotated[int, Ge(0)] = 30 * 86400
    """Lifetime of ``purpose=batch`` uploads and of batch output and error files unless the
    request sets ``expires_after`` / ``output_expires_after`` (OpenAI's default: 30 days);
    0 keeps them until deleted. Other purposes are kept until deleted."""
    sweep_s: Annotated[float, Gt(0)] = 60.0
    """How often a replica deletes expired files."""
    file_quota_bytes: Annotated[int, Gt(0)] = 1024**3
    """What one API key's files (uploads and batch outputs) may take together; uploads and new
    batches are refused at this size."""
    file_quota_files: Annotated[int, Gt(0)] = 1000
    """How many files one API key may keep."""
