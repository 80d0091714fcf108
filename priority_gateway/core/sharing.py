"""What gateway replicas tell each other about their routing, as plain data.

Rules:
- A replica's prefix index and its view of engine load come from its own routing; another
  replica's requests reach it only through engine scrapes (load, every few seconds) or never (what
  the approximate index guesses). Replicas therefore share two things, in batches a few ms apart:
  - facts (``RoutedBlocks``): "I sent this engine a request whose prompt's leading blocks hash to
    these" (approximate mode; in precise mode the engines' own events say what they hold);
  - their own load per engine (``EngineLoad``): requests in flight, pending prefill (uncached
    prompt tokens sent that have not reached their first token: the queue a new request would wait
    behind), and the concurrency limit the replica applies for the engine (0: none learned yet;
    every replica admits against ``fleet_limit`` of those heard and its own, so all agree on one
    limit and the fleet puts no more on an engine than one replica would), and its claim and holding
    of the engine's slots (``core/holdings.py``: how many of them it may fill);
  - in full batches, what the gaps it relayed showed per engine, as counts (``limiter.Evidence``):
    the replica that leads learns each engine's limit from everyone's, as one replica seeing every
    gap would, and the others take its limit (``core/limiter.py``).
- Applying a fact does to the index what routing the request did: record the blocks on the engine,
  most recently used. A fact applied twice, or late, only refreshes blocks the engine was said to
  hold; the index's capacity bound (LRU, in tokens) keeps memory bounded whatever arrives.
- Load is sent as absolute values, never as increments, so nothing lost or repeated can make it
  drift: a batch lists the engines whose load changed since the previous batch, and a full batch
  (every second, also the publisher's heartbeat) lists every engine with any; the engines a full
  batch leaves out have none. A publisher not heard from within ``silent_s`` counts for nothing.
- A batch carries its publisher's id, a sequence number (a receiver that sees a gap knows it
  missed batches), the send time (for measuring the channel's delay only) and the block width in
  characters (replicas that hash prompts differently must not mix their blocks).
- On the wire a batch is versioned binary: the header, the engine ids once, each fact's engine
  index, prompt tokens, block tokens and block hashes as unsigned 64-bit integers, then the load
  entries, then the evidence entries (an engine's whole-window counts, then its levels'). ``decode``
  refuses anything malformed or past the limits below with ``ValueError``, and any format but its
  own: replicas of versions with different formats ignore each other's batches (format 4 added the
  evidence).
- Evidence is absolute too (counts over the publisher's windows when it sent them): a full batch
  replaces what its publisher said before; other batches carry none and change nothing.
- Every table here is bounded: at most ``max_peers`` publishers (the one heard from least
  recently is forgotten first) and, per publisher, only engines it has load or evidence on, at most
  ``MAX_LEVELS`` levels each.
"""

from __future__ import annotations

import math
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from priority_gateway.core.limiter import Evidence, LevelCounts

FORMAT = 4
PUBLISHER_BYTES = 16
MAX_FACTS = 65_535
MAX_BLOCKS = 65_535
MAX_ENGINES = 4096
MAX_ENGINE_ID_BYTES = 2048
MAX_LEVELS = 4096

# format, flags, publisher, sequence, sent_at, block_chars, engines
_HEADER = struct.Struct("<BB16sQdHH")
_LENGTH = struct.Struct("<H")
_COUNT = struct.Struct("<I")
_FACT = struct.Struct("<HIHH")  # engine index, prompt tokens, block tokens, blocks
_LOAD = struct.Struct("<HIIfIII")  # engine index, in flight, prefill tokens, learned limit, claim, spare, held
_EVIDENCE = struct.Struct("<HIIIH")  # engine index, gaps, over budget, far over, levels
_LEVEL = struct.Struct("<HIIIII")  # level, fresh, fresh over, fresh within, long, long within
_FULL = 1


def fleet_limit(limits: Sequence[float]) -> float:
    """The limit the fleet applies to an engine: the mean of those its replicas learned, rounded to
    the nearest whole request, a tie down. Each replica learns from its own share of the gaps and
    steps out of phase with the others; the mean rounded up (as admission rounds a fractional
    limit: it starts a request while the load is under it) grows whenever any one replica steps up
    and shrinks only once all have stepped down, so the fleet ran a request more than one replica
    learns. Rounded to the nearest, most replicas must agree on a step either way."""
    return float(max(1, math.ceil(sum(limits) / len(limits) - 0.5 - 1e-9)))


