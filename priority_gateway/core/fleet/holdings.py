"""How many of an engine's slots each replica may fill: holdings every replica computes alike.

Replicas that only tell each other their in-flight requests overfill an engine whenever they start
requests within the same few ms: each counts the others' requests it has heard of, not those started
since. What closes it is an order everyone agrees on, and the channel has one: Redis delivers every
batch to every subscriber in the same order, the publisher's own batches included. Each replica
claims slots in its batches; applying the claims in that order, every replica computes the same
holdings, and each fills an engine only within its own. This is the fleet's one admission gate.

Rules:
- Slots: the limit the engine's leader publishes (``FleetTable.leader``), rounded up as one replica's
  admission rounds (it starts a request while its load is under the limit); without a leader, the
  replica's own limit for it. Holdings add up to at most the slots.
- A holder occupies the larger of its holding and the in-flight requests it last reported: a
  replica that fills an engine without holding slots (in its safe share) still leaves them taken,
  and no holding is kept, once applied, beyond the room the others' occupation leaves (what its holder
  runs stays its own): together the holders never make the engine run more than its slots.
- Each report carries the publisher's ``claim`` (the holding it needs, and waits for), its ``spare``
  (the holding it would keep if slots are free: its even share, so requests start without a round
  on the channel) and what it may fill as it sees it (``held``: its holding less releases still in
  transit). Applied, by every replica and in the channel's order: the holding becomes at least the
  one stated (a replica that missed batches or joined late catches up; a statement never lowers a
  holding, so a stale one is harmless); above the larger of claim and spare it is released at once
  (the claimant stopped using it when it sent the report); below the claim it waits. Then the free
  slots (slots less what every holder occupies) go to the waiting claims, first come first served,
  whole or in part; and, when nobody waits, the publisher keeps free slots up to its spare.
- From sending a report until it hears it back, a replica fills at most the least of its holding
  and the larger of claim and spare of each report in transit (``Fleet`` keeps those): what it
  releases it stops using before anyone else may take it.
- A holder whose row falls silent or is forgotten (``FleetTable``) leaves its slots free; they are
  granted with the next batch applied.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from priority_gateway.core.fleet.table import FleetTable


class Holdings:
    def __init__(self, table: FleetTable) -> None:
        self.table = table
        self._waiting: dict[str, list[bytes]] = {}  # per engine, in the order the claims came
        self._freed: set[str] = set()  # engines whose slots a silent replica left
        self.grew = False
        """This replica's own holding grew somewhere since the flag was last cleared."""

    def apply(self, publisher: bytes, engines: set[str], fixed: Callable[[str], float]) -> set[str]:
        """One batch of ``publisher``, its reports already in the table: ``engines`` are those it names
        (a full batch: also those the publisher held); ``fixed(engine)`` is the limit used when the
        engine has no leader. Returns the engines whose holdings changed."""
        row = self.table.rows[publisher]
        changed = set()
        for engine in engines:
            entry = row.report(engine)
            held = row.held.get(engine, 0)
            before = held
            held = min(max(held, entry.held), max(entry.claim, entry.spare))
            # Never a holding the slots the others occupy leave no room for (what it runs it keeps).
            held = row.held[engine] = min(held, max(entry.inflight, self.free(engine, fixed(engine), publisher)))
            waiting = self._waiting.setdefault(engine, [])
            if entry.claim > held:
                if publisher not in waiting:
                    waiting.append(publisher)
            elif publisher in waiting:
                waiting.remove(publisher)
            free = self._grant(engine, self.free(engine, fixed(engine)))
            held = row.held[engine]
            if not waiting and held < entry.spare and free > 0:
                held = row.held[engine] = min(entry.spare, held + free)
            if publisher == self.table.own and held > before:
                self.grew = True
            if not held:
                del row.held[engine]
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
        rows = self.table.rows
        for publisher in list(waiting):
            row = rows.get(publisher)
            if row is None or row.silent:
                waiting.remove(publisher)
                continue
            entry = row.report(engine)
            held = row.held.get(engine, 0)
            before = max(held, entry.inflight)
            held = row.held[engine] = max(held, min(entry.claim, before + free))
            free -= max(held, entry.inflight) - before
            if publisher == self.table.own and held > before:
                self.grew = True
            if held >= entry.claim:
                waiting.remove(publisher)
            if free <= 0:
                break
        return free

    def released(self, engines: set[str]) -> None:
        """Silent or forgotten holders left these engines' slots: grant them with the next batch."""
        for waiting in self._waiting.values():
            waiting[:] = [p for p in waiting if (row := self.table.rows.get(p)) is not None and not row.silent]
        self._freed |= engines

    def clear(self) -> None:
        self._waiting.clear()
        self._freed.clear()

    def slots(self, engine: str, fixed: float) -> int:
        leader = self.table.leader(engine)
        limit = self.table.limit_of(leader, engine) if leader is not None else fixed
        return math.ceil(limit)

    def free(self, engine: str, fixed: float, but: bytes | None = None) -> int:
        """Slots nobody occupies (negative: the holders occupy more than there are, after the limit fell),
        or nobody but ``but``."""
        occupied = 0
        for publisher, row in self.table.active():
            if publisher != but:
                held, inflight = row.held.get(engine, 0), row.report(engine).inflight
                occupied += held if held > inflight else inflight
        return self.slots(engine, fixed) - occupied

    def held(self, engine: str) -> int:
        row = self.table.rows.get(self.table.own)
        return 0 if row is None or row.silent else row.held.get(engine, 0)

    def waiters(self, engine: str) -> tuple[int, ...]:
        """The holdings of the other replicas whose claims on ``engine`` wait for slots."""
        rows = self.table.rows
        own = self.table.own
        return tuple(rows[p].held.get(engine, 0) for p in self._waiting.get(engine, ()) if p != own and p in rows)


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
