"""The gateway-side wait queue of one pool.

Rules:
- Ordered by class rank (interactive before batch), then by start deadline, then arrival
  (a preempted request queued again keeps its place).
- Each entry has a start deadline: past it, the request is refused rather than started
  late (an interactive request that cannot start in time for its TTFT budget is answered
  at once, never left to time out).
- ``shed`` removes the batch entry that arrived last, to make room for more urgent work.
- Cancelled entries (the client left) are skipped lazily.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from gateway.core.classes import CLASS_RANK
from gateway.core.request import RouteRequest


@dataclass(slots=True, order=True)
class Entry:
    rank: int
    deadline: float
    arrival: float
    seq: int
    request: RouteRequest = field(compare=False)
    enqueued: float = field(compare=False, default=0.0)
    cancelled: bool = field(compare=False, default=False)


class WaitQueue:
    def __init__(self) -> None:
        self._heap: list[Entry] = []
        # Per class, in arrival order: the newest batch entry is the one shed first.
        self._live: dict[str, dict[str, Entry]] = {cls: {} for cls in CLASS_RANK}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._live.values())

    def depth(self, cls: str) -> int:
        return len(self._live[cls])

    def push(self, req: RouteRequest, deadline: float, now: float) -> Entry:
        entry = Entry(CLASS_RANK[req.cls], deadline, req.arrival, next(self._seq), req, now)
        heapq.heappush(self._heap, entry)
        self._live[req.cls][req.id] = entry
        return entry

    def peek(self) -> Entry | None:
        heap = self._heap
        while heap and heap[0].cancelled:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def pop(self) -> Entry:
        entry = self.peek()
        assert entry is not None
        heapq.heappop(self._heap)
        self._forget(entry)
        return entry

    def remove(self, request: RouteRequest) -> Entry | None:
        entry = self._live[request.cls].get(request.id)
        if entry is not None:
            entry.cancelled = True
            self._forget(entry)
        return entry

    def _forget(self, entry: Entry) -> None:
        self._live[entry.request.cls].pop(entry.request.id, None)

    def expired(self, now: float) -> list[Entry]:
        gone = [e for entries in self._live.values() for e in entries.values() if e.deadline < now]
        for entry in gone:
            entry.cancelled = True
            self._forget(entry)
        return gone

    def position(self, cls: str, deadline: float) -> int:
        """How many live entries would be served before a new one of this class and deadline."""
        rank = CLASS_RANK[cls]
        ahead = sum(len(self._live[c]) for c, r in CLASS_RANK.items() if r < rank)
        return ahead + sum(1 for e in self._live[cls].values() if e.deadline <= deadline)

    def shed(self, cls: str) -> Entry | None:
        entries = self._live[cls]
        if not entries:
            return None
        victim = entries[next(reversed(entries))]
        victim.cancelled = True
        self._forget(victim)
        return victim
