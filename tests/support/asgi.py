"""Driving the gateway's ASGI app in-process: one request in, the whole answer out."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Answer:
    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""


async def call(
    app: Any,
    method: str,
    path: str,
    body: bytes = b"",
    headers: list[tuple[bytes, bytes]] | None = None,
    query: bytes = b"",
    chunked: bool = False,
) -> Answer:
    """One request through ``app`` as uvicorn would deliver it (``chunked``: no Content-Length)."""
    framing = [(b"transfer-encoding", b"chunked")] if chunked else [(b"content-length", str(len(body)).encode())]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [(b"host", b"test"), *framing, *(headers or [])],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    parts = [body[i : i + 65536] for i in range(0, len(body), 65536)] or [b""]
    answered = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if parts:
            chunk = parts.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(parts)}
        await answered.wait()
        return {"type": "http.disconnect"}

    answer = Answer()
    out: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            answer.headers = dict(message.get("headers", []))
        elif message["type"] == "http.response.body":
            out.append(message.get("body", b""))
            if not message.get("more_body"):
                answered.set()

    await app(scope, receive, send)
    answered.set()
    answer.body = b"".join(out)
    return answer
