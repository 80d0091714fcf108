"""What one replica tells the others, as one versioned binary batch.

Rules:
- One batch format, one version (``FORMAT``), one sequence per publisher. A batch carries its
  publisher's 16-byte id, its sequence number (a receiver that sees a gap knows it missed batches),
  the send time (for measuring the channel's delay only), the block width in characters (replicas
  that hash prompts differently must not mix their blocks), and three typed sections:
  - facts (``RoutedBlocks``): "I sent this engine a request whose prompt's leading blocks hash to
    these" (approximate prefix mode; in precise mode the engines' own KV events say it);
  - engine reports (``EngineReport``): the publisher's own in-flight requests, pending prefill,
    applied concurrency limit, slot claim, spare and holding per engine, the KV cache its paused
    sessions hold there (``sessions``), the LoRA adapters its requests there run on, and, in full
    batches, what the gaps it relayed showed (``limiter.Evidence``);
  - tenant counts (``TenantShare``): its requests running and queued per pool and tenant, with the
    tenant's weight.
- Everything is absolute, never an increment, so nothing lost or repeated can make a receiver
  drift: a batch lists what changed since the previous one (a count back to nothing as zero), a full
  batch lists everything the publisher has, and what it leaves out is nothing.
- With a fleet secret, every batch ends in a 16-byte HMAC-SHA256 tag over all that comes before it;
  a receiver with the secret refuses a batch without a valid tag, one without refuses a signed batch.
- ``decode`` refuses with ``WireError`` anything malformed, past the bounds below, or implausible (a
  replica does not run 2^32 requests on one engine): an honest replica never sends it, so a batch
  that has it is broken or forged, and refusing it whole is safer than trusting part of it. It names
  the batches of the previous version (routing format 4, tenant batches) so that a rolling upgrade
  says why the two versions do not hear each other.
- ``encode`` clamps what it writes to the same bounds, so every batch it makes decodes.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from dataclasses import dataclass, field

from priority_gateway.core.limiter import Evidence, LevelCounts
from priority_gateway.core.routing import RoutedBlocks

FORMAT = 5
PUBLISHER_BYTES = 16
TAG_BYTES = 16
MAX_FACTS = 65_535
MAX_BLOCKS = 65_535
MAX_ENGINES = 4096
MAX_ENGINE_ID_BYTES = 2048
MAX_LEVELS = 4096
MAX_TENANTS = 65_535
MAX_NAME_BYTES = 1024
MAX_REQUESTS = 1 << 16
"""Requests one replica may say it runs, holds or queues on one engine or for one tenant."""
MAX_GAPS = 1 << 28
"""Gaps one replica may say it saw on one engine within one window."""
MAX_ADAPTERS = 255
"""LoRA adapters one replica may say it has requests in flight for on one engine."""

_PREVIOUS = {4: "a routing batch of the previous version (format 4)", 0x54: "a tenant batch of the previous version"}

# format, flags, publisher, sequence, sent_at, block_chars, engines
_HEADER = struct.Struct("<BB16sQdHH")
_LENGTH = struct.Struct("<H")
_COUNT = struct.Struct("<I")
_FACT = struct.Struct("<HIHH")  # engine index, prompt tokens, block tokens, blocks
# engine index, flags, in flight, prefill, limit, claim, spare, held, KV held by paused sessions
_REPORT = struct.Struct("<HBIIfIIII")
_EVIDENCE = struct.Struct("<IIIH")  # gaps, over budget, far over, levels
_LEVEL = struct.Struct("<HIIIII")  # level, fresh, fresh over, fresh within, long, long within
_TENANT = struct.Struct("<IIf")  # in flight, queued, weight
_FULL = 1
_SIGNED = 2
_HAS_EVIDENCE = 1
_HAS_ADAPTERS = 2


class WireError(ValueError):
    """A batch this replica must not apply; the message says why."""


@dataclass(frozen=True, slots=True)
class EngineReport:
    """One replica's own state on one engine."""

    inflight: int = 0
    prefill: int = 0
    """Uncached prompt tokens sent that have not reached their first token."""
    limit: float = 0.0
    """The concurrency limit the publisher applies for the engine (0: none learned)."""
    claim: int = 0
    """The slots the publisher asks to hold, waiting for them if need be (``holdings``)."""
    spare: int = 0
    """The slots it would hold if they are free (never waited for)."""
    held: int = 0
    """The slots the publisher holds, as it sees it when it sends."""
    kv_held: int = 0
    """Tokens of KV cache the publisher's paused sessions hold on the engine (``sessions``)."""
    evidence: Evidence | None = None
    """What the publisher's own gaps on the engine showed (full batches; None: not said)."""
    adapters: tuple[str, ...] = ()
    """The LoRA adapters of the publisher's requests in flight there (what must stay loaded)."""

    def __bool__(self) -> bool:
        busy = self.inflight or self.prefill or self.limit or self.claim or self.spare or self.held or self.kv_held
        return bool(busy or self.adapters) or self.evidence is not None


