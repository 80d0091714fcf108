"""Weighted fair queueing among the tenants of one class: start-time fair queueing (SFQ).

Rules:
- Each tenant waits in its own line, earliest start deadline first, then arrival (the order
  the pool's queue had before tenants).
- Among tenants, the line whose tenant has the smallest start tag goes next (ties: the earlier
  deadline, then arrival). Starting a request moves its tenant's tag on by the request's cost
  (predicted prompt + decode tokens) divided by the tenant's weight, and sets the queue's
  virtual time to the tag it started at. A tenant that was idle comes back at the virtual
  time: idleness earns no credit, so a returning tenant can neither starve the others nor
  be starved by their history.
- Work-conserving: a tenant that may not start now (at its concurrency cap) is passed over;
  it never blocks the others, and nobody waits while someone eligible is queued.
- Starting a request hands out its ``Charge`` (tenant, cost, busy period). Settling it with the
  real token count when the request ends refunds over-predicted decode and charges the
  under-predicted, never below the virtual time; a charge of a busy period that has ended settles
  nothing (its debts were forgotten with it), nor does a request started on an empty queue (it
  was never charged).
- With fairness off the lines are merged by deadline alone (one queue, earliest deadline
  first), tags are kept but not used: the contrast run, and caps still hold per tenant.
- Continuing turns first (``lane`` ``CONTINUING``: a turn of an agent session that paused within its
  learned gap, ``sessions``): within a tenant's line they start before the line's other requests,
  each lane by deadline then arrival. The bound: while another request of the line waits, at most
  ``burst`` continuing turns start in a row; then the line's earliest other request starts. So a
  new session's first turn that is the ``k``-th of its lane starts within ``k x (burst + 1)`` starts
  of its tenant's line, and the tenants' shares are those of fair queueing, whatever their lanes.
  With fairness off the class is one line, and the bound holds for the class.
- Removing a waiting request (cancelled, expired, shed) charges nothing.
- When the queue empties, a busy period ends: the virtual time moves to the highest tag and
  every tenant is forgotten (nobody contends, so no debt is worth keeping). The state is
  bounded by the tenants active in the current busy period, never by the tenants ever seen.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Charge:
    """What starting a request charged its tenant, and in which busy period."""

    tenant: str
    cost: float
    period: int


CONTINUING = 0
"""Lane of a turn that continues a paused session (it holds KV cache, someone waits on it)."""
NEW = 1
"""Lane of every other request."""


@dataclass(slots=True, order=True)
class Waiting(Generic[T]):
    lane: int
    deadline: float
    arrival: float
    seq: int
    key: str = field(compare=False)
    tenant: str = field(compare=False)
    cost: float = field(compare=False)
    item: T = field(compare=False)
    enqueued: float = field(compare=False, default=0.0)
    cancelled: bool = field(compare=False, default=False)
    charge: Charge | None = field(compare=False, default=None)
    """Set by ``take``: what starting it charged (None when the busy period ended with it)."""

    @property
    def request(self) -> T:
        return self.item


@dataclass(slots=True)
class _Lanes(Generic[T]):
    """One line's two lanes, heaps by (deadline, arrival), and the continuing turns started in a row."""

    lanes: tuple[list[Waiting[T]], list[Waiting[T]]] = field(default_factory=lambda: ([], []))
    passed: int = 0
    """Continuing turns started in a row while a request of the other lane waited."""

    def top(self, lane: int) -> Waiting[T] | None:
        line = self.lanes[lane]
        while line and line[0].cancelled:
            heapq.heappop(line)
        return line[0] if line else None

    def head(self, burst: int) -> Waiting[T] | None:
        continuing, other = self.top(CONTINUING), self.top(NEW)
        if continuing is None or (other is not None and self.passed >= burst):
            return other
        return continuing

    def in_order(self, burst: int) -> list[Waiting[T]]:
        """Every live entry, in the order they would start."""
        continuing, other = (sorted(e for e in lane if not e.cancelled) for lane in self.lanes)
        if other and self.passed >= burst:
            return other[:1] + continuing + other[1:]
        return continuing + other

    def started(self, entry: Waiting[T]) -> None:
        if entry.lane == CONTINUING and self.top(NEW) is not None:
            self.passed += 1
        else:
            self.passed = 0

    def push(self, entry: Waiting[T]) -> None:
        heapq.heappush(self.lanes[entry.lane], entry)

    def clear(self) -> None:
        for lane in self.lanes:
            lane.clear()
        self.passed = 0


