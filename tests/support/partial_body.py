"""Clients that send part of a request body and never finish it: a server that waits for the whole
body before it answers never answers them, and one that keeps what they sent holds it."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any
from urllib.parse import urlsplit


def post_unfinished(url: str, path: str, head: bytes, size: int, headers: dict[str, str] | None = None) -> Any:
    """POST ``head`` plus ``size`` filler bytes as a chunked body without its last chunk; the
    answer as (status, headers, JSON body), or TimeoutError when none comes within 10 s."""
    parts = urlsplit(url)
    lines = [f"POST {path} HTTP/1.1", f"host: {parts.netloc}", "transfer-encoding: chunked"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall("\r\n".join(lines).encode() + b"\r\n\r\n")
        body = head + b"x" * size
        for start in range(0, len(body), 16384):
            chunk = body[start : start + 16384]
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                break  # the server answered and closed: read what it said
        received = b""
        while b"\r\n\r\n" not in received:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError(f"closed without an answer: {received!r}")
            received += data
        header_block, _, rest = received.partition(b"\r\n\r\n")
        status_line, *header_lines = header_block.decode("latin-1").split("\r\n")
        answer_headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
        length = int(answer_headers.get("content-length", "0"))
        while len(rest) < length:
            data = sock.recv(65536)
            if not data:
                break
            rest += data
    return int(status_line.split()[1]), answer_headers, json.loads(rest[:length])


async def _hold(host: str, port: int, head: bytes, size: int, answered: list[int | None], i: int) -> Any:
    reader, writer = await asyncio.open_connection(host, port)

    async def read_status() -> None:
        line = await reader.readline()
        if line.startswith(b"HTTP/1.1 "):
            answered[i] = int(line.split()[1])

    reading = asyncio.create_task(read_status())
    try:
        writer.write(head)
        block = b"x" * 65536
        left = size - 1  # all but the last byte
        while left > 0 and not reading.done():
            writer.write(block[: min(left, len(block))])
            left -= min(left, len(block))
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    return writer, reading


async def _settled(readings: list[asyncio.Task[None]], quiet_s: float = 2.0, limit_s: float = 30.0) -> None:
    """Wait until every answer the server is giving has arrived: until all have, or none more for
    ``quiet_s`` (what is still unanswered then is held), within ``limit_s``. A fixed wait would
    count answers still on their way on a busy host as bodies held."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    pending = {reading for reading in readings if not reading.done()}
    while pending and loop.time() < deadline:
        done, pending = await asyncio.wait(pending, timeout=quiet_s)
        if not done:
            return


async def _hold_all(url: str, path: str, count: int, size: int, headers: dict[str, str], during: Any) -> Any:
    parts = urlsplit(url)
    lines = [f"POST {path} HTTP/1.1", f"host: {parts.netloc}", f"content-length: {size}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    head = "\r\n".join(lines).encode() + b"\r\n\r\n"
    answered: list[int | None] = [None] * count
    held = await asyncio.gather(*(_hold(parts.hostname, parts.port, head, size, answered, i) for i in range(count)))
    try:
        await _settled([reading for _, reading in held])
        result = during()
    finally:
        for writer, reading in held:
            reading.cancel()
            writer.close()
    return answered, result


def hold_unfinished(
    url: str, path: str, count: int, size: int, headers: dict[str, str], during: Any
) -> tuple[list[int | None], Any]:
    """Open ``count`` connections that each POST ``path`` declaring a body of ``size`` bytes and send
    all of it but the last byte (stopping early once the server has answered), all at once; call
    ``during()`` while they are held open. Returns each connection's status (None: no answer yet)
    and what ``during`` returned."""
    return asyncio.run(_hold_all(url, path, count, size, headers, during))
