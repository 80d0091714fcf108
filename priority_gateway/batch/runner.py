"""Works batch jobs: every replica runs one ``BatchRunner`` over the shared store.

Rules:
- Each step of a batch is taken by one replica at a time through a lease in the store:
  validation (``validating``), each line (claimed with ``lease_s``, renewed every
  ``lease_s / 3`` while it runs) and finalisation (``finalizing``/``cancelling``). A
  replica that dies loses its leases, and another one carries on when they run out.
- A replica keeps at most ``concurrency`` lines in flight, over all batches, oldest batch
  first. Lines run through the gateway's own request path as batch-class requests
  (admission, backfill, the batch pool's engines), never over HTTP to itself.
- A line refused by admission (429) or without an engine (503) goes back to the store with
  a growing delay and is never failed for it; a line whose engine failed (5xx) is tried
  ``max_attempts`` times; any other answer is its result.
- A batch finalises when no line is pending or in flight; a cancelled or expired one when
  no line is in flight (the rest are abandoned). A cancelled batch does not wait for its lines:
  each replica stops the ones it runs (queued or streaming) as soon as it sees the batch
  ``cancelling`` and gives their claims back, so a cancel completes whatever its lines wait for.
  Output files have deterministic ids, so a finalisation retried by another replica rewrites
  the same files.
- Every batch reaches a terminal state. Only an unreachable store is waited out; any other
  exception while a batch is advanced, validated or finalised fails that batch with
  ``errors`` saying so (``batch_step_failed``), and an exception while a line runs fails
  that line: a fault that would repeat is never retried.
- A batch whose owner's API key is revoked (or gone) is cancelled, with ``errors`` saying
  why (``api_key_revoked``): nobody can read its results any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import TypeVar

from priority_gateway import log
from priority_gateway.batch.output import error_line, jsonl, request_id, response_line
from priority_gateway.batch.settings import BatchSettings
from priority_gateway.batch.validate import parse_input
from priority_gateway.errors import error_body
from priority_gateway.metrics import GatewayMetrics
from priority_gateway.store import Blobs, Store, StoreUnavailable
from priority_gateway.store.records import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    EXPIRED,
    FAILED,
    FINALIZING,
    IN_PROGRESS,
    VALIDATING,
    BatchRecord,
    Claim,
    FileRecord,
)

T = TypeVar("T")
RETRY_LATER = frozenset({429, 503})
ENGINE_FAILED = frozenset({500, 502, 504})
LIVE = (VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING)


@dataclass(frozen=True, slots=True)
class LineResponse:
    status: int
    body: bytes


@dataclass(frozen=True, slots=True)
class LineCall:
    """One run of one batch line through the gateway's request path."""

    endpoint: str
    body: bytes
    owner: str
    request_id: str
    batch_id: str
    custom_id: str


Executor = Callable[[LineCall], Awaitable[LineResponse]]


def output_file_ids(batch_id: str) -> tuple[str, str]:
    suffix = batch_id.removeprefix("batch_")
    return f"file-{suffix}-output", f"file-{suffix}-errors"


