"""Calls into the gateway's own request path from inside the process.

A batch line goes through ``Proxy.call``: the same parsing, classification, admission,
routing and relay as a client's request, without a socket, an ASGI request or a second trip
through HTTP. The answer is collected whole. The request carries its batch id and
``custom_id`` for the access log and, with tracing on, runs under the line's own span.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starlette.types import Message

from priority_gateway.batch.runner import Executor, LineCall, LineResponse
from priority_gateway.http.proxy import ENDPOINTS, Proxy

if TYPE_CHECKING:
    from priority_gateway.http.tracing import Tracing


@dataclass(slots=True)
class InternalResponse:
    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""


async def post(
    proxy: Proxy, path: str, body: bytes, headers: Sequence[tuple[bytes, bytes]], line: tuple[str, str] | None = None
) -> InternalResponse:
    """``POST path`` with ``body`` through ``proxy``, the answer collected whole."""
    response = InternalResponse()
    parts: list[bytes] = []

    async def collect(message: Message) -> None:
        if message["type"] == "http.response.start":
            response.status = message["status"]
            response.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    headers = [(b"content-type", b"application/json"), *headers]
    await proxy.call(ENDPOINTS[path], body, headers, collect, line)
    response.body = b"".join(parts)
    return response


def batch_executor(proxy: Proxy, authorization: Callable[[str], bytes], tracing: Tracing | None) -> Executor:
    """Batch lines as batch-class requests of their owner (``authorization(owner)``), through ``proxy``."""

    async def execute(call: LineCall) -> LineResponse:
        headers = [
            (b"x-priority", b"batch"),
            (b"x-request-id", call.request_id.encode()),
            (b"authorization", authorization(call.owner)),
        ]
        line = (call.batch_id, call.custom_id)
        if tracing is None:
            response = await post(proxy, call.endpoint, call.body, headers, line)
            return LineResponse(response.status, response.body)
        span = tracing.batch_line(call.batch_id, call.custom_id)
        status = 500
        try:
            response = await post(proxy, call.endpoint, call.body, [*headers, *span.headers], line)
            status = response.status
        finally:
            span.end(status)
        return LineResponse(response.status, response.body)

    return execute
