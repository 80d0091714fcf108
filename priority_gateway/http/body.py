"""Request bodies of the inference endpoints: parsed once, checked where routing reads them.

Rules:
- The gateway reads only what routing needs (model, stream, the output limit, the prompt,
  cache_salt; for the Responses API ``input`` and ``instructions``) and checks the
  shape of exactly those fields, so nothing it reads can fail later with a 500; every other
  field is the engine's to judge.
- The body is forwarded as received. Only a pool that takes vLLM's ``priority`` changes it,
  by appending the field to the raw bytes; the body is serialised again only when the client
  sent a ``priority`` of its own, which the gateway's must replace.
- Error messages never echo more than a short prefix of what the client sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

import orjson

from priority_gateway.errors import ApiError

ECHO_CHARS = 64


def echo(value: object) -> str:
    """A client-given value for an error message, cut to a short prefix."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= ECHO_CHARS else text[:ECHO_CHARS] + "..."


def _invalid(message: str, param: str) -> ApiError:
    return ApiError(400, message, "invalid_value", param)


def parse_body(body: bytes, required: str, check: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The JSON object of an inference request, with the fields routing reads checked (``check``:
    the endpoint's own fields, beyond ``messages`` and ``prompt``)."""
    if not body:
        raise ApiError(400, "request body is empty; expected a JSON object", "invalid_json")
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(parsed, dict):
        raise ApiError(400, "request body must be a JSON object", "invalid_json")
    value = parsed.get(required)
    if value is None:
        raise ApiError(400, f"'{required}' is required", "missing_required_parameter", required)
    if required == "messages":
        _check_messages(value)
    elif required == "prompt":
        _check_prompt(value)
    if check is not None:
        check(parsed)
    stream = parsed.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _invalid("'stream' must be a boolean", "stream")
    salt = parsed.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise _invalid("'cache_salt' must be a string", "cache_salt")
    return parsed


_CHAT_TEXT = ("text",)
_RESPONSES_TEXT = ("input_text", "output_text", "text")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise _invalid("'messages' must be a non-empty array", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid(f"'messages[{i}]' must be an object with 'role' and 'content'", f"messages[{i}]")
        _check_message(message, f"messages[{i}]", _CHAT_TEXT)


def _check_message(message: dict[str, Any], where: str, text_types: tuple[str, ...]) -> None:
    """A message's string ``role`` and its ``content``: a string, or typed parts whose text is a string."""
    if not isinstance(message.get("role"), str):
        raise _invalid(f"'{where}.role' must be a string", f"{where}.role")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _invalid(f"'{where}.content' must be a string or an array of parts", f"{where}.content")
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _invalid(f"'{where}.content[{j}]' must be an object with a string 'type'", f"{where}.content")
        if part["type"] in text_types and not isinstance(part.get("text"), str):
            raise _invalid(f"'{where}.content[{j}].text' must be a string", f"{where}.content")


def check_responses(parsed: dict[str, Any]) -> None:
    """The Responses API's ``instructions`` and ``input``: a string, or an array of items (objects;
    a message item has a string ``role`` and a string or an array of typed parts as ``content``, a
    ``function_call`` string ``name`` and ``arguments``, a ``function_call_output`` a string or an
    array of typed parts as ``output``)."""
    instructions = parsed.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _invalid("'instructions' must be a string", "instructions")
    items = parsed["input"]
    if isinstance(items, str):
        return
    if not isinstance(items, list):
        raise _invalid("'input' must be a string or an array of input items", "input")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _invalid(f"'input[{i}]' must be an object", f"input[{i}]")
        kind = item.get("type", "message")
        if not isinstance(kind, str):
            raise _invalid(f"'input[{i}].type' must be a string", f"input[{i}].type")
        if kind == "message":
            _check_message(item, f"input[{i}]", _RESPONSES_TEXT)
        elif kind == "function_call":
            # Both are rendered into the prompt: strings, as the API defines them (never a nest to recurse into).
            for name in ("name", "arguments"):
                if not isinstance(item.get(name, ""), str):
                    raise _invalid(f"'input[{i}].{name}' must be a string", f"input[{i}].{name}")
        elif kind == "function_call_output":
            output = item.get("output")
            if isinstance(output, list):
                for j, part in enumerate(output):
                    where = f"input[{i}].output[{j}]"
                    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                        raise _invalid(f"'{where}' must be an object with a string 'type'", where)
                    if part["type"] in _RESPONSES_TEXT and not isinstance(part.get("text"), str):
                        raise _invalid(f"'{where}.text' must be a string", where)
            elif output is not None and not isinstance(output, str):
                where = f"input[{i}].output"
                raise _invalid(f"'{where}' must be a string or an array of parts", where)


def _is_token(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_prompt(prompt: Any) -> None:
    if isinstance(prompt, str):
        return
    message = "'prompt' must be a string, an array of strings, an array of token ids or an array of such arrays"
    if not isinstance(prompt, list) or not prompt:
        raise _invalid(message, "prompt")
    first = prompt[0]
    if isinstance(first, str):
        ok = all(isinstance(p, str) for p in prompt)
    elif _is_token(first):
        ok = all(_is_token(t) for t in prompt)
    elif isinstance(first, list):
        ok = all(isinstance(p, list) and all(_is_token(t) for t in p) for p in prompt)
    else:
        ok = False
    if not ok:
        raise _invalid(message, "prompt")


# The output limit's fields, in the order vLLM reads them: a chat's ``max_completion_tokens`` wins
# over its ``max_tokens``; completions know only ``max_tokens``, responses ``max_output_tokens``.
_CHAT_LIMIT: tuple[str, ...] = ("max_completion_tokens", "max_tokens")
_COMPLETION_LIMIT: tuple[str, ...] = ("max_tokens",)
_RESPONSE_LIMIT: tuple[str, ...] = ("max_output_tokens",)


def max_tokens_of(parsed: Mapping[str, Any]) -> int | None:
    """The most tokens the engine will generate for this request, read as vLLM reads it; None when
    the client set none. The one reading of it: rate limits, fair-queue charges, slot predictions
    and deadlines all take this value. A limit that is not a positive integer is a 400 naming it."""
    if "messages" in parsed:
        names = _CHAT_LIMIT
    elif "prompt" in parsed:
        names = _COMPLETION_LIMIT
    else:
        names = _RESPONSE_LIMIT
    for name in names:
        value = parsed.get(name)
        if value is None:
            continue
        if not _is_token(value) or value < 1:
            raise _invalid(f"'{name}' must be a positive integer", name)
        return value
    return None


def with_priority(body: bytes, priority: int | None, replace: bool) -> bytes:
    """``body`` with vLLM's ``priority`` set, or without one (``None``: the pool takes none, and a
    client's own must not reach an engine that might honour it); ``replace``: the client sent one."""
    if not replace:
        if priority is None:
            return body
        end = body.rstrip()
        # A checked body is a JSON object with at least one member: append one more.
        return end[:-1] + b',"priority":%d}' % priority
    parsed = orjson.loads(body)
    if priority is None:
        del parsed["priority"]
    else:
        parsed["priority"] = priority
    try:
        return orjson.dumps(parsed)
    except orjson.JSONEncodeError:
        raise ApiError(400, "request body is nested too deeply to be forwarded", "invalid_json") from None