@dataclass(frozen=True, slots=True)
class RoutedBlocks:
    """A request went to ``engine``; it holds the leading prompt blocks ``blocks`` (none in precise mode)."""

    engine: str
    blocks: tuple[int, ...]
    prompt_tokens: int
    block_tokens: int


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One replica's own load on an engine."""

    inflight: int = 0
    prefill: int = 0
    """Uncached prompt tokens sent that have not reached their first token."""
    limit: float = 0.0
    """The concurrency limit the publisher learned for the engine (0: it admits without one)."""
    claim: int = 0
    """The slots the publisher asks to hold, waiting for them if need be (``core/holdings.py``)."""
    spare: int = 0
    """The slots it would hold if they are free (never waited for)."""
    held: int = 0
    """The slots the publisher holds, as it sees it when it sends."""

    def __bool__(self) -> bool:
        return bool(self.inflight or self.prefill or self.limit or self.claim or self.spare or self.held)


@dataclass(slots=True)
class Learned:
    """What one replica has to tell the others since its previous batch."""

    facts: list[RoutedBlocks] = field(default_factory=list)
    load: dict[str, EngineLoad] = field(default_factory=dict)
    """The publisher's own load per engine (absolute values)."""
    full: bool = False
    """``load`` names every engine the publisher has load on; the rest have none."""
    serial: int = 0
    """Which of the publisher's ``take_learned`` calls this is (the latest, once merged); never sent."""
    evidence: dict[str, Evidence] = field(default_factory=dict)
    """The publisher's own gaps per engine as counts (full batches only: they replace what came before)."""

    def __bool__(self) -> bool:
        return bool(self.facts or self.load or self.full)

    def merge(self, later: Learned) -> None:
        """Fold a later ``Learned`` of the same publisher into this one (its values win)."""
        self.facts.extend(later.facts)
        if later.full:
            self.load = dict(later.load)
            self.full = True
            self.evidence = dict(later.evidence)
        else:
            self.load.update(later.load)
        self.serial = later.serial


@dataclass(frozen=True, slots=True)
class Batch:
    publisher: bytes
    sequence: int
    sent_at: float
    block_chars: int
    learned: Learned


def encode(batch: Batch) -> bytes:
    if len(batch.publisher) != PUBLISHER_BYTES:
        raise ValueError(f"publisher id must be {PUBLISHER_BYTES} bytes")
    learned = batch.learned
    engines: dict[str, int] = {}
    for fact in learned.facts:
        engines.setdefault(fact.engine, len(engines))
    for engine in (*learned.load, *learned.evidence):
        engines.setdefault(engine, len(engines))
    if len(learned.facts) > MAX_FACTS or len(engines) > MAX_ENGINES:
        raise ValueError("too many facts or engines for one batch")
    flags = _FULL if learned.full else 0
    parts = [
        _HEADER.pack(
            FORMAT, flags, batch.publisher, batch.sequence, batch.sent_at, min(batch.block_chars, 0xFFFF), len(engines)
        )
    ]
    for engine in engines:
        raw = engine.encode()[:MAX_ENGINE_ID_BYTES]
        parts += [_LENGTH.pack(len(raw)), raw]
    parts.append(_COUNT.pack(len(learned.facts)))
    for fact in learned.facts:
        blocks = fact.blocks[:MAX_BLOCKS]
        parts.append(
            _FACT.pack(
                engines[fact.engine], min(fact.prompt_tokens, 0xFFFFFFFF), min(fact.block_tokens, 0xFFFF), len(blocks)
            )
        )
        parts.append(struct.pack(f"<{len(blocks)}Q", *blocks))
    parts.append(_COUNT.pack(len(learned.load)))
    for engine, load in learned.load.items():
        parts.append(
            _LOAD.pack(
                engines[engine],
                _u32(load.inflight),
                _u32(load.prefill),
                load.limit,
                _u32(load.claim),
                _u32(load.spare),
                _u32(load.held),
            )
        )
    parts.append(_COUNT.pack(len(learned.evidence)))
    for engine, evidence in learned.evidence.items():
        parts += _encode_evidence(engines[engine], evidence)
    return b"".join(parts)


