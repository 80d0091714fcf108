"""How many of an engine's slots each gateway replica may fill: holdings every replica computes alike.

Replicas that only tell each other their in-flight requests (``core/sharing.py``) overfill an engine
whenever they start requests within the same few ms: each counts the others' requests it has heard
of, not those started since. Splitting the free slots among the replicas by what each last heard
does not close it either: a replica's pictures of the others differ by what is still in transit,
so two replicas can each take their share of the same slots. What closes it is an order everyone
agrees on, and the channel has one: Redis delivers every batch to every subscriber in the same
order, the publisher's own batches included. Each replica claims slots in its batches; applying
the claims in that order, every replica computes the same holdings, and each fills an engine only
within its own.

Rules:
- Slots: the limit the fleet applies (``fleet_limit``: the mean of the limits in the batches heard
  for the engine, the replica's own as heard back, rounded to the nearest whole request); without
  any, the replica's fixed limit for it, rounded up as one replica's admission rounds (it starts a
  request while its load is under the limit). Holdings add up to at most the slots.
- A holder occupies the larger of its holding and the in-flight requests it last reported: a
  replica that fills an engine without holding slots (in its safe share) still leaves them taken.
- Each load entry carries the publisher's ``claim`` (the holding it needs, and waits for), its
  ``spare`` (the holding it would keep if slots are free: its even share, so requests start without
  a round on the channel) and what it may fill as it sees it (its holding less releases still in
  transit). Applied, by every replica and in the channel's order: the holding becomes at least the
  one stated (a replica that missed batches or joined late catches up; a statement never lowers a
  holding, so a stale one is harmless); above the larger of claim and spare it is released at once
  (the claimant stopped using it when it sent the entry); below the claim it waits. Then the free
  slots (slots less what every holder occupies) go to the waiting claims, first come first served,
  whole or in part; and, when nobody waits, the publisher keeps free slots up to its spare.
- From sending an entry until it hears it back, a replica fills at most the least of its holding
  and the larger of claim and spare of each entry in transit (the dispatcher keeps those): what it
  releases it stops using before anyone else may take it.
- A full batch lists every engine its publisher has any load, claim or holding on; an engine it
  leaves out it holds and claims nothing on.
- A replica forgotten (``keep``: not heard within the channel's ``silent_s``) or all of them (``clear``:
  the channel was lost) leaves its slots free; they are granted after the next batch.
- Bounded by what the peer table keeps: holders are the publishers it remembers, engines those
  the dispatcher knows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from priority_gateway.core.sharing import EngineLoad, fleet_limit

SELF = b""
"""The key of this replica's own holdings (publishers' ids are 16 bytes)."""


@dataclass(slots=True)
class _Holder:
    held: int = 0
    claim: int = 0
    spare: int = 0
    inflight: int = 0
    limit: float = 0.0

    @property
    def occupied(self) -> int:
        return max(self.held, self.inflight)


class Holdings:
    def __init__(self) -> None:
        self._engines: dict[str, dict[bytes, _Holder]] = {}
        self._waiting: dict[str, list[bytes]] = {}  # per engine, in the order the claims came
        self._freed: set[str] = set()  # engines whose slots a forgotten replica left
        self.grew = False
        """This replica's own holding grew somewhere since the flag was last cleared."""

    def apply(
        self, publisher: bytes, load: Mapping[str, EngineLoad], full: bool, fixed: Callable[[str], float]
    ) -> set[str]:
        """One batch's load entries from ``publisher``; ``fixed(engine)`` is the limit used when no
        batch carries one. Returns the engines whose holdings changed."""
        engines = set(load)
        if full:
            engines.update(e for e, holders in self._engines.items() if publisher in holders)
        changed = set()
        for engine in engines:
            entry = load.get(engine) or _NONE
            holders = self._engines.setdefault(engine, {})
            holder = holders.get(publisher)
            if holder is None:
                if not entry:
                    continue
                holder = holders[publisher] = _Holder()
            before = holder.held
            holder.inflight, holder.limit = entry.inflight, entry.limit
            holder.claim, holder.spare = entry.claim, entry.spare
            holder.held = min(max(holder.held, entry.held), max(entry.claim, entry.spare))
            waiting = self._waiting.setdefault(engine, [])
            if entry.claim > holder.held:
                if publisher not in waiting:
                    waiting.append(publisher)
            elif publisher in waiting:
                waiting.remove(publisher)
            free = self._grant(engine, self.free(engine, fixed(engine)))
            if not waiting and holder.held < holder.spare and free > 0:
                holder.held = min(holder.spare, holder.held + free)
            if publisher == SELF and holder.held > before:
                self.grew = True
            if not entry and not holder.held:
                del holders[publisher]
            changed.add(engine)
        for engine in self._freed - changed:
            free = self.free(engine, fixed(engine))
            if self._grant(engine, free) < free:
                changed.add(engine)
        self._freed.clear()
        return changed

    def _grant(self, engine: str, free: int) -> int:
        """The ``free`` slots to the waiting claims in turn; what is left free."""
        waiting = self._waiting.get(engine)
        if not waiting or free <= 0:
            return free
        holders = self._engines[engine]
        for publisher in list(waiting):
            holder = holders[publisher]
            before = holder.occupied
            holder.held = max(holder.held, min(holder.claim, before + free))
            free -= holder.occupied - before
            if publisher == SELF and holder.occupied > before:
                self.grew = True
            if holder.held >= holder.claim:
                waiting.remove(publisher)
            if free <= 0:
                break
        return free

    def keep(self, known: Callable[[bytes], bool]) -> set[str]:
        """Forget every holder but this replica and those ``known`` says are still heard."""
        changed = set()
        for engine, holders in self._engines.items():
            for publisher in [p for p in holders if p != SELF and not known(p)]:
                del holders[publisher]
                waiting = self._waiting.get(engine)
                if waiting and publisher in waiting:
                    waiting.remove(publisher)
                changed.add(engine)
        self._freed |= changed
        return changed

    def clear(self) -> None:
        self._engines.clear()
        self._waiting.clear()
        self._freed.clear()

    def slots(self, engine: str, fixed: float) -> int:
        return self._count(engine, fixed)[0]

    def free(self, engine: str, fixed: float) -> int:
        """Slots nobody occupies (negative: the holders occupy more than there are, after the limit fell)."""
        slots, occupied = self._count(engine, fixed)
        return slots - occupied

    def view(self, engine: str, fixed: float) -> tuple[int, int, int, tuple[int, ...]]:
        """(slots, free, this replica's holding, the holdings of the other replicas waiting) at once."""
        slots, occupied = self._count(engine, fixed)
        return slots, slots - occupied, self.held(engine), self.waiters(engine)

    def _count(self, engine: str, fixed: float) -> tuple[int, int]:
        """(slots, occupied) in one pass over the holders."""
        limits, occupied = [], 0
        for holder in self._engines.get(engine, {}).values():
            if holder.limit > 0:
                limits.append(holder.limit)
            occupied += holder.held if holder.held > holder.inflight else holder.inflight
        return int(fleet_limit(limits)) if limits else math.ceil(fixed), occupied

    def held(self, engine: str, publisher: bytes = SELF) -> int:
        holder = self._engines.get(engine, {}).get(publisher)
        return 0 if holder is None else holder.held

    def waiters(self, engine: str) -> tuple[int, ...]:
        """The holdings of the other replicas whose claims on ``engine`` wait for slots."""
        holders = self._engines.get(engine, {})
        return tuple(holders[p].held for p in self._waiting.get(engine, ()) if p != SELF)


