"""Replicas on one channel, as Redis pub/sub runs it: every batch reaches every replica, its publisher
included, in the one order it was sent; each replica reads its copy when it gets to it.

Every fleet test drives its replicas through this, and this drives only the product's ``Fleet``
(``outgoing``, ``receive``, ``channel_lost``, ``channel_up``): the bytes in between are the wire's."""

from __future__ import annotations

from collections.abc import Sequence

from priority_gateway.core.decisions import Dispatch
from priority_gateway.core.dispatcher import Dispatcher
from priority_gateway.core.engines import EngineState
from priority_gateway.core.fleet import FleetDecisions, FleetSettings
from priority_gateway.core.fleet.wire import Batch, Report, encode


def replica_id(i: int) -> bytes:
    """Replica ``i``'s id: ids sort as the replicas do (replica 0 has the lowest)."""
    return bytes([65 + i]) * 16


def settings(i: int, **options: object) -> FleetSettings:
    """Replica ``i`` of a fleet that starts settled (as the simulator's replicas start at once)."""
    options.setdefault("settled", True)
    return FleetSettings(replica_id(i), **options)  # type: ignore[arg-type]


def engine_of(replica: Dispatcher, engine: str) -> EngineState:
    state = replica.engine(engine)
    assert state is not None
    return state


def inflight(replica: Dispatcher, engine: str) -> int:
    return engine_of(replica, engine).inflight


def started(decided: FleetDecisions) -> list[Dispatch]:
    return [d for d in decided.others if isinstance(d, Dispatch)]


class Channel:
    def __init__(self, replicas: Sequence[Dispatcher]) -> None:
        self.replicas = list(replicas)
        self.sent: list[bytes] = []
        self.read = [0] * len(self.replicas)
        self.up = True
        self.heard: list[list[FleetDecisions]] = [[] for _ in self.replicas]
        """What each replica's ``receive`` decided, in order."""

    def publish(self, i: int, full: bool = False, now: float = 0.0) -> FleetDecisions:
        out = self.replicas[i].fleet.outgoing(now, full)
        if out.send is not None and self.up:
            self.sent.append(out.send)
        return out

    def deliver(self, i: int, now: float = 0.0) -> list[Dispatch]:
        """Replica ``i`` reads its next batch; the requests that starts."""
        data = self.sent[self.read[i]]
        self.read[i] += 1
        decided = self.replicas[i].fleet.receive(data, now)
        self.heard[i].append(decided)
        return started(decided)

    def behind(self, i: int) -> int:
        return len(self.sent) - self.read[i]

    def drain(self, now: float = 0.0) -> list[list[Dispatch]]:
        """Every replica reads all there is; the requests each started."""
        out: list[list[Dispatch]] = [[] for _ in self.replicas]
        for i in range(len(self.replicas)):
            while self.behind(i):
                out[i] += self.deliver(i, now)
        return out

    def round(self, now: float = 0.0, full: bool = False) -> list[list[Dispatch]]:
        """Every replica publishes, then reads all there is; the requests each started."""
        for i in range(len(self.replicas)):
            self.publish(i, full, now)
        return self.drain(now)

    def rounds(self, n: int = 3, now: float = 0.0) -> int:
        """Batches back and forth; the requests they started."""
        return sum(len(s) for _ in range(n) for s in self.round(now))

    def restore(self, now: float = 0.0) -> None:
        self.up = True
        for d in self.replicas:
            d.fleet.channel_up(now)

    def introduce(self, now: float = 0.0) -> None:
        """Every replica hears of every other (an empty full batch) before any claims a slot."""
        for i, replica in enumerate(self.replicas):
            for j, other in enumerate(self.replicas):
                if j != i:
                    empty = Batch(other.fleet.own, 0, now, other.fleet.block_chars, Report(full=True))
                    replica.fleet.receive(encode(empty, other.fleet.secret), now)

    def warm(self) -> None:
        """Replicas that knew of each other before they claimed slots: each holds its even share (one
        that heard nobody holds the whole limit, and keeps it until another waits for slots)."""
        self.introduce()
        for _ in range(3):
            self.round()
        assert all(not d.fleet.holdings.waiters(e) for d in self.replicas for e in d.limits)
