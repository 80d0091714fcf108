"""The state of the channel between replicas, and the safe share that is its rule while it cannot be trusted.

While the channel works, replicas fill engines within the slots they hold (``holdings``), so N
replicas together put no more on an engine than one would. Without it each replica alone would fill
the whole limit: N times what the engine holds. The safe share is what is left: each replica fills at
most ``limit / replicas`` of each engine, ``replicas`` being how many were heard (this one included)
within ``window_s``.

Rules:
- ``STARTING``: the replica has just started, or the channel has just come back, and it has not yet
  heard every other replica's full batch, so it cannot know what they hold. The safe share holds,
  over the replicas seen so far (the count grows as they are heard, never shrinks). ``settle_s`` after
  the channel works (``up``) it ends: ``UP``.
- ``UP``: the channel works and every replica has been heard: holdings decide (alone, the limit).
- ``DOWN``: the channel broke (``lost``): the safe share over the replicas seen within ``window_s``
  at that moment, fixed then, so a long outage does not shrink the count as memories age. ``up``
  moves to ``STARTING``: the others' loads come back in their next full batches.
- ``share(limit)``: the in-flight requests this replica may have on an engine of that limit while the
  safe share holds: ``floor(limit / replicas)``, at least 1 (a replica that may start nothing serves
  nobody); alone, the whole limit.
"""

from __future__ import annotations

import enum
import math


class State(enum.Enum):
    STARTING = "starting"
    UP = "up"
    DOWN = "down"


class Channel:
    __slots__ = ("_settle_at", "lost_once", "replicas", "settle_s", "state")

    def __init__(self, settle_s: float = 1.0, shared: bool = True) -> None:
        self.settle_s = settle_s
        self.state = State.STARTING if shared else State.UP
        self.replicas = 1
        """Replicas (this one included) the limit is split among while the safe share holds."""
        self.lost_once = False
        """The safe share began with a loss (its end is worth saying), not with a start."""
        self._settle_at: float | None = None

    @property
    def safe(self) -> bool:
        return self.state is not State.UP

    @property
    def works(self) -> bool:
        """Batches go through: up, or come back and settling."""
        return self.state is State.UP or self._settle_at is not None

    def seen(self, replicas: int) -> None:
        """Replicas heard lately, this one included: a starting replica counts them as they come."""
        if self.state is State.STARTING and not self.lost_once:
            self.replicas = max(self.replicas, replicas)

    def up(self, now: float) -> None:
        if self.state is not State.UP and self._settle_at is None:
            self.state = State.STARTING
            self._settle_at = now + self.settle_s

    def lost(self, replicas: int) -> bool:
        """The channel broke; True when the safe share began now (it did not already hold after a loss)."""
        self._settle_at = None
        began = not self.lost_once
        if began:
            self.replicas = max(self.replicas, replicas)
        self.state = State.DOWN
        self.lost_once = True
        return began

    def settle(self, now: float) -> bool:
        """End the safe share once ``settle_s`` passed since the channel came up; True when one that
        began with a loss ended now (a start ends silently)."""
        if self.state is State.STARTING and self._settle_at is not None and now >= self._settle_at:
            ended = self.lost_once
            self.state = State.UP
            self._settle_at = None
            self.replicas = 1
            self.lost_once = False
            return ended
        return False

    def share(self, limit: float) -> float:
        if self.replicas <= 1:
            return limit
        return max(1.0, math.floor(limit / self.replicas))
