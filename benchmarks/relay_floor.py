"""The least a Python relay can cost: two relays that do nothing but pass requests round robin to engines.

``relay_overhead.py --targets ...,asgi-floor,protocol-floor`` measures them beside the gateway and
``vllm-router``, to say how much of the gateway's CPU per request is its own work and how much any
relay on the same stack pays:

- ``asgi``: uvicorn (httptools, uvloop) and a bare ASGI app, as the gateway's HTTP layer runs;
- ``protocol``: an ``asyncio.Protocol`` on uvloop that parses with httptools and writes the answer
  itself, with no ASGI messages, no task per request beyond the relay's own, and no checks.

Both relay through the gateway's own engine client (``priority_gateway.upstream.h1``). Neither is a
product: no limits, no errors answered, no streaming (the non-streamed cases only).

    python benchmarks/relay_floor.py {asgi,protocol} PORT ENGINE_URL[,ENGINE_URL...]
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from typing import Any

import httptools
import uvloop

from priority_gateway.upstream.h1 import EngineClient

HEADERS = ((b"content-type", b"application/json"),)


class Engines:
    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.clients: list[EngineClient] = []
        self.turn = itertools.count()

    async def relay(self, path: bytes, body: bytes) -> tuple[int, bytes]:
        if not self.clients:  # made on the running loop
            self.clients = [EngineClient(url) for url in self.urls]
        client = self.clients[next(self.turn) % len(self.clients)]
        response = await client.request(b"POST", path, HEADERS, body)
        return response.status, await response.read()


def asgi_app(engines: Engines) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["method"] == "GET":  # readiness
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        status, payload = await engines.relay(scope["raw_path"], b"".join(parts))
        length = str(len(payload)).encode()
        head = [(b"content-type", b"application/json"), (b"content-length", length)]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": payload})

    return app


class ProtocolRelay(asyncio.Protocol):
    """HTTP/1.1 keep-alive, one request at a time per connection (wrk's way)."""

    engines: Engines

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        path, body = self.url, b"".join(self.body)
        self.url, self.body = b"", []
        if self.parser.get_method() == b"GET":  # readiness
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            return
        asyncio.get_running_loop().create_task(self._answer(path, body))

    async def _answer(self, path: bytes, body: bytes) -> None:
        status, payload = await self.engines.relay(path, body)
        head = b"HTTP/1.1 %d OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % (
            status,
            len(payload),
        )
        self.transport.write(head + payload)


def main() -> None:
    kind, port, urls = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
    engines = Engines(urls)
    if kind == "asgi":
        import uvicorn

        uvicorn.run(
            asgi_app(engines),
            host="127.0.0.1",
            port=port,
            loop="uvloop",
            http="httptools",
            log_level="warning",
            access_log=False,
        )
        return
    ProtocolRelay.engines = engines

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(ProtocolRelay, "127.0.0.1", port, backlog=4096)
        await server.serve_forever()

    uvloop.run(serve())


if __name__ == "__main__":
    main()
