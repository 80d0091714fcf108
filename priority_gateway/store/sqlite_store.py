"""The SQLite store: the embedded default, durable on one node with nothing to set up (``store: sqlite``).

Rules:
- One database file, ``<data_dir>/gateway.db`` (``sqlite://PATH`` names another), in WAL mode with
  ``synchronous=NORMAL``: a committed change survives the gateway being killed (``kill -9``, a
  crash); a power cut may lose the last moment of changes, as Redis' ``appendfsync everysec`` does.
- Every call runs on one worker thread that owns the connection, so no disk write and no wait for
  another process's lock ever blocks the event loop; each call is one transaction (``BEGIN
  IMMEDIATE`` when it writes), so it is atomic for this process and for every other one on the
  file (``gateway keys`` while the gateway runs, even a second gateway: SQLite's locks keep the
  file whole, and claims, leases and results keep the contract between them).
- A lock held by another process longer than ``BUSY_TIMEOUT_S``, a full disk or an unreadable
  file surface as ``StoreUnavailable``, as an unreachable Redis does.
- Lines: ``state`` 0 pending (dispatch order ``position``), 1 claimed (``lease_until``, ``owner``;
  a deferred line keeps its lease time and loses its owner), 2 done. Results are keyed by
  (batch, ``custom_id``): the first write wins.
- Leases and rate windows use the wall clock, so a lease taken before a restart still runs out
  after it (the monotonic clock starts again with the process).
- With ``keys.file`` set, API keys stay in that JSON file, as with ``store: memory``.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, TypeVar

import orjson

from priority_gateway.store.base import RATE_WINDOW_S, StoreUnavailable
from priority_gateway.store.memory import KeyFile, sliding_window
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

T = TypeVar("T")

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 5.0
PENDING, CLAIMED, DONE = 0, 1, 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (id TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL, owner TEXT NOT NULL, purpose TEXT NOT NULL,
    expires_at INTEGER, record BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS files_by_owner ON files (owner, seq);
CREATE INDEX IF NOT EXISTS files_by_expiry ON files (expires_at, id) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS file_usage (owner TEXT PRIMARY KEY, files INTEGER NOT NULL, bytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL, owner TEXT NOT NULL, status TEXT NOT NULL,
    record BLOB NOT NULL, lease_until REAL, lease_owner TEXT, lease_status TEXT);
CREATE INDEX IF NOT EXISTS batches_by_owner ON batches (owner, seq);
CREATE INDEX IF NOT EXISTS batches_by_status ON batches (status, seq);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, idx INTEGER NOT NULL, position INTEGER NOT NULL, custom_id TEXT NOT NULL,
    body BLOB NOT NULL, state INTEGER NOT NULL, lease_until REAL, owner TEXT, attempts INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, idx)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS lines_pending ON lines (batch_id, state, position);
CREATE INDEX IF NOT EXISTS lines_leased ON lines (batch_id, state, lease_until);
CREATE TABLE IF NOT EXISTS results (
    batch_id TEXT NOT NULL, custom_id TEXT NOT NULL, idx INTEGER NOT NULL, ok INTEGER NOT NULL, line BLOB NOT NULL,
    PRIMARY KEY (batch_id, custom_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS api_keys (id TEXT PRIMARY KEY, active INTEGER NOT NULL, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS rates (
    key_id TEXT NOT NULL, kind TEXT NOT NULL, window INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (key_id, kind, window)) WITHOUT ROWID;
"""

_TERMINAL = tuple(sorted(TERMINAL))
_NOT_TERMINAL = f"status NOT IN ({', '.join('?' * len(_TERMINAL))})"


def default_data_dir() -> Path:
    """``$XDG_STATE_HOME/priority-gateway``, else ``~/.local/state/priority-gateway``."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "priority-gateway"


def database_path(url: str, data_dir: str | None) -> Path:
    """The file of ``store: sqlite`` (in ``data_dir``) or ``sqlite://PATH``."""
    if url.startswith("sqlite://"):
        return Path(url.removeprefix("sqlite://")).expanduser()
    return (Path(data_dir).expanduser() if data_dir else default_data_dir()) / "gateway.db"


