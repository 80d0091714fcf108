"""One contract, three backends: every test runs against the in-process, the SQLite and the Redis store."""

from __future__ import annotations

import asyncio

from priority_gateway.store.base import BLOB_CHUNK
from priority_gateway.store.records import (
    CANCELLING,
    COMPLETED,
    FINALIZING,
    IN_PROGRESS,
    VALIDATING,
    ApiKey,
    BatchRecord,
    FileRecord,
    FileUsage,
    Line,
)


def file(i: int, owner: str = "k1", purpose: str = "batch") -> FileRecord:
    return FileRecord(f"file-{i}", owner, f"in{i}.jsonl", purpose, 10 * i, 1000 + i)


def batch(i: int, owner: str = "k1", status: str = VALIDATING) -> BatchRecord:
    return BatchRecord(f"batch_{i}", owner, "/v1/chat/completions", "file-x", "24h", 1000 + i, 90000, status=status)


async def running_batch(store, n: int, batch_id: str = "batch_1") -> None:
    await store.create_batch(BatchRecord(batch_id, "k1", "/v1/completions", "file-x", "24h", 1, 2, status=IN_PROGRESS))
    # Positions reverse the input order: claims must follow positions, not indexes.
    await store.load_lines(batch_id, [Line(i, n - i, f"c{i}", b'{"i":%d}' % i) for i in range(n)])


# -- files and blobs ---------------------------------------------------------------------------


async def test_blobs_are_read_whole_or_in_ranges_and_large_ones_round_trip(store):
    data = bytes(range(256)) * (4096 * 3 + 7)  # three pieces and some
    await store.put_blob("file-big", data)
    assert await store.get_blob("file-big") == data
    assert await store.read_blob("file-big", 0, 10) == data[:10]
    assert await store.read_blob("file-big", BLOB_CHUNK - 3, 6) == data[BLOB_CHUNK - 3 : BLOB_CHUNK + 3]
    assert await store.read_blob("file-big", len(data) - 4, 100) == data[-4:]
    assert await store.read_blob("file-big", len(data), 100) == b""
    await store.put_blob("file-empty", b"")
    assert await store.get_blob("file-empty") == b"" and await store.read_blob("file-empty", 0, 5) == b""
    assert await store.read_blob("file-none", 0, 5) is None and await store.get_blob("file-none") is None
    await store.put_blob("file-big", b"again")
    assert await store.get_blob("file-big") == b"again"
    await store.delete_blob("file-big")
    assert await store.read_blob("file-big", 0, 5) is None


async def test_files_are_listed_newest_first_per_owner_with_pagination(store):
    for i in range(5):
        await store.put_file(file(i))
    await store.put_file(file(9, owner="k2"))
    first = await store.list_files("k1", None, 2)
    assert [f.id for f in first.items] == ["file-4", "file-3"] and first.has_more
    second = await store.list_files("k1", "file-3", 2)
    assert [f.id for f in second.items] == ["file-2", "file-1"] and second.has_more
    last = await store.list_files("k1", "file-1", 2)
    assert [f.id for f in last.items] == ["file-0"] and not last.has_more
    ascending = await store.list_files("k1", None, 10, descending=False)
    assert [f.id for f in ascending.items] == [f"file-{i}" for i in range(5)]
    assert [f.id for f in (await store.list_files("k2", None, 10)).items] == ["file-9"]


async def test_files_filter_by_purpose_and_delete(store):
    await store.put_file(file(1))
    await store.put_file(file(2, purpose="batch_output"))
    await store.put_file(file(3))
    page = await store.list_files("k1", None, 1, purpose="batch")
    assert [f.id for f in page.items] == ["file-3"] and page.has_more
    assert (await store.get_file("file-2")).purpose == "batch_output"
    assert await store.delete_file("file-2")
    assert not await store.delete_file("file-2")
    assert await store.get_file("file-2") is None
    assert [f.id for f in (await store.list_files("k1", None, 10)).items] == ["file-3", "file-1"]


async def test_expired_files_come_due_in_expiry_order_until_deleted(store):
    for i, expires_at in ((1, 2050), (2, 2010), (3, None), (4, 5000)):
        record = file(i)
        record.expires_at = expires_at
        await store.put_file(record)
    assert await store.expired_files(1999, 10) == []
    assert await store.expired_files(2050, 10) == ["file-2", "file-1"]
    assert await store.expired_files(9999, 1) == ["file-2"]
    assert (await store.get_file("file-4")).expires_at == 5000
    await store.delete_file("file-2")
    assert await store.expired_files(9999, 10) == ["file-1", "file-4"]


