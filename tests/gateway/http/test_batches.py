"""The Batches API through the official openai client, on a gateway with the in-process store."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.gateway.batch.support import (
    MODEL,
    chat_line,
    client_for,
    file_lines,
    jsonl,
    start_stack,
    submit,
    upload,
    wait_batch,
)
from tests.support.observe import metric, wait_for
from tests.support.partial_body import post_unfinished


@pytest.fixture(scope="module")
def stack(procs, tmp_path_factory):
    return start_stack(tmp_path_factory.mktemp("batches"), procs, batch={"max_lines": 300, "concurrency": 8})


@pytest.fixture(scope="module")
def client(stack):
    return client_for(stack.gateways[0])


def test_a_batch_completes_with_every_custom_id_once(stack, client):
    url = stack.gateways[0].url
    before = metric(url, "gateway_requests_total", **{"class": "batch", "status": "200"})
    lines = [chat_line(i, prefix=f"shared system prompt {i % 3} " * 8) for i in range(40)]
    created = submit(
        client, lines, metadata={"job": "nightly"}, output_expires_after={"anchor": "created_at", "seconds": 7200}
    )
    assert created.status == "validating" and created.metadata == {"job": "nightly"}
    batch = wait_batch(client, created.id)
    assert batch.status == "completed", batch
    assert batch.request_counts.model_dump() == {"total": 40, "completed": 40, "failed": 0}
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    assert batch.error_file_id is None and batch.errors is None
    out = file_lines(client, batch.output_file_id)
    assert sorted(line["custom_id"] for line in out) == sorted(f"req-{i}" for i in range(40))
    for line in out:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["choices"][0]["message"]["content"]
        assert line["response"]["body"]["usage"]["completion_tokens"] == 4
    output_file = client.files.retrieve(batch.output_file_id)
    assert output_file.purpose == "batch_output" and output_file.bytes > 0
    assert output_file.expires_at == output_file.created_at + 7200
    # Every line went through the gateway's own path as a batch-class request.
    assert metric(url, "gateway_requests_total", **{"class": "batch", "status": "200"}) == before + 40
    assert metric(url, "gateway_batch_requests_total", status="completed") >= 40


@pytest.mark.parametrize(
    ("endpoint", "body", "check"),
    [
        ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 3}, lambda b: b["choices"][0]["text"]),
        ("/v1/embeddings", {"input": "embed me"}, lambda b: b["data"][0]["embedding"]),
    ],
)
def test_completions_and_embeddings_batches(client, endpoint, body, check):
    lines = [
        {"custom_id": f"c{i}", "method": "POST", "url": endpoint, "body": {"model": MODEL, **body}} for i in range(5)
    ]
    batch = wait_batch(client, submit(client, lines, endpoint=endpoint).id)
    assert batch.status == "completed" and batch.endpoint == endpoint
    out = file_lines(client, batch.output_file_id)
    assert len(out) == 5 and all(check(line["response"]["body"]) for line in out)


def test_invalid_input_fails_the_batch_with_errors_naming_lines(client):
    good = chat_line(0)
    data = jsonl(
        [
            good,
            b'{"custom_id": "broken", ',
            {**chat_line(1), "custom_id": "req-0"},
            {**chat_line(2), "method": "GET"},
            {**chat_line(3), "url": "/v1/completions"},
            {**chat_line(4), "body": {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}},
            {**chat_line(5), "custom_id": None},
        ]
    )
    created = client.batches.create(
        input_file_id=upload(client, data), endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = wait_batch(client, created.id)
    assert batch.status == "failed" and batch.failed_at is not None
    assert batch.output_file_id is None and batch.request_counts.total == 0
    errors = [(e.line, e.code) for e in batch.errors.data]
    assert errors == [
        (2, "invalid_json_line"),
        (3, "duplicate_custom_id"),
        (4, "invalid_method"),
        (5, "invalid_url"),
        (6, "model_not_found"),
        (7, "missing_required_parameter"),
    ]
    assert all(e.message for e in batch.errors.data)


def test_too_many_lines_fails_validation(client):
    batch = wait_batch(client, submit(client, [chat_line(i) for i in range(301)]).id)
    assert batch.status == "failed"
    assert [e.code for e in batch.errors.data] == ["too_many_requests"]


def test_requests_the_gateway_refuses_land_in_the_error_file(client):
    lines = [chat_line(0), {**chat_line(1), "body": {"model": MODEL, "max_tokens": 2}}]
    batch = wait_batch(client, submit(client, lines).id)
    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": 2, "completed": 1, "failed": 1}
    [ok] = file_lines(client, batch.output_file_id)
    [bad] = file_lines(client, batch.error_file_id)
    assert ok["custom_id"] == "req-0" and bad["custom_id"] == "req-1"
    assert bad["response"]["status_code"] == 400
    assert bad["response"]["body"]["error"]["code"] == "missing_required_parameter"


def test_cancel_stops_dispatch_and_keeps_what_finished(client):
    lines = [chat_line(i, max_tokens=150) for i in range(120)]
    created = submit(client, lines)
    wait_batch(client, created.id, until=("in_progress",))
    progressed = wait_for(lambda: client.batches.retrieve(created.id).request_counts.completed >= 8, timeout=30)
    assert progressed, "no progress in request_counts"
    cancelling = client.batches.cancel(created.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at is not None
    batch = wait_batch(client, created.id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    out = file_lines(client, batch.output_file_id)
    ids = [line["custom_id"] for line in out]
    assert len(ids) == len(set(ids)) == batch.request_counts.completed
    assert 8 <= batch.request_counts.completed < 120
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(created.id)


def test_an_expired_batch_keeps_finished_lines_and_reports_the_rest(stack):
    expiring = dict(stack.config, batch={**stack.config["batch"], "completion_window_s": 1.5, "concurrency": 2})
    stack.config, original = expiring, stack.config
    try:
        gateway = stack.add_gateway()
    finally:
        stack.config = original
    client = client_for(gateway)
    created = submit(client, [chat_line(i, max_tokens=200) for i in range(60)])
    batch = wait_batch(client, created.id, timeout=30)
    assert batch.status == "expired" and batch.expired_at is not None
    done = [line["custom_id"] for line in file_lines(client, batch.output_file_id)]
    expired = file_lines(client, batch.error_file_id)
    assert all(line["error"]["code"] == "batch_expired" and line["response"] is None for line in expired)
    assert done and expired
    assert sorted(done + [line["custom_id"] for line in expired]) == sorted(f"req-{i}" for i in range(60))


def test_batches_list_newest_first_with_pagination(client):
    ids = [submit(client, [chat_line(0)]).id for _ in range(3)]
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == ids[::-1][:2] and first.has_more
    second = client.batches.list(limit=2, after=ids[1])
    assert second.data[0].id == ids[0]
    walked = [b.id for b in client.batches.list(limit=2)]
    assert walked[:3] == ids[::-1] and len(walked) == len(set(walked))


def test_bad_create_requests_are_4xx_in_openai_shape(stack, client):
    url = stack.gateways[0].url + "/v1/batches"
    file_id = upload(client, jsonl([chat_line(0)]))
    cases = [
        ({"endpoint": "/v1/chat/completions", "completion_window": "24h"}, 400, "input_file_id"),
        ({"input_file_id": file_id, "endpoint": "/v1/images", "completion_window": "24h"}, 400, "endpoint"),
        (
            {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "1h"},
            400,
            "completion_window",
        ),
        (
            {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h", "metadata": [1]},
            400,
            "metadata",
        ),
        ({"input_file_id": "file-nope", "endpoint": "/v1/completions", "completion_window": "24h"}, 404, None),
        (
            {
                "input_file_id": file_id,
                "endpoint": "/v1/completions",
                "completion_window": "24h",
                "output_expires_after": {"anchor": "created_at", "seconds": 10**9},
            },
            400,
            "output_expires_after",
        ),
    ]
    for body, status, param in cases:
        response = httpx.post(url, json=body)
        assert response.status_code == status, (body, response.text)
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        if param:
            assert error["param"] == param
    response = httpx.post(url, content=b"{nope")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.NotFoundError):
        client.batches.cancel("batch_nope")
    assert json.loads(httpx.get(url + "?limit=0").text)["error"]["param"] == "limit"


def test_create_reads_a_bounded_body_and_echoes_only_a_prefix(stack):
    url = stack.gateways[0].url
    long_id = "file-" + "x" * 60_000
    body = {"input_file_id": long_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    response = httpx.post(url + "/v1/batches", json=body)
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert len(response.text) < 400
    response = httpx.get(url + "/v1/batches/batch_" + "y" * 10_000)
    assert response.status_code == 404 and len(response.text) < 400
    huge = httpx.post(url + "/v1/batches", json={**body, "input_file_id": "file-" + "x" * 10_000_000})
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "body_too_large"
    # Sent without a length and never finished: the gateway stops reading at its limit and answers.
    status, _, answer = post_unfinished(url, "/v1/batches", b'{"input_file_id": "', 1_000_000)
    assert (status, answer["error"]["code"]) == (413, "body_too_large")
