"""Queued requests hold bounded memory and nothing once their client is gone: real gateway, real HTTP."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.observe import metric, wait_for
from tests.support.procs import rss_bytes, start_stack

MODEL = "sim-model"
MIB = 1024 * 1024
QUEUED_BYTES = 4 * MIB


@pytest.fixture(scope="module")
def gateway(procs, tmp_path_factory):
    config = {
        # Batch work shares the one pool; one slot, so a second request must wait.
        "admission": {"initial_limit": 1, "max_limit": 1},
        "limits": {"max_queued_bytes": QUEUED_BYTES, "max_body_bytes": MIB},
    }
    return start_stack(procs, tmp_path_factory.mktemp("queue"), config, "--token-delay-ms", "20")


@contextlib.contextmanager
def slot_taken(gw) -> Iterator[None]:
    """A long batch stream holds the engine's only slot while the block runs."""
    body = {"model": MODEL, "prompt": "hold", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", gw.url + "/v1/completions", json=body, headers={"x-priority": "batch"}) as response,
    ):
        lines = response.iter_lines()  # kept: a dropped iterator closes the stream
        next(lines)
        yield


def queued(gw) -> float:
    return metric(gw.url, "gateway_queue_depth", pool="interactive", **{"class": "batch"})


def raw_request(gw, body: bytes) -> socket.socket:
    host, port = gw.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Priority: batch\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    sock.sendall(head + body)
    return sock


def completion(prompt_bytes: int) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "p" * prompt_bytes, "max_tokens": 2}).encode()


def test_a_client_that_leaves_while_queued_frees_its_place_at_once(gateway):
    with slot_taken(gateway):
        sock = raw_request(gateway, completion(100_000))
        assert wait_for(lambda: queued(gateway) == 1, timeout=5)
        assert metric(gateway.url, "gateway_queued_body_bytes", pool="interactive") > 100_000
        sock.close()
        assert wait_for(lambda: queued(gateway) == 0, timeout=1.5), "the abandoned request kept its place"
        assert metric(gateway.url, "gateway_queued_body_bytes", pool="interactive") == 0


def test_bodies_over_the_queue_byte_budget_are_refused_with_429(gateway):
    with slot_taken(gateway):
        waiting = [raw_request(gateway, completion(900_000)) for _ in range(4)]
        try:
            assert wait_for(lambda: queued(gateway) == 4, timeout=5)
            r = httpx.post(
                gateway.url + "/v1/completions",
                content=completion(900_000),
                headers={"x-priority": "batch", "content-type": "application/json"},
                timeout=5,
            )
            assert r.status_code == 429, r.text[:200]
            assert r.json()["error"]["code"] == "queue_full"
            assert "retry-after" in r.headers
        finally:
            for sock in waiting:
                sock.close()


def test_a_burst_of_oversized_and_queued_requests_stays_under_a_memory_bound(gateway):
    """Stated bound: the gateway grows by less than the queue budget plus 48 MiB."""
    before = rss_bytes(gateway)
    statuses: list[int] = []

    def send(body: bytes) -> None:
        try:
            r = httpx.post(
                gateway.url + "/v1/completions",
                content=body,
                headers={"x-priority": "batch", "content-type": "application/json"},
                timeout=60,
            )
            statuses.append(r.status_code)
        except httpx.HTTPError:
            statuses.append(0)

    with slot_taken(gateway):
        bodies = [completion(4 * MIB)] * 20 + [completion(900_000)] * 60
        threads = [threading.Thread(target=send, args=(b,)) for b in bodies]
        peak = before
        for t in threads:
            t.start()
        # The slot is held until every request the queue cannot take has been answered (the queue holds
        # about four): released sooner, on a busy host, late senders would find room and be served.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            peak = max(peak, rss_bytes(gateway))
            if len(statuses) >= len(bodies) - 4 and queued(gateway) >= 1:
                break
            threading.Event().wait(0.05)
        peak = max(peak, rss_bytes(gateway))
    for t in threads:
        t.join(timeout=60)
    assert statuses.count(413) == 20
    assert statuses.count(429) >= 50
    assert peak - before < QUEUED_BYTES + 48 * MIB, f"grew {(peak - before) / MIB:.0f} MiB"
