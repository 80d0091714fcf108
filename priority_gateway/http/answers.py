"""What an engine answered, judged before it reaches the client.

Rules:
- A success is a JSON object for a plain request and an event stream for a streamed one;
  anything else (HTML, plain text, a cut-off body) is the engine's failure: 502.
- Engine errors that are the client's fault keep the engine's message, in OpenAI's shape:
  400, 413 and 422 become 400 (bad parameters), 404 stays 404.
- Other engine errors become 503 (503, and 429: the engine is busy; retry shortly), 504 (504,
  408) or 502 (everything else: 5xx, and 4xx that mean the gateway and engine disagree),
  always in OpenAI's shape; an engine's own body never reaches the client for them.
"""

from __future__ import annotations

from typing import Any

import orjson

from priority_gateway.errors import ApiError

MESSAGE_CHARS = 1000

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


def _engine_message(payload: bytes) -> str | None:
    body = json_object(payload)
    if body is None:
        return None
    error = body.get("error")
    message = error.get("message") if isinstance(error, dict) else body.get("message")
    if not isinstance(message, str) or not message:
        return None
    return message[:MESSAGE_CHARS]


def engine_error(status: int, content_type: bytes | None, payload: bytes) -> ApiError:
    """The client's answer to an engine's error status."""
    message = _engine_message(payload) if is_json(content_type) else None
    mapped = _CLIENT_FAULTS.get(status)
    if mapped is not None and message is not None:
        code = "model_not_found" if mapped == 404 else "invalid_request"
        return ApiError(mapped, message, code)
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
