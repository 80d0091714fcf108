"""An engine that misbehaves on request, for what no real vLLM does on purpose.

Run as ``python -m tests.support.broken_engine PORT``. It answers ``/health``, ``/v1/models``
and ``/metrics`` as vLLM does; an inference request picks its misbehaviour by the
``x-request-id`` the gateway forwards (anything else gets a well-formed chat completion):

- ``html500``: 500 with an HTML page, as a proxy in front of a crashed engine answers.
- ``text200``: 200 with a plain-text body.
- ``json400``: vLLM's 400 for bad parameters, with its message.
- ``json401``: 401, as an engine with an API key the gateway does not send answers.
- ``short``: 200 JSON whose ``Content-Length`` promises more than is sent before the close.
- ``shortstream``: an event stream with a ``Content-Length``, cut off after two events.
- ``drip``: an event stream that sends one byte every 0.3 s, forever.
- ``dripjson``: a JSON answer that sends one byte every 0.3 s, forever.
- ``silent``: reads the request and never answers.
- ``coalesced``: an event stream of nine token events in three writes 0.2 s apart (one, then four,
  then four and ``[DONE]``), as an engine's events arrive when the network coalesces them.
"""

from __future__ import annotations

import asyncio
import sys

CHAT = (
    b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"sim-model","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)
BAD_REQUEST = b'{"error":{"message":"max_tokens is too large","type":"BadRequestError","param":null,"code":400}}'
MODELS = b'{"object":"list","data":[{"id":"sim-model","object":"model","owned_by":"vllm"}]}'
EVENT = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'


def head(status: int, reason: str, content_type: bytes, length: int | None) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}".encode(), b"content-type: " + content_type]
    lines.append(b"content-length: %d" % length if length is not None else b"transfer-encoding: chunked")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def whole(status: int, reason: str, content_type: bytes, body: bytes) -> bytes:
    return head(status, reason, content_type, len(body)) + body


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes]] | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return None
    line, *rest = raw.split(b"\r\n")
    headers = {}
    for item in rest:
        if b":" in item:
            name, value = item.split(b":", 1)
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get(b"content-length", b"0"))
    if length:
        await reader.readexactly(length)
    return line.split(b" ")[1], headers


async def drip(writer: asyncio.StreamWriter) -> None:
    while True:
        await asyncio.sleep(0.3)
        writer.write(b"1\r\n \r\n")
        await writer.drain()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


async def coalesced(writer: asyncio.StreamWriter) -> None:
    writer.write(head(200, "OK", b"text/event-stream", None) + chunk(EVENT))
    for tail in (b"", b"data: [DONE]\n\n"):
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(chunk(EVENT * 4 + tail))
    writer.write(b"0\r\n\r\n")


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while (request := await read_request(reader)) is not None:
            path, headers = request
            mode = headers.get(b"x-request-id", b"").decode()
            if path == b"/health":
                writer.write(whole(200, "OK", b"application/json", b"{}"))
            elif path == b"/v1/models":
                writer.write(whole(200, "OK", b"application/json", MODELS))
            elif path == b"/metrics":
                writer.write(whole(200, "OK", b"text/plain", b""))
            elif mode == "html500":
                writer.write(whole(500, "Internal Server Error", b"text/html", b"<html><body>Oops</body></html>"))
            elif mode == "text200":
                writer.write(whole(200, "OK", b"text/plain", b"OK"))
            elif mode == "json400":
                writer.write(whole(400, "Bad Request", b"application/json", BAD_REQUEST))
            elif mode == "json401":
                writer.write(whole(401, "Unauthorized", b"application/json", b'{"error":"Unauthorized"}'))
            elif mode == "short":
                writer.write(head(200, "OK", b"application/json", 1000) + CHAT[:40])
                await writer.drain()
                break
            elif mode == "shortstream":
                writer.write(head(200, "OK", b"text/event-stream", 1000) + EVENT + EVENT)
                await writer.drain()
                await asyncio.sleep(0.2)
                break
            elif mode == "drip":
                writer.write(head(200, "OK", b"text/event-stream", None))
                await drip(writer)
            elif mode == "dripjson":
                writer.write(head(200, "OK", b"application/json", None))
                await drip(writer)
            elif mode == "coalesced":
                await coalesced(writer)
            elif mode == "silent":
                await asyncio.sleep(3600)
            else:
                writer.write(whole(200, "OK", b"application/json", CHAT))
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