@dataclass(frozen=True, slots=True)
class TenantShare:
    """One replica's requests of one tenant in one pool."""

    inflight: int = 0
    queued: int = 0
    weight: float = 1.0

    def __bool__(self) -> bool:
        return bool(self.inflight or self.queued)


TenantKey = tuple[str, str]
"""``(pool, tenant)``."""


@dataclass(slots=True)
class Report:
    """What one replica has to tell the others since its previous batch."""

    facts: list[RoutedBlocks] = field(default_factory=list)
    engines: dict[str, EngineReport] = field(default_factory=dict)
    tenants: dict[TenantKey, TenantShare] = field(default_factory=dict)
    full: bool = False
    """``engines`` and ``tenants`` name everything the publisher has; the rest is nothing."""

    def __bool__(self) -> bool:
        return bool(self.facts or self.engines or self.tenants or self.full)


@dataclass(frozen=True, slots=True)
class Batch:
    publisher: bytes
    sequence: int
    sent_at: float
    block_chars: int
    report: Report


def encode(batch: Batch, secret: bytes | None = None) -> bytes:
    if len(batch.publisher) != PUBLISHER_BYTES:
        raise ValueError(f"publisher id must be {PUBLISHER_BYTES} bytes")
    report = batch.report
    engines: dict[str, int] = {}
    for fact in report.facts:
        engines.setdefault(fact.engine, len(engines))
    for engine in report.engines:
        engines.setdefault(engine, len(engines))
    # A tenant whose name is too long is not told: its share stays this replica's own.
    named = (((pool.encode(), tenant.encode()), share) for (pool, tenant), share in report.tenants.items())
    tenants = [(names, share) for names, share in named if max(map(len, names)) <= MAX_NAME_BYTES]
    if len(report.facts) > MAX_FACTS or len(engines) > MAX_ENGINES or len(tenants) > MAX_TENANTS:
        raise ValueError("too many facts, engines or tenants for one batch")
    flags = (_FULL if report.full else 0) | (_SIGNED if secret else 0)
    block_chars = min(batch.block_chars, 0xFFFF)
    parts = [_HEADER.pack(FORMAT, flags, batch.publisher, batch.sequence, batch.sent_at, block_chars, len(engines))]
    for engine in engines:
        raw = engine.encode()[:MAX_ENGINE_ID_BYTES]
        parts += [_LENGTH.pack(len(raw)), raw]
    parts.append(_COUNT.pack(len(report.facts)))
    for fact in report.facts:
        blocks = fact.blocks[:MAX_BLOCKS]
        index = engines[fact.engine]
        parts.append(
            _FACT.pack(index, _clamp(fact.prompt_tokens, 0xFFFFFFFF), _clamp(fact.block_tokens, 0xFFFF), len(blocks))
        )
        parts.append(struct.pack(f"<{len(blocks)}Q", *blocks))
    parts.append(_COUNT.pack(len(report.engines)))
    for engine, entry in report.engines.items():
        parts += _encode_report(engines[engine], entry)
    parts.append(_COUNT.pack(len(tenants)))
    for names, share in tenants:
        for name in names:
            parts += [_LENGTH.pack(len(name)), name]
        weight = share.weight if 0.0 < share.weight < math.inf else 1.0
        parts.append(_TENANT.pack(_clamp(share.inflight, MAX_REQUESTS), _clamp(share.queued, MAX_REQUESTS), weight))
    data = b"".join(parts)
    return data + _tag(secret, data) if secret else data