@dataclass(slots=True)
class _Tenant(Generic[T]):
    weight: float = 1.0
    tag: float = 0.0
    line: _Lanes[T] = field(default_factory=_Lanes)
    live: dict[str, Waiting[T]] = field(default_factory=dict)
    queued_cost: float = 0.0


class FairQueue(Generic[T]):
    def __init__(self, fair: bool = True, burst: int = 4) -> None:
        self.fair = fair
        self.burst = burst
        self._merged: _Lanes[T] = _Lanes()
        """With fairness off: the class's one line's count of continuing turns started in a row."""
        self._others = 0
        """Live entries of the ``NEW`` lane."""
        self.vtime = 0.0
        self.period = 0
        """Counts busy periods: a charge is settled only within the one it was made in."""
        self._tenants: dict[str, _Tenant[T]] = {}
        self._where: dict[str, str] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key: str) -> bool:
        return key in self._where

    def tenants(self) -> dict[str, int]:
        """Queued requests per tenant."""
        return {name: len(t.live) for name, t in self._tenants.items() if t.live}

    def backlog(self) -> dict[str, tuple[int, float]]:
        """Queued requests and weight per tenant."""
        return {name: (len(t.live), t.weight) for name, t in self._tenants.items() if t.live}

    def entries(self) -> Iterator[Waiting[T]]:
        for tenant in self._tenants.values():
            yield from tenant.live.values()

    def push(
        self,
        key: str,
        tenant: str,
        cost: float,
        deadline: float,
        arrival: float,
        item: T,
        weight: float = 1.0,
        now: float = 0.0,
        lane: int = NEW,
    ) -> Waiting[T]:
        if not weight > 0:
            raise ValueError("a tenant's weight must be positive")
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _Tenant(weight, self.vtime)
        state.weight = weight
        if not state.live:
            state.tag = max(state.tag, self.vtime)
        entry = Waiting(lane, deadline, arrival, next(self._seq), key, tenant, max(0.0, cost), item, now)
        state.line.push(entry)
        self._others += lane == NEW
        state.live[key] = entry
        state.queued_cost += entry.cost
        self._where[key] = tenant
        return entry

    def peek(
        self, eligible: Callable[[str], bool] | None = None, passed: Callable[[Waiting[T]], bool] | None = None
    ) -> Waiting[T] | None:
        """The entry that starts next among tenants for which ``eligible`` holds, entries for which
        ``passed`` holds left out (a tenant's next entry in its line then stands in its place)."""
        if not self.fair:
            return self._peek_merged(eligible, passed)
        burst = self.burst
        best: Waiting[T] | None = None
        best_key: tuple[float, ...] | None = None
        for name, state in self._tenants.items():
            if not state.live or (eligible is not None and not eligible(name)):
                continue
            head = state.line.head(burst)
            assert head is not None
            if passed is not None and passed(head):
                head = next((e for e in state.line.in_order(burst) if not passed(e)), None)
                if head is None:
                    continue
            rank = (state.tag, head.deadline, head.arrival, head.seq)
            if best_key is None or rank < best_key:
                best, best_key = head, rank
        return best

    def _peek_merged(
        self, eligible: Callable[[str], bool] | None, passed_over: Callable[[Waiting[T]], bool] | None
    ) -> Waiting[T] | None:
        """Fairness off: the class's earliest entry of each lane across tenants, then the lanes' rule."""
        tops: list[Waiting[T] | None] = [None, None]
        for name, state in self._tenants.items():
            if not state.live or (eligible is not None and not eligible(name)):
                continue
            for lane in (CONTINUING, NEW):
                head = state.line.top(lane)
                if head is not None and passed_over is not None and passed_over(head):
                    head = next(
                        (e for e in sorted(state.line.lanes[lane]) if not e.cancelled and not passed_over(e)), None
                    )
                top = tops[lane]
                if head is not None and (top is None or head < top):
                    tops[lane] = head
        continuing, other = tops
        if continuing is None or (other is not None and self._merged.passed >= self.burst):
            return other
        return continuing

    def take(self, key: str) -> Waiting[T] | None:
        """Remove ``key`` because it starts now: its tenant is charged."""
        tenant = self._where.get(key)
        if tenant is None:
            return None
        state = self._tenants[tenant]
        start = max(state.tag, self.vtime)
        self.vtime = start
        cost = state.live[key].cost
        state.tag = start + cost / state.weight
        period = self.period
        entry = self._drop(key)
        assert entry is not None
        if self.fair:
            state.line.started(entry)
        elif entry.lane == CONTINUING and self._others:
            self._merged.passed += 1
        else:
            self._merged.passed = 0
        if self.period == period:
            entry.charge = Charge(tenant, cost, period)
        self._forget_if_idle(tenant)
        return entry

    def charge(self, tenant: str, cost: float, weight: float = 1.0) -> Charge | None:
        """A request of ``tenant`` started without waiting: charged as if it had queued (None: the
        queue is empty, nobody contends, nothing is charged)."""
        if not self._where:
            return None
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _Tenant(weight, self.vtime)
        state.weight = weight
        start = max(state.tag, self.vtime)
        cost = max(0.0, cost)
        state.tag = start + cost / weight
        self._forget_if_idle(tenant)
        return Charge(tenant, cost, self.period)

    def settle(self, charge: Charge, actual: float) -> None:
        """The request ``charge`` was for ended having cost ``actual`` tokens."""
        state = self._tenants.get(charge.tenant)
        if state is None or charge.period != self.period:
            return
        state.tag = max(self.vtime, state.tag + (max(0.0, actual) - charge.cost) / state.weight)
        self._forget_if_idle(charge.tenant)

    def remove(self, key: str) -> Waiting[T] | None:
        """Remove ``key`` without charging (cancelled, expired, shed)."""
        entry = self._drop(key)
        if entry is not None:
            self._forget_if_idle(entry.tenant)
        return entry

    def _drop(self, key: str) -> Waiting[T] | None:
        tenant = self._where.pop(key, None)
        if tenant is None:
            return None
        state = self._tenants[tenant]
        entry = state.live.pop(key)
        entry.cancelled = True
        self._others -= entry.lane == NEW
        state.queued_cost -= entry.cost
        if not state.live:
            state.line.clear()
            state.queued_cost = 0.0
        if not self._where:
            self._end_busy_period()
        return entry

    def _end_busy_period(self) -> None:
        self.vtime = max([self.vtime, *(s.tag for s in self._tenants.values())])
        self._tenants.clear()
        self._merged.passed = 0
        self.period += 1

    def _forget_if_idle(self, tenant: str) -> None:
        state = self._tenants.get(tenant)
        if state is not None and not state.live and state.tag <= self.vtime:
            del self._tenants[tenant]

    def newest_of_heaviest(self) -> Waiting[T] | None:
        """The newest entry of the tenant with the most queued cost per weight (the one to shed)."""
        loaded = [s for s in self._tenants.values() if s.live]
        if not loaded:
            return None
        heaviest = max(loaded, key=lambda s: (s.queued_cost / s.weight, len(s.live)))
        return heaviest.live[next(reversed(heaviest.live))]

    def ahead(
        self, tenant: str, deadline: float, eligible: Callable[[str], bool] | None = None, lane: int = NEW
    ) -> int:
        """About how many queued entries would start before a new one of ``tenant``.

        Its own tenant's entries with an earlier or equal deadline, and of every other tenant those
        whose tags come before the new entry's (estimated from that tenant's mean queued cost).
        Tenants for which ``eligible`` is false (at their cap) are not ahead of anyone. A continuing
        turn (``lane``) has only its own lane's entries of its tenant ahead.
        """
        if not self.fair:
            return sum(
                1
                for entry in self.entries()
                if entry.deadline <= deadline
                and entry.lane <= lane
                and (entry.tenant == tenant or eligible is None or eligible(entry.tenant))
            )
        own = self._tenants.get(tenant)
        count = 0
        tag = self.vtime
        if own is not None:
            ahead_cost = 0.0
            for entry in own.live.values():
                if entry.deadline <= deadline and entry.lane <= lane:
                    count += 1
                    ahead_cost += entry.cost
            tag = max(own.tag, self.vtime) + ahead_cost / own.weight
        for name, state in self._tenants.items():
            if name == tenant or not state.live or (eligible is not None and not eligible(name)):
                continue
            mean = state.queued_cost / len(state.live)
            start = max(state.tag, self.vtime)
            if tag < start:
                continue
            if mean <= 0:
                count += len(state.live)
                continue
            count += min(len(state.live), int((tag - start) * state.weight / mean) + 1)
        return count
