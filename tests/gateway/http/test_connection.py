"""Slow, oversized and too many client connections, over real sockets to a real gateway."""

from __future__ import annotations

import json
import socket
import sys
import time

import httpx
import openai
import pytest

from priority_gateway.http.connection import LINGER_S
from tests.support.observe import wait_for
from tests.support.partial_body import hold_unfinished
from tests.support.procs import Proc, free_port, rss_bytes, start_engine, start_stack

LIMITS = {
    "header_timeout_s": 1.0,
    "body_timeout_s": 1.0,
    "keepalive_timeout_s": 1.0,
    "max_header_bytes": 16384,
    "max_headers": 64,
    "max_connections": 40,
    "max_connections_per_client": 40,
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
    if b"transfer-encoding: chunked" in head.lower():
        chunks = []
        while body:
            size, _, rest = body.partition(b"\r\n")
            chunks.append(rest[: int(size, 16)])
            body = rest[int(size, 16) + 2 :]
        body = b"".join(chunks)
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
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")  # the socket waits for the answer
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


def test_pipelined_requests_are_answered_in_turn_each_in_its_own_response(gateway):
    body = json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nX-Request-Id: pipe-{{n}}\r\n\r\n{body}"
    )
    with connect(gateway) as sock:
        # Three requests in one write; then a health check, also pipelined, that closes.
        sock.sendall("".join(request.replace("{n}", str(n)) for n in range(3)).encode())
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        closed, data = read_until_closed(sock, 10.0)
    assert closed
    answers = data.split(b"HTTP/1.1 ")[1:]
    assert [a.split(b" ", 1)[0] for a in answers] == [b"200"] * 4
    ids = [line for a in answers for line in a.split(b"\r\n") if line.startswith(b"x-request-id")]
    assert ids == [b"x-request-id: pipe-0", b"x-request-id: pipe-1", b"x-request-id: pipe-2"]
    for answer in answers[:3]:
        head, _, payload = answer.partition(b"\r\n\r\n")
        length = int(next(v for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n")) if k == b"content-length"))
        assert json.loads(payload[:length])["object"] == "chat.completion"
    assert answers[3].endswith(b'{"status":"ok"}')


# -- one client cannot keep the others out -------------------------------------------------------

PER_CLIENT = {"max_connections": 32, "max_connections_per_client": 8, "trusted_proxies": ["127.0.0.5"]}


@pytest.fixture(scope="module")
def shared(procs, tmp_path_factory):
    config = {"limits": {**LIMITS, "keepalive_timeout_s": 30.0, **PER_CLIENT}}
    return start_stack(procs, tmp_path_factory.mktemp("per-client"), config, "--token-delay-ms", "1")


def connect_from(gw: Proc, source: str) -> socket.socket:
    host, port = gw.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))


def health(sock: socket.socket, forwarded: str | None = None) -> int:
    """GET /health on ``sock`` (kept alive); the status, or 0 when the connection closed without one."""
    extra = f"x-forwarded-for: {forwarded}\r\n" if forwarded else ""
    sock.sendall(f"GET /health HTTP/1.1\r\nhost: x\r\n{extra}\r\n".encode())
    sock.settimeout(5)
    try:
        data = sock.recv(65536)
    except (ConnectionResetError, TimeoutError):
        return 0
    return int(data.split(b" ")[1]) if data else 0


def test_one_client_re_opening_idle_connections_does_not_keep_the_others_out(shared):
    hog = []
    try:
        # One address opens all it can and keeps them idle.
        for _ in range(31):
            hog.append(connect_from(shared, "127.0.0.1"))
        served = [health(sock) for sock in hog]
        assert served.count(200) == PER_CLIENT["max_connections_per_client"], served
        # Twenty other clients, each from an address of its own, all get in.
        others = [connect_from(shared, f"127.0.0.{10 + n}") for n in range(20)]
        try:
            assert [health(sock) for sock in others] == [200] * 20
        finally:
            for sock in others:
                sock.close()
    finally:
        for sock in hog:
            sock.close()


def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_cap(shared):
    cap = PER_CLIENT["max_connections_per_client"]
    through_proxy = [connect_from(shared, "127.0.0.5") for _ in range(cap + 6)]
    untrusted = [connect_from(shared, "127.0.0.6") for _ in range(cap + 1)]
    try:
        # The proxy's connections count against the client each request names, not the proxy.
        first = [health(sock, "10.1.1.1") for sock in through_proxy[: cap + 1]]
        assert first == [200] * cap + [503]
        assert [health(sock, "10.2.2.2, 10.1.1.1") for sock in through_proxy[cap + 1 :]] == [503] * 5
        assert health(connect_from(shared, "127.0.0.5"), "10.3.3.3") == 200
        # A client that is no trusted proxy cannot choose whom it counts as.
        spoofed = [health(sock, f"10.9.9.{n}") for n, sock in enumerate(untrusted)]
        assert spoofed.count(200) == cap
    finally:
        for sock in through_proxy + untrusted:
            sock.close()


def test_refusals_written_before_the_body_is_read_reach_clients_still_sending(gateway):
    """Clients that send their body while they read (each stops at its first failed write, as
    asyncio's streams do) get the 413 the gateway answered on the head: closing with the body
    unread would answer with a TCP reset, which fails their next write and takes the answer with it."""
    head = {"content-type": "application/json"}
    answered, _ = hold_unfinished(gateway.url, "/v1/chat/completions", 40, 64 * 1024 * 1024, head, lambda: None)
    assert answered == [413] * 40


def test_a_client_that_keeps_a_refused_connection_open_is_let_go_after_the_linger(gateway):
    """A lingering close holds the connection only ``LINGER_S``: a client that neither sends the rest
    nor closes is not held longer (its writes then meet a closed connection)."""
    with connect(gateway) as sock:
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        sock.sendall(head + b"content-length: %d\r\n\r\n{" % (64 * 1024 * 1024))
        ended, answer = read_until_closed(sock, within=5)  # the answer, then the gateway's side ends
        assert ended and error_of(answer)[0] == 413
        sock.sendall(b"x" * 1000)  # still read (and dropped) while it lingers
        time.sleep(LINGER_S + 1)  # the client idles past the linger: the behaviour under test
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            for _ in range(20):
                sock.sendall(b"x" * 65536)
                time.sleep(0.05)
