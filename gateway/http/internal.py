"""Calls into the gateway's own request path from inside the process.

A batch line becomes an ASGI request to the ``Proxy``: the same parsing, classification,
admission, routing and relay as a client's request, without a socket or a second trip
through HTTP. The body is handed over in one message; the response is collected whole.
The request carries its batch id and ``custom_id`` for the access log and, with tracing on,
runs under the line's own span.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.batch.runner import Executor, LineCall, LineResponse
from gateway.http.proxy import BATCH_LINE, ENDPOINTS, Proxy

if TYPE_CHECKING:
    from gateway.runtime import Gateway


@dataclass(slots=True)
class InternalResponse:
    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""


class InternalCaller:
    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    async def post(
        self, path: str, body: bytes, headers: list[tuple[bytes, bytes]], line: tuple[str, str] | None = None
    ) -> InternalResponse:
        endpoint = ENDPOINTS[path]
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
            BATCH_LINE: line,
        }
        delivered = False
        never: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            # Nobody disconnects from an in-process call: the proxy's watcher waits here until cancelled.
            return await never

        response = InternalResponse()
        parts: list[bytes] = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                response.status = message["status"]
                response.headers = list(message.get("headers", []))
            elif message["type"] == "http.response.body":
                parts.append(message.get("body", b""))

        try:
            await self.proxy.handle(scope, receive, send, endpoint)
        finally:
            never.cancel()
        response.body = b"".join(parts)
        return response


def batch_executor(gateway: Gateway, proxy: Proxy) -> Executor:
    """Batch lines as batch-class requests of their owner, through ``proxy``."""
    caller = InternalCaller(proxy)

    async def execute(call: LineCall) -> LineResponse:
        headers = [
            (b"x-priority", b"batch"),
            (b"x-request-id", call.request_id.encode()),
            (b"authorization", gateway.keys.internal_authorization(call.owner)),
        ]
        line = (call.batch_id, call.custom_id)
        if gateway.tracing is None:
            response = await caller.post(call.endpoint, call.body, headers, line)
            return LineResponse(response.status, response.body)
        span = gateway.tracing.batch_line(call.batch_id, call.custom_id)
        status = 500
        try:
            response = await caller.post(call.endpoint, call.body, headers + span.headers, line)
            status = response.status
        finally:
            span.end(status)
        return LineResponse(response.status, response.body)

    return execute
