"""A batch's input file, checked line by line before any work starts.

Rules:
- Every line is a JSON object with a string ``custom_id`` (unique in the file), ``method``
  ``POST``, ``url`` equal to the batch's endpoint, and an object ``body`` whose ``model`` a
  pool serves. Blank lines are skipped. Errors name their 1-based line; the first
  ``MAX_ERRORS`` are kept.
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

from gateway.core.prefix import prompt_text
from gateway.store.records import Line

MAX_ERRORS = 100


@dataclass(slots=True)
class ParsedInput:
    lines: list[Line] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None


def _error(code: str, message: str, line: int | None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def parse_input(
    data: bytes, endpoint: str, models: Collection[str], max_lines: int, prefix_chars: int = 512
) -> ParsedInput:
    out = ParsedInput()
    seen: set[str] = set()
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
            item = orjson.loads(raw)
        except orjson.JSONDecodeError:
            fail("invalid_json_line", "This line is not parseable as valid JSON.", number)
            continue
        if not isinstance(item, dict):
            fail("invalid_json_line", "Each line must be a JSON object.", number)
            continue
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            fail("missing_required_parameter", "Each request needs a string 'custom_id'.", number, "custom_id")
            continue
        if custom_id in seen:
            fail("duplicate_custom_id", f"The custom_id {custom_id!r} is a duplicate of another request.", number)
            continue
        seen.add(custom_id)
        if item.get("method") != "POST":
            fail("invalid_method", f"'method' must be 'POST', got {item.get('method')!r}.", number, "method")
            continue
        if item.get("url") != endpoint:
            fail(
                "invalid_url",
                f"'url' must be the batch's endpoint {endpoint!r}, got {item.get('url')!r}.",
                number,
                "url",
            )
            continue
        body = item.get("body")
        if not isinstance(body, dict):
            fail("invalid_body", "'body' must be a JSON object.", number, "body")
            continue
        model = body.get("model")
        if model is None and len(models) == 1:
            model = next(iter(models))
        if not isinstance(model, str) or (models and model not in models):
            served = ", ".join(sorted(models)) or "none"
            fail("model_not_found", f"The model {model!r} is not served here (served: {served}).", number, "body.model")
            continue
        out.model = out.model or model
        body.pop("stream", None)
        body.pop("stream_options", None)
        prefix = prompt_text(body)[:prefix_chars] if endpoint != "/v1/embeddings" else str(body.get("input"))[:64]
        rows.append((model, prefix, len(rows), custom_id, orjson.dumps(body)))
    if out.errors:
        return out
    order = sorted(range(len(rows)), key=lambda i: rows[i][:3])
    positions = {row: position for position, row in enumerate(order)}
    out.lines = [Line(i, positions[i], row[3], row[4]) for i, row in enumerate(rows)]
    return out
