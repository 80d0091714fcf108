"""The Files and Batches API's operations, for one owner at a time.

Rules:
- Files and batches belong to the key that created them (``owner``; ``""`` without keys).
  Another owner gets 404, exactly as for an id that does not exist.
- A file object exists only once its body is stored: a rejected or failed upload leaves
  nothing behind.
- Each owner's files (uploads and batch outputs) count against a quota of files and bytes
  (``file_quota_files``, ``file_quota_bytes``): an upload that would exceed it, and a new
  batch while it is full, get 400 ``file_quota_exceeded``. Outputs of running batches are
  always written (they may take the owner past the quota until files are deleted or expire).
- Error messages show ids and values a client sent only as a short excerpt.
- A new batch starts ``validating``; the runners do the rest (see ``runner``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any

from priority_gateway.batch.runner import BatchRunner, Executor
from priority_gateway.batch.settings import BatchSettings
from priority_gateway.errors import ApiError, excerpt
from priority_gateway.metrics import GatewayMetrics
from priority_gateway.store import Blobs, DirectoryBlobs, Store
from priority_gateway.store.base import BLOB_CHUNK
from priority_gateway.store.records import (
    CANCELLING,
    IN_PROGRESS,
    TERMINAL,
    VALIDATING,
    BatchRecord,
    FileRecord,
    FileUsage,
    Page,
)

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
WINDOWS = ("24h",)
PURPOSES = ("batch",)


MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 30 * 86400


def expires_after_seconds(value: Any, param: str) -> int:
    """The seconds of an OpenAI expiration policy: ``{"anchor": "created_at", "seconds": N}``."""
    if not isinstance(value, dict) or value.get("anchor") != "created_at":
        raise ApiError(400, f"'{param}' must be {{'anchor': 'created_at', 'seconds': N}}", "invalid_value", param)
    seconds = value.get("seconds")
    if isinstance(seconds, str) and seconds.isdigit():
        seconds = int(seconds)  # multipart form fields arrive as text
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not MIN_EXPIRY_S <= seconds <= MAX_EXPIRY_S:
        raise ApiError(
            400,
            f"'{param}.seconds' must be an integer from {MIN_EXPIRY_S} (1 hour) to {MAX_EXPIRY_S} (30 days)",
            "invalid_value",
            param,
        )
    return seconds


def _not_found(kind: str, object_id: str) -> ApiError:
    return ApiError(404, f"No such {kind} object: {excerpt(object_id)}", "not_found", "id")


def _over_quota(used: FileUsage, quota: FileUsage, what: str) -> ApiError:
    return ApiError(
        400,
        f"{what}: the files of this API key would exceed its storage quota of {quota.files} files "
        f"and {quota.bytes} bytes (they take {used.files} files and {used.bytes} bytes now). "
        "Delete files, or wait for them to expire.",
        "file_quota_exceeded",
        "file",
    )


class BatchService:
    def __init__(
        self, store: Store, settings: BatchSettings, metrics: GatewayMetrics, models: Callable[[], Collection[str]]
    ) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.models = models
        self.blobs: Blobs = DirectoryBlobs(settings.files_dir) if settings.files_dir else store
        self.runner: BatchRunner | None = None

    @property
    def quota(self) -> FileUsage:
        return FileUsage(self.settings.file_quota_files, self.settings.file_quota_bytes)

    def attach(self, execute: Executor) -> None:
        """Give the runner the gateway's request path (the HTTP layer owns it)."""
        self.runner = BatchRunner(self.store, self.blobs, self.settings, execute, self.models, self.metrics)

    def start(self) -> None:
        if self.runner is not None:
            self.runner.start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.stop()

    # -- files ---------------------------------------------------------------------------

    async def upload_room(self, owner: str) -> int:
        """The most bytes an upload of ``owner`` may have now: the file size limit, or what the quota leaves."""
        used = await self.store.file_usage(owner)
        quota = self.quota
        if used.files >= quota.files or used.bytes >= quota.bytes:
            raise _over_quota(used, quota, "This upload cannot be stored")
        return min(self.settings.max_file_bytes, quota.bytes - used.bytes)

    async def too_large(self, owner: str, size: int | None) -> ApiError:
        """The error for an upload of ``size`` bytes (None: over the room it had) that does not fit."""
        limit = self.settings.max_file_bytes
        if size is not None and size > limit:
            return ApiError(413, f"the file is {size} bytes; the limit is {limit}", "file_too_large", "file")
        used = await self.store.file_usage(owner)
        if size is None and used.files < self.quota.files and limit <= self.quota.bytes - used.bytes:
            return ApiError(413, f"the file exceeds the limit of {limit} bytes", "file_too_large", "file")
        what = "This upload cannot be stored" if size is None else f"This file of {size} bytes cannot be stored"
        return _over_quota(used, self.quota, what)

    async def create_file(
        self, owner: str, filename: str, purpose: str, data: bytes, expires_after_s: int | None = None
    ) -> FileRecord:
        if purpose not in PURPOSES:
            raise ApiError(
                400,
                f"'purpose' must be one of {', '.join(PURPOSES)} here, got {excerpt(purpose)}",
                "invalid_value",
                "purpose",
            )
        if not data.strip():
            raise ApiError(400, "the file is empty", "empty_file", "file")
        if len(data) > self.settings.max_file_bytes:
            raise await self.too_large(owner, len(data))
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(400, "the file must be UTF-8 encoded JSONL", "invalid_file", "file") from None
        now = int(time.time())
        if expires_after_s is None and purpose == "batch" and self.settings.file_retention_s:
            expires_after_s = self.settings.file_retention_s
        expires_at = None if expires_after_s is None else now + expires_after_s
        record = FileRecord("file-" + secrets.token_hex(12), owner, filename, purpose, len(data), now, expires_at)
        await self.blobs.put_blob(record.id, data)
        try:
            stored = await self.store.put_file(record, self.quota)
        except BaseException:
            await self.blobs.delete_blob(record.id)
            raise
        if not stored:
            await self.blobs.delete_blob(record.id)
            raise await self.too_large(owner, len(data))
        return record

    async def get_file(self, owner: str, file_id: str) -> FileRecord:
        record = await self.store.get_file(file_id)
        if record is not None and record.expired(time.time()):
            record = None  # gone for callers already, whether or not the sweep has run
        if record is None or record.owner != owner:
            raise _not_found("File", file_id)
        return record

    async def file_content(self, owner: str, file_id: str) -> tuple[int, AsyncIterator[bytes]]:
        """A file's length and its body in pieces of ``BLOB_CHUNK`` bytes, read from the store as they
        are sent: a large file is never held whole (404 now when the file or its body is gone)."""
        record = await self.get_file(owner, file_id)
        first = await self.blobs.read_blob(file_id, 0, BLOB_CHUNK)
        if first is None:
            raise _not_found("File", file_id)
        return record.bytes, self._pieces(file_id, first, record.bytes)

    async def _pieces(self, file_id: str, first: bytes, size: int) -> AsyncIterator[bytes]:
        piece, sent = first, 0
        while True:
            yield piece
            sent += len(piece)
            if sent >= size:
                return
            got = await self.blobs.read_blob(file_id, sent, BLOB_CHUNK)
            if not got:
                raise RuntimeError(f"file {file_id} lost its body after {sent} of {size} bytes")
            piece = got

    async def delete_file(self, owner: str, file_id: str) -> None:
        await self.get_file(owner, file_id)
        await self.store.delete_file(file_id)
        await self.blobs.delete_blob(file_id)

    async def list_files(
        self, owner: str, after: str | None, limit: int, descending: bool, purpose: str | None
    ) -> Page:
        page = await self.store.list_files(owner, after, limit, descending, purpose)
        now = time.time()
        page.items = [f for f in page.items if not f.expired(now)]
        return page

    # -- batches -------------------------------------------------------------------------

    async def create_batch(self, owner: str, request: dict[str, Any]) -> BatchRecord:
        input_file_id = request.get("input_file_id")
        if not isinstance(input_file_id, str) or not input_file_id:
            raise ApiError(400, "'input_file_id' is required", "missing_required_parameter", "input_file_id")
        endpoint = request.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise ApiError(400, f"'endpoint' must be one of {', '.join(ENDPOINTS)}", "invalid_value", "endpoint")
        window = request.get("completion_window")
        if window not in WINDOWS:
            raise ApiError(
                400, f"'completion_window' must be one of {', '.join(WINDOWS)}", "invalid_value", "completion_window"
            )
        metadata = request.get("metadata")
        if metadata is not None and not _valid_metadata(metadata):
            raise ApiError(
                400,
                "'metadata' holds up to 16 pairs of strings (keys up to 64, values up to 512 characters)",
                "invalid_value",
                "metadata",
            )
        output_expires_after_s = None
        if request.get("output_expires_after") is not None:
            output_expires_after_s = expires_after_seconds(request["output_expires_after"], "output_expires_after")
        source = await self.get_file(owner, input_file_id)
        if source.purpose != "batch":
            raise ApiError(
                400, f"the file {input_file_id} has purpose {source.purpose!r}, not 'batch'", "invalid_value"
            )
        used = await self.store.file_usage(owner)
        if used.files >= self.quota.files or used.bytes >= self.quota.bytes:
            raise _over_quota(used, self.quota, "This batch would have nowhere to write its results")
        now = int(time.time())
        record = BatchRecord(
            id="batch_" + secrets.token_hex(12),
            owner=owner,
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=window,
            created_at=now,
            expires_at=now + int(self.settings.completion_window_s),
            metadata=metadata,
            output_expires_after_s=output_expires_after_s,
        )
        await self.store.create_batch(record)
        if self.runner is not None:
            self.runner.wake()
        return record

    async def get_batch(self, owner: str, batch_id: str) -> BatchRecord:
        record = await self.store.get_batch(batch_id)
        if record is None or record.owner != owner:
            raise _not_found("Batch", batch_id)
        return record

    async def list_batches(self, owner: str, after: str | None, limit: int) -> Page:
        return await self.store.list_batches(owner, after, limit)

    async def cancel_batch(self, owner: str, batch_id: str) -> BatchRecord:
        record = await self.get_batch(owner, batch_id)
        if record.status in TERMINAL:
            raise ApiError(409, f"Cannot cancel a batch with status {record.status!r}.", "batch_not_cancellable")
        changed = await self.store.update_batch(
            batch_id, [VALIDATING, IN_PROGRESS], status=CANCELLING, cancelling_at=int(time.time())
        )
        if self.runner is not None:
            self.runner.wake()
        record = await self.get_batch(owner, batch_id)
        if not changed and record.status not in (CANCELLING, *TERMINAL):
            raise ApiError(409, f"Cannot cancel a batch with status {record.status!r}.", "batch_not_cancellable")
        return record


def _valid_metadata(metadata: Any) -> bool:
    return (
        isinstance(metadata, dict)
        and len(metadata) <= 16
        and all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in metadata.items()
        )
    )
