"""Request bodies, SSE parsing and error keys of the load generator."""

from __future__ import annotations

import orjson

from priority_gateway.bench.loadgen import Target, _content, _error_key, _EventReader
from priority_gateway.bench.workload import RequestSpec
from priority_gateway.upstream.h1 import EngineClient


def test_body_streams_with_usage_ignore_eos_and_max_tokens():
    target = Target(EngineClient("http://127.0.0.1:1"), "m", "chat", None)
    headers, body = target.request(RequestSpec("hello", 42, cls="batch"))
    data = orjson.loads(body)
    assert data["stream"] is True and data["stream_options"] == {"include_usage": True}
    assert data["ignore_eos"] is True and data["max_tokens"] == 42
    assert data["messages"] == [{"role": "user", "content": "hello"}]
    assert (b"x-priority", b"batch") in headers
    assert target.path == b"/v1/chat/completions"


def test_completions_body_and_class_override():
    target = Target(EngineClient("http://127.0.0.1:1"), "m", "completions", "interactive", ignore_eos=False)
    headers, body = target.request(RequestSpec("hello", 3, cls="batch"))
    data = orjson.loads(body)
    assert data["prompt"] == "hello" and "ignore_eos" not in data
    assert (b"x-priority", b"interactive") in headers
    assert target.path == b"/v1/completions"


def test_events_split_across_reads():
    reader = _EventReader()
    stream = b'data: {"a": 1}\n\ndata: {"b"' + b": 2}\n\n: comment\n\ndata: [DONE]\n\n"
    events = []
    for i in range(0, len(stream), 7):
        events += reader.feed(stream[i : i + 7])
    assert events == [b'{"a": 1}', b'{"b": 2}', b"[DONE]"]


def test_content_events_chat_and_completions():
    assert _content({"choices": [{"delta": {"content": "hi"}}]})
    assert not _content({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    assert not _content({"choices": [{"delta": {}, "finish_reason": "length"}]})
    assert _content({"choices": [{"text": " x"}]})
    assert not _content({"choices": [], "usage": {"completion_tokens": 3}})


def test_error_keys():
    assert _error_key("429", {"error": {"code": "slo_budget_exceeded", "type": "rate_limit_error"}}) == (
        "429 slo_budget_exceeded"
    )
    assert _error_key("404", {"error": {"code": 404, "type": "NotFoundError"}}) == "404 NotFoundError"
    assert _error_key("502", None) == "502"
    assert _error_key("stream", {"error": {"code": "upstream_error"}}) == "stream upstream_error"
