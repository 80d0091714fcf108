"""The SQLite store beyond the contract: what it keeps across a reopen, and other processes on its file."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys

import pytest

from priority_gateway.store import SqliteStore, StoreUnavailable
from priority_gateway.store.records import IN_PROGRESS, ApiKey, BatchRecord, FileRecord, Line

CLAIMANT = """
import asyncio, pathlib, sys
from priority_gateway.store import SqliteStore

async def main(path, name):
    store = SqliteStore(path)
    await store.open()
    # Both start claiming together: each waits for the other's mark.
    pathlib.Path(path + "." + name).touch()
    while len(list(pathlib.Path(path).parent.glob("*.db.?"))) < 2:
        await asyncio.sleep(0.01)
    got = []
    while claims := await store.claim_lines("batch_1", name, 3, 30):
        for c in claims:
            await store.complete_line("batch_1", c.index, c.custom_id, True, name.encode())
            got.append(c.index)
        await asyncio.sleep(0.005)  # the lines' work, while the other process claims
    await store.close()
    print(" ".join(map(str, got)))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def running(store: SqliteStore, n: int) -> None:
    await store.create_batch(BatchRecord("batch_1", "k", "/v1/completions", "f", "24h", 1, 2, status=IN_PROGRESS))
    await store.load_lines("batch_1", [Line(i, i, f"c{i}", b"{}") for i in range(n)])


async def test_everything_is_there_after_a_reopen_and_leases_still_run_out(tmp_path):
    path = tmp_path / "gateway.db"
    store = SqliteStore(path)
    await store.open()
    await running(store, 3)
    await store.put_file(FileRecord("file-1", "k", "in.jsonl", "batch", 5, 1))
    await store.put_blob("file-1", b"hello")
    await store.put_key(ApiKey("key-1", "ci", "h", ["batch"], "batch", 1))
    [claim] = await store.claim_lines("batch_1", "before", 1, 0.2)
    await store.complete_line("batch_1", 1, "c1", True, b"done")
    await store.close()

    again = SqliteStore(path)
    await again.open()
    try:
        assert (await again.get_batch("batch_1")).completed == 1
        assert await again.get_blob("file-1") == b"hello" and (await again.get_file("file-1")).bytes == 5
        assert [k.id for k in await again.list_keys()] == ["key-1"]
        assert (await again.line_counts("batch_1")).pending == 1
        await asyncio.sleep(0.3)  # the claim taken before the restart runs out after it
        taken = await again.claim_lines("batch_1", "after", 5, 30)
        assert sorted(c.index for c in taken) == [claim.index, 2]
    finally:
        await again.close()


def test_two_processes_on_one_file_share_the_lines_without_losing_or_repeating_one(tmp_path):
    path = tmp_path / "gateway.db"

    async def setup() -> None:
        store = SqliteStore(path)
        await store.open()
        await running(store, 300)
        await store.close()

    asyncio.run(setup())
    procs = [
        subprocess.Popen([sys.executable, "-c", CLAIMANT, str(path), name], stdout=subprocess.PIPE, text=True)
        for name in ("a", "b")
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    got = [int(i) for out in outputs for i in out.split()]
    assert sorted(got) == list(range(300)), "every line exactly once"
    assert all(out.split() for out in outputs), f"both processes worked: {outputs}"
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT count(*) FROM results").fetchone()[0] == 300


async def test_a_lock_held_by_another_process_never_stalls_the_event_loop_and_ends_as_unavailable(tmp_path):
    path = tmp_path / "gateway.db"
    store = SqliteStore(path, busy_timeout_s=1.0)
    await store.open()
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process's write transaction
        write = asyncio.create_task(store.put_blob("b", b"x"))
        ticked = asyncio.Event()
        asyncio.get_running_loop().call_soon(ticked.set)
        await ticked.wait()
        assert not write.done(), "the write waits for the lock off the event loop"
        with pytest.raises(StoreUnavailable, match="locked"):
            await write
        assert await store.ping()  # reads still go (WAL)
        other.execute("ROLLBACK")
        await store.put_blob("b", b"y")
        assert await store.get_blob("b") == b"y"
    finally:
        other.close()
        await store.close()


async def test_a_data_directory_that_cannot_be_written_is_one_clear_error(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    store = SqliteStore(blocked / "gateway.db")
    with pytest.raises(StoreUnavailable, match="cannot open the store's file"):
        await store.open()
