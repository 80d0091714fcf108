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
- Slots: the mean of the limits in the batches heard for the engine (the replica's own as heard
  back), rounded up as one replica's admission rounds (it starts a request while its load is under
  the limit); without any, the replica's fixed limit for it. Holdings add up to at most the slots.
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from priority_gateway.core.sharing import EngineLoad

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
            holder.inflight, holder.limit = entry.inflight, entry.limit
            holder.claim, holder.spare = entry.claim, entry.spare
            holder.held = min(max(holder.held, entry.held), max(entry.claim, entry.spare))
            waiting = self._waiting.setdefault(engine, [])
            if entry.claim > holder.held:
                if publisher not in waiting:
                    waiting.append(publisher)
            elif publisher in waiting:
                waiting.remove(publisher)
            self._grant(engine, fixed(engine))
            if not waiting and holder.held < holder.spare:
                holder.held = min(holder.spare, holder.held + self.free(engine, fixed(engine)))
            if not entry and not holder.held:
                del holders[publisher]
            changed.add(engine)
        for engine in self._freed - changed:
            if self._grant(engine, fixed(engine)):
                changed.add(engine)
        self._freed.clear()
        return changed

    def _grant(self, engine: str, fixed: float) -> bool:
        waiting = self._waiting.get(engine)
        if not waiting:
            return False
        holders = self._engines[engine]
        free = self.free(engine, fixed)
        granted = False
        for publisher in list(waiting):
            if free <= 0:
                break
            holder = holders[publisher]
            before = holder.occupied
            holder.held = max(holder.held, min(holder.claim, before + free))
            free -= holder.occupied - before
            granted = granted or holder.occupied > before
            if holder.held >= holder.claim:
                waiting.remove(publisher)
        return granted

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
        holders = self._engines.get(engine, {})
        limits = [h.limit for h in holders.values() if h.limit > 0]
        return math.ceil(sum(limits) / len(limits) if limits else fixed)

    def free(self, engine: str, fixed: float) -> int:
        """Slots nobody occupies."""
        holders = self._engines.get(engine, {})
        return max(0, self.slots(engine, fixed) - sum(h.occupied for h in holders.values()))

    def held(self, engine: str, publisher: bytes = SELF) -> int:
        holder = self._engines.get(engine, {}).get(publisher)
        return 0 if holder is None else holder.held

    def others_waiting(self, engine: str) -> int:
        """Other replicas whose claims on ``engine`` wait for slots."""
        return sum(1 for p in self._waiting.get(engine, ()) if p != SELF)


_NONE = EngineLoad()


def claims(inflight: int, demand: int, slots: int, replicas: int, others_waiting: int) -> tuple[int, int]:
    """(claim, spare) of a replica on an engine. It claims what it runs there and what waits for it
    (``demand``); while others wait, at most a fair share among them and this one, never less than it
    runs. Its spare, while nobody else waits, is an even share of the slots."""
    need = max(inflight, min(slots, inflight + demand))
    if others_waiting:
        return min(need, max(inflight, fair_share(slots, others_waiting))), 0
    return need, slots // max(1, replicas)


def fair_share(slots: int, others_waiting: int) -> int:
    """A replica's share of the slots while ``others_waiting`` replicas wait for some, rounded up so
    none stays idle (first come first served settles the rest)."""
    return -(-slots // (others_waiting + 1))
