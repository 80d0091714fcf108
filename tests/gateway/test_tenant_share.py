"""Two ``gateway serve`` replicas on one real ``redis-server`` share their tenants: a tenant whose
requests all come through one replica gets its share of the engine, not that replica's whole view of
it, while the other tenant's requests come through the other replica; with Redis killed, each
replica says its shares are its own."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.support.observe import log_lines, metric, wait_for
from tests.support.procs import start_engine, start_gateway
from tests.support.redis import RedisServer

pytestmark = pytest.mark.redis

LIMIT = 4
ADMIN = "admin-secret"


def stream(url: str, key: str, request_id: str, max_tokens: int, failed: list[str], stop: threading.Event) -> None:
    """One streamed completion, read until it ends or ``stop`` is set (the client leaves)."""
    body = {"model": "sim-model", "prompt": "count slowly", "max_tokens": max_tokens, "stream": True}
    headers = {"authorization": f"Bearer {key}", "x-request-id": request_id}
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers, timeout=60) as r:
            if r.status_code != 200:
                failed.append(f"{request_id}: {r.status_code}")
            for _ in r.iter_bytes():
                if stop.is_set():
                    break
    except httpx.HTTPError as exc:  # recorded: the test fails on it with what it was
        failed.append(f"{request_id}: {type(exc).__name__}: {exc}")


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def replicas(procs, tmp_path, redis_server):
    """One simulated engine of limit ``LIMIT``, and two replicas in front of it sharing over Redis."""
    engine = start_engine(tmp_path, "--token-delay-ms", "20")
    procs.append(engine)
    engine.wait_ready()
    pinned = {"initial_limit": LIMIT, "min_limit": LIMIT, "max_limit": LIMIT}
    config = {
        "pools": {"interactive": {"engines": [engine.url]}},
        "store": redis_server.url,
        "admission": pinned,
        "classes": {"interactive": {"ttft_p99_ms": 30000, "itl_p99_ms": 1000}},
        "scrape": {"interval_s": 60},
        "keys": {"required": True},
    }
    pair = [start_gateway(tmp_path, config, env={"GATEWAY__KEYS__ADMIN": ADMIN}) for _ in range(2)]
    procs.extend(pair)
    for replica in pair:
        replica.wait_ready("/ready")
        assert wait_for(lambda r=replica: metric(r.url, "gateway_routing_share_up") == 1), replica.log()
    return pair


def test_a_tenant_on_one_replica_gets_its_share_of_the_fleet_and_shares_go_local_without_redis(replicas, redis_server):
    a, b = replicas
    threads: list[threading.Thread] = []
    stop = threading.Event()
    try:
        admin = {"authorization": f"Bearer {ADMIN}"}
        keys = {
            tenant: httpx.post(a.url + "/admin/keys", json={"name": tenant, "tenant": tenant}, headers=admin).json()[
                "secret"
            ]
            for tenant in ("quiet", "noisy")
        }
        failed: list[str] = []

        def start(url: str, tenant: str, request_id: str, max_tokens: int = 300) -> None:
            thread = threading.Thread(target=stream, args=(url, keys[tenant], request_id, max_tokens, failed, stop))
            thread.start()
            threads.append(thread)

        # The quiet tenant's long request through b (it runs until the test ends, however long the
        # host takes over the rest); once a has heard of it, the noisy tenant's six through a.
        start(b.url, "quiet", "quiet-0", max_tokens=2000)
        assert wait_for(lambda: metric(b.url, "gateway_tenant_inflight", tenant="quiet") == 1), failed
        assert wait_for(lambda: metric(a.url, "gateway_tenant_share_replicas") == 2), a.log()
        assert wait_for(lambda: metric(a.url, "gateway_engine_peer_inflight") == 1), a.log()
        for n in range(6):
            start(a.url, "noisy", f"noisy-{n}")
        # Two tenants active across the fleet: the noisy one's share is two of the four slots. It takes
        # them and leaves the last one free for the quiet tenant (a alone would see only the noisy
        # tenant and hand it all three free slots).
        assert wait_for(lambda: metric(a.url, "gateway_tenant_queued", tenant="noisy") == 4), a.log()
        assert metric(a.url, "gateway_tenant_inflight", tenant="noisy") == 2
        start(b.url, "quiet", "quiet-1", max_tokens=5)
        threads[-1].join(timeout=30)
        assert not failed, failed
        # The quiet request took the slot the noisy tenant left: it ended while every noisy request was
        # still running (each takes 6 s of tokens at least). Whether it started at once or after a
        # moment in b's queue depends on when b's next exchange granted it the slot, which the host's
        # load decides; that it never waited for a noisy request to end does not.
        ended_on_a = [x["request_id"] for x in log_lines(a.log_path.read_text(), "access")]
        assert not ended_on_a, ended_on_a
        assert metric(a.url, "gateway_tenant_inflight", tenant="noisy") == 2
        assert wait_for(lambda: bool(log_lines(b.log_path.read_text(), "access")))
        quiet = {x["request_id"]: x for x in log_lines(b.log_path.read_text(), "access")}["quiet-1"]
        assert quiet["admission"] in ("admitted", "queued") and quiet["status"] == "200", quiet

        redis_server.kill()
        for replica in (a, b):
            assert wait_for(lambda r=replica: metric(r.url, "gateway_routing_share_up") == 0, timeout=10)
            assert metric(replica.url, "gateway_tenant_share_replicas") == 1
            assert wait_for(lambda r=replica: bool(log_lines(r.log_path.read_text(), "tenant_shares_local")))
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