_NONE = EngineLoad()


def claims(
    inflight: int, demand: int, held: int, slots: int, replicas: int, waiters: Sequence[int], over: bool
) -> tuple[int, int]:
    """(claim, spare) of a replica on an engine, given the holdings of the other replicas that wait
    for slots there (``waiters``). It claims what it runs there and what waits for it (``demand``).
    - Nobody else waits: it keeps what it ``held`` (a busy replica whose queue runs dry for a moment
      must not wait a round to get its slots back), unless the holders occupy ``over`` the slots
      (the limit fell); its spare is an even share of the slots.
    - Others wait: it gives up what it holds and does not use, and keeps no spare; if one of them
      holds less than its fair share, it claims no more than its own (``yield_to``)."""
    need = max(inflight, min(slots, inflight + demand))
    if not waiters:
        return max(need, 0 if over else min(held, slots)), slots // max(1, replicas)
    share = yield_to(slots, waiters)
    return (need if share is None else min(need, max(inflight, share))), 0


def yield_to(slots: int, waiters: Sequence[int]) -> int | None:
    """The fair share (the slots split evenly among the waiting replicas and this one, rounded down)
    that this replica must not fill beyond while a waiting replica holds less than it; else None.
    Those at their share wait for what others free, first come first served, and wait no harder:
    none of them makes the others yield, so nothing flips back and forth."""
    share = slots // (len(waiters) + 1)
    return share if any(held < share for held in waiters) else None
