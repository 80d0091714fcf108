"""What gateway replicas tell each other about their tenants, so fair shares hold fleet-wide.

Why: a tenant's weighted share of a pool's slots is enforced where requests start, on each
replica, from the requests that replica sees. A tenant whose traffic lands on one replica (one
client, one connection) would hold only that replica's view of its share, and every other
replica would count it as idle. So replicas tell each other, per pool and tenant, what they have
running and queued there; each replica then counts every replica's requests when it asks whether
a tenant is over its share, as distributed rate limiters share their local demand (Raghavan et
al., "Cloud control with distributed rate limiting", SIGCOMM 2007) rather than each enforcing a
fixed split.

Rules:
- A replica sends its own counts per ``(pool, tenant)`` as absolute values, never increments,
  so nothing lost or repeated can make them drift: a batch lists what changed since the previous
  one (a count back to nothing is listed as zero), a full batch (every second, with the routing
  heartbeat) lists everything and what it leaves out is nothing. With each count goes the
  tenant's weight as the key store gave it (a replica that has no request of that tenant learns
  it there).
- These batches go on the routing channel beside the routing batches (``core/sharing.py``), told
  apart by their first byte, and carry their own sequence numbers; a replica that does not know
  them rejects them as malformed and shares routing as before.
- A publisher not heard from within ``silent_s`` counts for nothing; when the channel is lost,
  every peer is forgotten: shares are then this replica's own (local fairness), until the others'
  next batches.
- Everything is bounded: at most ``max_peers`` publishers (the least recently heard forgotten
  first), ``MAX_ENTRIES`` entries a batch, names of at most ``MAX_NAME_BYTES`` bytes (a longer
  tenant name is not shared: that tenant's share stays local). ``decode`` refuses anything
  malformed with ``ValueError``.
"""

from __future__ import annotations

import math
import struct
from collections import OrderedDict
from dataclasses import dataclass, field

from priority_gateway.core.sharing import PUBLISHER_BYTES  # one replica id on both kinds of batch

MAGIC = 0x54
"""First byte of a tenant batch (routing batches begin with their small format number)."""
FORMAT = 1
MAX_ENTRIES = 65_535
MAX_NAME_BYTES = 1024

# magic, format, flags, publisher, sequence, entries
_HEADER = struct.Struct("<BBB16sQI")
_NAME = struct.Struct("<H")
_COUNTS = struct.Struct("<IIf")  # in flight, queued, weight
_FULL = 1

Key = tuple[str, str]
"""``(pool, tenant)``."""


@dataclass(frozen=True, slots=True)
class TenantShare:
    """One replica's requests of one tenant in one pool."""

    inflight: int = 0
    queued: int = 0
    weight: float = 1.0

    def __bool__(self) -> bool:
        return bool(self.inflight or self.queued)


@dataclass(slots=True)
class TenantShares:
    """What one replica has to tell about its tenants since its previous batch."""

    shares: dict[Key, TenantShare] = field(default_factory=dict)
    full: bool = False
    """``shares`` names everything the publisher has; the rest is nothing."""

    def __bool__(self) -> bool:
        return bool(self.shares or self.full)

    def merge(self, later: TenantShares) -> None:
        """Fold a later ``TenantShares`` of the same publisher into this one (its values win)."""
        if later.full:
            self.shares = dict(later.shares)
            self.full = True
        else:
            self.shares.update(later.shares)


@dataclass(frozen=True, slots=True)
class TenantBatch:
    publisher: bytes
    sequence: int
    told: TenantShares


def is_tenant_batch(data: bytes) -> bool:
    return data[:1] == bytes((MAGIC,))


def encode(batch: TenantBatch) -> bytes:
    if len(batch.publisher) != PUBLISHER_BYTES:
        raise ValueError(f"publisher id must be {PUBLISHER_BYTES} bytes")
    entries = []
    for (pool, tenant), share in batch.told.shares.items():
        names = (pool.encode(), tenant.encode())
        if all(len(name) <= MAX_NAME_BYTES for name in names):
            entries.append((names, share))
    if len(entries) > MAX_ENTRIES:
        raise ValueError("too many tenant entries for one batch")
    flags = _FULL if batch.told.full else 0
    parts = [_HEADER.pack(MAGIC, FORMAT, flags, batch.publisher, batch.sequence, len(entries))]
    for names, share in entries:
        for name in names:
            parts += [_NAME.pack(len(name)), name]
        parts.append(_COUNTS.pack(_u32(share.inflight), _u32(share.queued), share.weight))
    return b"".join(parts)


