"""The scheduler carries every decision of the core out on the event loop (``priority_gateway/scheduler.py``)."""

from __future__ import annotations

import asyncio

from priority_gateway.core.classes import BATCH, INTERACTIVE, Budget
from priority_gateway.core.dispatcher import AdmissionSettings, Dispatch, Dispatcher, PoolSpec, Queued, Rejection
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.core.reasons import Refusal
from priority_gateway.core.request import RouteRequest
from priority_gateway.scheduler import Scheduler


def scheduler(max_queue: int = 10, limit: float = 1.0) -> Scheduler:
    admission = AdmissionSettings(
        enabled=True, limits=LimitSettings(initial=limit, unbudgeted=limit), max_queue=max_queue, backfill_reserve=0.0
    )
    pools = [
        PoolSpec("interactive", ["i0"], policy="least_loaded"),
        PoolSpec("batch", ["b0"], policy="least_loaded", takes_priority=True),
    ]
    return Scheduler(Dispatcher(pools, budgets={INTERACTIVE: 0.05, BATCH: None}, admission=admission))


def req(rid: str, cls: str = BATCH) -> RouteRequest:
    return RouteRequest(rid, cls, "m", 0.0, 100, budget=Budget(), restartable=True)


async def test_a_finish_hands_the_freed_slot_to_the_waiter():
    s = scheduler()
    first = s.submit(req("a"))
    assert isinstance(first, Dispatch)
    second = req("b")
    assert isinstance(s.submit(second), Queued)
    waiting = asyncio.create_task(s.wait_turn(second))
    await asyncio.sleep(0)
    s.finish(first, ok=True)
    turn = await asyncio.wait_for(waiting, 1.0)
    assert isinstance(turn, Dispatch) and turn.request is second and turn.engine.id == "b0"


async def test_a_turn_that_comes_as_the_waiter_leaves_is_given_back():
    s = scheduler()
    first = s.submit(req("a"))
    assert isinstance(first, Dispatch)
    second = req("b")
    s.submit(second)
    waiting = asyncio.create_task(s.wait_turn(second))
    await asyncio.sleep(0)
    s.finish(first, ok=True)  # resolves the waiter's future...
    waiting.cancel()  # ...and the client leaves before the task runs again
    await asyncio.gather(waiting, return_exceptions=True)
    engine = s.dispatcher.engine("b0")
    assert engine is not None and engine.inflight == 0  # the slot was not lost
    assert isinstance(s.submit(req("c")), Dispatch)


async def test_a_waiter_that_leaves_gives_up_its_place():
    s = scheduler(max_queue=1)
    running = s.submit(req("a"))
    assert isinstance(running, Dispatch)
    queued = req("b")
    s.submit(queued)
    waiting = asyncio.create_task(s.wait_turn(queued))
    await asyncio.sleep(0)
    refused = s.submit(req("c"))
    assert isinstance(refused, Rejection) and refused.reason is Refusal.QUEUE_FULL
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert isinstance(s.submit(req("d")), Queued)  # its place is free again


def interactive(rid: str) -> RouteRequest:
    return RouteRequest(rid, INTERACTIVE, "m", 0.0, 100, budget=Budget(ttft_s=5.0, itl_s=0.05))


async def test_a_preemption_stops_the_relay_and_its_request_gets_a_turn_again():
    s = scheduler(limit=2.0)
    in_batch_pool = [s.submit(req(f"b{n}")) for n in range(2)]
    assert all(isinstance(d, Dispatch) and d.engine.id == "b0" for d in in_batch_pool)
    # The interactive engine is idle: batch work backfills it, stoppably (not streamed).
    backfilled = s.submit(req("bf"))
    assert isinstance(backfilled, Dispatch) and backfilled.engine.id == "i0" and backfilled.preemptible
    stopped: list[str] = []
    s.running(backfilled.request, lambda: not stopped.append("bf"))
    assert isinstance(s.submit(interactive("u1")), Dispatch)  # the slot kept back from backfill
    urgent = s.submit(interactive("u2"))
    assert isinstance(urgent, Dispatch) and urgent.engine.id == "i0"
    assert stopped == ["bf"]  # the relay was told to stop...
    s.stopped(backfilled.request)
    waiting = asyncio.create_task(s.wait_turn(backfilled.request))
    await asyncio.sleep(0)
    s.finish(in_batch_pool[0], ok=True)  # ...and its request starts again where room frees
    again = await asyncio.wait_for(waiting, 1.0)
    assert isinstance(again, Dispatch) and again.request is backfilled.request and again.engine.id == "b0"


async def test_a_preemption_that_comes_too_late_drops_the_requeued_copy():
    s = scheduler(limit=2.0)
    for n in range(2):
        s.submit(req(f"b{n}"))
    backfilled = s.submit(req("bf"))
    assert isinstance(backfilled, Dispatch) and backfilled.engine.id == "i0"
    s.running(backfilled.request, lambda: False)  # it has started answering: it cannot be restarted
    s.submit(interactive("u1"))
    assert isinstance(s.submit(interactive("u2")), Dispatch)
    assert s.dispatcher.readings.queue_depths()[("batch", BATCH)] == 0  # no copy waits for a turn it would never take
