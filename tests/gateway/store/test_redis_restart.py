"""The Redis store across a Redis outage: errors while it is down, everything back after."""

from __future__ import annotations

import pytest

from priority_gateway.store import RedisStore, StoreUnavailable
from priority_gateway.store.records import IN_PROGRESS, BatchRecord, Line
from tests.support.redis import RedisServer


async def test_store_reports_an_outage_and_reconnects_with_data_kept(tmp_path):
    server = RedisServer(tmp_path, durable=True).start()
    store = RedisStore(server.url)
    await store.open()
    try:
        await store.create_batch(BatchRecord("batch_r", "k", "/v1/completions", "f", "24h", 1, 2, status=IN_PROGRESS))
        await store.load_lines("batch_r", [Line(i, i, f"c{i}", b"{}") for i in range(3)])
        [claim] = await store.claim_lines("batch_r", "a", 1, 30)
        server.kill()
        assert not await store.ping()
        with pytest.raises(StoreUnavailable):
            await store.complete_line("batch_r", claim.index, claim.custom_id, True, b"ok")
        server.start()
        assert await store.complete_line("batch_r", claim.index, claim.custom_id, True, b"ok")
        counts = await store.line_counts("batch_r")
        assert (counts.pending, counts.live) == (2, 0)
        assert (await store.get_batch("batch_r")).completed == 1
    finally:
        await store.close()
        server.stop()
