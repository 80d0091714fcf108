"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import orjson
from starlette.types import Send

ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class ApiError(Exception):
    """An error answered to the client with ``status`` and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        retry_after_s: float | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s
        self.headers = headers or []

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.code, self.param)

    def response_headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"content-type", b"application/json"), *self.headers]
        if self.retry_after_s is not None:
            headers.append((b"retry-after", retry_after_value(self.retry_after_s)))
        return headers


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
                "param": param,
                "code": code,
            }
        }
    )


def retry_after_value(seconds: float) -> bytes:
    # Retry-After takes whole seconds; never advertise 0, which invites a hot retry loop.
    return str(max(1, int(seconds + 0.999))).encode()


def excerpt(value: object, limit: int = 64) -> str:
    """Client input as an error message may show it: a short prefix, never the whole of it."""
    if isinstance(value, str):
        shown = repr(value[:limit])
        return shown if len(value) <= limit else f"{shown}... ({len(value)} characters)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) or (isinstance(value, int) and abs(value) < 10**limit):
        return repr(value)[:limit]
    return {dict: "an object", list: "an array", int: "a number"}.get(type(value), type(value).__name__)


async def send_error(send: Send, exc: ApiError) -> None:
    """Answer an ASGI request with ``exc``."""
    await send({"type": "http.response.start", "status": exc.status, "headers": exc.response_headers()})
    await send({"type": "http.response.body", "body": exc.body()})
