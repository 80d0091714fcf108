"""How much of an engine's limit this replica may fill when it cannot hear the other replicas.

While the sharing channel (``core/sharing.py``) works, every replica counts the others' in-flight
requests on an engine against the engine's limit, so N replicas together put no more on it than
one would. Without the channel that count is gone, and each replica alone would fill the whole
limit: N times what the engine holds. The safe share is what is left: each replica fills at most
``limit / replicas`` of each engine, ``replicas`` being how many were heard (this one included)
within ``window_s`` before the channel broke.

Rules:
- ``heard`` notes each batch's publisher and when; at most ``max_peers`` publishers are remembered
  (the one heard least recently is forgotten first).
- ``lost`` enters the fallback (once; True when it entered): the replicas counted are fixed then,
  so a long outage does not shrink the count as memories age.
- ``resumed`` ends it ``settle_s`` later (True when it ended): the others' loads come back in their
  next full batches, and until then the share still holds.
- ``joining`` starts the same fallback for a replica that has just started: until ``settle_s`` after
  the channel first works it has not heard every other replica's full batch, so it cannot know
  what they hold (``core/holdings.py``). Joining, the replicas counted are those heard so far
  (growing as they are heard); it ends silently (``settle`` answers False), and ``lost`` turns it
  into the fallback proper.
- ``share(limit)``: the in-flight requests this replica may have on an engine of that limit in the
  fallback: ``floor(limit / replicas)``, at least 1 (a replica that may start nothing serves nobody);
  alone, the whole limit.
"""

from __future__ import annotations

import math
from collections import OrderedDict


class SafeShare:
    __slots__ = ("_heard", "_resume_at", "joining", "max_peers", "replicas", "safe", "settle_s", "window_s")

    def __init__(self, window_s: float = 30.0, settle_s: float = 1.0, max_peers: int = 1024) -> None:
        self.window_s = window_s
        self.settle_s = settle_s
        self.max_peers = max_peers
        self.safe = False
        self.joining = False
        self.replicas = 1
        """Replicas (this one included) the limit is split among while ``safe``."""
        self._heard: OrderedDict[bytes, float] = OrderedDict()
        self._resume_at: float | None = None

    def heard(self, publisher: bytes, now: float) -> None:
        self._heard[publisher] = now
        self._heard.move_to_end(publisher)
        while len(self._heard) > self.max_peers:
            self._heard.popitem(last=False)
        if self.joining:
            self.replicas = max(self.replicas, self.seen(now))

    def seen(self, now: float) -> int:
        """Replicas heard within ``window_s`` before ``now``, this one included."""
        return 1 + sum(1 for when in self._heard.values() if now - when <= self.window_s)

    def join(self) -> None:
        """This replica has just started: share until settled once the channel works."""
        if not self.safe:
            self.safe = self.joining = True
            self.replicas = 1

    def lost(self, now: float) -> bool:
        self._resume_at = None
        if self.safe and not self.joining:
            return False
        self.safe, self.joining = True, False
        self.replicas = max(self.replicas, self.seen(now))
        return True

    def resumed(self, now: float) -> None:
        if self.safe and self._resume_at is None:
            self._resume_at = now + self.settle_s

    def settle(self, now: float) -> bool:
        """End the fallback once ``settle_s`` passed since the channel came back; True when a fallback
        entered by ``lost`` ended (joining ends silently)."""
        if self.safe and self._resume_at is not None and now >= self._resume_at:
            ended = not self.joining
            self.safe = self.joining = False
            self._resume_at = None
            self.replicas = 1
            return ended
        return False

    def share(self, limit: float) -> float:
        if self.replicas <= 1:
            return limit
        return max(1.0, math.floor(limit / self.replicas))
