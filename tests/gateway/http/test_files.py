"""The Files API through the official openai client, and what it refuses."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.batch.support import chat_line, client_for, jsonl, start_stack
from tests.support.observe import wait_for

LIMIT = 50_000


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
