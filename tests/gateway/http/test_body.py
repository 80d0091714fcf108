"""Request bodies: what routing reads is checked; vLLM's priority is written without re-serialising."""

from __future__ import annotations

import orjson
import pytest

from priority_gateway.errors import ApiError
from priority_gateway.http.body import echo, max_tokens_of, parse_body, with_priority


def test_priority_is_appended_to_the_raw_body():
    body = b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}  \n'
    out = with_priority(body, 1, replace=False)
    assert out.startswith(body.rstrip()[:-1])
    assert orjson.loads(out) == {**orjson.loads(body), "priority": 1}


def test_a_client_priority_is_replaced_not_duplicated():
    out = with_priority(b'{"prompt": "x", "priority": -100}', 1, replace=True)
    assert out.count(b"priority") == 1 and orjson.loads(out)["priority"] == 1


def test_a_body_too_deep_to_rewrite_is_a_400():
    deep = b'{"prompt": "x", "priority": 3, "a": ' + b"[" * 300 + b"]" * 300 + b"}"
    with pytest.raises(ApiError) as caught:
        with_priority(deep, 1, replace=True)
    assert caught.value.status == 400


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
    ],
)
def test_the_field_at_fault_is_named(body, param):
    with pytest.raises(ApiError) as caught:
        parse_body(orjson.dumps(body), "messages")
    assert caught.value.param == param


def test_the_output_limit_is_read_as_vllm_reads_it():
    chat = {"messages": []}
    assert max_tokens_of({**chat, "max_tokens": 16}) == 16
    assert max_tokens_of({**chat, "max_completion_tokens": 8}) == 8
    assert max_tokens_of({**chat, "max_tokens": 1, "max_completion_tokens": 400}) == 400
    assert max_tokens_of({"prompt": "x", "max_tokens": 16, "max_completion_tokens": 400}) == 16
    assert max_tokens_of({"input": "x", "max_output_tokens": 4, "max_tokens": 9}) == 4
    assert max_tokens_of({**chat, "max_tokens": None}) is None
    assert max_tokens_of(chat) is None


@pytest.mark.parametrize("value", [True, -1, 0, "16", 1.5, [16]])
def test_an_output_limit_that_is_not_a_positive_integer_is_400_naming_it(value):
    with pytest.raises(ApiError) as caught:
        max_tokens_of({"messages": [], "max_tokens": 4, "max_completion_tokens": value})
    assert caught.value.status == 400 and caught.value.param == "max_completion_tokens"


def test_echo_keeps_a_short_prefix():
    assert echo("x" * 10) == "x" * 10
    assert len(echo("x" * 10_000)) < 80


def test_a_client_priority_is_removed_where_the_pool_takes_none():
    out = with_priority(b'{"prompt": "x", "priority": -100, "n": 1}', None, replace=True)
    assert orjson.loads(out) == {"prompt": "x", "n": 1}


def test_a_body_without_priority_is_forwarded_as_sent_where_the_pool_takes_none():
    body = b'{"prompt": "x"}  '
    assert with_priority(body, None, replace=False) is body
