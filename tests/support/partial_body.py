"""A client that sends part of a chunked request body and never finishes it: a server that waits
for the whole body before it answers never answers it."""

from __future__ import annotations

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
