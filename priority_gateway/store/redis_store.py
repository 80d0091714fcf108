"""The Redis store: several gateway replicas share files, batch jobs, keys and rate limits.

Rules:
- Every multi-step change is one Lua script, so replicas never see half of it: claiming
  lines, renewing and deferring claims, storing a result, changing a batch's status,
  taking a batch-level lease, counting a rate-limited request.
- Batch lines: ``{b}:pending`` (sorted set, score = dispatch position), ``{b}:leases``
  (sorted set, score = lease expiry in ms of Redis' own clock), ``{b}:owners`` (hash line ->
  claimant), ``{b}:results`` (hash custom_id -> result, written with HSETNX: the first
  result of a line wins and a second one changes nothing). A line whose lease ran out is
  claimed again by whoever asks next, so a dead replica's work is taken over.
- Batch records are hashes of JSON-encoded fields; request counts move with HINCRBY.
  ``batches:active`` (sorted by creation) lists the batches runners look at;
  ``files:by:<owner>`` and ``batches:by:<owner>`` index each owner's objects for listing;
  ``files:expiry`` orders files by ``expires_at`` for the sweep that deletes them.
- File bodies are Redis strings unless ``batch.files_dir`` puts them on a shared directory
  (see ``priority_gateway.store.blobs``), written and read in pieces of ``BLOB_CHUNK`` bytes
  (written under a name of their own, renamed into place at the end, dropped by Redis an hour
  after a writer that died), so no one command holds Redis for a large body.
- Files count against their owner's usage (``files:usage:<owner>``: files and bytes), kept
  with the file records by the same scripts; ``put_file`` refuses a file that would take the
  owner past a given limit, atomically, so replicas cannot race past a quota together.
- The client holds at most ``POOL_CONNECTIONS`` connections (``?max_connections=`` in the URL
  overrides it); a call beyond them waits up to ``POOL_WAIT_S`` (``?timeout=``) for one to come
  free, then fails with ``StoreBusy``: a full pool is load, never reported as an outage.
- Connection failures surface as ``StoreUnavailable`` after a few quick retries; the client
  reconnects on the next call, so nothing needs restarting when Redis comes back. So do the
  refusals of a Redis that is up but cannot take writes (out of memory, a read-only replica,
  a failed snapshot, loading, busy): they last until Redis is fixed, and retrying is safe.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from priority_gateway.store.base import BLOB_CHUNK, RATE_WINDOW_S, StoreBusy, StoreUnavailable
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

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

CLAIM = (
    _NOW
    + """
