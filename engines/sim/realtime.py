"""Drives an ``EngineCore`` with the wall clock, for the HTTP server.

Rules:
- One asyncio task runs engine steps back to back while the core has work: ``core.step(now)``
  with the monotonic clock, a sleep until that step's end, then every request's new tokens go to
  its ``Stream``. With no work, the task waits until a request comes.
- Back-to-back steps are chained on their nominal times (a step starts when the previous one was
  due to end, not when the sleep happened to return), so timer lateness does not accumulate and
  the engine keeps the profile's pace; a step never starts before the latest arrival it may see.
- A stream is registered when its request enters the core and dropped when it finishes or is
  aborted; outputs for dropped streams are ignored (the core has already forgotten them).
- KV cache events of a step are handed to the publisher when the step is taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence

from priority_gateway.core.kv_events import KVEvent
from priority_gateway.engines.sim.core import EngineCore, EngineRequest, StepOutput

Clock = Callable[[], float]
Publish = Callable[[Sequence[KVEvent]], None]
# Behind schedule by more than this (a busy process), the chain restarts from the clock.
_MAX_LAG_S = 0.05


class Stream:
    """New tokens of one request, as the engine delivers them."""

    __slots__ = ("_waiter", "cached_tokens", "finished", "id", "pending", "reason", "stream_tokens", "total")

    def __init__(self, request_id: str, stream_tokens: bool = True) -> None:
        self.id = request_id
        # A non-streamed reply only needs the end: waking its reader on every step is waste.
        self.stream_tokens = stream_tokens
        self.pending = 0
        self.total = 0
        self.finished = False
        self.reason: str | None = None
        self.cached_tokens = 0
        self._waiter: asyncio.Future[None] | None = None

    def push(self, out: StepOutput) -> None:
        self.pending += out.new_tokens
        self.total += out.new_tokens
        if out.first_token:
            self.cached_tokens = out.cached_tokens
        if out.finished:
            self.finished = True
            self.reason = out.finish_reason
            self._wake()
        elif self.stream_tokens:
            self._wake()

    def close(self, reason: str) -> None:
        if not self.finished:
            self.finished = True
            self.reason = reason
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def until_finished(self) -> str | None:
        """Wait for the end of the request; its finish reason."""
        while not self.finished:
            await self.next()
        return self.reason

    async def next(self) -> tuple[int, bool, str | None]:
        """Tokens delivered since the last call (waits for at least one, or the end)."""
        while self.pending == 0 and not self.finished:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        n, self.pending = self.pending, 0
        return n, self.finished, self.reason


class RealtimeDriver:
    def __init__(self, core: EngineCore, publish: Publish | None = None, clock: Clock = time.monotonic) -> None:
        self.core = core
        self.clock = clock
        self.publish = publish
        self.streams: dict[str, Stream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_submit = 0.0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, req: EngineRequest, stream_tokens: bool = True) -> Stream:
        stream = Stream(req.id, stream_tokens)
        self._last_submit = now = self.clock()
        self.core.add_request(req, now)
        self.streams[req.id] = stream
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> bool:
        stream = self.streams.pop(request_id, None)
        if stream is not None:
            stream.close("abort")
        return self.core.abort(request_id, self.clock())

    async def run(self) -> None:
        core = self.core
        clock = self.clock
        due: float | None = None  # when the previous step was due to end, while chained
        while True:
            if not core.has_work:
                due = None
                self._wake.clear()
                await self._wake.wait()
                continue
            now = clock()
            start = now if due is None or now - due > _MAX_LAG_S else max(due, self._last_submit)
            result = core.step(start)
            if result.kv_events and self.publish is not None:
                self.publish(result.kv_events)
            due = start + result.duration_s
            if result.duration_s > 0:
                await asyncio.sleep(max(0.0, due - clock()))
            elif not result.outputs and not result.scheduled_tokens:
                # Nothing could be scheduled (blocked on KV blocks); wait for a change.
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.001)
            self._deliver(result.outputs)
            if result.duration_s <= 0:
                await asyncio.sleep(0)

    def _deliver(self, outputs: Sequence[StepOutput]) -> None:
        streams = self.streams
        for out in outputs:
            stream = streams.get(out.request_id)
            if stream is None:
                continue
            stream.push(out)
            if out.finished:
                del streams[out.request_id]