async def test_files_count_against_their_owner_and_a_limit_refuses_whole(store):
    limit = FileUsage(files=3, bytes=65)
    assert await store.put_file(file(1), limit) and await store.put_file(file(2), limit)
    assert await store.file_usage("k1") == FileUsage(2, 30)
    assert not await store.put_file(file(4), limit)  # 70 bytes
    assert await store.get_file("file-4") is None and await store.file_usage("k1") == FileUsage(2, 30)
    assert await store.put_file(file(3), limit)
    assert not await store.put_file(file(0), limit)  # a fourth file
    # Written again (a retried finalisation), a file counts its change in size only.
    assert await store.put_file(file(3))
    bigger = file(3)
    bigger.bytes = 35
    assert await store.put_file(bigger, limit)
    assert await store.file_usage("k1") == FileUsage(3, 65)
    assert await store.put_file(file(5, owner="k2"), limit)
    assert await store.file_usage("k2") == FileUsage(1, 50)
    assert await store.delete_file("file-3") and not await store.delete_file("file-3")
    assert await store.file_usage("k1") == FileUsage(2, 30)
    assert await store.file_usage("nobody") == FileUsage(0, 0)


async def test_blobs_round_trip(store):
    await store.put_blob("file-a", b"x" * 1000)
    assert await store.get_blob("file-a") == b"x" * 1000
    await store.delete_blob("file-a")
    assert await store.get_blob("file-a") is None


# -- batches -----------------------------------------------------------------------------------


async def test_batches_round_trip_and_list_newest_first(store):
    for i in range(3):
        await store.create_batch(batch(i))
    record = batch(7)
    record.metadata = {"job": "nightly"}
    await store.create_batch(record)
    got = await store.get_batch("batch_7")
    assert got == record
    page = await store.list_batches("k1", None, 2)
    assert [b.id for b in page.items] == ["batch_7", "batch_2"] and page.has_more
    page = await store.list_batches("k1", "batch_2", 5)
    assert [b.id for b in page.items] == ["batch_1", "batch_0"] and not page.has_more
    assert (await store.list_batches("k2", None, 5)).items == []
    assert await store.get_batch("batch_nope") is None


async def test_update_batch_compares_status_and_terminal_leaves_active(store):
    await store.create_batch(batch(1))
    await store.create_batch(batch(2))
    assert not await store.update_batch("batch_1", expect=[IN_PROGRESS], status=FINALIZING)
    assert await store.update_batch("batch_1", expect=[VALIDATING], status=IN_PROGRESS, in_progress_at=5, total=3)
    got = await store.get_batch("batch_1")
    assert (got.status, got.in_progress_at, got.total) == (IN_PROGRESS, 5, 3)
    assert await store.batch_status_counts() == {VALIDATING: 1, IN_PROGRESS: 1}
    assert await store.update_batch("batch_1", status=COMPLETED, errors=[{"code": "x", "line": 1}])
    assert (await store.get_batch("batch_1")).errors == [{"code": "x", "line": 1}]
    assert await store.active_batches() == ["batch_2"]
    assert await store.batch_status_counts() == {VALIDATING: 1, COMPLETED: 1}
    assert not await store.update_batch("batch_missing", status=COMPLETED)


async def test_batch_lease_is_exclusive_until_it_runs_out(store):
    await store.create_batch(batch(1))
    assert await store.lease_batch("batch_1", [VALIDATING], "1e5", 0.3)
    assert not await store.lease_batch("batch_1", [VALIDATING], "b", 0.3)
    assert (await store.get_batch("batch_1")).status == VALIDATING
    assert not await store.lease_batch("batch_1", [FINALIZING], "b", 0.3)
    await asyncio.sleep(0.35)
    assert await store.lease_batch("batch_1", [VALIDATING], "b", 0.3)
    await store.update_batch("batch_1", status=FINALIZING)
    assert await store.lease_batch("batch_1", [FINALIZING], "a", 30), "a lease ends with the status it was taken in"


# -- lines -------------------------------------------------------------------------------------


async def test_claims_follow_positions_and_only_while_in_progress(store):
    await running_batch(store, 5)
    first = await store.claim_lines("batch_1", "a", 2, 10)
    assert [c.index for c in first] == [4, 3]
    assert (first[0].custom_id, first[0].body) == ("c4", b'{"i":4}')
    counts = await store.line_counts("batch_1")
    assert (counts.pending, counts.live, counts.stale) == (3, 2, 0)
    await store.update_batch("batch_1", status=CANCELLING)
    assert await store.claim_lines("batch_1", "a", 2, 10) == []


async def test_an_expired_claim_is_taken_over_and_only_the_owner_renews(store):
    await running_batch(store, 3)
    [claim] = await store.claim_lines("batch_1", "dead", 1, 0.2)
    assert await store.renew_lines("batch_1", "other", [claim.index], 0.2) == 0
    assert await store.renew_lines("batch_1", "dead", [claim.index], 0.2) == 1
    await asyncio.sleep(0.3)
    assert (await store.line_counts("batch_1")).stale == 1
    taken = await store.claim_lines("batch_1", "alive", 2, 10)
    assert [c.index for c in taken] == [claim.index, 1]
    assert await store.renew_lines("batch_1", "dead", [claim.index], 10) == 0
    assert await store.defer_line("batch_1", "dead", claim.index, 0) == 0


