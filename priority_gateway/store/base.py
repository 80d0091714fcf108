"""The store protocol: everything the gateway shares between replicas and keeps across restarts.

Rules every backend keeps (the contract tests in tests/gateway/store/ check them):
- Files and batches are listed newest first (files also oldest first), per owner; ``after``
  is the id of the last item of the previous page.
- Each owner's files are counted (``file_usage``: files and bytes) as they are put and
  deleted; ``put_file`` with a ``limit`` stores nothing and answers False when the file would
  take its owner past it (a file put again counts only its change in size).
- A batch's status changes only through ``update_batch``, which may demand the current
  status (compare-and-set); terminal statuses leave the set of active batches.
- Batch lines move pending -> claimed (with a lease) -> done. ``claim_lines`` hands out
  claims whose lease ran out first (a dead claimant's work, or a line put back with
  ``defer_line``), then pending lines in ``position`` order, and only while the batch is
  ``in_progress``. A claim is renewed or deferred only by its current claimant.
- ``complete_line`` stores a line's result at most once per ``custom_id``: the first write
  wins, counts move only then, and the claim is dropped either way.
- Rate limits: a sliding window counter per key and minute (this minute's count plus the
  previous minute's, weighted by how much of it still lies inside the last 60 s).
- Times of leases and rate windows come from the backend's own clock, so replicas with
  drifting clocks still agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from priority_gateway.store.records import (
    ApiKey,
    BatchRecord,
    Claim,
    FileRecord,
    FileUsage,
    Line,
    LineCounts,
    Page,
    RateDecision,
    Result,
)

RATE_WINDOW_S = 60.0


class StoreUnavailable(RuntimeError):
    """The backend cannot be reached right now; the caller retries later."""


class StoreBusy(StoreUnavailable):
    """Every connection to the backend is in use and none came free in time: load, not an outage
    (callers that fail open on an outage must not on this)."""


BLOB_CHUNK = 1024 * 1024
"""Bytes a blob is written and read in, at most, per call to the backend."""


class Blobs(Protocol):
    """Where file bodies live. A body appears whole or not at all (a reader never sees half of it),
    and can be read in ranges, so that a large one is never held whole to be sent."""

    async def put_blob(self, blob_id: str, data: bytes) -> None: ...

    async def get_blob(self, blob_id: str) -> bytes | None: ...

    async def read_blob(self, blob_id: str, start: int, length: int) -> bytes | None:
        """At most ``length`` bytes of the blob from ``start`` (fewer at its end, none past it); None
        when there is no such blob."""
        ...

    async def delete_blob(self, blob_id: str) -> None: ...


class Store(Blobs, Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def ping(self) -> bool: ...

    # -- files ---------------------------------------------------------------------------

    async def put_file(self, record: FileRecord, limit: FileUsage | None = None) -> bool:
        """Store ``record``, unless its owner's files would then exceed ``limit``."""
        ...

    async def file_usage(self, owner: str) -> FileUsage: ...

    async def get_file(self, file_id: str) -> FileRecord | None: ...

    async def delete_file(self, file_id: str) -> bool: ...

    async def expired_files(self, now: int, limit: int) -> list[str]:
        """Ids of files whose ``expires_at`` has passed, oldest expiry first."""
        ...

    async def list_files(
        self, owner: str, after: str | None, limit: int, descending: bool = True, purpose: str | None = None
    ) -> Page: ...

    # -- batches -------------------------------------------------------------------------

    async def create_batch(self, record: BatchRecord) -> None: ...

    async def get_batch(self, batch_id: str) -> BatchRecord | None: ...

    async def list_batches(self, owner: str, after: str | None, limit: int) -> Page: ...

    async def update_batch(self, batch_id: str, expect: Sequence[str] | None = None, **changes: Any) -> bool:
        """Apply ``changes`` if the batch's status is one of ``expect`` (or always, without)."""
        ...

    async def active_batches(self) -> list[str]: ...

    async def batch_status_counts(self) -> dict[str, int]: ...

    async def lease_batch(self, batch_id: str, statuses: Sequence[str], claimant: str, lease_s: float) -> bool:
        """Take the batch-level step (validating or finalizing) if its status is one of
        ``statuses`` and nobody holds an unexpired lease taken in the status it has now."""
        ...

    # -- batch lines ---------------------------------------------------------------------

    async def load_lines(self, batch_id: str, lines: Sequence[Line]) -> None:
        """Replace the batch's lines (a retried validation loads them again)."""
        ...

    async def claim_lines(self, batch_id: str, claimant: str, n: int, lease_s: float) -> list[Claim]: ...

    async def renew_lines(self, batch_id: str, claimant: str, indexes: Sequence[int], lease_s: float) -> int: ...

    async def defer_line(self, batch_id: str, claimant: str, index: int, delay_s: float) -> int:
        """Give a claimed line back, to be claimed again after ``delay_s``; returns its attempts so far
        (0 when the caller no longer holds the claim)."""
        ...

    async def complete_line(self, batch_id: str, index: int, custom_id: str, ok: bool, line: bytes) -> bool: ...

    async def line_counts(self, batch_id: str) -> LineCounts: ...

    async def results(self, batch_id: str) -> list[Result]: ...

    async def unfinished_lines(self, batch_id: str) -> list[tuple[int, str]]:
        """Lines without a result, as (index, custom_id)."""
        ...

    async def drop_lines(self, batch_id: str) -> None: ...

    # -- API keys ------------------------------------------------------------------------

    async def put_key(self, key: ApiKey) -> None: ...

    async def get_key(self, key_id: str) -> ApiKey | None: ...

    async def list_keys(self) -> list[ApiKey]: ...

    async def revoke_key(self, key_id: str, at: int) -> bool: ...

    async def active_key_count(self) -> int: ...

    # -- rate limits ---------------------------------------------------------------------

    async def rate_hit(self, key_id: str, rpm: int | None, tpm: int | None, tokens: int) -> RateDecision:
        """Count one request of ``tokens`` tokens if it fits both limits; refuse it otherwise."""
        ...

    async def rate_charge(self, key_id: str, tokens: int) -> None:
        """Add tokens learnt after the fact (a response's completion tokens beyond what it reserved),
        or give some back (``tokens`` below 0: a reservation it did not use) to the current minute,
        whose count never goes below 0."""
        ...
