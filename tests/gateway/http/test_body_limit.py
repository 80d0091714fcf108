"""One body limit on every route, enforced before any route reads: real gateway, real HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.observe import peak_memory
from tests.support.partial_body import hold_unfinished
from tests.support.procs import rss_bytes, start_stack

LIMIT = 1024 * 1024
FILE_LIMIT = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def gateway(procs, tmp_path_factory):
    config = {"max_body_bytes": LIMIT, "batch": {"max_file_bytes": FILE_LIMIT}, "keys": {"admin": "admin-secret"}}
    return start_stack(procs, tmp_path_factory.mktemp("body"), config, "--token-delay-ms", "1")


def chunks(total: int, size: int = 256 * 1024) -> Iterator[bytes]:
    """A body of ``total`` bytes sent chunked (no Content-Length), as a JSON string."""
    yield b'{"input_file_id": "'
    sent = 0
    while sent < total:
        yield b"a" * size
        sent += size
    yield b'"}'


def assert_413(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text[:200]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "body_too_large"
    assert len(response.content) < 1000


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("POST", "/v1/batches", {}),
        ("POST", "/admin/keys", {"authorization": "Bearer admin-secret"}),
        ("POST", "/v1/chat/completions", {}),
        ("GET", "/v1/models", {}),
    ],
)
def test_a_declared_body_over_the_limit_is_413_on_every_route(gateway, method, path, headers):
    before = rss_bytes(gateway)
    big = b'{"input_file_id": "' + b"a" * (20 * LIMIT) + b'"}'
    try:
        r = httpx.request(method, gateway.url + path, content=big, headers=headers, timeout=30)
    except httpx.HTTPError:
        pytest.fail("the gateway dropped the connection instead of answering 413")
    assert_413(r)
    assert rss_bytes(gateway) - before < 8 * LIMIT


@pytest.mark.parametrize("path", ["/v1/batches", "/admin/keys", "/v1/completions"])
def test_a_chunked_body_over_the_limit_is_413_before_it_is_read_whole(gateway, path):
    before = rss_bytes(gateway)
    headers = {"authorization": "Bearer admin-secret", "content-type": "application/json"}
    try:
        r = httpx.post(gateway.url + path, content=chunks(64 * LIMIT), headers=headers, timeout=30)
    except httpx.HTTPError:
        # The gateway answered 413 and closed while we were still sending: what matters is
        # that it did not take the whole body in.
        r = None
    if r is not None:
        assert_413(r)
    assert rss_bytes(gateway) - before < 16 * LIMIT


def test_uploads_have_their_own_larger_limit(gateway):
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    fits = line * ((2 * LIMIT) // len(line))
    r = httpx.post(gateway.url + "/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", fits)})
    assert r.status_code == 200, r.text[:300]
    too_big = b"a" * (FILE_LIMIT + 512 * 1024)
    r = httpx.post(gateway.url + "/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", too_big)})
    assert r.status_code == 413


def test_a_chunked_upload_over_the_limit_is_refused_before_it_is_spooled(gateway):
    sent = 0

    def multipart() -> Iterator[bytes]:
        nonlocal sent
        yield b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n\r\n'
        for _ in range(256):
            sent += 256 * 1024
            yield b"a" * 256 * 1024  # 64 MiB offered, 16 times the limit
        yield b"\r\n--b--\r\n"

    headers = {"content-type": "multipart/form-data; boundary=b"}
    try:
        r = httpx.post(gateway.url + "/v1/files", content=multipart(), headers=headers, timeout=30)
        assert r.status_code == 413
    except httpx.HTTPError:
        pass  # answered and closed while we were still sending
    assert sent < 32 * 1024 * 1024, "the whole upload was taken in before the refusal"


# -- bodies in flight: authenticated first, bounded together -----------------------------------

MIB = 1024 * 1024
BODY = 10 * MIB
RECEIVING = 32 * MIB


@pytest.fixture(scope="module")
def keyed(procs, tmp_path_factory):
    """A gateway that requires keys (one exists), bodies of up to 10 MiB, 32 MiB of them in flight."""
    config = {"keys": {"admin": "admin-secret"}, "limits": {"max_receiving_bytes": RECEIVING}}
    gateway = start_stack(procs, tmp_path_factory.mktemp("keyed"), config, "--token-delay-ms", "1")
    created = httpx.post(
        gateway.url + "/admin/keys", json={"name": "bodies"}, headers={"authorization": "Bearer admin-secret"}
    )
    assert created.status_code == 201, created.text
    gateway.secret = created.json()["secret"]
    return gateway


@pytest.mark.parametrize(("path", "count"), [("/v1/chat/completions", 300), ("/v1/files", 100), ("/v1/batches", 100)])
def test_bodies_without_a_key_are_refused_on_their_headers_and_never_held(keyed, path, count):
    headers = {"content-type": "application/json"}
    if path == "/v1/files":
        headers = {"content-type": "multipart/form-data; boundary=b"}
    with peak_memory(lambda: rss_bytes(keyed)) as memory:
        answered, _ = hold_unfinished(keyed.url, path, count, BODY, headers, lambda: None)
    print(f"{path}: {count} keyless bodies of 10 MiB held, RSS +{memory.growth:.0f} MiB (peak {memory.peak:.0f})")
    assert answered == [401] * count
    assert memory.growth < 150, f"RSS grew {memory.growth:.0f} MiB"


def test_bodies_in_flight_share_one_budget(keyed):
    headers = {"content-type": "application/json", "authorization": f"Bearer {keyed.secret}"}
    with peak_memory(lambda: rss_bytes(keyed)) as memory:
        answered, _ = hold_unfinished(keyed.url, "/v1/chat/completions", 40, BODY, headers, lambda: None)
    print(f"40 keyed bodies of 10 MiB held: RSS +{memory.growth:.0f} MiB (peak {memory.peak:.0f})")
    # Three fit in 32 MiB and wait for their last byte; the others are told to come back.
    assert answered.count(None) == RECEIVING // BODY
    assert answered.count(503) == 40 - RECEIVING // BODY
    assert memory.growth < 100, f"RSS grew {memory.growth:.0f} MiB"


def test_the_budget_answers_503_with_retry_after_and_413_beyond_it_whole(keyed):
    url = keyed.url + "/v1/chat/completions"
    headers = {"content-type": "application/json", "authorization": f"Bearer {keyed.secret}"}

    def during() -> httpx.Response:
        return httpx.post(url, content=b"{" + b" " * (5 * MIB) + b"}", headers=headers, timeout=10)

    _, refused = hold_unfinished(keyed.url, "/v1/chat/completions", 3, BODY, headers, during)
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert refused.json()["error"]["code"] == "bodies_in_flight"
    # Once they are gone, the same body is read (and judged: it is no chat).
    assert httpx.post(url, content=b"{" + b" " * (5 * MIB) + b"}", headers=headers, timeout=10).status_code == 400
    whole = httpx.post(keyed.url + "/v1/files", content=b"x" * (RECEIVING + 1), headers=headers, timeout=10)
    assert whole.status_code == 413 and whole.json()["error"]["code"] == "body_too_large"
