"""Client connections: uvicorn's httptools protocol with limits on bytes, time and count.

Rules:
- A request's line and headers may take ``max_header_bytes``; past that the client gets 431
  and the connection closes, before the parser holds more (httptools itself has no limit).
- The head must arrive within ``header_timeout_s`` of the connection opening or of its first
  byte after an idle keep-alive pause, the body within ``body_timeout_s`` (``upload_timeout_s``
  for ``/v1/files``) of the head: otherwise 408 (or a plain close once an answer has
  started). A client that sends nothing, half its headers or half its body is not held.
- An idle keep-alive connection closes after ``keepalive_timeout_s`` (uvicorn's own timer).
- Beyond ``max_connections`` open connections a new one gets 503 at once and is closed,
  which keeps descriptors free for the engine side.
- Every refusal is OpenAI's error shape with ``connection: close``.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from priority_gateway import log
from priority_gateway.errors import error_body
from priority_gateway.limits import ClientLimits

_REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}
# Under a flood of connections, one log line per this many seconds says how many were refused.
_REFUSAL_LOG_S = 10.0


class _TooManyHeaders(Exception):
    pass


def refusal(status: int, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response in OpenAI's error shape that ends the connection."""
    body = error_body(status, message, code)
    return b"".join(
        (
            b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status]),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        )
    )


class GuardedProtocol(HttpToolsProtocol):
    """One client connection; ``limits`` is set on the subclass that ``protocol_class`` makes."""

    limits: ClientLimits = ClientLimits()
    upload_paths: frozenset[bytes] = frozenset({b"/v1/files"})
    refused_connections = 0
    _refusals_logged_at = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._body_pending = False
        self._upload = False
        self._timer: asyncio.TimerHandle | None = None
        self._refused = False

    # -- connection ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._note_refused_connection()
            message = "the gateway has too many open connections; retry shortly"
            self._refuse(refusal(503, message, "too_many_connections"))
            return
        self._arm(self.limits.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._refused:
            return
        # Timers only for what is still incomplete after this read: a request that arrives in
        # one piece (the usual case) costs none. A running timer is never reset by more bytes.
        if self._in_head:
            if self._head_bytes > self.limits.max_header_bytes:
                limit = self.limits.max_header_bytes
                self._refuse(refusal(431, f"request headers exceed the limit of {limit} bytes", "headers_too_large"))
            elif self._head_bytes and self._timer is None:
                self._arm(self.limits.header_timeout_s, self._head_timed_out)
        elif self._body_pending and self._timer is None:
            seconds = self.limits.upload_timeout_s if self._upload else self.limits.body_timeout_s
            self._arm(seconds, self._body_timed_out)

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to what httptools cannot parse, and ours to too many headers.
        if self.headers is not None and len(self.headers) >= self.limits.max_headers:
            limit = self.limits.max_headers
            self._refuse(refusal(431, f"more than {limit} request headers", "headers_too_large"))
        else:
            self._refuse(refusal(400, msg, "invalid_http"))

    # -- parser callbacks --------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= self.limits.max_headers:
            raise _TooManyHeaders  # httptools stops parsing; uvicorn answers through send_400_response
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_head = False
        self._head_bytes = 0
        self._body_pending = True
        self._upload = self.url.split(b"?", 1)[0].rstrip(b"/") in self.upload_paths
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head = True
        self._body_pending = False
        super().on_message_complete()

    # -- limits ------------------------------------------------------------------------

    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timed_out(self) -> None:
        self._timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head behind a request still answering: that one has its own deadline.
            self._arm(self.limits.header_timeout_s, self._head_timed_out)
            return
        seconds = self.limits.header_timeout_s
        self._refuse(refusal(408, f"request headers not received within {seconds:g} s", "request_timeout"))

    def _body_timed_out(self) -> None:
        self._timer = None
        cycle = self.cycle
        if cycle is None or not self._body_pending:
            return
        log.info("client_body_timeout", path=self.url[:64].decode("latin-1"), client=str(self.client))
        if cycle.response_started:
            self._close()
            return
        seconds = self.limits.upload_timeout_s if self._upload else self.limits.body_timeout_s
        self._refuse(refusal(408, f"request body not received within {seconds:g} s", "request_timeout"))

    def _refuse(self, response: bytes) -> None:
        self._refused = True
        if self.cycle is not None and not self.cycle.response_complete:
            # The application sees the client gone; anything it still sends is dropped.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        if not self.transport.is_closing():
            self.transport.write(response)
        self._close()

    def _note_refused_connection(self) -> None:
        cls = type(self)
        cls.refused_connections += 1
        now = self.loop.time()
        if now - cls._refusals_logged_at >= _REFUSAL_LOG_S:
            cls._refusals_logged_at = now
            log.warning("connections_refused", limit=self.limits.max_connections, total=cls.refused_connections)

    def _close(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()


def protocol_class(limits: ClientLimits) -> type[GuardedProtocol]:
    return type("GatewayHttpProtocol", (GuardedProtocol,), {"limits": limits})


# Descriptors the gateway keeps for itself beyond its client connections and their engine
# connections: engine pools' idle connections, health probes, scrapes, the store, logs.
OWN_DESCRIPTORS = 256


def fit_descriptors(limits: ClientLimits) -> ClientLimits:
    """Raise the open-file limit as far as allowed; lower ``max_connections`` to what it holds.

    Each client connection may hold one engine connection, so half of what is left after the
    gateway's own descriptors goes to clients: a flood of clients then never starves the engine
    side (health probes, relays), which would otherwise mark healthy engines down.
    """
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return limits
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return limits
    room = max(1, (soft - OWN_DESCRIPTORS) // 2)
    if limits.max_connections <= room:
        return limits
    log.warning("max_connections_lowered", configured=limits.max_connections, used=room, open_files_limit=soft)
    return replace(limits, max_connections=room)
