"""Malformed inference requests get 4xx in OpenAI's shape, never a bare 500: real gateway, real HTTP."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.support.procs import start_engine, start_gateway

MODEL = "sim-model"


@pytest.fixture(scope="module")
def gateway(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("malformed")
    interactive = start_engine(tmp, "--token-delay-ms", "1")
    batch = start_engine(tmp, "--token-delay-ms", "1", "--scheduling-policy", "priority")
    procs.extend([interactive, batch])
    interactive.wait_ready()
    batch.wait_ready()
    config = {
        "pools": {
            "interactive": {"engines": [interactive.url]},
            "batch": {"engines": [batch.url], "scheduling_policy": "priority"},
        }
    }
    gw = start_gateway(tmp, config)
    procs.append(gw)
    gw.wait_ready("/ready")
    return gw


def nested(depth: int, leaf: object = "x") -> object:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def assert_4xx(response: httpx.Response) -> dict:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert len(error["message"]) < 400
    return error


BAD_CHAT_BODIES = [
    {"messages": [1]},
    {"messages": ["hi"]},
    {"messages": [None]},
    {"messages": "hello"},
    {"messages": [{"role": "user", "content": nested(900)}]},
    {"messages": [{"role": nested(900), "content": "x"}]},
    {"messages": [{"role": "user", "content": [nested(900)]}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": nested(900)}]}]},
    {"messages": [{"role": "user", "content": "x"}], "cache_salt": nested(900)},
    {"messages": [{"role": "user", "content": "x"}], "cache_salt": 5},
    {"messages": [{"role": "user", "content": "x"}], "stream": "yes"},
    {"messages": [{"role": "user", "content": "x"}], "model": "m" * 100_000},
]


@pytest.mark.parametrize("body", BAD_CHAT_BODIES, ids=range(len(BAD_CHAT_BODIES)))
@pytest.mark.parametrize("priority", ["interactive", "batch"])
def test_malformed_chat_requests_are_4xx(gateway, body, priority):
    r = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": MODEL, **body},
        headers={"x-priority": priority},
        timeout=10,
    )
    assert_4xx(r)


@pytest.mark.parametrize("prompt", [[None], [1, [2]], [[1], "x"], [{"a": 1}], nested(900), [True], {}])
def test_malformed_completion_prompts_are_4xx(gateway, prompt):
    r = httpx.post(gateway.url + "/v1/completions", json={"model": MODEL, "prompt": prompt}, timeout=10)
    assert_4xx(r)


def test_a_deep_body_to_a_priority_pool_is_served_or_refused_never_500(gateway):
    deep = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "extra": nested(300)}
    r = httpx.post(gateway.url + "/v1/chat/completions", json=deep, headers={"x-priority": "batch"}, timeout=10)
    assert r.status_code < 500, r.text[:300]
    with_own_priority = {**deep, "priority": 7}
    r = httpx.post(
        gateway.url + "/v1/chat/completions", json=with_own_priority, headers={"x-priority": "batch"}, timeout=10
    )
    assert_4xx(r)


def test_the_openai_client_gets_a_bad_request_error_for_non_object_messages(gateway):
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=10)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=["hello"])  # type: ignore[list-item]
    assert caught.value.body["param"] == "messages[0]"


def test_errors_echo_only_a_short_prefix_of_the_input(gateway):
    r = httpx.post(
        gateway.url + "/v1/chat/completions",
        content=json.dumps({"model": "x" * 1_000_000, "messages": [{"role": "user", "content": "x"}]}),
        headers={"x-priority": "y" * 4000},
        timeout=10,
    )
    assert_4xx(r)
    assert len(r.content) < 1000


def test_a_request_id_that_cannot_be_echoed_is_replaced(gateway):
    r = httpx.post(
        gateway.url + "/v1/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 2},
        headers={"x-request-id": "é".encode("latin-1") * 10},
        timeout=10,
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"].isascii()