async def test_deferred_lines_come_back_after_their_delay(store):
    await running_batch(store, 2)
    [claim] = await store.claim_lines("batch_1", "a", 1, 10)
    assert await store.defer_line("batch_1", "a", claim.index, 0.3) == 1
    assert [c.index for c in await store.claim_lines("batch_1", "a", 5, 10)] == [0]
    assert await store.claim_lines("batch_1", "a", 5, 10) == []
    await asyncio.sleep(0.35)
    again = await store.claim_lines("batch_1", "b", 5, 10)
    assert [c.index for c in again] == [claim.index]
    assert await store.defer_line("batch_1", "b", claim.index, 0.1) == 2


async def test_results_are_written_once_per_custom_id(store):
    await running_batch(store, 3)
    claims = await store.claim_lines("batch_1", "a", 3, 10)
    assert await store.complete_line("batch_1", claims[0].index, claims[0].custom_id, True, b"first")
    assert not await store.complete_line("batch_1", claims[0].index, claims[0].custom_id, False, b"second")
    assert await store.complete_line("batch_1", claims[1].index, claims[1].custom_id, False, b"bad")
    record = await store.get_batch("batch_1")
    assert (record.completed, record.failed) == (1, 1)
    results = await store.results("batch_1")
    assert [(r.index, r.ok, r.line) for r in results] == [(1, False, b"bad"), (2, True, b"first")]
    assert await store.unfinished_lines("batch_1") == [(0, "c0")]
    counts = await store.line_counts("batch_1")
    assert (counts.pending, counts.live) == (0, 1)


async def test_no_result_counts_after_the_batch_ended(store):
    await running_batch(store, 1)
    [claim] = await store.claim_lines("batch_1", "a", 1, 10)
    await store.update_batch("batch_1", status=COMPLETED)
    assert not await store.complete_line("batch_1", claim.index, claim.custom_id, True, b"late")
    assert (await store.get_batch("batch_1")).completed == 0


async def test_loading_again_replaces_lines_and_drop_clears_them(store):
    await running_batch(store, 4)
    await store.claim_lines("batch_1", "a", 2, 10)
    await store.load_lines("batch_1", [Line(0, 0, "only", b"{}")])
    counts = await store.line_counts("batch_1")
    assert (counts.pending, counts.live) == (1, 0)
    await store.drop_lines("batch_1")
    assert await store.claim_lines("batch_1", "a", 5, 10) == []
    assert await store.results("batch_1") == []


async def test_claims_never_hand_a_line_to_two_claimants(store):
    await running_batch(store, 200)
    got = await asyncio.gather(*(store.claim_lines("batch_1", f"r{i}", 7, 10) for i in range(40)))
    indexes = [c.index for claims in got for c in claims]
    assert sorted(indexes) == list(range(200))


# -- keys --------------------------------------------------------------------------------------


async def test_keys_round_trip_and_revoke(store):
    key = ApiKey("gkaaa", "ci", "hash", ["batch"], "batch", 10, rpm=5, tpm=None)
    await store.put_key(key)
    await store.put_key(ApiKey("gkbbb", "web", "hash2", ["interactive", "batch"], "interactive", 11))
    assert await store.get_key("gkaaa") == key
    assert [k.id for k in await store.list_keys()] == ["gkaaa", "gkbbb"]
    assert await store.active_key_count() == 2
    assert await store.revoke_key("gkaaa", 99)
    assert not await store.revoke_key("gkaaa", 100)
    assert (await store.get_key("gkaaa")).revoked_at == 99
    assert await store.active_key_count() == 1
    assert await store.get_key("nope") is None


# -- rate limits -------------------------------------------------------------------------------


async def test_requests_per_minute_are_counted_per_key(store):
    for _ in range(3):
        assert (await store.rate_hit("k1", 3, None, 10)).allowed
    refused = await store.rate_hit("k1", 3, None, 10)
    assert not refused.allowed and refused.limit == "rpm"
    assert 0 < refused.retry_after_s <= 120
    assert (await store.rate_hit("k2", 3, None, 10)).allowed


async def test_tokens_per_minute_include_charges_after_the_fact(store):
    assert (await store.rate_hit("k1", None, 100, 40)).allowed
    await store.rate_charge("k1", 50)
    refused = await store.rate_hit("k1", None, 100, 20)
    assert not refused.allowed and refused.limit == "tpm"
    assert (await store.rate_hit("k1", None, 100, 10)).allowed
    too_big = await store.rate_hit("k9", None, 100, 500)
    assert not too_big.allowed and too_big.retry_after_s > 0


async def test_a_reservation_given_back_frees_the_window_but_never_below_zero(store):
    assert (await store.rate_hit("k1", None, 100, 90)).allowed
    assert not (await store.rate_hit("k1", None, 100, 20)).allowed
    await store.rate_charge("k1", -60)
    assert (await store.rate_hit("k1", None, 100, 60)).allowed
    await store.rate_charge("k2", -1000)
    assert (await store.rate_hit("k2", None, 100, 100)).allowed
    assert not (await store.rate_hit("k2", None, 100, 1)).allowed
