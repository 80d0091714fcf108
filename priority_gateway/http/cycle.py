"""One request and its response on a client connection: the ASGI cycle the gateway's protocol runs.

uvicorn's own cycle, made lean for a relay whose answers are mostly one head and one body: every
route (the inference endpoints and FastAPI's) runs on it, with the same ASGI messages.

Rules:
- ``receive`` hands over the body as it arrived; a body that came with the head is handed over
  without waiting. Once the response is complete or the client gone, ``receive`` says
  ``http.disconnect``.
- The response head is held until the first body part and written with it: a plain answer is one
  write, not two. A head whose body does not follow at once (a stream before its first token) is
  written at the end of the event loop's current iteration, so it is never held back.
- Header names must be tokens and values free of control characters (as uvicorn checks); a body
  longer or shorter than its ``content-length`` is an error and the connection closes. Without a
  length the body is chunked; HEAD, 204 and 304 answers carry none.
- ``scope["extensions"][DISCONNECT]`` takes one callback, called once if the client goes away
  before the response completes: the relay learns of it without a task waiting on ``receive``.
- An application that fails before its answer starts gets a 500; after, the connection closes.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Scope
from uvicorn.protocols.http.flow_control import FlowControl

DISCONNECT = "gateway.disconnect"

_HEADER_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
_HEADER_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")
_STATUS_LINES: dict[int, bytes] = {}
_NO_BODY = frozenset({204, 304})
_logger = logging.getLogger("uvicorn.error")


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        import http

        try:
            phrase = http.HTTPStatus(status).phrase.encode()
        except ValueError:
            phrase = b""
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (status, phrase)
    return line


class Cycle:
    __slots__ = (
        "__weakref__",
        "_default_headers",
        "_head",
        "_waiters",
        "body",
        "body_ended",
        "chunked",
        "disconnected",
        "flow",
        "keep_alive",
        "loop",
        "more_body",
        "on_disconnect",
        "on_response",
        "remaining",
        "response_complete",
        "response_started",
        "scope",
        "transport",
        "waiting_for_100_continue",
    )

    def __init__(
        self,
        scope: Scope,
        transport: asyncio.Transport,
        flow: FlowControl,
        loop: asyncio.AbstractEventLoop,
        default_headers: list[tuple[bytes, bytes]],
        expect_100_continue: bool,
        keep_alive: bool,
        on_response: Callable[[], None],
    ) -> None:
        self.scope = scope
        self.transport = transport
        self.flow = flow
        self.loop = loop
        self._default_headers = default_headers
        self._waiters: list[asyncio.Future[None]] | None = None
        self.on_response = on_response
        self.on_disconnect: Callable[[], None] | None = None
        self.disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect_100_continue
        self.body = bytearray()
        self.more_body = True
        self.body_ended = False
        self.response_started = False
        self.response_complete = False
        self.chunked = False
        self.remaining = 0
        self._head: bytes | None = None
        scope["extensions"] = {DISCONNECT: self._watch}

    # -- what the protocol tells ------------------------------------------------------

    @property
    def message_event(self) -> Cycle:
        """What uvicorn's protocol sets when body bytes, the body's end or a disconnect arrive (its
        cycle's ``asyncio.Event``): the cycle itself, so that no reference loop outlives a request."""
        return self

    def set(self) -> None:
        """Wake every waiting ``receive``; tell the disconnect callback of a client gone."""
        if self._waiters:
            waiters, self._waiters = self._waiters, None
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        if self.disconnected and self.on_disconnect is not None:
            callback, self.on_disconnect = self.on_disconnect, None
            callback()

    async def _wait(self) -> None:
        waiter = self.loop.create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        await waiter

    def _watch(self, callback: Callable[[], None]) -> None:
        if self.disconnected and not self.response_complete:
            callback()
        else:
            self.on_disconnect = callback

    async def run_asgi(self, app: ASGIApp) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            _logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self.send_500_response()
            else:
                self.transport.close()
        else:
            if not self.response_started and not self.disconnected:
                _logger.error("ASGI callable returned without starting response.")
                await self.send_500_response()
            elif not self.response_complete and not self.disconnected:
                _logger.error("ASGI callable returned without completing response.")
                self.transport.close()
        finally:
            # Nothing of this request may point back at it once it ends: refcounts free it, not the GC.
            self.on_response = _nothing
            self.on_disconnect = None
            self.scope.pop("extensions", None)

    async def send_500_response(self) -> None:
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21")]
        await self.send(
            {"type": "http.response.start", "status": 500, "headers": [*headers, (b"connection", b"close")]}
        )
        await self.send({"type": "http.response.body", "body": b"Internal Server Error", "more_body": False})

    # -- ASGI ------------------------------------------------------------------------

    async def receive(self) -> Message:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            if not self.body and self.more_body:
                await self._wait()
            # The body was handed over whole: what is left to say is the disconnect (or the end).
            while self.body_ended and not self.disconnected and not self.response_complete:
                await self._wait()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        message = {"type": "http.request", "body": bytes(self.body), "more_body": self.more_body}
        self.body = bytearray()
        self.body_ended = not self.more_body
        return message

    async def send(self, message: Message) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{kind}'.")
            self.response_started = True
            self.waiting_for_100_continue = False
            self._head = self._encode_head(message["status"], message.get("headers", ()))
            self.loop.call_soon(self._write_head)
        elif not self.response_complete:
            if kind != "http.response.body":
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
            self._send_body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(f"Unexpected ASGI message '{kind}' sent, after response already completed.")

    # -- the response ----------------------------------------------------------------

    def _encode_head(self, status: int, headers: Any) -> bytes:
        if self._default_headers:
            headers = [*self._default_headers, *headers]
        content = [status_line(status)]
        names = []
        values = []
        length: int | None = None
        close = False
        for name, value in headers:
            name = name.lower()
            names.append(name)
            values.append(value)
            if name == b"content-length":
                if length is None:
                    length = int(value.decode())
            elif name == b"transfer-encoding":
                if value.lower() == b"chunked":
                    length = None
                    self.chunked = True
            elif name == b"connection" and b"close" in [t.strip() for t in value.lower().split(b",")]:
                self.keep_alive = False
                close = True
            content += (name, b": ", value, b"\r\n")
        # Each check once over every name and every value (a tab is allowed in a value, never in a name).
        if _HEADER_NAME.search(b"".join(names)):
            raise RuntimeError("Invalid HTTP header name.")
        if _HEADER_VALUE.search(b"\t".join(values)):
            raise RuntimeError("Invalid HTTP header value.")
        if not self.keep_alive and not close:
            content.append(b"connection: close\r\n")
        if length is not None and not self.chunked:
            self.remaining = length
        elif not self.chunked and self.scope["method"] != "HEAD" and status not in _NO_BODY:
            self.chunked = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)

    def _write_head(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self.disconnected:
            self.transport.write(head)

    def _send_body(self, body: bytes, more_body: bool) -> None:
        head, self._head = self._head, None
        if self.scope["method"] == "HEAD":
            data = b""
            self.remaining = 0
        elif self.chunked:
            data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more_body:
                data += b"0\r\n\r\n"
        else:
            if len(body) > self.remaining:
                raise RuntimeError("Response content longer than Content-Length")
            self.remaining -= len(body)
            data = body
        if head is not None:
            data = head + data if data else head
        if data:
            self.transport.write(data)
        if not more_body:
            if self.remaining != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.set()
            if not self.keep_alive and not self.more_body:
                # With the request's body still arriving the protocol closes instead, lingering:
                # a close with input unread resets the connection and loses this answer.
                self.transport.close()
            self.on_response()


def _nothing() -> None:
    pass