def _encode_report(index: int, entry: EngineReport) -> list[bytes]:
    evidence = entry.evidence
    limit = entry.limit if 0.0 <= entry.limit <= MAX_REQUESTS else float(MAX_REQUESTS)
    adapters = [raw for name in entry.adapters[:MAX_ADAPTERS] if len(raw := name.encode()) <= MAX_NAME_BYTES]
    flags = (_HAS_EVIDENCE if evidence is not None else 0) | (_HAS_ADAPTERS if adapters else 0)
    parts = [
        _REPORT.pack(
            index,
            flags,
            _clamp(entry.inflight, MAX_REQUESTS),
            _clamp(entry.prefill, 0xFFFFFFFF),
            limit,
            _clamp(entry.claim, MAX_REQUESTS),
            _clamp(entry.spare, MAX_REQUESTS),
            _clamp(entry.held, MAX_REQUESTS),
            _clamp(entry.kv_held, 0xFFFFFFFF),
        )
    ]
    if adapters:
        parts.append(bytes((len(adapters),)))
        for raw in adapters:
            parts += [_LENGTH.pack(len(raw)), raw]
    if evidence is None:
        return parts
    # Clamped and kept consistent: the decoder refuses counts that contradict each other.
    levels = [(level, c) for level, c in sorted(evidence.levels.items()) if 0 < level <= 0xFFFF][:MAX_LEVELS]
    gaps = _clamp(evidence.gaps, MAX_GAPS)
    parts.append(
        _EVIDENCE.pack(gaps, min(_clamp(evidence.over, gaps), gaps), min(_clamp(evidence.far, gaps), gaps), len(levels))
    )
    for level, c in levels:
        fresh, long = _clamp(c.fresh, MAX_GAPS), _clamp(c.long, MAX_GAPS)
        over = min(_clamp(c.fresh_over, fresh), fresh)
        within = min(_clamp(c.fresh_within, fresh), fresh - over)
        parts.append(_LEVEL.pack(level, fresh, over, within, long, min(_clamp(c.long_within, long), long)))
    return parts


def decode(data: bytes, secret: bytes | None = None) -> Batch:
    if not data:
        raise WireError("empty batch")
    if data[0] != FORMAT:
        known = _PREVIOUS.get(data[0])
        raise WireError(
            f"{known}: replicas of different versions ignore each other" if known else f"unknown format {data[0]}"
        )
    try:
        view = memoryview(data)
        _, flags, publisher, sequence, sent_at, block_chars, n_engines = _HEADER.unpack_from(view, 0)
        view = _verified(view, flags, secret)
        at = _HEADER.size
        engines = []
        for _ in range(n_engines):
            name, at = _name(view, at, MAX_ENGINE_ID_BYTES)
            engines.append(name)
        facts, at = _decode_facts(view, at, engines)
        reports, at = _decode_reports(view, at, engines)
        tenants, at = _decode_tenants(view, at)
        if at != len(view):
            raise WireError("trailing bytes")
    except (struct.error, UnicodeDecodeError) as exc:
        raise WireError(f"malformed batch: {exc}") from None
    if not math.isfinite(sent_at):
        raise WireError("send time out of bounds")
    report = Report(facts, reports, tenants, bool(flags & _FULL))
    return Batch(bytes(publisher), sequence, sent_at, block_chars, report)


def _verified(view: memoryview, flags: int, secret: bytes | None) -> memoryview:
    """The batch without its tag, once the tag is checked against ``secret``."""
    signed = bool(flags & _SIGNED)
    if not secret:
        if signed:
            raise WireError("signed batch, and this replica has no fleet secret")
        return view
    if not signed:
        raise WireError("unsigned batch, and this replica requires the fleet secret")
    body, tag = view[:-TAG_BYTES], bytes(view[-TAG_BYTES:])
    if len(view) < _HEADER.size + TAG_BYTES or not hmac.compare_digest(tag, _tag(secret, bytes(body))):
        raise WireError("bad signature: not signed with this fleet's secret")
    return body


def _tag(secret: bytes, data: bytes) -> bytes:
    return hmac.new(secret, data, hashlib.sha256).digest()[:TAG_BYTES]