class BatchRunner:
    def __init__(
        self,
        store: Store,
        blobs: Blobs,
        settings: BatchSettings,
        execute: Executor,
        models: Callable[[], Collection[str]],
        metrics: GatewayMetrics,
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.settings = settings
        self.execute = execute
        self.models = models
        self.metrics = metrics
        self.claimant = uuid.uuid4().hex[:12]
        self._wake = asyncio.Event()
        self._held: dict[str, set[int]] = {}
        self._running: dict[tuple[str, int], asyncio.Task[None]] = {}  # lines inside the request path
        self._stopping: set[str] = set()  # cancelled batches whose lines here are being stopped
        self._attempts: dict[tuple[str, int], int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._steps: set[str] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._gauges_at = 0.0
        self._swept_at = 0.0

    @property
    def inflight(self) -> int:
        return sum(len(v) for v in self._held.values())

    def start(self) -> None:
        self._loops = [
            asyncio.create_task(self._run(), name="batch runner"),
            asyncio.create_task(self._renew_loop(), name="batch lease renewal"),
        ]
        log.info("batch_runner_started", claimant=self.claimant, concurrency=self.settings.concurrency)

    async def stop(self) -> None:
        held = {batch_id: sorted(indexes) for batch_id, indexes in self._held.items()}
        for task in [*self._loops, *self._tasks]:
            task.cancel()
        for task in [*self._loops, *self._tasks]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        # Hand the lines this replica was running back at once rather than when their leases
        # run out (which is all that happens if the process dies instead).
        with contextlib.suppress(StoreUnavailable, TimeoutError):
            async with asyncio.timeout(2.0):
                for batch_id, indexes in held.items():
                    for index in indexes:
                        await self.store.defer_line(batch_id, self.claimant, index, 0)

    def wake(self) -> None:
        self._wake.set()

    def _spawn(self, coro: Awaitable[None], name: str) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                await self._tick()
                failures = 0
            except StoreUnavailable as exc:
                failures += 1
                if failures == 1:
                    log.warning("batch_store_unavailable", reason=str(exc))
                await asyncio.sleep(min(5.0, 0.2 * 2**failures))
                continue
            except Exception:
                log.error("batch_tick_failed", exc_info=True)
            self._wake.clear()
            # asyncio.timeout, not wait_for, which can lose the cancellation that stops this loop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.poll_s):
                    await self._wake.wait()

    async def _tick(self) -> None:
        revoked: dict[str, bool] = {}
        for batch_id in await self.store.active_batches():
            try:
                record = await self.store.get_batch(batch_id)
                if record is None:
                    continue
                if record.owner and record.status in (VALIDATING, IN_PROGRESS):
                    if record.owner not in revoked:
                        revoked[record.owner] = await self._revoked(record.owner)
                    if revoked[record.owner]:
                        await self._cancel_for_revoked_key(record)
                        continue
                await self._advance(record)
            except StoreUnavailable:
                raise
            except Exception as exc:
                log.error("batch_advance_failed", batch_id=batch_id, exc_info=True)
                await self._fail(batch_id, LIVE, "advance", exc)
        now = time.monotonic()
        if now - self._swept_at >= self.settings.sweep_s:
            self._swept_at = now
            await self.sweep_expired()
        if now - self._gauges_at > 1.0:
            self._gauges_at = now
            counts = await self.store.batch_status_counts()
            for status in (VALIDATING, IN_PROGRESS, FINALIZING, COMPLETED, FAILED, EXPIRED, CANCELLING, CANCELLED):
                self.metrics.batches.labels(status).set(counts.get(status, 0))

    async def sweep_expired(self, limit: int = 500) -> int:
        """Delete files whose time is up (any replica may sweep; deleting twice is harmless)."""
        ids = await self.store.expired_files(int(time.time()), limit)
        for file_id in ids:
            await self.store.delete_file(file_id)
            await self.blobs.delete_blob(file_id)
        if ids:
            log.info("files_expired", count=len(ids), first=ids[0])
        return len(ids)

    async def _advance(self, record: BatchRecord) -> None:
        if record.id in self._steps:
            return
        now = int(time.time())
        lease = self.settings.lease_s
        if record.status == VALIDATING:
            if await self.store.lease_batch(record.id, [VALIDATING], self.claimant, lease):
                self._step(record.id, self._validate(record), (VALIDATING,), "validate")
        elif record.status == IN_PROGRESS:
            if now >= record.expires_at:
                await self.store.update_batch(
                    record.id, [IN_PROGRESS], status=FINALIZING, ending=EXPIRED, finalizing_at=now
                )
                self.wake()
                return
            free = self.settings.concurrency - self.inflight
            claims = await self.store.claim_lines(record.id, self.claimant, free, lease) if free > 0 else []
            for claim in claims:
                self._held.setdefault(record.id, set()).add(claim.index)
                self._spawn(self._run_line(record, claim), f"batch line {record.id}/{claim.index}")
            if free > 0 and not claims:
                counts = await self.store.line_counts(record.id)
                if counts.pending == counts.live == counts.stale == 0:
                    await self.store.update_batch(
                        record.id, [IN_PROGRESS], status=FINALIZING, ending=COMPLETED, finalizing_at=now
                    )
                    self.wake()
        elif record.status in (FINALIZING, CANCELLING):
            if record.status == CANCELLING and record.id in self._held and record.id not in self._stopping:
                self._stopping.add(record.id)
                for (batch_id, _), task in self._running.items():
                    if batch_id == record.id:
                        task.cancel()
                log.info("batch_lines_stopped", batch_id=record.id, lines=len(self._held[record.id]))
            counts = await self.store.line_counts(record.id)
            if counts.live == 0 and await self.store.lease_batch(
                record.id, [FINALIZING, CANCELLING], self.claimant, lease
            ):
                self._step(record.id, self._finalize(record), (FINALIZING, CANCELLING), "finalize")

    def _step(self, batch_id: str, coro: Awaitable[None], statuses: tuple[str, ...], what: str) -> None:
        self._steps.add(batch_id)

        async def step() -> None:
            try:
                await coro
            except StoreUnavailable as exc:
                log.warning("batch_step_interrupted", batch_id=batch_id, reason=str(exc))
            except Exception as exc:
                log.error("batch_step_failed", batch_id=batch_id, step=what, exc_info=True)
                with contextlib.suppress(StoreUnavailable):
                    await self._fail(batch_id, statuses, what, exc)
            finally:
                self._steps.discard(batch_id)
                self.wake()

        self._spawn(step(), f"batch step {batch_id}")

    async def _fail(self, batch_id: str, statuses: tuple[str, ...], what: str, exc: Exception) -> None:
        """End a batch that cannot go on: a fault that repeats must not hold it (or the log) forever."""
        message = f"The gateway could not {what} this batch ({type(exc).__name__}); its log names batch {batch_id}."
        error = {"code": "batch_step_failed", "message": message, "param": None, "line": None}
        if await self.store.update_batch(batch_id, statuses, status=FAILED, failed_at=int(time.time()), errors=[error]):
            await self.store.drop_lines(batch_id)
            log.warning("batch_failed", batch_id=batch_id, step=what, reason=type(exc).__name__)

    # -- revoked keys --------------------------------------------------------------------

    async def _revoked(self, owner: str) -> bool:
        key = await self.store.get_key(owner)
        return key is None or not key.active

    async def _cancel_for_revoked_key(self, record: BatchRecord) -> None:
        message = (
            "The API key that created this batch was revoked: the batch was cancelled, "
            "and its unfinished requests were not run."
        )
        error = {"code": "api_key_revoked", "message": message, "param": None, "line": None}
        now = int(time.time())
        if await self.store.update_batch(
            record.id, [VALIDATING, IN_PROGRESS], status=CANCELLING, cancelling_at=now, errors=[error]
        ):
            log.info("batch_cancelled_key_revoked", batch_id=record.id, key_id=record.owner)
            self.wake()

    # -- validation ----------------------------------------------------------------------

    async def _validate(self, record: BatchRecord) -> None:
        data = await self.blobs.get_blob(record.input_file_id)
        now = int(time.time())
        if data is None:
            errors = [{"code": "file_not_found", "message": "The input file was deleted.", "param": None, "line": None}]
            await self.store.update_batch(record.id, [VALIDATING], status=FAILED, failed_at=now, errors=errors)
            return
        parsed = await asyncio.to_thread(
            parse_input,
            data,
            record.endpoint,
            set(self.models()),
            self.settings.max_lines,
            self.settings.prefix_chars,
        )
        if parsed.errors:
            await self.store.update_batch(record.id, [VALIDATING], status=FAILED, failed_at=now, errors=parsed.errors)
            log.info("batch_failed_validation", batch_id=record.id, errors=len(parsed.errors))
            return
        await self.store.load_lines(record.id, parsed.lines)
        started = await self.store.update_batch(
            record.id,
            [VALIDATING],
            status=IN_PROGRESS,
            in_progress_at=int(time.time()),
            total=len(parsed.lines),
            model=parsed.model,
        )
        log.info("batch_started", batch_id=record.id, lines=len(parsed.lines), started=started)

    # -- lines ---------------------------------------------------------------------------

    async def _run_line(self, record: BatchRecord, claim: Claim) -> None:
        key = (record.id, claim.index)
        line_id = request_id()
        crashed = False
        try:
            try:
                call = LineCall(record.endpoint, claim.body, record.owner, line_id, record.id, claim.custom_id)
                task = asyncio.current_task()
                assert task is not None
                self._running[key] = task
                try:
                    answer = await self.execute(call)
                finally:
                    del self._running[key]
            except asyncio.CancelledError:
                if record.id not in self._stopping:
                    raise
                # Its batch was cancelled: the line is abandoned, its claim given back at once.
                await self._persist(lambda: self.store.defer_line(record.id, self.claimant, claim.index, 0))
                return
            except Exception:
                # The gateway's own request path broke on this line: running it again would break again.
                log.error("batch_line_crashed", batch_id=record.id, line=claim.index, exc_info=True)
                crashed = True
                answer = LineResponse(500, error_body(500, "The gateway failed to run this request.", "internal_error"))
            attempts = self._attempts.get(key, 0) + 1
            if not crashed and (
                answer.status in RETRY_LATER
                or (answer.status in ENGINE_FAILED and attempts < self.settings.max_attempts)
            ):
                self._attempts[key] = attempts
                delay = min(self.settings.retry_max_s, self.settings.retry_base_s * 2 ** (attempts - 1))
                delay *= random.uniform(0.8, 1.2)
                await self._persist(lambda: self.store.defer_line(record.id, self.claimant, claim.index, delay))
                self.metrics.batch_requests.labels("retried").inc()
                return
            self._attempts.pop(key, None)
            ok = 200 <= answer.status < 300
            line = response_line(line_id, claim.custom_id, answer.status, line_id, answer.body)
            written = await self._persist(
                lambda: self.store.complete_line(record.id, claim.index, claim.custom_id, ok, line)
            )
            if written:
                self.metrics.batch_requests.labels(COMPLETED if ok else FAILED).inc()
        finally:
            held = self._held.get(record.id)
            if held is not None:
                held.discard(claim.index)
                if not held:
                    del self._held[record.id]
                    self._stopping.discard(record.id)
            self.wake()

    async def _persist(self, write: Callable[[], Awaitable[T]]) -> T:
        """Keep trying a write a line's outcome depends on until the store answers again."""
        delay = 0.1
        while True:
            try:
                return await write()
            except StoreUnavailable:
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_s / 3)
            for batch_id, indexes in list(self._held.items()):
                try:
                    await self.store.renew_lines(batch_id, self.claimant, sorted(indexes), self.settings.lease_s)
                except StoreUnavailable as exc:
                    log.warning("batch_lease_renewal_failed", batch_id=batch_id, reason=str(exc))
                    break

    # -- finalisation --------------------------------------------------------------------

    async def _finalize(self, record: BatchRecord) -> None:
        results = await self.store.results(record.id)
        done = [r.line for r in results if r.ok]
        failed = [r.line for r in results if not r.ok]
        errors = list(failed)
        if record.status == FINALIZING and record.ending == EXPIRED:
            message = "This request could not be executed before the completion window expired."
            errors += [
                error_line(cid, "batch_expired", message) for _, cid in await self.store.unfinished_lines(record.id)
            ]
        output_id, error_id = output_file_ids(record.id)
        output_file = await self._write_file(record, output_id, "output", done)
        error_file = await self._write_file(record, error_id, "errors", errors)
        now = int(time.time())
        if record.status == CANCELLING:
            final = {"status": CANCELLED, "cancelled_at": now}
        elif record.ending == EXPIRED:
            final = {"status": EXPIRED, "expired_at": now}
        else:
            final = {"status": COMPLETED, "completed_at": now}
        finished = await self.store.update_batch(
            record.id,
            [FINALIZING, CANCELLING],
            output_file_id=output_file,
            error_file_id=error_file,
            completed=len(done),
            failed=len(failed),
            **final,
        )
        if finished:
            await self.store.drop_lines(record.id)
            for key in [k for k in self._attempts if k[0] == record.id]:
                del self._attempts[key]
            log.info("batch_finished", batch_id=record.id, status=final["status"], ok=len(done), failed=len(failed))

    async def _write_file(self, record: BatchRecord, file_id: str, kind: str, lines: list[bytes]) -> str | None:
        if not lines:
            return None
        body = jsonl(lines)
        await self.blobs.put_blob(file_id, body)
        now = int(time.time())
        lifetime = record.output_expires_after_s or self.settings.file_retention_s
        await self.store.put_file(
            FileRecord(
                file_id,
                record.owner,
                f"{record.id}_{kind}.jsonl",
                "batch_output",
                len(body),
                now,
                now + lifetime if lifetime else None,
            )
        )
        return file_id
