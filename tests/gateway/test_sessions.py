"""Recognising a request's session as clients send it: each source, the configured order, bad values."""

import pytest

from priority_gateway.sessions import MAX_PLAIN_CHARS, SOURCES, SessionRecognition, normalise

HEADERS = [
    "x-session-id",
    "x-session-affinity",
    "session-id",
    "x-claude-code-session-id",
    "x-gateway-inference-fairness-id",
]
FIELDS = ["prompt_cache_key", "conversation", "previous_response_id", "safety_identifier", "user"]


def test_every_source_is_known():
    assert sorted(SOURCES) == sorted(HEADERS + FIELDS)


@pytest.mark.parametrize("name", HEADERS)
def test_a_session_header_names_the_session(name):
    key = SessionRecognition().key({name.encode(): b"abc-123"}, {})
    assert key == "h:abc-123"


@pytest.mark.parametrize("field", FIELDS)
def test_a_body_field_names_the_session(field):
    assert SessionRecognition().key(None, {field: "abc-123"}) == f"b:{field}:abc-123"


def test_a_conversation_object_names_the_session_by_its_id():
    assert SessionRecognition().key(None, {"conversation": {"id": "conv_9"}}) == "b:conversation:conv_9"


def test_the_first_usable_source_in_the_configured_order_wins():
    headers = {b"x-session-affinity": b"from-header"}
    body = {"prompt_cache_key": "cache", "user": "alice"}
    assert SessionRecognition().key(headers, body) == "h:from-header"
    assert SessionRecognition(["user", "x-session-affinity"]).key(headers, body) == "b:user:alice"
    assert SessionRecognition(["prompt_cache_key"]).key(headers, body) == "b:prompt_cache_key:cache"
    assert SessionRecognition(["session-id"]).key(headers, body) is None
    assert SessionRecognition(enabled=False).key(headers, body) is None


@pytest.mark.parametrize("empty", [b"", b"   ", b"\t"])
def test_an_empty_value_is_ignored_and_the_next_source_is_tried(empty):
    key = SessionRecognition().key({b"x-session-id": empty, b"session-id": b"next"}, {"user": ""})
    assert key == "h:next"
    assert SessionRecognition().key({b"x-session-id": empty}, {"user": "  "}) is None


@pytest.mark.parametrize("value", [12, 3.5, True, None, ["a"], {"id": 5}])
def test_a_body_value_that_is_not_a_string_is_not_a_session_nor_an_error(value):
    assert SessionRecognition().key(None, {"user": value, "conversation": value}) is None


def test_long_and_non_ascii_values_become_bounded_hashes_that_still_match():
    huge = "s" * 1_000_000
    key = normalise(huge)
    assert key is not None and key.startswith("~") and len(key) <= MAX_PLAIN_CHARS
    assert normalise(huge) == key  # equal values, equal keys
    assert normalise(huge[:-1] + "t") == key  # only MAX_READ_BYTES of a value are read
    accented = normalise("séance-1")
    assert accented is not None and accented.startswith("~") and accented.isascii()
    assert normalise("séance-1") == accented and normalise("séance-2") != accented
    control = normalise("a\x00b\x1b[31m")
    assert control is not None and control.startswith("~") and control.isprintable()
    assert normalise("x" * MAX_PLAIN_CHARS) == "x" * MAX_PLAIN_CHARS
    assert normalise("x" * (MAX_PLAIN_CHARS + 1)).startswith("~")
    assert normalise(b"caf\xc3\xa9").startswith("~")  # header bytes, not ASCII


def test_an_unknown_source_is_refused():
    with pytest.raises(ValueError, match="x-nope"):
        SessionRecognition(["x-nope"])  # type: ignore[list-item]
