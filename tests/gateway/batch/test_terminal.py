"""Every batch reaches a terminal state: a line the gateway cannot read fails the batch with
``errors`` naming it, and a step that breaks fails its batch with a reason instead of looping."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.batch.support import MODEL, TERMINAL, chat_line, client_for, jsonl, start_stack, upload, wait_batch
from tests.support.examples import examples

DEEP = 300  # past orjson's limit of 254 levels when writing JSON back


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def with_messages(messages: Any) -> dict[str, Any]:
    line = chat_line(1)
    line["body"]["messages"] = messages
    return line


@pytest.fixture(scope="module")
def stack(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("terminal")
    return start_stack(tmp, procs, batch={"files_dir": str(tmp / "files"), "max_lines": 50})


@pytest.fixture(scope="module")
def client(stack):
    return client_for(stack.gateways[0])


def run(client, lines: list[Any]) -> Any:
    file_id = upload(client, jsonl(lines))
    created = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    return wait_batch(client, created.id, timeout=15)


@pytest.mark.parametrize(
    ("bad", "param"),
    [
        (with_messages([1]), "body.messages"),
        (with_messages(["hi"]), "body.messages"),
        (with_messages([None]), "body.messages"),
        (with_messages("hello"), "body.messages"),
        (with_messages({"role": "user"}), "body.messages"),
        ({**chat_line(1), "body": {**chat_line(1)["body"], "logit_bias": nested(DEEP)}}, "body"),
        (with_messages([{"role": "user", "content": nested(DEEP)}]), "body"),
    ],
    ids=["int", "string", "null", "text", "object", "deep-field", "deep-content"],
)
def test_a_line_the_gateway_cannot_read_fails_the_batch_naming_it(client, bad, param):
    batch = run(client, [chat_line(0), chat_line(2), bad, chat_line(3)])
    assert batch.status == "failed" and batch.failed_at is not None
    [error] = batch.errors.data
    assert (error.line, error.param) == (3, param)
    assert error.code and error.message and len(error.message) < 300


def test_a_long_custom_id_is_not_echoed_back(client):
    long_id = "c" * 100_000
    batch = run(client, [{**chat_line(0), "custom_id": long_id}, {**chat_line(1), "custom_id": long_id}])
    [error] = batch.errors.data
    assert (error.line, error.code) == (2, "duplicate_custom_id")
    assert len(error.message) < 300


def test_a_broken_step_fails_its_batch_with_a_reason(stack, client):
    file_id = upload(client, jsonl([chat_line(0)]))
    blob = Path(stack.config["batch"]["files_dir"]) / file_id
    blob.unlink()
    blob.mkdir()  # reading the input now raises, as a broken volume would
    created = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = wait_batch(client, created.id, timeout=15)
    assert batch.status == "failed" and batch.failed_at is not None
    [error] = batch.errors.data
    assert error.code == "batch_step_failed" and error.line is None
    # The batch after it is not held up.
    assert run(client, [chat_line(0)]).status == "completed"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
deep = st.integers(min_value=250, max_value=400).map(nested)
anything = json_values | deep
bodies = st.fixed_dictionaries(
    {"model": st.just(MODEL), "max_tokens": st.just(2)},
    optional={"messages": anything | st.lists(anything, min_size=1, max_size=3), "extra": anything},
)
envelopes = st.builds(
    lambda body, cid: {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body},
    bodies | anything,
    st.text(min_size=1, max_size=6),
)
lines = st.lists(envelopes | anything, min_size=1, max_size=4)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=lines)
def test_any_json_lines_end_in_a_terminal_state(client, items):
    batch = run(client, [json.dumps(item).encode() for item in items])
    assert batch.status in TERMINAL
    if batch.status == "failed":
        assert batch.errors.data
        assert all(e.line is None or 1 <= e.line <= len(items) for e in batch.errors.data)
    else:
        assert batch.status == "completed"
        counts = batch.request_counts
        assert counts.total == len(items) == counts.completed + counts.failed