def _name(view: memoryview, at: int, limit: int) -> tuple[str, int]:
    (size,) = _LENGTH.unpack_from(view, at)
    at += _LENGTH.size
    if size > limit or at + size > len(view):
        raise WireError("name out of bounds")
    return bytes(view[at : at + size]).decode(), at + size


def _count(view: memoryview, at: int, limit: int, what: str) -> tuple[int, int]:
    (n,) = _COUNT.unpack_from(view, at)
    if n > limit:
        raise WireError(f"too many {what}")
    return n, at + _COUNT.size


def _decode_facts(view: memoryview, at: int, engines: list[str]) -> tuple[list[RoutedBlocks], int]:
    n, at = _count(view, at, MAX_FACTS, "facts")
    facts = []
    for _ in range(n):
        index, prompt_tokens, block_tokens, n_blocks = _FACT.unpack_from(view, at)
        at += _FACT.size
        if index >= len(engines) or block_tokens == 0 or at + 8 * n_blocks > len(view):
            raise WireError("fact out of bounds")
        blocks = struct.unpack_from(f"<{n_blocks}Q", view, at)
        at += 8 * n_blocks
        facts.append(RoutedBlocks(engines[index], blocks, prompt_tokens, block_tokens))
    return facts, at


def _decode_reports(view: memoryview, at: int, engines: list[str]) -> tuple[dict[str, EngineReport], int]:
    n, at = _count(view, at, len(engines), "engine reports")
    out = {}
    for _ in range(n):
        index, flags, inflight, prefill, limit, claim, spare, held, kv_held = _REPORT.unpack_from(view, at)
        at += _REPORT.size
        if index >= len(engines) or engines[index] in out:
            raise WireError("engine report out of bounds")
        if max(inflight, claim, spare, held) > MAX_REQUESTS or not 0.0 <= limit <= MAX_REQUESTS:
            raise WireError(f"implausible engine report: {inflight} in flight, limit {limit:g}, claim {claim}")
        adapters: list[str] = []
        if flags & _HAS_ADAPTERS:
            if at >= len(view):
                raise WireError("engine report cut short")
            n_adapters = view[at]
            at += 1
            for _ in range(n_adapters):
                name, at = _name(view, at, MAX_NAME_BYTES)
                adapters.append(name)
        evidence = None
        if flags & _HAS_EVIDENCE:
            evidence, at = _decode_evidence(view, at)
        out[engines[index]] = EngineReport(
            inflight, prefill, limit, claim, spare, held, kv_held, evidence, tuple(adapters)
        )
    return out, at


def _decode_evidence(view: memoryview, at: int) -> tuple[Evidence, int]:
    gaps, over, far, n_levels = _EVIDENCE.unpack_from(view, at)
    at += _EVIDENCE.size
    if gaps > MAX_GAPS or over > gaps or far > gaps or n_levels > MAX_LEVELS:
        raise WireError("evidence out of bounds")
    levels = {}
    for _ in range(n_levels):
        level, fresh, fresh_over, fresh_within, long, long_within = _LEVEL.unpack_from(view, at)
        at += _LEVEL.size
        bad_counts = fresh > MAX_GAPS or long > MAX_GAPS or fresh_over + fresh_within > fresh or long_within > long
        if level == 0 or level in levels or bad_counts:
            raise WireError("evidence level out of bounds")
        levels[level] = LevelCounts(fresh, fresh_over, fresh_within, long, long_within)
    return Evidence(gaps, over, far, levels), at


def _decode_tenants(view: memoryview, at: int) -> tuple[dict[TenantKey, TenantShare], int]:
    n, at = _count(view, at, MAX_TENANTS, "tenant entries")
    out: dict[TenantKey, TenantShare] = {}
    for _ in range(n):
        pool, at = _name(view, at, MAX_NAME_BYTES)
        tenant, at = _name(view, at, MAX_NAME_BYTES)
        inflight, queued, weight = _TENANT.unpack_from(view, at)
        at += _TENANT.size
        if inflight > MAX_REQUESTS or queued > MAX_REQUESTS or not 0.0 < weight < math.inf:
            raise WireError("implausible tenant entry")
        out[(pool, tenant)] = TenantShare(inflight, queued, weight)
    return out, at


def _clamp(value: int, top: int) -> int:
    return max(0, min(value, top))