def _encode_evidence(index: int, evidence: Evidence) -> list[bytes]:
    """One engine's evidence entry, its counts clamped to what the format holds and kept consistent."""
    levels = [(level, c) for level, c in sorted(evidence.levels.items()) if 0 < level <= 0xFFFF][:MAX_LEVELS]
    gaps = _u32(evidence.gaps)
    parts = [_EVIDENCE.pack(index, gaps, min(_u32(evidence.over), gaps), min(_u32(evidence.far), gaps), len(levels))]
    for level, c in levels:
        fresh, long = _u32(c.fresh), _u32(c.long)
        over = min(_u32(c.fresh_over), fresh)
        within = min(_u32(c.fresh_within), fresh - over)
        parts.append(_LEVEL.pack(level, fresh, over, within, long, min(_u32(c.long_within), long)))
    return parts


def _decode_evidence(view: memoryview, at: int, engines: list[str]) -> tuple[dict[str, Evidence], int]:
    (n,) = _COUNT.unpack_from(view, at)
    at += _COUNT.size
    if n > len(engines):
        raise ValueError("too many evidence entries")
    out = {}
    for _ in range(n):
        index, gaps, over, far, n_levels = _EVIDENCE.unpack_from(view, at)
        at += _EVIDENCE.size
        if index >= len(engines) or engines[index] in out or over > gaps or far > gaps or n_levels > MAX_LEVELS:
            raise ValueError("evidence entry out of bounds")
        levels = {}
        for _ in range(n_levels):
            level, fresh, fresh_over, fresh_within, long, long_within = _LEVEL.unpack_from(view, at)
            at += _LEVEL.size
            if level == 0 or level in levels or fresh_over + fresh_within > fresh or long_within > long:
                raise ValueError("evidence level out of bounds")
            levels[level] = LevelCounts(fresh, fresh_over, fresh_within, long, long_within)
        out[engines[index]] = Evidence(gaps, over, far, levels)
    return out, at


def decode(data: bytes) -> Batch:
    view = memoryview(data)
    try:
        fmt, flags, publisher, sequence, sent_at, block_chars, n_engines = _HEADER.unpack_from(view, 0)
        if fmt != FORMAT:
            raise ValueError(f"unknown format {fmt}")
        at = _HEADER.size
        engines = []
        for _ in range(n_engines):
            (size,) = _LENGTH.unpack_from(view, at)
            at += _LENGTH.size
            if size > MAX_ENGINE_ID_BYTES or at + size > len(view):
                raise ValueError("engine id out of bounds")
            engines.append(bytes(view[at : at + size]).decode())
            at += size
        (n_facts,) = _COUNT.unpack_from(view, at)
        at += _COUNT.size
        if n_facts > MAX_FACTS:
            raise ValueError("too many facts")
        facts = []
        for _ in range(n_facts):
            index, prompt_tokens, block_tokens, n_blocks = _FACT.unpack_from(view, at)
            at += _FACT.size
            if index >= n_engines or block_tokens == 0 or at + 8 * n_blocks > len(view):
                raise ValueError("fact out of bounds")
            blocks = struct.unpack_from(f"<{n_blocks}Q", view, at)
            at += 8 * n_blocks
            facts.append(RoutedBlocks(engines[index], blocks, prompt_tokens, block_tokens))
        (n_loads,) = _COUNT.unpack_from(view, at)
        at += _COUNT.size
        if n_loads > n_engines:
            raise ValueError("too many load entries")
        load = {}
        for _ in range(n_loads):
            index, inflight, prefill, limit, claim, spare, held = _LOAD.unpack_from(view, at)
            at += _LOAD.size
            if index >= n_engines or not 0.0 <= limit < math.inf:
                raise ValueError("load entry out of bounds")
            load[engines[index]] = EngineLoad(inflight, prefill, limit, claim, spare, held)
        evidence, at = _decode_evidence(view, at, engines)
        if at != len(view):
            raise ValueError("trailing bytes")
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed batch: {exc}") from None
    learned = Learned(facts, load, bool(flags & _FULL), evidence=evidence)
    return Batch(bytes(publisher), sequence, sent_at, block_chars, learned)


def _u32(value: int) -> int:
    return max(0, min(value, 0xFFFFFFFF))


@dataclass(slots=True)
class _Peer:
    sequence: int
    heard_at: float
    load: dict[str, EngineLoad] = field(default_factory=dict)
    evidence: dict[str, Evidence] = field(default_factory=dict)


