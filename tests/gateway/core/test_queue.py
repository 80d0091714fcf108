"""The pool's wait queue: order, deadlines, shedding and cancellation (``priority_gateway/core/queue.py``)."""

from __future__ import annotations

from priority_gateway.core.classes import BATCH, INTERACTIVE
from priority_gateway.core.queue import WaitQueue
from priority_gateway.core.request import RouteRequest


def req(rid: str, cls: str = INTERACTIVE, arrival: float = 0.0) -> RouteRequest:
    return RouteRequest(rid, cls, "m", arrival)


def drain(queue: WaitQueue) -> list[str]:
    out = []
    while queue.peek() is not None:
        out.append(queue.pop().request.id)
    return out


def test_interactive_first_then_earliest_deadline_then_arrival():
    queue = WaitQueue()
    queue.push(req("b-early", BATCH, 0.0), deadline=1.0, now=0.0)
    queue.push(req("i-late", INTERACTIVE, 0.1), deadline=9.0, now=0.1)
    queue.push(req("i-soon", INTERACTIVE, 0.2), deadline=2.0, now=0.2)
    queue.push(req("i-soon-later-arrival", INTERACTIVE, 0.3), deadline=2.0, now=0.3)
    assert drain(queue) == ["i-soon", "i-soon-later-arrival", "i-late", "b-early"]
    assert len(queue) == 0


def test_a_request_queued_again_keeps_its_place_by_its_arrival():
    queue = WaitQueue()
    queue.push(req("newer", arrival=5.0), deadline=10.0, now=5.0)
    # Preempted and queued again at t=6, but it arrived first: it goes first.
    queue.push(req("older", arrival=1.0), deadline=10.0, now=6.0)
    assert drain(queue) == ["older", "newer"]


def test_removed_entries_are_skipped_and_not_counted():
    queue = WaitQueue()
    first, second = req("first"), req("second", arrival=1.0)
    queue.push(first, 5.0, 0.0)
    queue.push(second, 5.0, 1.0)
    assert queue.remove(first) is not None
    assert queue.remove(first) is None  # twice: nothing more to remove
    assert (len(queue), queue.depth(INTERACTIVE)) == (1, 1)
    assert drain(queue) == ["second"]


def test_expired_takes_out_only_what_is_past_its_deadline():
    queue = WaitQueue()
    queue.push(req("past"), deadline=1.0, now=0.0)
    queue.push(req("at"), deadline=2.0, now=0.0)
    queue.push(req("future", BATCH), deadline=3.0, now=0.0)
    assert sorted(e.request.id for e in queue.expired(now=2.0)) == ["past"]
    assert queue.expired(now=2.0) == []
    assert drain(queue) == ["at", "future"]


def test_shed_takes_the_newest_batch_entry_and_never_interactive():
    queue = WaitQueue()
    queue.push(req("i", INTERACTIVE), 1.0, 0.0)
    assert queue.shed(BATCH) is None
    queue.push(req("b-old", BATCH, 0.0), 100.0, 0.0)
    queue.push(req("b-new", BATCH, 1.0), 50.0, 1.0)
    victim = queue.shed(BATCH)
    assert victim is not None and victim.request.id == "b-new"
    assert (queue.depth(INTERACTIVE), queue.depth(BATCH)) == (1, 1)
    assert drain(queue) == ["i", "b-old"]


def test_position_counts_who_would_be_served_first():
    queue = WaitQueue()
    queue.push(req("i1"), 1.0, 0.0)
    queue.push(req("i2"), 3.0, 0.0)
    queue.push(req("b1", BATCH), 2.0, 0.0)
    assert queue.position(req("i"), 2.0) == 1  # behind i1 only
    assert queue.position(req("i"), 3.0) == 2  # an equal deadline waits its turn
    assert queue.position(req("b", BATCH), 0.5) == 2  # every interactive entry goes first
    assert queue.position(req("b", BATCH), 2.0) == 3


def test_an_entry_remembers_when_it_was_queued():
    queue = WaitQueue()
    entry = queue.push(req("r", arrival=1.0), 9.0, now=4.0)
    assert (entry.enqueued, queue.peek()) == (4.0, entry)