def decode(data: bytes) -> TenantBatch:
    view = memoryview(data)
    try:
        magic, fmt, flags, publisher, sequence, n = _HEADER.unpack_from(view, 0)
        if magic != MAGIC or fmt != FORMAT:
            raise ValueError(f"not a tenant batch of format {FORMAT}")
        if n > MAX_ENTRIES:
            raise ValueError("too many tenant entries")
        at = _HEADER.size
        shares: dict[Key, TenantShare] = {}
        for _ in range(n):
            names = []
            for _ in range(2):
                (size,) = _NAME.unpack_from(view, at)
                at += _NAME.size
                if size > MAX_NAME_BYTES or at + size > len(view):
                    raise ValueError("name out of bounds")
                names.append(bytes(view[at : at + size]).decode())
                at += size
            inflight, queued, weight = _COUNTS.unpack_from(view, at)
            at += _COUNTS.size
            if not 0.0 < weight < math.inf:
                raise ValueError("weight out of bounds")
            shares[(names[0], names[1])] = TenantShare(inflight, queued, weight)
        if at != len(view):
            raise ValueError("trailing bytes")
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed tenant batch: {exc}") from None
    return TenantBatch(bytes(publisher), sequence, TenantShares(shares, bool(flags & _FULL)))


def _u32(value: int) -> int:
    return max(0, min(value, 0xFFFFFFFF))


@dataclass(slots=True)
class _Publisher:
    heard_at: float
    shares: dict[Key, TenantShare] = field(default_factory=dict)


class FleetTenants:
    """The other replicas' tenants as heard: per pool, each tenant's requests running and queued there."""

    def __init__(self, max_peers: int = 1024) -> None:
        self.max_peers = max_peers
        self._peers: OrderedDict[bytes, _Publisher] = OrderedDict()
        # pool -> tenant -> [in flight, queued, weight] summed over peers (the weight: the latest heard)
        self._pools: dict[str, dict[str, list[float]]] = {}

    def __len__(self) -> int:
        """Publishers heard (and not forgotten)."""
        return len(self._peers)

    def report(self, batch: TenantBatch, now: float) -> None:
        peer = self._peers.get(batch.publisher)
        if peer is None:
            peer = self._peers[batch.publisher] = _Publisher(now)
        peer.heard_at = now
        self._peers.move_to_end(batch.publisher)
        told = batch.told
        if told.full:
            for key in set(peer.shares) - set(told.shares):
                self._add(key, peer.shares.pop(key), -1)
        for key, new in told.shares.items():
            old = peer.shares.pop(key, None)
            if old is not None:
                self._add(key, old, -1)
            if new:
                peer.shares[key] = new
                self._add(key, new, 1)
        while len(self._peers) > self.max_peers:
            _, gone = self._peers.popitem(last=False)
            self._drop(gone)

    def expire(self, now: float, silent_s: float) -> None:
        for publisher in [p for p, peer in self._peers.items() if now - peer.heard_at > silent_s]:
            self._drop(self._peers.pop(publisher))

    def clear(self) -> None:
        self._peers.clear()
        self._pools.clear()

    def of(self, pool: str) -> dict[str, tuple[int, int, float]]:
        """The tenants the others have running or queued in ``pool``: requests running there, queued, weight."""
        return {tenant: (int(c[0]), int(c[1]), c[2]) for tenant, c in self._pools.get(pool, {}).items()}

    def running(self, tenant: str) -> int:
        """The others' requests of ``tenant`` in flight, in every pool."""
        return sum(int(tenants[tenant][0]) for tenants in self._pools.values() if tenant in tenants)

    def _drop(self, peer: _Publisher) -> None:
        for key, share in peer.shares.items():
            self._add(key, share, -1)
        peer.shares.clear()

    def _add(self, key: Key, share: TenantShare, sign: int) -> None:
        pool, tenant = key
        tenants = self._pools.setdefault(pool, {})
        counts = tenants.setdefault(tenant, [0.0, 0.0, share.weight])
        counts[0] += sign * share.inflight
        counts[1] += sign * share.queued
        if sign > 0:
            counts[2] = share.weight
        if counts[0] <= 0 and counts[1] <= 0:
            del tenants[tenant]
            if not tenants:
                del self._pools[pool]
