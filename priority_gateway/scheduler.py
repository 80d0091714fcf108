"""The core's dispatcher on the wall clock: the one place its decisions are carried out.

Rules:
- Every call into the dispatcher goes through here, and every ``Decisions`` it returns is
  applied whole before the call returns: a dispatch or refusal of a queued request wakes that
  request's waiter, a preemption stops the relay running it, a shed request is refused.
- A dispatch nobody waits for any more (the client left in the same instant) is finished at once,
  so its slot is never lost; a preemption that comes too late (the relay already answered, or
  started streaming) cancels the copy the core queued again.
- Time is ``time.monotonic()``, read here and passed to the core.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from priority_gateway import log
from priority_gateway.core.dispatcher import Answer, Decisions, Dispatch, Dispatcher, Preempted, Rejection
from priority_gateway.core.request import RouteRequest


class Scheduler:
    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self._waiters: dict[str, asyncio.Future[Dispatch | Rejection]] = {}
        # Running relays by request id: how to stop one that the core preempts.
        self._running: dict[str, Callable[[], bool]] = {}

    def home(self, cls: str) -> str:
        """The pool requests of ``cls`` are queued in."""
        return self.dispatcher.home[cls]

    # -- the request path ----------------------------------------------------------------

    def submit(self, req: RouteRequest) -> Answer:
        decided = self.dispatcher.submit(req, time.monotonic())
        self._apply(decided)
        assert decided.answer is not None
        return decided.answer

    async def wait_turn(self, req: RouteRequest) -> Dispatch | Rejection:
        """Wait until the core dispatches or refuses ``req`` (queued by ``submit``, ``retry`` or a preemption)."""
        fut = self._waiters.get(req.id)
        if fut is None:
            fut = self._waiters[req.id] = asyncio.get_running_loop().create_future()
        try:
            return await fut
        except asyncio.CancelledError:
            outcome = fut.result() if fut.done() and not fut.cancelled() else None
            if isinstance(outcome, Dispatch):
                # Our turn came in the same instant the waiter left: give the slot straight back.
                self.finish(outcome, ok=False)
            else:
                self.cancel(req)
            raise
        finally:
            self._waiters.pop(req.id, None)

    def retry(self, dispatch: Dispatch) -> Answer:
        decided = self.dispatcher.retry(dispatch, time.monotonic())
        self._apply(decided)
        assert decided.answer is not None
        return decided.answer

    def finish(self, dispatch: Dispatch, ok: bool, generated: int | None = None, prompt: int | None = None) -> None:
        """``generated``/``prompt``: the tokens the engine reported, when known (settles the tenant's charge)."""
        self._apply(self.dispatcher.finish(dispatch, time.monotonic(), ok, generated, prompt))

    def cancel(self, req: RouteRequest) -> None:
        self._apply(self.dispatcher.cancel(req, time.monotonic()))

    def running(self, req: RouteRequest, stop: Callable[[], bool]) -> None:
        """``req`` is being relayed; ``stop()`` ends the attempt (False once it cannot be restarted)."""
        self._running[req.id] = stop

    def stopped(self, req: RouteRequest) -> None:
        self._running.pop(req.id, None)

    def observe_ttft(self, dispatch: Dispatch, seconds: float) -> None:
        self.dispatcher.observe_ttft(dispatch, seconds)

    def observe_itl(self, dispatch: Dispatch, seconds: float, now: float, times: int = 1) -> None:
        self.dispatcher.observe_itl(dispatch, seconds, now, times)

    # -- the poll loop ---------------------------------------------------------------------

    def poll(self) -> None:
        decided = self.dispatcher.poll(time.monotonic())
        self._apply(decided)
        for change in decided.limit_changes:
            log.info("concurrency_limit", engine=change.engine, old=change.old, new=change.new, reason=change.reason)

    def close(self) -> None:
        for fut in self._waiters.values():
            if not fut.done():
                fut.cancel()

    # -- carrying decisions out ------------------------------------------------------------

    def carry_out(self, decided: Decisions) -> None:
        """What another part of the core decided (the fleet: slots granted start queued requests)."""
        self._apply(decided)

    def _apply(self, decided: Decisions) -> None:
        for outcome in decided.others:
            if isinstance(outcome, Preempted):
                self._preempt(outcome)
                continue
            fut = self._waiters.get(outcome.request.id)
            if fut is not None and not fut.done():
                fut.set_result(outcome)
            elif isinstance(outcome, Dispatch):
                # Nobody waits for it any more: give the slot back.
                self.finish(outcome, ok=False)

    def _preempt(self, outcome: Preempted) -> None:
        req = outcome.request
        stop = self._running.get(req.id)
        if stop is not None and stop():
            # Its next turn may come within this very batch of outcomes: be there to take it.
            self._waiters[req.id] = asyncio.get_running_loop().create_future()
        else:
            # It finished (or started answering) meanwhile: drop the copy the core queued again.
            self.cancel(req)