def _batch(row: sqlite3.Row | tuple[Any, ...]) -> BatchRecord:
    return BatchRecord.from_fields(orjson.loads(row[0]))


class SqliteStore:
    def __init__(
        self, path: str | Path, keys_file: str | Path | None = None, busy_timeout_s: float = BUSY_TIMEOUT_S
    ) -> None:
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self._key_file = KeyFile(keys_file) if keys_file else None
        self._db: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None

    # -- the worker thread ---------------------------------------------------------------

    async def _call(self, work: Callable[[sqlite3.Connection], T], write: bool = False) -> T:
        if self._thread is None:
            raise RuntimeError("the store is not open")
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._run, work, write)

    def _run(self, work: Callable[[sqlite3.Connection], T], write: bool) -> T:
        db = self._db
        if db is None:
            raise RuntimeError("the store is not open")
        try:
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                result = work(db)
            except BaseException:
                db.rollback()
                raise
            db.commit()
            return result
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"sqlite {self.path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:  # a damaged or foreign file
            raise StoreUnavailable(f"sqlite {self.path}: {exc}") from exc

    def _connect(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailable(
                f"cannot open the store's file {self.path}: {exc} (data_dir, or GATEWAY__DATA_DIR, names a "
                "writable directory; store: sqlite://PATH a file)"
            ) from exc
        try:
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise StoreUnavailable(f"sqlite {self.path}: WAL mode refused (journal_mode {mode}); use a local disk")
            db.execute("PRAGMA synchronous=NORMAL")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreUnavailable(
                    f"sqlite {self.path} was written by a newer gateway "
                    f"(schema {version}, this one reads {SCHEMA_VERSION})"
                )
            db.executescript(_SCHEMA)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.Error as exc:
            db.close()
            raise StoreUnavailable(f"sqlite {self.path}: {exc}") from exc
        except StoreUnavailable:
            db.close()
            raise
        self._db = db

    async def open(self) -> None:
        if self._thread is not None:
            return
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        try:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._connect)
        except BaseException:
            self._thread.shutdown(wait=False)
            self._thread = None
            raise

    async def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return

        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await asyncio.get_running_loop().run_in_executor(thread, shut)
        thread.shutdown(wait=False)

    async def ping(self) -> bool:
        try:
            return await self._call(lambda db: db.execute("SELECT 1").fetchone()[0] == 1)
        except StoreUnavailable:
            return False

    @staticmethod
    def _next_seq(db: sqlite3.Connection) -> int:
        db.execute(
            "INSERT INTO counters (name, value) VALUES ('seq', 1) ON CONFLICT (name) DO UPDATE SET value = value + 1"
        )
        return int(db.execute("SELECT value FROM counters WHERE name = 'seq'").fetchone()[0])

    # -- blobs ---------------------------------------------------------------------------

    async def put_blob(self, blob_id: str, data: bytes) -> None:
        await self._call(lambda db: db.execute("INSERT OR REPLACE INTO blobs VALUES (?, ?)", (blob_id, data)), True)

    async def get_blob(self, blob_id: str) -> bytes | None:
        row = await self._call(lambda db: db.execute("SELECT data FROM blobs WHERE id = ?", (blob_id,)).fetchone())
        return None if row is None else bytes(row[0])

    async def read_blob(self, blob_id: str, start: int, length: int) -> bytes | None:
        # substr counts from 1; it reads the range without loading the whole blob.
        row = await self._call(
            lambda db: db.execute(
                "SELECT substr(data, ?, ?) FROM blobs WHERE id = ?", (start + 1, max(0, length), blob_id)
            ).fetchone()
        )
        return None if row is None else bytes(row[0] or b"")  # an empty blob's range is NULL

    async def delete_blob(self, blob_id: str) -> None:
        await self._call(lambda db: db.execute("DELETE FROM blobs WHERE id = ?", (blob_id,)), True)

    # -- files ---------------------------------------------------------------------------

    @staticmethod
    def _usage(db: sqlite3.Connection, owner: str) -> FileUsage:
        row = db.execute("SELECT files, bytes FROM file_usage WHERE owner = ?", (owner,)).fetchone()
        return FileUsage(max(0, row[0]), max(0, row[1])) if row else FileUsage()

    async def put_file(self, record: FileRecord, limit: FileUsage | None = None) -> bool:
        def put(db: sqlite3.Connection) -> bool:
            old = db.execute("SELECT seq, record FROM files WHERE id = ?", (record.id,)).fetchone()
            old_bytes = orjson.loads(old[1])["bytes"] if old else 0
            used = self._usage(db, record.owner)
            usage = FileUsage(used.files + (old is None), used.bytes + record.bytes - old_bytes)
            if limit is not None and (usage.files > limit.files or usage.bytes > limit.bytes):
                return False
            seq = old[0] if old else self._next_seq(db)
            db.execute(
                "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?)",
                (record.id, seq, record.owner, record.purpose, record.expires_at, orjson.dumps(asdict(record))),
            )
            db.execute("INSERT OR REPLACE INTO file_usage VALUES (?, ?, ?)", (record.owner, usage.files, usage.bytes))
            return True

        return await self._call(put, True)

    async def file_usage(self, owner: str) -> FileUsage:
        return await self._call(lambda db: self._usage(db, owner))

    async def get_file(self, file_id: str) -> FileRecord | None:
        row = await self._call(lambda db: db.execute("SELECT record FROM files WHERE id = ?", (file_id,)).fetchone())
        return None if row is None else FileRecord(**orjson.loads(row[0]))

    async def delete_file(self, file_id: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            row = db.execute("SELECT owner, record FROM files WHERE id = ?", (file_id,)).fetchone()
            if row is None:
                return False
            db.execute("DELETE FROM files WHERE id = ?", (file_id,))
            used = self._usage(db, row[0])
            size = orjson.loads(row[1])["bytes"]
            db.execute(
                "INSERT OR REPLACE INTO file_usage VALUES (?, ?, ?)",
                (row[0], max(0, used.files - 1), max(0, used.bytes - size)),
            )
            return True

        return await self._call(delete, True)

    async def expired_files(self, now: int, limit: int) -> list[str]:
        sql = "SELECT id FROM files WHERE expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at, id LIMIT ?"
        rows = await self._call(lambda db: db.execute(sql, (now, limit)).fetchall())
        return [row[0] for row in rows]

    async def list_files(
        self, owner: str, after: str | None, limit: int, descending: bool = True, purpose: str | None = None
    ) -> Page:
        where, args = "owner = ?", [owner]
        if purpose is not None:
            where, args = where + " AND purpose = ?", [*args, purpose]
        rows = await self._call(lambda db: _page(db, "files", where, args, after, limit, descending))
        return Page([FileRecord(**orjson.loads(row[0])) for row in rows[:limit]], len(rows) > limit)

    # -- batches -------------------------------------------------------------------------

    async def create_batch(self, record: BatchRecord) -> None:
        def create(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT OR REPLACE INTO batches (id, seq, owner, status, record) VALUES (?, ?, ?, ?, ?)",
                (record.id, self._next_seq(db), record.owner, record.status, orjson.dumps(record.to_fields())),
            )

        await self._call(create, True)

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        row = await self._call(lambda db: _get_batch(db, batch_id))
        return None if row is None else _batch(row)

    async def list_batches(self, owner: str, after: str | None, limit: int) -> Page:
        rows = await self._call(lambda db: _page(db, "batches", "owner = ?", [owner], after, limit, True))
        return Page([_batch(row) for row in rows[:limit]], len(rows) > limit)

    async def update_batch(self, batch_id: str, expect: Sequence[str] | None = None, **changes: Any) -> bool:
        def update(db: sqlite3.Connection) -> bool:
            row = _get_batch(db, batch_id)
            if row is None:
                return False
            record = _batch(row)
            if expect is not None and record.status not in expect:
                return False
            for name, value in changes.items():
                setattr(record, name, value)
            _put_batch(db, record)
            return True

        return await self._call(update, True)

    async def active_batches(self) -> list[str]:
        sql = f"SELECT id FROM batches WHERE {_NOT_TERMINAL} ORDER BY seq"
        return [row[0] for row in await self._call(lambda db: db.execute(sql, _TERMINAL).fetchall())]

    async def batch_status_counts(self) -> dict[str, int]:
        rows = await self._call(
            lambda db: db.execute("SELECT status, count(*) FROM batches GROUP BY status").fetchall()
        )
        return {status: n for status, n in rows}

    async def lease_batch(self, batch_id: str, statuses: Sequence[str], claimant: str, lease_s: float) -> bool:
        def lease(db: sqlite3.Connection) -> bool:
            row = db.execute(
                "SELECT status, lease_until, lease_status FROM batches WHERE id = ?", (batch_id,)
            ).fetchone()
            if row is None or row[0] not in statuses:
                return False
            now = time.time()
            if row[1] is not None and row[1] > now and row[2] == row[0]:
                return False
            db.execute(
                "UPDATE batches SET lease_until = ?, lease_owner = ?, lease_status = ? WHERE id = ?",
                (now + lease_s, claimant, row[0], batch_id),
            )
            return True

        return await self._call(lease, True)

    # -- batch lines ---------------------------------------------------------------------

    async def load_lines(self, batch_id: str, lines: Sequence[Line]) -> None:
        def load(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM lines WHERE batch_id = ?", (batch_id,))
            db.execute("DELETE FROM results WHERE batch_id = ?", (batch_id,))
            db.executemany(
                "INSERT INTO lines (batch_id, idx, position, custom_id, body, state) VALUES (?, ?, ?, ?, ?, ?)",
                ((batch_id, x.index, x.position, x.custom_id, x.body, PENDING) for x in lines),
            )

        await self._call(load, True)

    async def claim_lines(self, batch_id: str, claimant: str, n: int, lease_s: float) -> list[Claim]:
        if n <= 0:
            return []

        def claim(db: sqlite3.Connection) -> list[Claim]:
            row = db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None or row[0] != IN_PROGRESS:
                return []
            now = time.time()
            chosen = db.execute(
                "SELECT idx, custom_id, body FROM lines WHERE batch_id = ? AND state = ? AND lease_until <= ?"
                " ORDER BY lease_until, idx LIMIT ?",
                (batch_id, CLAIMED, now, n),
            ).fetchall()
            if len(chosen) < n:
                chosen += db.execute(
                    "SELECT idx, custom_id, body FROM lines WHERE batch_id = ? AND state = ? ORDER BY position LIMIT ?",
                    (batch_id, PENDING, n - len(chosen)),
                ).fetchall()
            db.executemany(
                "UPDATE lines SET state = ?, lease_until = ?, owner = ? WHERE batch_id = ? AND idx = ?",
                ((CLAIMED, now + lease_s, claimant, batch_id, idx) for idx, _, _ in chosen),
            )
            return [Claim(idx, custom_id, bytes(body)) for idx, custom_id, body in chosen]

        return await self._call(claim, True)

    async def renew_lines(self, batch_id: str, claimant: str, indexes: Sequence[int], lease_s: float) -> int:
        if not indexes:
            return 0

        def renew(db: sqlite3.Connection) -> int:
            until = time.time() + lease_s
            cursor = db.executemany(
                "UPDATE lines SET lease_until = ? WHERE batch_id = ? AND idx = ? AND state = ? AND owner = ?",
                ((until, batch_id, index, CLAIMED, claimant) for index in indexes),
            )
            return int(cursor.rowcount)

        return await self._call(renew, True)

    async def defer_line(self, batch_id: str, claimant: str, index: int, delay_s: float) -> int:
        def defer(db: sqlite3.Connection) -> int:
            row = db.execute(
                "UPDATE lines SET lease_until = ?, owner = NULL, attempts = attempts + 1"
                " WHERE batch_id = ? AND idx = ? AND state = ? AND owner = ? RETURNING attempts",
                (time.time() + delay_s, batch_id, index, CLAIMED, claimant),
            ).fetchone()
            return 0 if row is None else int(row[0])

        return await self._call(defer, True)

    async def complete_line(self, batch_id: str, index: int, custom_id: str, ok: bool, line: bytes) -> bool:
        def complete(db: sqlite3.Connection) -> bool:
            row = _get_batch(db, batch_id)
            if row is None:
                return False
            db.execute(
                "UPDATE lines SET state = ?, lease_until = NULL, owner = NULL WHERE batch_id = ? AND idx = ?",
                (DONE, batch_id, index),
            )
            record = _batch(row)
            if record.status in TERMINAL:
                return False
            inserted = db.execute(
                "INSERT OR IGNORE INTO results VALUES (?, ?, ?, ?, ?)", (batch_id, custom_id, index, int(ok), line)
            ).rowcount
            if not inserted:
                return False
            if ok:
                record.completed += 1
            else:
                record.failed += 1
            _put_batch(db, record)
            return True

        return await self._call(complete, True)

    async def line_counts(self, batch_id: str) -> LineCounts:
        def counts(db: sqlite3.Connection) -> LineCounts:
            now = time.time()
            pending, live, stale = db.execute(
                "SELECT count(*) FILTER (WHERE state = ?), count(*) FILTER (WHERE state = ? AND lease_until > ?),"
                " count(*) FILTER (WHERE state = ? AND lease_until <= ?) FROM lines WHERE batch_id = ?",
                (PENDING, CLAIMED, now, CLAIMED, now, batch_id),
            ).fetchone()
            return LineCounts(pending, live, stale)

        return await self._call(counts)

    async def results(self, batch_id: str) -> list[Result]:
        sql = "SELECT idx, ok, line FROM results WHERE batch_id = ? ORDER BY idx"
        rows = await self._call(lambda db: db.execute(sql, (batch_id,)).fetchall())
        return [Result(idx, bool(ok), bytes(line)) for idx, ok, line in rows]

    async def unfinished_lines(self, batch_id: str) -> list[tuple[int, str]]:
        sql = (
            "SELECT idx, custom_id FROM lines WHERE batch_id = ? AND custom_id NOT IN"
            " (SELECT custom_id FROM results WHERE batch_id = ?) ORDER BY idx"
        )
        rows = await self._call(lambda db: db.execute(sql, (batch_id, batch_id)).fetchall())
        return [(idx, custom_id) for idx, custom_id in rows]

    async def drop_lines(self, batch_id: str) -> None:
        def drop(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM lines WHERE batch_id = ?", (batch_id,))
            db.execute("DELETE FROM results WHERE batch_id = ?", (batch_id,))
            db.execute(
                "UPDATE batches SET lease_until = NULL, lease_owner = NULL, lease_status = NULL WHERE id = ?",
                (batch_id,),
            )

        await self._call(drop, True)

    # -- API keys ------------------------------------------------------------------------

    async def put_key(self, key: ApiKey) -> None:
        if self._key_file is not None:
            keys = dict(self._key_file.load())
            keys[key.id] = replace(key)
            self._key_file.save(keys)
            return
        await self._call(
            lambda db: db.execute(
                "INSERT OR REPLACE INTO api_keys VALUES (?, ?, ?)",
                (key.id, int(key.active), orjson.dumps(asdict(key))),
            ),
            True,
        )

    async def get_key(self, key_id: str) -> ApiKey | None:
        if self._key_file is not None:
            key = self._key_file.load().get(key_id)
            return None if key is None else replace(key)
        row = await self._call(lambda db: db.execute("SELECT record FROM api_keys WHERE id = ?", (key_id,)).fetchone())
        return None if row is None else ApiKey(**orjson.loads(row[0]))

    async def list_keys(self) -> list[ApiKey]:
        if self._key_file is not None:
            keys = [replace(k) for k in self._key_file.load().values()]
        else:
            rows = await self._call(lambda db: db.execute("SELECT record FROM api_keys").fetchall())
            keys = [ApiKey(**orjson.loads(row[0])) for row in rows]
        return sorted(keys, key=lambda k: (k.created_at, k.id))

    async def revoke_key(self, key_id: str, at: int) -> bool:
        key = await self.get_key(key_id)
        if key is None or not key.active:
            return False
        await self.put_key(replace(key, revoked_at=at))
        return True

    async def active_key_count(self) -> int:
        if self._key_file is not None:
            return sum(1 for k in self._key_file.load().values() if k.active)
        return int(await self._call(lambda db: db.execute("SELECT count(*) FROM api_keys WHERE active").fetchone()[0]))

    # -- rate limits ---------------------------------------------------------------------

    async def rate_hit(self, key_id: str, rpm: int | None, tpm: int | None, tokens: int) -> RateDecision:
        def hit(db: sqlite3.Connection) -> RateDecision:
            now = time.time()
            window = int(now // RATE_WINDOW_S)
            rows = db.execute(
                "SELECT kind, window, count FROM rates WHERE key_id = ? AND window >= ?", (key_id, window - 1)
            ).fetchall()
            counts: dict[tuple[str, int], int] = {(kind, w): c for kind, w, c in rows}
            before = dict(counts)
            decision = sliding_window(now, counts, {"rpm": (rpm, 1), "tpm": (tpm, tokens)})
            db.executemany(
                "INSERT OR REPLACE INTO rates VALUES (?, ?, ?, ?)",
                ((key_id, kind, w, c) for (kind, w), c in counts.items() if before.get((kind, w)) != c),
            )
            db.execute("DELETE FROM rates WHERE key_id = ? AND window < ?", (key_id, window - 1))
            return decision

        return await self._call(hit, True)

    async def rate_charge(self, key_id: str, tokens: int) -> None:
        """``tokens`` more (or, negative, a refund that never takes the window below 0)."""
        if tokens == 0:
            return
        window = int(time.time() // RATE_WINDOW_S)
        await self._call(
            lambda db: db.execute(
                "INSERT INTO rates VALUES (?, 'tpm', ?, max(0, ?))"
                " ON CONFLICT (key_id, kind, window) DO UPDATE SET count = max(0, count + ?)",
                (key_id, window, tokens, tokens),
            ),
            True,
        )


def _get_batch(db: sqlite3.Connection, batch_id: str) -> tuple[Any, ...] | None:
    row: tuple[Any, ...] | None = db.execute("SELECT record FROM batches WHERE id = ?", (batch_id,)).fetchone()
    return row


def _put_batch(db: sqlite3.Connection, record: BatchRecord) -> None:
    db.execute(
        "UPDATE batches SET status = ?, record = ? WHERE id = ?",
        (record.status, orjson.dumps(record.to_fields()), record.id),
    )


def _page(
    db: sqlite3.Connection, table: str, where: str, args: list[Any], after: str | None, limit: int, descending: bool
) -> list[tuple[Any, ...]]:
    """Up to ``limit + 1`` records of ``table`` matching ``where`` that follow ``after`` in ``seq`` order
    (none when ``after`` is not one of them)."""
    if after is not None:
        row = db.execute(f"SELECT seq FROM {table} WHERE id = ? AND {where}", [after, *args]).fetchone()
        if row is None:
            return []
        where, args = where + (" AND seq < ?" if descending else " AND seq > ?"), [*args, row[0]]
    order = "DESC" if descending else "ASC"
    rows: list[tuple[Any, ...]] = db.execute(
        f"SELECT record FROM {table} WHERE {where} ORDER BY seq {order} LIMIT ?", [*args, limit + 1]
    ).fetchall()
    return rows
