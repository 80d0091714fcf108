import json

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from priority_gateway.batch.validate import MAX_ERRORS, parse_input
from tests.support.examples import examples

ENDPOINT = "/v1/chat/completions"


def line(custom_id: str, text: str, **body) -> bytes:
    item = {
        "custom_id": custom_id,
        "method": "POST",
        "url": ENDPOINT,
        "body": {"model": "m", "messages": [{"role": "user", "content": text}], **body},
    }
    return orjson.dumps(item)


def test_lines_sharing_a_prefix_are_dispatched_next_to_each_other():
    texts = ["beta tail 1", "alpha shared start, then x", "beta tail 2", "alpha shared start, then y", "gamma"]
    data = b"\n".join(line(f"c{i}", t) for i, t in enumerate(texts))
    parsed = parse_input(data, ENDPOINT, {"m"}, 100)
    assert not parsed.errors and parsed.model == "m"
    by_position = [texts[x.index] for x in sorted(parsed.lines, key=lambda x: x.position)]
    assert by_position == sorted(texts)
    assert [x.custom_id for x in parsed.lines] == [f"c{i}" for i in range(5)]


def test_streaming_is_dropped_and_a_single_served_model_is_assumed():
    item = orjson.loads(line("a", "x", stream=True, stream_options={"include_usage": True}))
    del item["body"]["model"]
    parsed = parse_input(orjson.dumps(item), ENDPOINT, {"only"}, 10)
    body = orjson.loads(parsed.lines[0].body)
    assert "stream" not in body and "stream_options" not in body
    assert parsed.model == "only"


def test_blank_lines_are_skipped_and_line_numbers_count_them():
    data = b"\n".join([line("a", "x"), b"", b"   ", b"[1, 2]"])
    parsed = parse_input(data, ENDPOINT, {"m"}, 10)
    assert [(e["line"], e["code"]) for e in parsed.errors] == [(4, "invalid_json_line")]
    assert parsed.lines == []


def test_empty_and_oversized_files_fail_as_a_whole():
    assert [e["code"] for e in parse_input(b"\n \n", ENDPOINT, {"m"}, 10).errors] == ["empty_file"]
    many = b"\n".join(line(f"c{i}", "x") for i in range(11))
    assert [e["code"] for e in parse_input(many, ENDPOINT, {"m"}, 10).errors] == ["too_many_requests"]


def test_errors_are_capped():
    data = b"\n".join(b"{" for _ in range(MAX_ERRORS + 50))
    assert len(parse_input(data, ENDPOINT, {"m"}, 10_000).errors) == MAX_ERRORS


def nested(depth: int, leaf: object = "x") -> object:
    value = leaf
    for _ in range(depth):
        value = [value] if depth % 2 else {"k": value}
    return value


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


def mostly(common: st.SearchStrategy, rare: st.SearchStrategy) -> st.SearchStrategy:
    """``common`` three times in four, ``rare`` otherwise (``one_of`` would treat them alike)."""
    return st.integers(0, 3).flatmap(lambda i: rare if i == 0 else common)


anything = mostly(json_values, st.integers(min_value=240, max_value=400).map(nested))


message_lists = st.lists(
    anything | st.fixed_dictionaries({"role": anything, "content": anything}), min_size=0, max_size=3
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": mostly(st.just("m"), anything),
        "messages": message_lists | anything,
        "prompt": anything,
        "input": anything,
        "stream": anything,
        "cache_salt": anything,
    },
)
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


def envelopes(endpoint: str) -> st.SearchStrategy:
    return st.fixed_dictionaries(
        {
            "custom_id": mostly(st.text(min_size=1, max_size=4), anything),
            "method": mostly(st.just("POST"), anything),
            "url": mostly(st.just(endpoint), anything),
            "body": mostly(bodies, anything),
        }
    )


def encode(item: object) -> bytes:
    return json.dumps(item, allow_nan=True).encode()


def deep_line(depth: int) -> bytes:
    """A request whose body nests ``depth`` levels (past Python's own recursion limit if need be)."""
    return (
        b'{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"x":'
        + b"[" * depth
        + b"]" * depth
        + b"}}"
    )


def raw_lines(endpoint: str) -> st.SearchStrategy:
    odd = st.one_of(
        anything.map(encode),
        st.integers(min_value=200, max_value=1100).map(deep_line),
        st.binary(max_size=40).filter(lambda b: b"\n" not in b),
    )
    return mostly(envelopes(endpoint).map(encode), odd)


one_line = st.sampled_from(ENDPOINTS).flatmap(lambda ep: st.tuples(st.just(ep), raw_lines(ep)))
many_lines = st.sampled_from(ENDPOINTS).flatmap(
    lambda ep: st.tuples(st.just(ep), st.lists(raw_lines(ep), min_size=1, max_size=8))
)


@settings(max_examples=examples(1000), deadline=None)
@given(case=one_line)
def test_any_line_is_an_accepted_request_or_an_error_of_that_line(case):
    endpoint, raw = case
    parsed = parse_input(raw, endpoint, {"m"}, 10)
    if not raw.strip():
        assert [e["code"] for e in parsed.errors] == ["empty_file"]
        return
    if parsed.errors:
        [error] = parsed.errors
        assert error["line"] == 1 and error["code"] and 0 < len(error["message"]) < 300
        assert parsed.lines == []
    else:
        [accepted] = parsed.lines
        body = orjson.loads(accepted.body)
        assert isinstance(body, dict) and "stream" not in body
        messages = body.get("messages")
        assert messages is None or all(isinstance(m, dict) for m in messages)


@settings(max_examples=examples(200), deadline=None)
@given(case=many_lines)
def test_a_file_of_any_lines_is_accepted_whole_or_fails_naming_its_lines(case):
    endpoint, lines = case
    data = b"\n".join(lines)
    parsed = parse_input(data, endpoint, {"m"}, 100)
    numbers = {n for n, raw in enumerate(data.split(b"\n"), start=1) if raw.strip()}
    if parsed.errors:
        assert parsed.lines == []
        assert all(e["line"] in numbers or e["code"] == "empty_file" for e in parsed.errors)
    else:
        assert len(parsed.lines) == len(numbers)
        assert sorted(x.position for x in parsed.lines) == list(range(len(numbers)))


def test_lines_the_gateway_cannot_read_are_errors_naming_them():
    cases = {
        b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [1]}}': (
            "invalid_value",
            "body.messages",
        ),
        b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": "hi"}}': (
            "invalid_value",
            "body.messages",
        ),
        deep_line(300): ("invalid_json_line", "body"),
        deep_line(1100): ("invalid_json_line", None),
    }
    for raw, (code, param) in cases.items():
        [error] = parse_input(raw, ENDPOINT, {"m"}, 10).errors
        assert (error["line"], error["code"], error["param"]) == (1, code, param)


def test_client_input_in_messages_is_cut_short():
    item = orjson.loads(line("a", "x"))
    errors = parse_input(
        b"\n".join(orjson.dumps({**item, **change}) for change in ({}, {}, {"method": "G" * 10**5})),
        ENDPOINT,
        {"m"},
        10,
    ).errors
    assert [e["code"] for e in errors] == ["duplicate_custom_id", "duplicate_custom_id"]
    errors = parse_input(orjson.dumps({**item, "url": "u" * 10**5}), ENDPOINT, {"m"}, 10).errors
    assert errors[0]["code"] == "invalid_url" and len(errors[0]["message"]) < 300
