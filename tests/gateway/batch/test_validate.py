import orjson

from gateway.batch.validate import MAX_ERRORS, parse_input

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
