"""What an engine answered, judged before it reaches the client.

Rules:
- A success is a JSON object for a plain request and an event stream for a streamed one;
  anything else (HTML, plain text, a cut-off body) is the engine's failure: 502.
- Engine errors that are the client's fault are the engine's own, in OpenAI's shape: 400, 413 and
  422 become 400 (bad parameters), 404 stays 404, each with the engine's message and ``param`` (an
  unknown ``previous_response_id`` is not an unknown model) and its ``code`` when that is a string
  (vLLM's is the status number: then ``model_not_found`` for a 404 on ``model``, ``not_found`` for
  another 404, ``invalid_request`` for a 400).
- Other engine errors become 503 (503, and 429: the engine is busy; retry shortly), 504 (504,
  408) or 502 (everything else: 5xx, and 4xx that mean the gateway and engine disagree),
  always in OpenAI's shape; an engine's own body never reaches the client for them.
"""

from __future__ import annotations

from typing import Any

import orjson

from priority_gateway.errors import ApiError

MESSAGE_CHARS = 1000
FIELD_CHARS = 64

_CLIENT_FAULTS = {400: 400, 413: 400, 422: 400, 404: 404}
_ENGINE_FAULTS = {503: 503, 429: 503, 504: 504, 408: 504}


def json_object(payload: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def is_json(content_type: bytes | None) -> bool:
    return content_type is not None and b"json" in content_type.lower()


def is_event_stream(content_type: bytes | None) -> bool:
    return content_type is not None and content_type.lower().startswith(b"text/event-stream")


def _field(error: dict[str, Any], name: str) -> str | None:
    value = error.get(name)
    return value[:FIELD_CHARS] if isinstance(value, str) and value else None


def engine_message(payload: bytes) -> str | None:
    """The message of an engine's error body in OpenAI's (or FastAPI's) shape, cut to ``MESSAGE_CHARS``."""
    fields = _engine_error_fields(payload)
    return fields[0] if fields is not None else None


def _engine_error_fields(payload: bytes) -> tuple[str, str | None, str | None] | None:
    """The engine's error ``message``, ``code`` (if a string) and ``param``; None without a message."""
    body = json_object(payload)
    if body is None:
        return None
    error = body.get("error")
    error = error if isinstance(error, dict) else body  # vLLM before 0.10 answered the fields at the top
    message = error.get("message")
    if not isinstance(message, str) or not message:
        return None
    return message[:MESSAGE_CHARS], _field(error, "code"), _field(error, "param")


def engine_error(status: int, content_type: bytes | None, payload: bytes) -> ApiError:
    """The client's answer to an engine's error status."""
    fields = _engine_error_fields(payload) if is_json(content_type) else None
    message = fields[0] if fields is not None else None
    mapped = _CLIENT_FAULTS.get(status)
    if mapped is not None and fields is not None:
        message, code, param = fields
        if code is None:
            code = ("model_not_found" if param == "model" else "not_found") if mapped == 404 else "invalid_request"
        return ApiError(mapped, message, code, param)
    mapped = _ENGINE_FAULTS.get(status, 502)
    detail = f": {message}" if message else ""
    if mapped == 503:
        return ApiError(503, f"engine busy ({status}){detail}", "upstream_busy", retry_after_s=1.0)
    if mapped == 504:
        return ApiError(504, f"engine timed out ({status}){detail}", "upstream_timeout")
    return ApiError(502, f"engine failed ({status}){detail}", "upstream_error")


def not_json(status: int, content_type: bytes | None) -> ApiError:
    kind = (content_type or b"no content type").decode("latin-1")[:64]
    return ApiError(502, f"engine answered {status} with a body that is not a JSON object ({kind})", "upstream_error")
