"""The Files API through the official openai client, and what it refuses."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import socket
from pathlib import Path

import httpx
import openai
import pytest

from priority_gateway.http.files import FORM_OVERHEAD
from tests.gateway.batch.support import chat_line, client_for, jsonl, start_stack, wait_batch
from tests.support.observe import peak_memory, until, wait_for
from tests.support.partial_body import post_unfinished
from tests.support.procs import rss_bytes
from tests.support.redis import RedisServer

LIMIT = 50_000
ENDPOINT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def stack(procs, tmp_path_factory):
    return start_stack(tmp_path_factory.mktemp("files"), procs, batch={"max_file_bytes": LIMIT})


@pytest.fixture(scope="module")
def client(stack):
    return client_for(stack.gateways[0])


def expiry(anchor: str, seconds: str) -> dict[str, str]:
    return {"expires_after[anchor]": anchor, "expires_after[seconds]": seconds}


def file_ids(client):
    return [f.id for f in client.files.list()]


def test_upload_list_retrieve_content_delete(client):
    data = jsonl([chat_line(i) for i in range(3)])
    created = client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch")
    assert created.object == "file" and created.purpose == "batch" and created.status == "processed"
    assert (created.bytes, created.filename) == (len(data), "input.jsonl")
    assert client.files.retrieve(created.id) == created
    assert client.files.content(created.id).content == data
    assert created.id in file_ids(client)
    assert [f.id for f in client.files.list(purpose="batch_output")] == []
    deleted = client.files.delete(created.id)
    assert deleted.deleted and deleted.id == created.id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(created.id)
    with pytest.raises(openai.NotFoundError):
        client.files.delete(created.id)


def test_batch_files_expire_after_30_days_or_as_asked(client):
    default = client.files.create(file=("d.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    assert default.expires_at == default.created_at + 30 * 86400
    hour = client.files.create(
        file=("h.jsonl", io.BytesIO(b"{}\n")), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
    )
    assert hour.expires_at == hour.created_at + 3600
    assert client.files.retrieve(hour.id).expires_at == hour.expires_at


def test_files_list_pages_in_both_orders(client):
    ids = [client.files.create(file=(f"f{i}.jsonl", io.BytesIO(b"{}\n")), purpose="batch").id for i in range(3)]
    newest = client.files.list(limit=2)
    assert [f.id for f in newest.data] == ids[::-1][:2] and newest.has_more
    oldest = [f.id for f in client.files.list(order="asc")]
    assert oldest[-3:] == ids
    assert [f.id for f in client.files.list(after=ids[1], limit=5)][:1] == [ids[0]]


@pytest.mark.parametrize(
    ("kwargs", "status", "param"),
    [
        ({"data": {"purpose": "batch"}, "files": {"file": ("x.jsonl", b"\xff\xfe{}\n")}}, 400, "file"),
        ({"data": {"purpose": "batch"}, "files": {"file": ("x.jsonl", b"  \n")}}, 400, "file"),
        ({"data": {"purpose": "fine-tune"}, "files": {"file": ("x.jsonl", b"{}\n")}}, 400, "purpose"),
        ({"data": {}, "files": {"file": ("x.jsonl", b"{}\n")}}, 400, "purpose"),
        ({"data": {"purpose": "batch"}, "files": {"document": ("x.jsonl", b"{}\n")}}, 400, "file"),
        (
            {"data": {"purpose": "batch", **expiry("created_at", "60")}, "files": {"file": ("x.jsonl", b"{}\n")}},
            400,
            "expires_after",
        ),
        (
            {"data": {"purpose": "batch", **expiry("last_active_at", "3600")}, "files": {"file": ("x.jsonl", b"{}\n")}},
            400,
            "expires_after",
        ),
        ({"data": {"purpose": "batch"}}, 400, None),
        ({"json": {"purpose": "batch", "file": "{}"}}, 400, None),
        ({"data": {"purpose": "batch"}, "files": {"file": ("x.jsonl", b"{}\n" * (LIMIT // 3 + 1))}}, 413, None),
        ({"data": {"purpose": "batch"}, "files": {"file": ("x.jsonl", b"{}\n" * (LIMIT // 2))}}, 413, None),
        ({"data": {"purpose": "batch"}, "files": {"file": ("x.jsonl", b"{}\n" * LIMIT)}}, 413, None),
    ],
)
def test_malformed_uploads_are_refused_and_leave_nothing_behind(stack, client, kwargs, status, param):
    before = file_ids(client)
    response = httpx.post(stack.gateways[0].url + "/v1/files", timeout=10, **kwargs)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    assert file_ids(client) == before


def bodies(files_dir: Path) -> list[Path]:
    return [p for p in files_dir.rglob("*") if p.is_file()]


def test_expired_files_are_swept_from_the_store_and_the_files_dir(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("expiry")
    files_dir = tmp / "files"
    stack = start_stack(tmp, procs, batch={"file_retention_s": 2, "sweep_s": 0.2, "files_dir": str(files_dir)})
    client = client_for(stack.gateways[0])
    short = client.files.create(file=("s.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    kept = client.files.create(
        file=("k.jsonl", io.BytesIO(b"{}\n")), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
    )
    assert short.expires_at == short.created_at + 2
    assert len(bodies(files_dir)) == 2

    def swept() -> bool:
        try:
            client.files.retrieve(short.id)
        except openai.NotFoundError:
            return len(bodies(files_dir)) == 1
        return False

    assert wait_for(swept, timeout=15)
    assert client.files.retrieve(kept.id).id == kept.id
    assert client.files.content(kept.id).content == b"{}\n"
    assert short.id not in file_ids(client)


def multipart_head(boundary: str = "b0undary") -> tuple[bytes, dict[str, str]]:
    head = (
        f'--{boundary}\r\ncontent-disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\ncontent-disposition: form-data; name="file"; filename="big.jsonl"\r\n'
        "content-type: application/octet-stream\r\n\r\n"
    ).encode()
    return head, {"content-type": f"multipart/form-data; boundary={boundary}"}


def test_an_upload_without_a_length_is_read_only_up_to_the_limit(stack, client):
    before = file_ids(client)
    head, headers = multipart_head()
    # Four times the limit, never finished: a gateway that reads it all before judging never answers.
    status, _, answer = post_unfinished(stack.gateways[0].url, "/v1/files", head, 4 * LIMIT + FORM_OVERHEAD, headers)
    assert (status, answer["error"]["code"]) == (413, "file_too_large")
    assert file_ids(client) == before


def test_a_long_file_name_is_refused(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("n" * 1000 + ".jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    assert refused.value.code == "invalid_value" and len(refused.value.message) < 300


def test_each_key_keeps_files_within_its_quota(stack):
    quota = {"file_quota_files": 3, "file_quota_bytes": 100_000}
    stack.config, original = dict(stack.config, batch={**stack.config["batch"], **quota}), stack.config
    try:
        client = client_for(stack.add_gateway())
    finally:
        stack.config = original

    def put(size: int) -> str:
        return client.files.create(file=("f.jsonl", io.BytesIO(b"x" * (size - 1) + b"\n")), purpose="batch").id

    def refused(call) -> openai.BadRequestError:
        with pytest.raises(openai.BadRequestError) as error:
            call()
        assert error.value.code == "file_quota_exceeded" and error.value.param == "file"
        assert "3 files and 100000 bytes" in error.value.message
        return error.value

    first, _ = put(40_000), put(40_000)
    refused(lambda: put(30_000))  # 110,000 bytes in all
    batch_input = client.files.create(file=("in.jsonl", io.BytesIO(jsonl([chat_line(0)]))), purpose="batch").id
    refused(lambda: put(100))  # a fourth file

    # Full, a key cannot start a batch: its results would have nowhere to go.
    def start_batch():
        return client.batches.create(input_file_id=batch_input, endpoint=ENDPOINT, completion_window="24h")

    refused(start_batch)
    assert len(file_ids(client)) == 3
    client.files.delete(first)
    created = start_batch()
    assert created.status == "validating"
    # The batch's output took the freed room; once it is deleted there is room for an upload again.
    batch = wait_batch(client, created.id)
    refused(lambda: put(100))
    client.files.delete(batch.output_file_id)
    assert put(100)


# -- large downloads, through a real redis-server ----------------------------------------------

BIG = 64 * 1024 * 1024  # eight downloads held whole would take 512 MiB, past the 200 MiB bound


def file_behind_a_gateway(procs, tmp, size: int, download_timeout_s: float):
    """A gateway on a real redis-server and a file of about ``size`` bytes uploaded through it: the
    gateway, the file's id, its SHA-256 and its length."""
    server = RedisServer(tmp).start()
    procs.append(server)
    limits = {"download_timeout_s": download_timeout_s}
    stack = start_stack(tmp, procs, store=server.url, batch={"max_file_bytes": size + 1024}, limits=limits)
    gateway = stack.gateways[0]
    line = json.dumps(chat_line(0)).encode() + b"\n"
    data = line * (size // len(line))
    uploaded = client_for(gateway).files.create(file=("big.jsonl", io.BytesIO(data)), purpose="batch")
    return gateway, uploaded.id, hashlib.sha256(data).hexdigest(), len(data)


@pytest.fixture(scope="module")
def big_file(procs, tmp_path_factory):
    # Downloads that are read take what the host gives them: sixteen of 64 MiB at once on a busy
    # two-core machine, tens of seconds.
    return file_behind_a_gateway(procs, tmp_path_factory.mktemp("big-files"), BIG, download_timeout_s=600)


@pytest.fixture(scope="module")
def stalled_file(procs, tmp_path_factory):
    # Larger than what the sockets' buffers hold, so that a download nobody reads cannot finish.
    return file_behind_a_gateway(procs, tmp_path_factory.mktemp("stalled"), 16 * 1024 * 1024, download_timeout_s=5)


async def download(url: str, file_id: str, delay_s: float = 0.0) -> tuple[int, str, int]:
    """Status, SHA-256 and length of a download read in 1 MiB pieces (``delay_s`` between them)."""
    digest = hashlib.sha256()
    size = 0
    async with (
        httpx.AsyncClient(timeout=120) as http,
        http.stream("GET", f"{url}/v1/files/{file_id}/content") as response,
    ):
        async for chunk in response.aiter_bytes(1024 * 1024):
            digest.update(chunk)
            size += len(chunk)
            await asyncio.sleep(delay_s)
        return response.status_code, digest.hexdigest(), size


def test_concurrent_downloads_of_a_large_file_are_streamed_in_bounded_memory(big_file):
    gateway, file_id, sha, size = big_file

    async def eight() -> list[tuple[int, str, int]]:
        return list(await asyncio.gather(*(download(gateway.url, file_id, 0.005) for _ in range(8))))

    with peak_memory(lambda: rss_bytes(gateway)) as memory:
        done = asyncio.run(eight())
    print(f"8 downloads of {size / 2**20:.0f} MiB: RSS +{memory.growth:.0f} MiB (peak {memory.peak:.0f} MiB)")
    assert done == [(200, sha, size)] * 8
    assert memory.growth < 200, f"RSS grew {memory.growth:.0f} MiB"


def test_downloads_beyond_the_bound_are_told_to_come_back_and_other_calls_go_on(big_file):
    gateway, file_id, sha, size = big_file

    async def run() -> list[tuple[int, str, int]]:
        # 50 ms between 1 MiB reads: each of the sixteen read lasts 3 s at least, past the listing below.
        downloads = [asyncio.create_task(download(gateway.url, file_id, 0.05)) for _ in range(24)]
        async with httpx.AsyncClient(timeout=30) as http:
            # Once the eight beyond the bound have their answer, sixteen are being read.
            assert await until(lambda: sum(d.done() for d in downloads) >= 8, within_s=60)
            listed = await http.get(gateway.url + "/v1/files")
            assert listed.status_code == 200 and file_id in listed.text
        return list(await asyncio.gather(*downloads))

    done = asyncio.run(run())
    assert sorted(d[0] for d in done) == [200] * 16 + [503] * 8
    assert all(d == (200, sha, size) for d in done if d[0] == 200)


def test_a_download_that_stops_being_read_is_closed_and_its_slot_comes_back(stalled_file):
    gateway, file_id, _, _ = stalled_file
    stalled = []
    for _ in range(16):
        sock = socket.create_connection(("127.0.0.1", int(gateway.url.rsplit(":", 1)[1])))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(f"GET /v1/files/{file_id}/content HTTP/1.1\r\nhost: x\r\n\r\n".encode())
        stalled.append(sock)
    try:
        assert wait_for(lambda: httpx.get(f"{gateway.url}/v1/files/{file_id}/content").status_code == 503, timeout=5)
        # Nobody reads them: after download_timeout_s the gateway closes them and serves again.
        assert wait_for(lambda: asyncio.run(download(gateway.url, file_id))[0] == 200, timeout=60, interval=1)
    finally:
        for sock in stalled:
            sock.close()