class Peers:
    """Other replicas as heard through the channel: their sequence numbers and their load."""

    def __init__(self, max_peers: int = 1024) -> None:
        self.max_peers = max_peers
        self._peers: OrderedDict[bytes, _Peer] = OrderedDict()
        self._inflight: dict[str, int] = {}
        self._prefill: dict[str, int] = {}

    def heard(self, publisher: bytes, sequence: int, now: float) -> int:
        """Note a batch; answer how many of this publisher's batches were missed before it."""
        peer = self._peers.get(publisher)
        if peer is None:
            peer = self._peers[publisher] = _Peer(sequence, now)
            missed = 0  # the first batch heard from it: nothing is known missing
        else:
            missed = max(0, sequence - peer.sequence - 1)
            peer.sequence = max(sequence, peer.sequence)
            peer.heard_at = now
        self._peers.move_to_end(publisher)
        while len(self._peers) > self.max_peers:
            _, gone = self._peers.popitem(last=False)
            self._drop(gone)
        return missed

    def report(self, publisher: bytes, load: dict[str, EngineLoad], full: bool) -> set[str]:
        """A publisher's load (after ``heard``); returns the engines whose totals changed."""
        peer = self._peers.get(publisher)
        if peer is None:
            return set()
        changed = set()
        if full:
            for engine in set(peer.load) - set(load):
                changed.add(engine)
                self._add(engine, peer.load.pop(engine), -1)
        for engine, new in load.items():
            old = peer.load.get(engine, _NONE)
            if new != old:
                if (new.inflight, new.prefill, new.limit) != (old.inflight, old.prefill, old.limit):
                    changed.add(engine)  # what the totals and limits tell; claims are the holdings' (``holdings.py``)
                self._add(engine, old, -1)
                self._add(engine, new, 1)
                if new:
                    peer.load[engine] = new
                else:
                    peer.load.pop(engine, None)
        return changed

    def report_evidence(self, publisher: bytes, evidence: dict[str, Evidence]) -> None:
        """A publisher's evidence from a full batch (after ``heard``): it replaces what it said before."""
        peer = self._peers.get(publisher)
        if peer is not None:
            peer.evidence = dict(evidence)

    def evidence(self, engine: str) -> list[Evidence]:
        """What the publishers heard last said their gaps on ``engine`` showed."""
        return [e for peer in self._peers.values() if (e := peer.evidence.get(engine)) is not None]

    def limit_of(self, publisher: bytes, engine: str) -> float:
        """The limit ``publisher`` last reported applying for ``engine`` (0: none, or not heard)."""
        peer = self._peers.get(publisher)
        load = peer.load.get(engine) if peer is not None else None
        return load.limit if load is not None else 0.0

    def lowest(self, engine: str) -> bytes | None:
        """The lowest id of the publishers that learn a limit for ``engine`` (their full batches carry
        evidence for it, if only that they saw nothing); None: nobody heard does."""
        return min((p for p, peer in self._peers.items() if engine in peer.evidence), default=None)

    def expire(self, now: float, silent_s: float) -> set[str]:
        """Forget publishers not heard from within ``silent_s``; returns the engines whose totals changed."""
        changed: set[str] = set()
        for publisher in [p for p, peer in self._peers.items() if now - peer.heard_at > silent_s]:
            changed |= self._drop(self._peers.pop(publisher))
        return changed

    def clear(self) -> set[str]:
        """The channel was lost: nobody is heard any more."""
        changed: set[str] = set()
        for peer in self._peers.values():
            changed |= self._drop(peer)
        self._peers.clear()
        return changed

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, publisher: bytes) -> bool:
        return publisher in self._peers

    def inflight(self, engine: str) -> int:
        return self._inflight.get(engine, 0)

    def limits(self, engine: str) -> tuple[float, ...]:
        """The limits the publishers heard learned for ``engine``."""
        return tuple(x for peer in self._peers.values() if engine in peer.load and (x := peer.load[engine].limit) > 0)

    def prefill(self, engine: str) -> int:
        return self._prefill.get(engine, 0)

    def active(self, now: float, within_s: float) -> int:
        """Publishers heard from within the last ``within_s`` seconds."""
        return sum(1 for peer in self._peers.values() if now - peer.heard_at <= within_s)

    def _drop(self, peer: _Peer) -> set[str]:
        for engine, load in peer.load.items():
            self._add(engine, load, -1)
        changed = set(peer.load)
        peer.load.clear()
        peer.evidence.clear()
        return changed

    def _add(self, engine: str, load: EngineLoad, sign: int) -> None:
        for totals, value in ((self._inflight, load.inflight), (self._prefill, load.prefill)):
            if value:
                total = totals.get(engine, 0) + sign * value
                if total:
                    totals[engine] = total
                else:
                    totals.pop(engine, None)


_NONE = EngineLoad()
