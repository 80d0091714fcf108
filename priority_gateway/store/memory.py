"""The in-process store: one replica, no setup (``store: memory``, the embedded default).

Everything lives in this process and is gone when it stops, except API keys when
``keys.file`` names a JSON file: then keys are read from and written to that file, so
``gateway keys create`` and a running gateway share them. Leases use the monotonic clock.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from priority_gateway.store.base import RATE_WINDOW_S
from priority_gateway.store.records import (
    IN_PROGRESS,
    TERMINAL,
    ApiKey,
    BatchRecord,
    Claim,
    FileRecord,
    FileUsage,
    Line,
    LineCounts,
    Page,
    RateDecision,
    Result,
)


def paginate(ids: list[str], after: str | None, limit: int) -> tuple[list[str], bool]:
    """The page of ``ids`` (already in listing order) that follows ``after``."""
    start = 0
    if after is not None:
        try:
            start = ids.index(after) + 1
        except ValueError:
            return [], False
    chosen = ids[start : start + limit]
    return chosen, start + limit < len(ids)


def sliding_window(
    now_s: float, counts: dict[tuple[str, int], int], limits: dict[str, tuple[int | None, int]]
) -> RateDecision:
    """Decide one request against per-kind limits ``{kind: (limit, cost)}`` and count it if it fits.

    ``counts`` maps (kind, window number) to the amount counted in that minute.
    """
    window = int(now_s // RATE_WINDOW_S)
    elapsed = now_s - window * RATE_WINDOW_S
    for kind, (limit, cost) in limits.items():
        if not limit:
            continue
        current = counts.get((kind, window), 0)
        previous = counts.get((kind, window - 1), 0)
        if previous * (RATE_WINDOW_S - elapsed) / RATE_WINDOW_S + current + cost > limit:
            return RateDecision(False, retry_after(limit, cost, current, previous, elapsed), kind)
    for kind, (limit, cost) in limits.items():
        if limit and cost:
            counts[(kind, window)] = counts.get((kind, window), 0) + cost
    for stale in [k for k in counts if k[1] < window - 1]:
        del counts[stale]
    return RateDecision(True)


def retry_after(limit: int, cost: int, current: int, previous: int, elapsed: float) -> float:
    """Seconds until a request of ``cost`` fits the sliding window again."""
    if cost > limit:
        return RATE_WINDOW_S
    if current + cost > limit:
        # Not before the next minute, and then this minute's count weighs in as the previous one.
        share = 1.0 - (limit - cost) / current if current else 0.0
        return RATE_WINDOW_S - elapsed + max(0.0, share) * RATE_WINDOW_S
    share = 1.0 - (limit - current - cost) / previous
    return max(0.001, share * RATE_WINDOW_S - elapsed)


@dataclass(slots=True)
class _Lines:
    lines: dict[int, tuple[str, bytes]] = field(default_factory=dict)
    pending: dict[int, int] = field(default_factory=dict)
    leases: dict[int, float] = field(default_factory=dict)
    owners: dict[int, str] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)
    results: dict[str, Result] = field(default_factory=dict)


class KeyFile:
    """API keys in a JSON file, re-read when it changes on disk."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._mtime: float | None = None
        self._keys: dict[str, ApiKey] = {}

    def load(self) -> dict[str, ApiKey]:
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            self._keys, self._mtime = {}, None
            return self._keys
        if mtime != self._mtime:
            data = orjson.loads(self.path.read_bytes() or b"[]")
            self._keys = {item["id"]: ApiKey(**item) for item in data}
            self._mtime = mtime
        return self._keys

    def save(self, keys: dict[str, ApiKey]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        tmp.write_bytes(orjson.dumps([asdict(k) for k in keys.values()], option=orjson.OPT_INDENT_2))
        os.chmod(tmp, 0o600)
        tmp.replace(self.path)
        self._keys = dict(keys)
        self._mtime = self.path.stat().st_mtime_ns


class MemoryStore:
    def __init__(self, keys_file: str | Path | None = None) -> None:
        self._files: dict[str, FileRecord] = {}
        self._usage: dict[str, FileUsage] = {}
        self._blobs: dict[str, bytes] = {}
        self._batches: dict[str, BatchRecord] = {}
        self._order: dict[str, int] = {}
        self._seq = 0
        self._lines: dict[str, _Lines] = {}
        self._leases: dict[str, tuple[float, str, str]] = {}
        self._key_file = KeyFile(keys_file) if keys_file else None
        self._keys: dict[str, ApiKey] = {}
        self._rates: dict[str, dict[tuple[str, int], int]] = {}

    @staticmethod
    def _now() -> float:
        return time.monotonic()

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def ping(self) -> bool:
        return True

    def _next(self, item_id: str) -> None:
        self._seq += 1
        self._order[item_id] = self._seq

    # -- blobs ---------------------------------------------------------------------------

    async def put_blob(self, blob_id: str, data: bytes) -> None:
        self._blobs[blob_id] = data

    async def get_blob(self, blob_id: str) -> bytes | None:
        return self._blobs.get(blob_id)

    async def read_blob(self, blob_id: str, start: int, length: int) -> bytes | None:
        data = self._blobs.get(blob_id)
        return None if data is None else data[start : start + length]

    async def delete_blob(self, blob_id: str) -> None:
        self._blobs.pop(blob_id, None)

    # -- files ---------------------------------------------------------------------------

    async def put_file(self, record: FileRecord, limit: FileUsage | None = None) -> bool:
        old = self._files.get(record.id)
        used = self._usage.get(record.owner, FileUsage())
        usage = FileUsage(used.files + (old is None), used.bytes + record.bytes - (old.bytes if old else 0))
        if limit is not None and (usage.files > limit.files or usage.bytes > limit.bytes):
            return False
        if old is None:
            self._next(record.id)
        self._files[record.id] = replace(record)
        self._usage[record.owner] = usage
        return True

    async def file_usage(self, owner: str) -> FileUsage:
        return self._usage.get(owner, FileUsage())

    async def get_file(self, file_id: str) -> FileRecord | None:
        record = self._files.get(file_id)
        return None if record is None else replace(record)

    async def delete_file(self, file_id: str) -> bool:
        self._order.pop(file_id, None)
        record = self._files.pop(file_id, None)
        if record is None:
            return False
        used = self._usage[record.owner]
        self._usage[record.owner] = FileUsage(used.files - 1, used.bytes - record.bytes)
        return True

    async def expired_files(self, now: int, limit: int) -> list[str]:
        due = sorted((f.expires_at, f.id) for f in self._files.values() if f.expired(now) and f.expires_at is not None)
        return [file_id for _, file_id in due[:limit]]

    async def list_files(
        self, owner: str, after: str | None, limit: int, descending: bool = True, purpose: str | None = None
    ) -> Page:
        mine = [f for f in self._files.values() if f.owner == owner and (purpose is None or f.purpose == purpose)]
        mine.sort(key=lambda f: self._order[f.id], reverse=descending)
        ids, more = paginate([f.id for f in mine], after, limit)
        return Page([replace(self._files[i]) for i in ids], more)

    # -- batches -------------------------------------------------------------------------

    async def create_batch(self, record: BatchRecord) -> None:
        self._next(record.id)
        self._batches[record.id] = replace(record)

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        record = self._batches.get(batch_id)
        return None if record is None else replace(record)

    async def list_batches(self, owner: str, after: str | None, limit: int) -> Page:
        mine = sorted((b for b in self._batches.values() if b.owner == owner), key=lambda b: -self._order[b.id])
        ids, more = paginate([b.id for b in mine], after, limit)
        return Page([replace(self._batches[i]) for i in ids], more)

    async def update_batch(self, batch_id: str, expect: Sequence[str] | None = None, **changes: Any) -> bool:
        record = self._batches.get(batch_id)
        if record is None or (expect is not None and record.status not in expect):
            return False
        for name, value in changes.items():
            setattr(record, name, value)
        return True

    async def active_batches(self) -> list[str]:
        active = [b for b in self._batches.values() if b.status not in TERMINAL]
        return [b.id for b in sorted(active, key=lambda b: self._order[b.id])]

    async def batch_status_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for record in self._batches.values():
            counts[record.status] = counts.get(record.status, 0) + 1
        return counts

    async def lease_batch(self, batch_id: str, statuses: Sequence[str], claimant: str, lease_s: float) -> bool:
        record = self._batches.get(batch_id)
        if record is None or record.status not in statuses:
            return False
        now = self._now()
        held = self._leases.get(batch_id)
        if held is not None and held[0] > now and held[2] == record.status:
            return False
        self._leases[batch_id] = (now + lease_s, claimant, record.status)
        return True

    # -- batch lines ---------------------------------------------------------------------

    async def load_lines(self, batch_id: str, lines: Sequence[Line]) -> None:
        state = self._lines[batch_id] = _Lines()
        for line in lines:
            state.lines[line.index] = (line.custom_id, line.body)
            state.pending[line.index] = line.position

    async def claim_lines(self, batch_id: str, claimant: str, n: int, lease_s: float) -> list[Claim]:
        record = self._batches.get(batch_id)
        state = self._lines.get(batch_id)
        if record is None or state is None or record.status != IN_PROGRESS or n <= 0:
            return []
        now = self._now()
        taken = sorted((at, i) for i, at in state.leases.items() if at <= now)[:n]
        chosen = [i for _, i in taken]
        if len(chosen) < n:
            pending = sorted(state.pending, key=state.pending.__getitem__)[: n - len(chosen)]
            for index in pending:
                del state.pending[index]
            chosen.extend(pending)
        claims = []
        for index in chosen:
            state.leases[index] = now + lease_s
            state.owners[index] = claimant
            custom_id, body = state.lines[index]
            claims.append(Claim(index, custom_id, body))
        return claims

    async def renew_lines(self, batch_id: str, claimant: str, indexes: Sequence[int], lease_s: float) -> int:
        state = self._lines.get(batch_id)
        if state is None:
            return 0
        renewed = 0
        for index in indexes:
            if index in state.leases and state.owners.get(index) == claimant:
                state.leases[index] = self._now() + lease_s
                renewed += 1
        return renewed

    async def defer_line(self, batch_id: str, claimant: str, index: int, delay_s: float) -> int:
        state = self._lines.get(batch_id)
        if state is None or index not in state.leases or state.owners.get(index) != claimant:
            return 0
        state.leases[index] = self._now() + delay_s
        state.owners.pop(index, None)
        state.attempts[index] = state.attempts.get(index, 0) + 1
        return state.attempts[index]

    async def complete_line(self, batch_id: str, index: int, custom_id: str, ok: bool, line: bytes) -> bool:
        state = self._lines.get(batch_id)
        record = self._batches.get(batch_id)
        if state is None or record is None:
            return False
        state.leases.pop(index, None)
        state.owners.pop(index, None)
        state.pending.pop(index, None)
        if custom_id in state.results or record.status in TERMINAL:
            return False
        state.results[custom_id] = Result(index, ok, line)
        if ok:
            record.completed += 1
        else:
            record.failed += 1
        return True

    async def line_counts(self, batch_id: str) -> LineCounts:
        state = self._lines.get(batch_id)
        if state is None:
            return LineCounts(0, 0, 0)
        now = self._now()
        live = sum(1 for at in state.leases.values() if at > now)
        return LineCounts(len(state.pending), live, len(state.leases) - live)

    async def results(self, batch_id: str) -> list[Result]:
        state = self._lines.get(batch_id)
        return [] if state is None else sorted(state.results.values(), key=lambda r: r.index)

    async def unfinished_lines(self, batch_id: str) -> list[tuple[int, str]]:
        state = self._lines.get(batch_id)
        if state is None:
            return []
        done = state.results.keys()
        return sorted((i, cid) for i, (cid, _) in state.lines.items() if cid not in done)

    async def drop_lines(self, batch_id: str) -> None:
        self._lines.pop(batch_id, None)
        self._leases.pop(batch_id, None)

    # -- API keys ------------------------------------------------------------------------

    def _key_map(self) -> dict[str, ApiKey]:
        return self._key_file.load() if self._key_file is not None else self._keys

    def _save_keys(self, keys: dict[str, ApiKey]) -> None:
        if self._key_file is not None:
            self._key_file.save(keys)

    async def put_key(self, key: ApiKey) -> None:
        keys = dict(self._key_map())
        keys[key.id] = replace(key)
        self._keys = keys
        self._save_keys(keys)

    async def get_key(self, key_id: str) -> ApiKey | None:
        key = self._key_map().get(key_id)
        return None if key is None else replace(key)

    async def list_keys(self) -> list[ApiKey]:
        return sorted((replace(k) for k in self._key_map().values()), key=lambda k: (k.created_at, k.id))

    async def revoke_key(self, key_id: str, at: int) -> bool:
        keys = dict(self._key_map())
        key = keys.get(key_id)
        if key is None or not key.active:
            return False
        keys[key_id] = replace(key, revoked_at=at)
        self._keys = keys
        self._save_keys(keys)
        return True

    async def active_key_count(self) -> int:
        return sum(1 for k in self._key_map().values() if k.active)

    # -- rate limits ---------------------------------------------------------------------

    async def rate_hit(self, key_id: str, rpm: int | None, tpm: int | None, tokens: int) -> RateDecision:
        counts = self._rates.setdefault(key_id, {})
        return sliding_window(time.time(), counts, {"rpm": (rpm, 1), "tpm": (tpm, tokens)})

    async def rate_charge(self, key_id: str, tokens: int) -> None:
        counts = self._rates.setdefault(key_id, {})
        window = math.floor(time.time() / RATE_WINDOW_S)
        counts[("tpm", window)] = max(0, counts.get(("tpm", window), 0) + tokens)
