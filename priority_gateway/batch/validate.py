"""A batch's input file, checked line by line before any work starts.

Rules:
- Every line is a JSON object with a string ``custom_id`` (unique in the file), ``method``
  ``POST``, ``url`` equal to the batch's endpoint, and an object ``body`` whose ``model`` a
  pool serves. Blank lines are skipped. Errors name their 1-based line; the first
  ``MAX_ERRORS`` are kept.
- A body the gateway cannot read is an error of its line too: ``messages`` that is not an
  array of objects, or nesting deeper than JSON can be written back (``MAX_DEPTH``). What
  only the request path or the engine can judge (a missing ``messages``, a bad parameter)
  is left to them: such a line ends in the error file.
- No line, whatever it holds, raises: anything unexpected is an error of its line.
  Messages show client input only as a short excerpt.
- Streaming is meaningless in a batch: ``stream`` and ``stream_options`` are dropped.
- Dispatch order groups lines that share a prompt prefix: lines are sorted by model and
  the first ``prefix_chars`` characters of their prompt, so lines with the longest common
  prefixes sit next to each other (a hash would only group identical prefixes) and reach
  the engines close together, while the prefix is still in their KV cache.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import orjson

from priority_gateway.core.prefix import prompt_text
from priority_gateway.errors import excerpt
from priority_gateway.store.records import Line

MAX_ERRORS = 100
MAX_DEPTH = 254
"""orjson writes JSON nested at most this deep; a deeper body could never be sent on."""


@dataclass(slots=True)
class ParsedInput:
    lines: list[Line] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None


class LineError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


def _error(code: str, message: str, line: int | None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


@dataclass(slots=True)
class _Checker:
    endpoint: str
    models: Collection[str]
    prefix_chars: int
    seen: set[str] = field(default_factory=set)

    def read(self, raw: bytes) -> tuple[str, str, str, bytes]:
        """(model, dispatch prefix, custom_id, body) of one line, or ``LineError``."""
        try:
            item = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise LineError("invalid_json_line", "This line is not parseable as valid JSON.") from None
        if not isinstance(item, dict):
            raise LineError("invalid_json_line", "Each line must be a JSON object.")
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            raise LineError("missing_required_parameter", "Each request needs a string 'custom_id'.", "custom_id")
        if custom_id in self.seen:
            message = f"The custom_id {excerpt(custom_id)} is a duplicate of another request."
            raise LineError("duplicate_custom_id", message)
        self.seen.add(custom_id)
        if item.get("method") != "POST":
            raise LineError("invalid_method", f"'method' must be 'POST', got {excerpt(item.get('method'))}.", "method")
        if item.get("url") != self.endpoint:
            got = excerpt(item.get("url"))
            raise LineError("invalid_url", f"'url' must be the batch's endpoint {self.endpoint!r}, got {got}.", "url")
        body = item.get("body")
        if not isinstance(body, dict):
            raise LineError("invalid_body", "'body' must be a JSON object.", "body")
        model = body.get("model")
        if model is None and len(self.models) == 1:
            model = next(iter(self.models))
        if not isinstance(model, str) or (self.models and model not in self.models):
            served = ", ".join(sorted(self.models)) or "none"
            raise LineError(
                "model_not_found", f"The model {excerpt(model)} is not served here (served: {served}).", "body.model"
            )
        messages = body.get("messages")
        if messages is not None and not (isinstance(messages, list) and all(isinstance(m, dict) for m in messages)):
            raise LineError("invalid_value", "'messages' must be an array of message objects.", "body.messages")
        body.pop("stream", None)
        body.pop("stream_options", None)
        try:
            data = orjson.dumps(body)
        except orjson.JSONEncodeError:
            message = f"The body is nested more than {MAX_DEPTH} levels deep."
            raise LineError("invalid_json_line", message, "body") from None
        if self.endpoint == "/v1/embeddings":
            value = body.get("input")
            if isinstance(value, list) and value:
                value = value[0]
            prefix = value[:64] if isinstance(value, str) else ""
        else:
            prefix = prompt_text(body)[: self.prefix_chars]
        return model, prefix, custom_id, data


def parse_input(
    data: bytes, endpoint: str, models: Collection[str], max_lines: int, prefix_chars: int = 512
) -> ParsedInput:
    out = ParsedInput()
    checker = _Checker(endpoint, models, prefix_chars)
    rows: list[tuple[str, str, int, str, bytes]] = []

    def fail(code: str, message: str, line: int | None, param: str | None = None) -> None:
        if len(out.errors) < MAX_ERRORS:
            out.errors.append(_error(code, message, line, param))

    raw_lines = data.split(b"\n")
    count = sum(1 for raw in raw_lines if raw.strip())
    if count == 0:
        fail("empty_file", "The input file has no requests.", None)
        return out
    if count > max_lines:
        fail("too_many_requests", f"The input file has {count} requests; the limit is {max_lines}.", None)
        return out
    for number, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        try:
            model, prefix, custom_id, body = checker.read(raw)
        except LineError as exc:
            fail(exc.code, exc.message, number, exc.param)
            continue
        except Exception as exc:  # whatever a line holds, it is that line's error
            fail("invalid_request", f"This line could not be read ({type(exc).__name__}).", number)
            continue
        out.model = out.model or model
        rows.append((model, prefix, len(rows), custom_id, body))
    if out.errors:
        return out
    order = sorted(range(len(rows)), key=lambda i: rows[i][:3])
    positions = {row: position for position, row in enumerate(order)}
    out.lines = [Line(i, positions[i], row[3], row[4]) for i, row in enumerate(rows)]
    return out
