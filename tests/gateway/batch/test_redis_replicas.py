"""Batch jobs on Redis: two replicas share them, and neither a replica killed with SIGKILL nor
a Redis restart (append-only file, fsync always) loses or duplicates a line."""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from tests.gateway.batch.support import (
    MODEL,
    chat_line,
    client_for,
    file_lines,
    start_stack,
    submit,
    wait_batch,
)
from tests.support.observe import log_lines, metric, wait_for
from tests.support.procs import start_gateway
from tests.support.redis import RedisServer

pytestmark = pytest.mark.redis

REPLICA_BATCH = {"concurrency": 16, "lease_s": 2}


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"), durable=True).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def replicas(procs, tmp_path_factory, redis_server):
    return start_stack(
        tmp_path_factory.mktemp("replicas"), procs, store=redis_server.url, batch=REPLICA_BATCH, gateways=2
    )


def wait_progress(client, batch_id: str, completed: int, timeout: float = 60.0) -> None:
    """Until ``completed`` lines are done, while the batch is still running."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        assert batch.status in ("validating", "in_progress"), batch
        if batch.request_counts.completed >= completed:
            return
        assert time.monotonic() < deadline, f"no progress: {batch.request_counts}"
        time.sleep(0.05)


def outages_met(gateway) -> int:
    return len(log_lines(gateway.log_path.read_text(), "batch_store_unavailable"))


def assert_each_line_once(client, batch, n: int) -> None:
    assert batch.status == "completed", batch
    assert batch.request_counts.model_dump() == {"total": n, "completed": n, "failed": 0}
    ids = [line["custom_id"] for line in file_lines(client, batch.output_file_id)]
    assert len(ids) == n and set(ids) == {f"req-{i}" for i in range(n)}


def test_a_batch_made_on_one_replica_is_seen_and_worked_by_both(replicas):
    a, b = replicas.gateways
    client_a, client_b = client_for(a), client_for(b)
    before = [metric(g.url, "gateway_batch_requests_total", status="completed") for g in (a, b)]
    created = submit(client_a, [chat_line(i, max_tokens=20) for i in range(400)])
    assert client_b.batches.retrieve(created.id).id == created.id
    assert created.id in [x.id for x in client_b.batches.list(limit=5).data]
    assert client_b.files.retrieve(created.input_file_id).id == created.input_file_id
    batch = wait_batch(client_b, created.id, timeout=120)
    assert_each_line_once(client_b, batch, 400)
    done = [
        metric(g.url, "gateway_batch_requests_total", status="completed") - x
        for g, x in zip((a, b), before, strict=True)
    ]
    assert all(n > 0 for n in done), done
    assert sum(done) == 400
    # The gauge follows the store's status counts, refreshed about once a second.
    counted = wait_for(lambda: metric(b.url, "gateway_batches", status="completed") >= 1, timeout=5)
    assert counted, "gateway_batches{status=completed} never counted the batch"


def test_a_batch_is_cancelled_through_the_other_replica(replicas):
    a, b = replicas.gateways
    client_a, client_b = client_for(a), client_for(b)
    created = submit(client_a, [chat_line(i, max_tokens=200) for i in range(300)])
    wait_progress(client_a, created.id, 10)
    assert client_b.batches.cancel(created.id).status in ("cancelling", "cancelled")
    batch = wait_batch(client_a, created.id, timeout=60)
    assert batch.status == "cancelled"
    ids = [line["custom_id"] for line in file_lines(client_a, batch.output_file_id)]
    assert len(ids) == len(set(ids)) == batch.request_counts.completed
    assert 10 <= len(ids) < 300


def test_a_replica_killed_mid_batch_loses_and_duplicates_nothing(procs, tmp_path, redis_server):
    stack = start_stack(tmp_path, procs, store=redis_server.url, batch=REPLICA_BATCH)
    victim = stack.gateways[0]
    client = client_for(victim)
    created = submit(client, [chat_line(i, max_tokens=100) for i in range(500)])
    wait_progress(client, created.id, 50)
    victim.kill(signal.SIGKILL)
    assert client_for(victim) and not victim.alive
    port = int(victim.url.rsplit(":", 1)[1])
    revived = start_gateway(tmp_path, stack.config, port=port)
    procs.append(revived)
    revived.wait_ready("/ready")
    batch = wait_batch(client, created.id, timeout=120)
    assert_each_line_once(client, batch, 500)


def test_a_redis_restart_mid_batch_loses_and_duplicates_nothing(replicas, redis_server):
    a, _ = replicas.gateways
    client = client_for(a)
    created = submit(client, [chat_line(i, max_tokens=150) for i in range(500)])
    wait_progress(client, created.id, 50)
    outages = {g.url: outages_met(g) for g in replicas.gateways}
    redis_server.kill()
    # Interactive traffic does not need the store.
    reply = httpx.post(
        a.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 4},
        timeout=10,
    )
    assert reply.status_code == 200, reply.text
    outage = httpx.get(f"{a.url}/v1/batches/{created.id}", timeout=10)
    assert outage.status_code == 503 and outage.json()["error"]["code"] == "store_unavailable"
    for g in replicas.gateways:  # each replica's batch runner met the outage
        assert wait_for(lambda g=g: outages_met(g) > outages[g.url]), g.log()
    redis_server.start()
    batch = wait_batch(client, created.id, timeout=120)
    assert_each_line_once(client, batch, 500)
