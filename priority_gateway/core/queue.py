"""The gateway-side wait queue of one pool.

Rules:
- Ordered by class rank (the class's vLLM ``priority``: lower first). Inside a class, the
  tenants share by weighted fair queueing charged in predicted tokens (``fair_queue``); each
  tenant's own requests go by start deadline, then arrival (a preempted request queued again
  keeps its place), continuing turns of paused sessions first within the bound of ``fair_queue``
  (``burst``). With fairness off, a class is one line by deadline, as before tenants.
- Each entry has a start deadline: past it, the request is refused rather than started
  late (an interactive request that cannot start in time for its TTFT budget is answered
  at once, never left to time out).
- ``shed`` removes, from the lowest-ranked batch class with waiting work, the newest entry of
  the tenant with the most queued work per weight: the flood goes first.
- Cancelled entries (the client left) are skipped lazily.
"""

from __future__ import annotations

from collections.abc import Callable

from priority_gateway.core.classes import DEFAULT_CLASSES, ClassTable
from priority_gateway.core.fair_queue import CONTINUING, NEW, Charge, FairQueue, Waiting
from priority_gateway.core.request import RouteRequest

DEFAULT_DECODE_TOKENS = 256
"""Decode tokens charged for a request that does not say its ``max_tokens``."""

Entry = Waiting[RouteRequest]


class WaitQueue:
    def __init__(
        self,
        classes: ClassTable = DEFAULT_CLASSES,
        fair: bool = True,
        decode_tokens: int = DEFAULT_DECODE_TOKENS,
        burst: int = 4,
    ) -> None:
        self.classes = classes
        self.fair = fair
        self.decode_tokens = decode_tokens
        self._lines: dict[str, FairQueue[RouteRequest]] = {cls: FairQueue(fair, burst) for cls in classes.names}

    def __len__(self) -> int:
        return sum(map(len, self._lines.values()))

    def depth(self, cls: str) -> int:
        return len(self._lines[cls])

    def depth_of(self, classes: tuple[str, ...]) -> int:
        return sum(len(self._lines[cls]) for cls in classes)

    def tenants(self, cls: str) -> dict[str, int]:
        return self._lines[cls].tenants()

    def backlog(self) -> dict[str, tuple[int, float]]:
        """Per tenant with requests waiting in any class: how many, and its weight."""
        out: dict[str, tuple[int, float]] = {}
        for line in self._lines.values():
            for tenant, (n, weight) in line.backlog().items():
                out[tenant] = (out.get(tenant, (0, weight))[0] + n, weight)
        return out

    def cost(self, req: RouteRequest) -> float:
        """What a request is charged: its prompt and predicted decode tokens."""
        return req.prompt_tokens + (req.max_tokens if req.max_tokens is not None else self.decode_tokens)

    def push(self, req: RouteRequest, deadline: float, now: float) -> Entry:
        line = self._lines[req.cls]
        lane = CONTINUING if req.continuing else NEW
        return line.push(req.id, req.tenant, self.cost(req), deadline, req.arrival, req, req.weight, now, lane)

    def peek(
        self, eligible: Callable[[str], bool] | None = None, passed: Callable[[Entry], bool] | None = None
    ) -> Entry | None:
        """The entry that starts next; tenants for which ``eligible`` is false, and entries for which
        ``passed`` is true, are passed over."""
        for line in self._lines.values():
            if len(line) and (entry := line.peek(eligible, passed)) is not None:
                return entry
        return None

    def pop(self) -> Entry:
        """Take the entry that starts next."""
        entry = self.peek()
        assert entry is not None
        self.take(entry.request)
        return entry

    def take(self, request: RouteRequest) -> Entry | None:
        """Remove ``request`` because it starts now: its tenant is charged for it."""
        return self._lines[request.cls].take(request.id)

    def charge(self, request: RouteRequest) -> Charge | None:
        """``request`` started without waiting: its tenant is charged all the same."""
        return self._lines[request.cls].charge(request.tenant, self.cost(request), request.weight)

    def settle(self, request: RouteRequest, charge: Charge, actual: float) -> None:
        """``request`` ended having cost ``actual`` tokens (prompt and generated), not what it was charged."""
        self._lines[request.cls].settle(charge, actual)

    def remove(self, request: RouteRequest) -> Entry | None:
        return self._lines[request.cls].remove(request.id)

    def expired(self, now: float) -> list[Entry]:
        gone = [e for line in self._lines.values() for e in line.entries() if e.deadline < now]
        for entry in gone:
            self._lines[entry.item.cls].remove(entry.key)
        return gone

    def position(self, req: RouteRequest, deadline: float, eligible: Callable[[str], bool] | None = None) -> int:
        """About how many live entries would be served before ``req`` with this deadline (tenants for
        which ``eligible`` is false are not ahead in its class)."""
        rank = self.classes.rank[req.cls]
        ahead = sum(len(line) for cls, line in self._lines.items() if self.classes.rank[cls] < rank)
        lane = CONTINUING if req.continuing else NEW
        return ahead + self._lines[req.cls].ahead(req.tenant, deadline, eligible, lane)

    def shed(self, cls: str | None = None) -> Entry | None:
        """Drop the newest entry of the heaviest tenant of class ``cls``, by default of the lowest-ranked
        batch class that has any."""
        for name in (cls,) if cls is not None else reversed(self.classes.batch_like):
            line = self._lines[name]
            victim = line.newest_of_heaviest()
            if victim is not None:
                line.remove(victim.key)
                return victim
        return None
