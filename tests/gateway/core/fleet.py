"""Replicas on one channel, as Redis pub/sub runs it: every batch reaches every replica, its publisher
included, in the one order it was sent; each replica reads its copy when it gets to it."""

from __future__ import annotations

from priority_gateway.core.dispatcher import Dispatch, Dispatcher
from priority_gateway.core.engines import EngineState
from priority_gateway.core.sharing import Batch, Learned, decode, encode


def engine_of(replica: Dispatcher, engine: str) -> EngineState:
    state = replica.engine(engine)
    assert state is not None
    return state


def inflight(replica: Dispatcher, engine: str) -> int:
    return engine_of(replica, engine).inflight


class Fleet:
    def __init__(self, replicas: list[Dispatcher]) -> None:
        self.replicas = replicas
        self.ids = [bytes([65 + i]) * 16 for i in range(len(replicas))]
        self.sent: list[tuple[int, int, bytes]] = []  # (publisher, serial, bytes on the wire)
        self.read = [0] * len(replicas)
        self.sequence = [0] * len(replicas)

    def introduce(self) -> None:
        """Every replica hears of every other (an empty full batch) before any claims a slot."""
        for i, replica in enumerate(self.replicas):
            for j in range(len(self.replicas)):
                if j != i:
                    replica.learn(Batch(self.ids[j], 0, 0.0, 64, Learned([], {}, True)), 0.0)

    def publish(self, i: int, full: bool = False, now: float = 0.0) -> None:
        learned = self.replicas[i].take_learned(full, now)
        if learned:
            self.sequence[i] += 1
            batch = Batch(self.ids[i], self.sequence[i], 0.0, 64, learned)
            self.sent.append((i, learned.serial, encode(batch)))

    def deliver(self, i: int, now: float = 0.0) -> list[Dispatch]:
        """Replica ``i`` reads its next batch; the requests that starts."""
        publisher, serial, data = self.sent[self.read[i]]
        self.read[i] += 1
        replica = self.replicas[i]
        if publisher == i:
            replica.heard_own(decode(data), serial)
        else:
            replica.learn(decode(data), now)
        return [d for d in replica.admit_granted(now) if isinstance(d, Dispatch)]

    def behind(self, i: int) -> int:
        return len(self.sent) - self.read[i]

    def round(self, now: float = 0.0, full: bool = False) -> list[list[Dispatch]]:
        """Every replica publishes, then reads all there is; the requests each started."""
        for i in range(len(self.replicas)):
            self.publish(i, full, now)
        started: list[list[Dispatch]] = [[] for _ in self.replicas]
        for i in range(len(self.replicas)):
            while self.behind(i):
                started[i] += self.deliver(i, now)
        return started