if redis.call('HGET', KEYS[1], 'status') ~= ARGV[4] then return {} end
local n = tonumber(ARGV[2])
local lease_until = now + tonumber(ARGV[3])
local chosen = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, n)
if #chosen < n then
  local popped = redis.call('ZPOPMIN', KEYS[2], n - #chosen)
  for i = 1, #popped, 2 do chosen[#chosen + 1] = popped[i] end
end
local out = {}
for _, idx in ipairs(chosen) do
  redis.call('ZADD', KEYS[3], lease_until, idx)
  redis.call('HSET', KEYS[4], idx, ARGV[1])
  out[#out + 1] = idx
  out[#out + 1] = redis.call('HGET', KEYS[5], idx)
end
return out
"""
)

RENEW = (
    _NOW
    + """
local n = 0
for i = 3, #ARGV do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[1] and redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[i])
    n = n + 1
  end
end
return n
"""
)

DEFER = (
    _NOW
    + """
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
"""
)

COMPLETE = """
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
local status = redis.call('HGET', KEYS[4], 'status')
if not status then return 0 end
for i = 5, #ARGV do if status == ARGV[i] then return 0 end end
if redis.call('HSETNX', KEYS[1], ARGV[2], ARGV[3]) == 1 then
  redis.call('HINCRBY', KEYS[4], ARGV[4], 1)
  return 1
end
return 0
"""

LINE_COUNTS = (
    _NOW
    + """
local leased = redis.call('ZCARD', KEYS[2])
local live = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
return {redis.call('ZCARD', KEYS[1]), live, leased - live}
"""
)

UPDATE_BATCH = """
local current = redis.call('HGET', KEYS[1], 'status')
if not current then return 0 end
local expected = tonumber(ARGV[3])
if expected > 0 then
  local ok = false
  for i = 4, 3 + expected do if current == ARGV[i] then ok = true end end
  if not ok then return 0 end
end
local new = nil
for i = 4 + expected, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  if ARGV[i] == 'status' then new = ARGV[i + 1] end
end
if new and new ~= current then
  redis.call('HINCRBY', KEYS[2], current, -1)
  redis.call('HINCRBY', KEYS[2], new, 1)
end
if ARGV[2] == '1' then redis.call('ZREM', KEYS[3], ARGV[1]) end
return 1
"""

LEASE_BATCH = (
    _NOW
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
local ok = false
for i = 3, #ARGV do if status == ARGV[i] then ok = true end end
if not ok then return 0 end
local held = tonumber(redis.call('HGET', KEYS[1], 'lease_until') or '0')
if held > now and redis.call('HGET', KEYS[1], 'lease_status') == status then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', now + tonumber(ARGV[2]), 'lease_owner', ARGV[1], 'lease_status', status)
return 1
"""
)

# Sliding window counter: this minute's count plus the previous minute's, weighted by the
# share of it still inside the last 60 s. KEYS[1] is the key's counter prefix.
RATE_HIT = (
    _NOW
    + """
local window_ms = tonumber(ARGV[1])
local w = math.floor(now / window_ms)
local elapsed = (now - w * window_ms) / 1000.0
local window_s = window_ms / 1000.0
local kinds = {{'rpm', tonumber(ARGV[2]), 1}, {'tpm', tonumber(ARGV[3]), tonumber(ARGV[4])}}
for _, k in ipairs(kinds) do
  local limit, cost = k[2], k[3]
  if limit > 0 then
    local cur = tonumber(redis.call('GET', KEYS[1] .. ':' .. k[1] .. ':' .. w) or '0')
    local prev = tonumber(redis.call('GET', KEYS[1] .. ':' .. k[1] .. ':' .. (w - 1)) or '0')
    if prev * (window_s - elapsed) / window_s + cur + cost > limit then
      local wait
      if cost > limit then
        wait = window_s
      elseif cur + cost > limit then
        local share = 0
        if cur > 0 then share = math.max(0, 1 - (limit - cost) / cur) end
        wait = window_s - elapsed + share * window_s
      else
        wait = math.max(0.001, (1 - (limit - cur - cost) / prev) * window_s - elapsed)
      end
      return {0, tostring(wait), k[1]}
    end
  end
end
for _, k in ipairs(kinds) do
  if k[2] > 0 and k[3] > 0 then
    local key = KEYS[1] .. ':' .. k[1] .. ':' .. w
    redis.call('INCRBY', key, k[3])
    redis.call('PEXPIRE', key, 2 * window_ms + 1000)
  end
end
return {1, '0', ''}
"""
)

RATE_CHARGE = (
    _NOW
    + """
local w = math.floor(now / tonumber(ARGV[1]))
local key = KEYS[1] .. ':tpm:' .. w
local count = redis.call('INCRBY', key, tonumber(ARGV[2]))
if count < 0 then redis.call('INCRBY', key, -count) end
redis.call('PEXPIRE', key, 2 * tonumber(ARGV[1]) + 1000)
return 1
"""
)

# KEYS: file, owner's index, expiry index, owner's usage, seq; ARGV: id, record, bytes,
# expires_at ('' for none), file limit, byte limit (0: no limit). A file written again (a
# retried finalisation) changes the usage by its difference in size only.
PUT_FILE = """
local old = redis.call('GET', KEYS[1])
local files, bytes = 1, tonumber(ARGV[3])
if old then
  files = 0
  bytes = bytes - cjson.decode(old)['bytes']
end
if tonumber(ARGV[5]) > 0 then
  local used_files = tonumber(redis.call('HGET', KEYS[4], 'files') or '0')
  local used_bytes = tonumber(redis.call('HGET', KEYS[4], 'bytes') or '0')
  if used_files + files > tonumber(ARGV[5]) or used_bytes + bytes > tonumber(ARGV[6]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[2])
if not old then redis.call('ZADD', KEYS[2], 'NX', redis.call('INCR', KEYS[5]), ARGV[1]) end
if ARGV[4] ~= '' then redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1]) else redis.call('ZREM', KEYS[3], ARGV[1]) end
redis.call('HINCRBY', KEYS[4], 'files', files)
redis.call('HINCRBY', KEYS[4], 'bytes', bytes)
return 1
"""

# KEYS: file, owner's index, expiry index, owner's usage; ARGV: id.
DELETE_FILE = """
local old = redis.call('GET', KEYS[1])
if not old then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
local files = redis.call('HINCRBY', KEYS[4], 'files', -1)
local bytes = redis.call('HINCRBY', KEYS[4], 'bytes', -cjson.decode(old)['bytes'])
-- Files stored before usage was counted must not drive it below zero.
if files < 0 then redis.call('HSET', KEYS[4], 'files', 0) end
if bytes < 0 then redis.call('HSET', KEYS[4], 'bytes', 0) end
return 1
"""

_TERMINAL_JSON = [orjson.dumps(s) for s in sorted(TERMINAL)]
# Error codes of a Redis that is up but refuses work until an operator acts (or it settles).
_CANNOT_SERVE = frozenset({"OOM", "READONLY", "MISCONF", "MASTERDOWN", "NOREPLICAS", "BUSY", "LOADING", "TRYAGAIN"})


def _cannot_serve(exc: ResponseError) -> bool:
    # redis-py strips the code from some errors (OutOfMemoryError, ReadOnlyError), keeps it in
    # others, and puts the command before it when a pipeline's command failed.
    if type(exc).__name__ in ("OutOfMemoryError", "ReadOnlyError"):
        return True
    text = str(exc)
    _, pipeline, error = text.partition(" of pipeline caused error: ")
    return (error if pipeline else text).lstrip("('\" ").split(" ", 1)[0] in _CANNOT_SERVE


def _bytes(reply: object) -> bytes:
    """A reply as the client gives it: bytes, since it never decodes (``decode_responses`` is off)."""
    if not isinstance(reply, bytes):
        raise TypeError(f"expected bytes from redis, got {type(reply).__name__}")
    return reply


def _text(reply: object) -> str:
    return _bytes(reply).decode()


def _enc(value: Any) -> bytes:
    return orjson.dumps(value)


def _line_value(custom_id: str, body: bytes) -> bytes:
    return orjson.dumps(custom_id) + b"\n" + body


def _split_line(value: bytes) -> tuple[str, bytes]:
    head, _, body = value.partition(b"\n")
    return orjson.loads(head), body


POOL_CONNECTIONS = 128
# A body being written in pieces is dropped by Redis if its writer dies before renaming it.
_PARTIAL_BLOB_S = 3600
POOL_WAIT_S = 5.0


class _BoundedPool(aioredis.BlockingConnectionPool):
    """redis-py's blocking pool, its wait for a free connection reported as ``StoreBusy``."""

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        except RedisConnectionError as exc:
            # The pool's own wait ran out (redis-py raises "No connection available." from it).
            if isinstance(exc.__cause__, TimeoutError):
                raise StoreBusy(f"redis: all {self.max_connections} connections busy for {self.timeout:g} s") from exc
            raise


class RedisStore:
    def __init__(self, url: str, prefix: str = "gw") -> None:
        self.url = url
        self.prefix = prefix
        self.r: aioredis.Redis | None = None

    async def open(self) -> None:
        # No network here: the client connects on first use, so a gateway starts (and serves
        # interactive traffic) while Redis is still down.
        pool = _BoundedPool.from_url(
            self.url,
            max_connections=POOL_CONNECTIONS,
            timeout=POOL_WAIT_S,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
            socket_connect_timeout=1.0,
            socket_timeout=10.0,
            health_check_interval=5,
        )
        self.r = aioredis.Redis.from_pool(pool)  # closed with the client
        r = self.r
        self._claim = r.register_script(CLAIM)
        self._renew = r.register_script(RENEW)
        self._defer = r.register_script(DEFER)
        self._complete = r.register_script(COMPLETE)
        self._line_counts = r.register_script(LINE_COUNTS)
        self._update = r.register_script(UPDATE_BATCH)
        self._lease = r.register_script(LEASE_BATCH)
        self._rate_hit = r.register_script(RATE_HIT)
        self._rate_charge = r.register_script(RATE_CHARGE)
        self._put_file = r.register_script(PUT_FILE)
        self._delete_file = r.register_script(DELETE_FILE)

    async def close(self) -> None:
        if self.r is not None:
            await self.r.aclose()
            self.r = None

    @property
    def redis(self) -> aioredis.Redis:
        if self.r is None:
            raise RuntimeError("the store is not open")
        return self.r

    @asynccontextmanager
    async def _io(self) -> AsyncIterator[aioredis.Redis]:
        try:
            yield self.redis
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        except ResponseError as exc:
            if _cannot_serve(exc):
                raise StoreUnavailable(f"redis refused: {type(exc).__name__}: {exc}") from exc
            raise

    async def ping(self) -> bool:
        try:
            async with self._io() as r:
                return bool(await r.ping())
        except StoreUnavailable:
            return False

    # -- key names -----------------------------------------------------------------------

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def _bk(self, batch_id: str, part: str) -> str:
        # One hash tag per batch keeps a batch's keys together on a Redis Cluster slot.
        return f"{self.prefix}:b:{{{batch_id}}}:{part}"

    # -- blobs ---------------------------------------------------------------------------

    async def put_blob(self, blob_id: str, data: bytes) -> None:
        # In pieces under a name of its own, then renamed into place: no one command holds Redis
        # (or outlasts the socket timeout) for a large body, and no reader sees half of it.
        key = self._k("blob", blob_id)
        partial = self._k("blob-partial", blob_id, uuid.uuid4().hex[:8])
        view = memoryview(data)
        async with self._io() as r:
            await r.set(partial, bytes(view[:BLOB_CHUNK]), ex=_PARTIAL_BLOB_S)
            for start in range(BLOB_CHUNK, len(view), BLOB_CHUNK):
                await r.append(partial, bytes(view[start : start + BLOB_CHUNK]))
            async with r.pipeline(transaction=True) as p:
                p.rename(partial, key)
                p.persist(key)
                await p.execute()

    async def get_blob(self, blob_id: str) -> bytes | None:
        parts = []
        start = 0
        while True:
            part = await self.read_blob(blob_id, start, BLOB_CHUNK)
            if part is None:
                return None
            parts.append(part)
            if len(part) < BLOB_CHUNK:
                return b"".join(parts)
            start += len(part)

    async def read_blob(self, blob_id: str, start: int, length: int) -> bytes | None:
        key = self._k("blob", blob_id)
        async with self._io() as r, r.pipeline(transaction=True) as p:
            p.exists(key)
            p.getrange(key, start, start + length - 1)
            exists, data = await p.execute()
        return _bytes(data) if exists else None

    async def delete_blob(self, blob_id: str) -> None:
        async with self._io() as r:
            await r.delete(self._k("blob", blob_id))

    # -- files ---------------------------------------------------------------------------

    def _file_keys(self, file_id: str, owner: str) -> list[str]:
        return [
            self._k("file", file_id),
            self._k("files", "by", owner),
            self._k("files", "expiry"),
            self._k("files", "usage", owner),
        ]

    async def put_file(self, record: FileRecord, limit: FileUsage | None = None) -> bool:
        expires = "" if record.expires_at is None else str(record.expires_at)
        args: list[str | bytes | int] = [record.id, _enc(asdict(record)), record.bytes, expires]
        args += [limit.files, limit.bytes] if limit is not None else [0, 0]
        async with self._io():
            keys = [*self._file_keys(record.id, record.owner), self._k("seq")]
            return bool(await self._put_file(keys=keys, args=args))

    async def file_usage(self, owner: str) -> FileUsage:
        async with self._io() as r:
            files, size = await r.hmget(self._k("files", "usage", owner), ["files", "bytes"])
        return FileUsage(max(0, int(files or 0)), max(0, int(size or 0)))

    async def get_file(self, file_id: str) -> FileRecord | None:
        async with self._io() as r:
            raw = await r.get(self._k("file", file_id))
        return None if raw is None else FileRecord(**orjson.loads(raw))

    async def delete_file(self, file_id: str) -> bool:
        record = await self.get_file(file_id)
        if record is None:
            return False
        async with self._io():
            return bool(await self._delete_file(keys=self._file_keys(file_id, record.owner), args=[file_id]))

    async def expired_files(self, now: int, limit: int) -> list[str]:
        async with self._io() as r:
            ids = await r.zrangebyscore(self._k("files", "expiry"), "-inf", now, start=0, num=limit)
        return [_text(i) for i in ids]

    async def _page_ids(self, index: str, after: str | None, limit: int, descending: bool) -> list[str]:
        """Ids of ``index`` from just after ``after`` (none when ``after`` is unknown), up to ``limit``."""
        async with self._io() as r:
            start = 0
            if after is not None:
                rank = await (r.zrevrank(index, after) if descending else r.zrank(index, after))
                if not isinstance(rank, int):
                    return []  # not in the index (None)
                start = rank + 1
            ids = await (r.zrevrange if descending else r.zrange)(index, start, start + limit - 1)
        return [_text(i) for i in ids]

    async def list_files(
        self, owner: str, after: str | None, limit: int, descending: bool = True, purpose: str | None = None
    ) -> Page:
        index = self._k("files", "by", owner)
        page = Page()
        cursor = after
        while len(page.items) <= limit:
            ids = await self._page_ids(index, cursor, max(limit, 100), descending)
            if not ids:
                break
            for file_id in ids:
                record = await self.get_file(file_id)
                if record is not None and (purpose is None or record.purpose == purpose):
                    page.items.append(record)
            cursor = ids[-1]
        page.has_more = len(page.items) > limit
        page.items = page.items[:limit]
        return page

    # -- batches -------------------------------------------------------------------------

    def _batch_key(self, batch_id: str) -> str:
        return self._k("batch", batch_id)

    async def create_batch(self, record: BatchRecord) -> None:
        fields = {name: _enc(value) for name, value in record.to_fields().items()}
        async with self._io() as r:
            seq = await r.incr(self._k("seq"))
            async with r.pipeline(transaction=True) as p:
                p.hset(self._batch_key(record.id), mapping=fields)  # type: ignore[arg-type]
                p.zadd(self._k("batches", "by", record.owner), {record.id: seq})
                p.zadd(self._k("batches", "active"), {record.id: seq})
                p.hincrby(self._k("batches", "status"), _enc(record.status).decode(), 1)
                await p.execute()

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        async with self._io() as r:
            raw = await r.hgetall(self._batch_key(batch_id))
        if not raw:
            return None
        # lease_* fields belong to lease_batch and are not JSON.
        fields = {_text(k): v for k, v in raw.items()}
        return BatchRecord.from_fields({k: orjson.loads(v) for k, v in fields.items() if not k.startswith("lease_")})

    async def list_batches(self, owner: str, after: str | None, limit: int) -> Page:
        ids = await self._page_ids(self._k("batches", "by", owner), after, limit + 1, True)
        records = [b for b in [await self.get_batch(i) for i in ids[:limit]] if b is not None]
        return Page(records, len(ids) > limit)

    async def update_batch(self, batch_id: str, expect: Sequence[str] | None = None, **changes: Any) -> bool:
        expected = [_enc(s) for s in expect or ()]
        args: list[Any] = [batch_id, "1" if changes.get("status") in TERMINAL else "0", len(expected), *expected]
        for name, value in changes.items():
            args += [name, _enc(value)]
        keys = [self._batch_key(batch_id), self._k("batches", "status"), self._k("batches", "active")]
        async with self._io():
            return bool(await self._update(keys=keys, args=args))

    async def active_batches(self) -> list[str]:
        async with self._io() as r:
            return [_text(i) for i in await r.zrange(self._k("batches", "active"), 0, -1)]

    async def batch_status_counts(self) -> dict[str, int]:
        async with self._io() as r:
            raw = await r.hgetall(self._k("batches", "status"))
        return {orjson.loads(k): int(v) for k, v in raw.items() if int(v) > 0}

    async def lease_batch(self, batch_id: str, statuses: Sequence[str], claimant: str, lease_s: float) -> bool:
        args: list[str | bytes | int] = [claimant, int(lease_s * 1000), *(_enc(s) for s in statuses)]
        async with self._io():
            return bool(await self._lease(keys=[self._batch_key(batch_id)], args=args))

    # -- batch lines ---------------------------------------------------------------------

    def _line_keys(self, batch_id: str) -> dict[str, str]:
        parts = ("lines", "pending", "leases", "owners", "attempts", "results")
        return {part: self._bk(batch_id, part) for part in parts}

    async def load_lines(self, batch_id: str, lines: Sequence[Line]) -> None:
        keys = self._line_keys(batch_id)
        async with self._io() as r:
            await r.delete(*keys.values())
            for start in range(0, len(lines), 2000):
                chunk = lines[start : start + 2000]
                async with r.pipeline(transaction=False) as p:
                    p.hset(keys["lines"], mapping={str(x.index): _line_value(x.custom_id, x.body) for x in chunk})
                    p.zadd(keys["pending"], {str(x.index): x.position for x in chunk})
                    await p.execute()

    async def claim_lines(self, batch_id: str, claimant: str, n: int, lease_s: float) -> list[Claim]:
        if n <= 0:
            return []
        k = self._line_keys(batch_id)
        keys = [self._batch_key(batch_id), k["pending"], k["leases"], k["owners"], k["lines"]]
        async with self._io():
            raw = await self._claim(keys=keys, args=[claimant, n, int(lease_s * 1000), _enc(IN_PROGRESS)])
        claims = []
        for i in range(0, len(raw), 2):
            custom_id, body = _split_line(raw[i + 1])
            claims.append(Claim(int(raw[i]), custom_id, body))
        return claims

    async def renew_lines(self, batch_id: str, claimant: str, indexes: Sequence[int], lease_s: float) -> int:
        if not indexes:
            return 0
        k = self._line_keys(batch_id)
        async with self._io():
            return int(
                await self._renew(
                    keys=[k["leases"], k["owners"]], args=[claimant, int(lease_s * 1000), *map(str, indexes)]
                )
            )

    async def defer_line(self, batch_id: str, claimant: str, index: int, delay_s: float) -> int:
        k = self._line_keys(batch_id)
        async with self._io():
            return int(
                await self._defer(
                    keys=[k["leases"], k["owners"], k["attempts"]], args=[str(index), claimant, int(delay_s * 1000)]
                )
            )

    async def complete_line(self, batch_id: str, index: int, custom_id: str, ok: bool, line: bytes) -> bool:
        k = self._line_keys(batch_id)
        keys = [k["results"], k["leases"], k["owners"], self._batch_key(batch_id), k["pending"]]
        value = f"{index} {int(ok)} ".encode() + line
        args = [str(index), custom_id, value, "completed" if ok else "failed", *_TERMINAL_JSON]
        async with self._io():
            return bool(await self._complete(keys=keys, args=args))

    async def line_counts(self, batch_id: str) -> LineCounts:
        k = self._line_keys(batch_id)
        async with self._io():
            pending, live, stale = await self._line_counts(keys=[k["pending"], k["leases"]], args=[])
        return LineCounts(int(pending), int(live), int(stale))

    async def results(self, batch_id: str) -> list[Result]:
        async with self._io() as r:
            raw = await r.hgetall(self._bk(batch_id, "results"))
        out = []
        for value in raw.values():
            index, ok, line = _bytes(value).split(b" ", 2)
            out.append(Result(int(index), ok == b"1", line))
        out.sort(key=lambda x: x.index)
        return out

    async def unfinished_lines(self, batch_id: str) -> list[tuple[int, str]]:
        async with self._io() as r:
            lines = await r.hgetall(self._bk(batch_id, "lines"))
            done = {_text(k) for k in await r.hkeys(self._bk(batch_id, "results"))}
        out = []
        for index, value in lines.items():
            custom_id, _ = _split_line(_bytes(value))
            if custom_id not in done:
                out.append((int(index), custom_id))
        return sorted(out)

    async def drop_lines(self, batch_id: str) -> None:
        async with self._io() as r:
            await r.delete(*self._line_keys(batch_id).values())
            await r.hdel(self._batch_key(batch_id), "lease_until", "lease_owner", "lease_status")

    # -- API keys ------------------------------------------------------------------------

    async def put_key(self, key: ApiKey) -> None:
        async with self._io() as r, r.pipeline(transaction=True) as p:
            p.set(self._k("key", key.id), _enc(asdict(key)))
            p.sadd(self._k("keys"), key.id)
            if key.active:
                p.sadd(self._k("keys", "active"), key.id)
            else:
                p.srem(self._k("keys", "active"), key.id)
            await p.execute()

    async def get_key(self, key_id: str) -> ApiKey | None:
        async with self._io() as r:
            raw = await r.get(self._k("key", key_id))
        return None if raw is None else ApiKey(**orjson.loads(raw))

    async def list_keys(self) -> list[ApiKey]:
        async with self._io() as r:
            ids = sorted(_text(i) for i in await r.smembers(self._k("keys")))
            raws = await r.mget([self._k("key", i) for i in ids]) if ids else []
        keys = [ApiKey(**orjson.loads(raw)) for raw in raws if raw is not None]
        return sorted(keys, key=lambda k: (k.created_at, k.id))

    async def revoke_key(self, key_id: str, at: int) -> bool:
        key = await self.get_key(key_id)
        if key is None or not key.active:
            return False
        key.revoked_at = at
        await self.put_key(key)
        return True

    async def active_key_count(self) -> int:
        async with self._io() as r:
            return int(await r.scard(self._k("keys", "active")))

    # -- rate limits ---------------------------------------------------------------------

    async def rate_hit(self, key_id: str, rpm: int | None, tpm: int | None, tokens: int) -> RateDecision:
        args = [int(RATE_WINDOW_S * 1000), rpm or 0, tpm or 0, tokens]
        async with self._io():
            allowed, wait, kind = await self._rate_hit(keys=[self._k("rl", key_id)], args=args)
        if int(allowed):
            return RateDecision(True)
        return RateDecision(False, float(wait), kind.decode() if isinstance(kind, bytes) else str(kind))

    async def rate_charge(self, key_id: str, tokens: int) -> None:
        if tokens == 0:
            return
        async with self._io():
            await self._rate_charge(keys=[self._k("rl", key_id)], args=[int(RATE_WINDOW_S * 1000), tokens])
