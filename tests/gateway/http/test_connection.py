"""Slow, oversized and too many client connections, over real sockets to a real gateway."""

from __future__ import annotations

import json
import socket
import sys
import time

import httpx
import openai
import pytest

from tests.support.observe import wait_for
from tests.support.procs import Proc, free_port, rss_bytes, start_engine, start_stack

LIMITS = {
    "header_timeout_s": 1.0,
    "body_timeout_s": 1.0,
    "keepalive_timeout_s": 1.0,
    "max_header_bytes": 16384,
    "max_headers": 64,
    "max_connections": 40,
}


@pytest.fixture(scope="module")
def gateway(procs, tmp_path_factory):
    return start_stack(procs, tmp_path_factory.mktemp("conn"), {"limits": LIMITS}, "--token-delay-ms", "1")


def connect(gw: Proc) -> socket.socket:
    host, port = gw.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def read_until_closed(sock: socket.socket, within: float) -> tuple[bool, bytes]:
    """(closed by the server within ``within`` s, what it sent)."""
    sock.settimeout(0.1)
    data = b""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True, data
        if not chunk:
            return True, data
        data += chunk
    return False, data


def error_of(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    return status, json.loads(body)["error"]


def test_a_connection_that_sends_nothing_is_closed_with_408(gateway):
    with connect(gateway) as sock:
        closed, data = read_until_closed(sock, 4.0)
    assert closed, "an idle new connection was held open"
    status, error = error_of(data)
    assert status == 408 and error["code"] == "request_timeout"


def test_half_sent_headers_are_closed_with_408(gateway):
    with connect(gateway) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        closed, data = read_until_closed(sock, 4.0)
    assert closed
    assert error_of(data)[0] == 408


def test_headers_dripped_a_byte_at_a_time_do_not_reset_the_timer(gateway):
    started = time.monotonic()
    with connect(gateway) as sock:
        line = b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 200
        closed = False
        for byte in line:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            closed, _ = read_until_closed(sock, 0.2)
            if closed:
                break
    assert closed and time.monotonic() - started < 4.0


def test_half_sent_body_is_closed_with_408_in_openai_shape(gateway):
    with connect(gateway) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model": '
        )
        closed, data = read_until_closed(sock, 4.0)
    assert closed
    status, error = error_of(data)
    assert status == 408 and set(error) == {"message", "type", "param", "code"}


def test_an_idle_keep_alive_connection_is_closed(gateway):
    with connect(gateway) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.2)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        closed, _ = read_until_closed(sock, 4.0)
    assert closed, "an idle keep-alive connection was held open"


def test_headers_over_the_limit_get_431_and_memory_stays_flat(gateway):
    before = rss_bytes(gateway)
    with connect(gateway) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0
        try:
            # 64 MiB offered; the gateway must stop reading long before.
            for _ in range(1024):
                sock.sendall(b"a" * 65536)
                sent += 65536
        except (BrokenPipeError, ConnectionResetError):
            pass
        closed, data = read_until_closed(sock, 4.0)
    assert closed and sent < 16 * 1024 * 1024
    if data:
        assert error_of(data)[0] == 431
    assert rss_bytes(gateway) - before < 16 * 1024 * 1024


def test_too_many_header_fields_get_431(gateway):
    with connect(gateway) as sock:
        fields = b"".join(b"X-H%d: v\r\n" % i for i in range(200))
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
        closed, data = read_until_closed(sock, 4.0)
    assert closed
    status, error = error_of(data)
    assert status == 431 and error["code"] == "headers_too_large"


def test_connections_over_the_cap_are_refused_with_503_and_serving_goes_on(gateway):
    socks = [connect(gateway) for _ in range(LIMITS["max_connections"] + 10)]
    try:
        refused = 0
        for sock in socks[-10:]:
            closed, data = read_until_closed(sock, 0.5)
            if closed and data:
                status, error = error_of(data)
                assert status == 503 and error["code"] == "too_many_connections"
                refused += 1
        assert refused == 10
    finally:
        for sock in socks:
            sock.close()
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=10)
    assert wait_for(lambda: httpx.get(gateway.url + "/health").status_code == 200, timeout=5)
    done = client.chat.completions.create(model="sim-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert done.choices[0].message.content is not None


def test_a_client_flood_at_the_descriptor_limit_leaves_engines_healthy(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fds")
    engine = start_engine(tmp, "--token-delay-ms", "1")
    procs.append(engine)
    engine.wait_ready()
    port = free_port()
    config = tmp / "gateway.yaml"
    config.write_text(
        json.dumps(
            {
                "pools": {"interactive": {"engines": [engine.url]}},
                "health": {"interval_s": 0.1, "timeout_s": 0.5, "unhealthy_after": 1},
                "limits": {"header_timeout_s": 30},
            }
        )
    )
    # 400 descriptors, hard limit too: the gateway cannot raise it.
    cmd = ["prlimit", "--nofile=400:400", sys.executable, "-m", "priority_gateway", "serve", "--config", str(config)]
    gw = Proc([*cmd, "--port", str(port)], f"http://127.0.0.1:{port}", tmp / "gateway.log").start()
    procs.append(gw)
    gw.wait_ready("/ready")
    flood = []
    try:
        for _ in range(600):
            try:
                flood.append(connect(gw))
            except OSError:
                break
        time.sleep(2.0)  # twenty health probes while every client slot is taken
        assert "engine_unhealthy" not in gw.log()
    finally:
        for sock in flood:
            sock.close()
    assert "max_connections_lowered" in gw.log()
    assert wait_for(lambda: httpx.get(gw.url + "/ready").status_code == 200, timeout=5)
    r = httpx.post(gw.url + "/v1/completions", json={"model": "sim-model", "prompt": "x", "max_tokens": 2})
    assert r.status_code == 200
