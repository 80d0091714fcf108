"""What the store keeps: files, batch jobs, batch lines and their results, API keys.

Records are plain data; the OpenAI wire shape of files and batches is built here too, so
every backend and every replica answers with the same objects.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

VALIDATING = "validating"
IN_PROGRESS = "in_progress"
FINALIZING = "finalizing"
COMPLETED = "completed"
FAILED = "failed"
EXPIRED = "expired"
CANCELLING = "cancelling"
CANCELLED = "cancelled"
TERMINAL = frozenset({COMPLETED, FAILED, EXPIRED, CANCELLED})


@dataclass(slots=True)
class FileRecord:
    id: str
    owner: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    expires_at: int | None = None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": self.expires_at,
        }


@dataclass(frozen=True, slots=True)
class FileUsage:
    """Files and bytes: what an owner's files take, or the most they may take."""

    files: int = 0
    bytes: int = 0


@dataclass(slots=True)
class BatchRecord:
    id: str
    owner: str
    endpoint: str
    input_file_id: str
    completion_window: str
    created_at: int
    expires_at: int
    status: str = VALIDATING
    metadata: dict[str, str] | None = None
    errors: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    ending: str | None = None
    """The status finalizing leads to: completed, expired (or cancelled, from cancelling)."""
    model: str | None = None
    output_expires_after_s: int | None = None
    """Lifetime of the output and error files (``output_expires_after``); default: the settings'."""

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "model": self.model,
            "errors": None if self.errors is None else {"object": "list", "data": self.errors},
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
        }

    def to_fields(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_fields(cls, data: dict[str, Any]) -> BatchRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(slots=True)
class ApiKey:
    id: str
    name: str
    secret_hash: str
    classes: list[str]
    default_class: str
    created_at: int
    rpm: int | None = None
    tpm: int | None = None
    revoked_at: int | None = None
    tenant: str | None = None
    """The tenant the key's requests are charged to in its class's fair queue (keys may share one);
    None: the key is a tenant of its own."""
    weight: float = 1.0
    """The tenant's weight in fair queueing: while several tenants wait, each gets this share of the
    total weight of those waiting (a tenant of several keys has the lowest of theirs)."""
    max_concurrency: int | None = None
    """Most requests of the tenant in flight at once; more wait in the queue (never refused for it).
    None: no cap (a tenant of several keys has the tightest cap of theirs)."""

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def to_api(self) -> dict[str, Any]:
        data = asdict(self)
        del data["secret_hash"]
        data["object"] = "api_key"
        return data


@dataclass(frozen=True, slots=True)
class Line:
    """One request of a batch, as loaded for execution: ``position`` is its dispatch order."""

    index: int
    position: int
    custom_id: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Claim:
    index: int
    custom_id: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Result:
    index: int
    ok: bool
    line: bytes


@dataclass(frozen=True, slots=True)
class LineCounts:
    pending: int
    live: int
    """Claims whose lease has not run out: work in flight (or waiting out a backoff)."""
    stale: int
    """Claims whose lease ran out: their claimant died or gave the line back for later."""


@dataclass(slots=True)
class Page:
    items: list[Any] = field(default_factory=list)
    has_more: bool = False


@dataclass(frozen=True, slots=True)
class RateDecision:
    allowed: bool
    retry_after_s: float = 0.0
    limit: str = ""
    """Which limit refused: ``rpm`` or ``tpm``."""
