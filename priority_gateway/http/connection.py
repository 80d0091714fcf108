"""Client connections: uvicorn's httptools protocol with limits on bytes, time and count.

Rules:
- A request's line and headers may take ``max_header_bytes``; past that the client gets 431
  and the connection closes, before the parser holds more (httptools itself has no limit).
- The head must arrive within ``header_timeout_s`` of the connection opening or of its first
  byte after an idle keep-alive pause, the body within ``body_timeout_s`` (``upload_timeout_s``
  for ``/v1/files``) of the head: otherwise 408 (or a plain close once an answer has
  started). A client that sends nothing, half its headers or half its body is not held.
- A file download (``/v1/files/{id}/content``) must be answered whole within
  ``download_timeout_s`` of its head; past it the connection closes (a client that stops reading
  holds one of the bounded downloads no longer).
- An idle keep-alive connection closes after ``keepalive_timeout_s`` (uvicorn's own timer).
- Beyond ``max_connections`` open connections a new one gets 503 at once and is closed,
  which keeps descriptors free for the engine side; beyond ``max_connections_per_client`` from
  one client address, too, so one client cannot keep the others out. A connection from one of
  ``trusted_proxies`` counts, from each request's head on, against the client that request's
  ``X-Forwarded-For`` names (its last address that is not a trusted proxy; the proxy's own
  address when there is none), and gets the 503 when that client is over its cap; that client is
  the request's ``client`` too. No other source of forwarded headers is trusted (uvicorn's
  ``proxy_headers`` is off).
- Every refusal is OpenAI's error shape with ``connection: close``.
- An answer that closes the connection before the request has arrived whole (a refusal on the
  head, a 413 or 503 on the declared length) lingers: the gateway ends its side, then reads and
  drops what the client still sends, for up to ``LINGER_S`` and the declared length (at most
  ``max_receiving_bytes``; chunked, or a refusal of the head itself: ``max_body_bytes``), and closes
  when the client does. A close with input unread would answer with a TCP reset, which fails
  the client's next write and, with it, the answer it had not read yet.
- Each request runs on the gateway's own ASGI cycle (``priority_gateway.http.cycle``), not uvicorn's;
  everything else about the connection (parsing, keep-alive, pipelined requests answered in turn,
  flow control, graceful shutdown) is uvicorn's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import urllib.parse
from dataclasses import replace
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from priority_gateway import log
from priority_gateway.config.limits import ClientLimits
from priority_gateway.errors import error_body
from priority_gateway.http.cycle import Cycle

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


LINGER_S = 5.0
"""How long a closing connection reads (and drops) what its client still sends."""


class GuardedProtocol(HttpToolsProtocol):
    """One client connection; ``limits`` is set on the subclass that ``protocol_class`` makes."""

    limits: ClientLimits = ClientLimits()
    upload_paths: frozenset[bytes] = frozenset({b"/v1/files"})
    refused_connections = 0
    _refusals_logged_at = 0.0
    per_client: dict[str, int] = {}
    """Open connections per client address (each subclass that ``protocol_class`` makes has its own)."""
    proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._body_pending = False
        self._upload = False
        self._timer: asyncio.TimerHandle | None = None
        self._download: asyncio.TimerHandle | None = None
        self._refused = False
        self._lingering = -1
        """Bytes still to drop before the connection closes (-1: not closing)."""
        self._counted: str | None = None
        self._behind_proxy = False

    # -- connection ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._note_refused_connection()
            message = "the gateway has too many open connections; retry shortly"
            self._refuse(refusal(503, message, "too_many_connections"), linger=False)
            return
        peer = self.client[0] if self.client else ""
        self._behind_proxy = bool(self.proxies) and _trusted(peer, self.proxies)
        if not self._behind_proxy and not self._count_as(peer):
            return
        self._arm(self.limits.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._download_done()
        self._uncount()
        super().connection_lost(exc)

    def _count_as(self, client: str) -> bool:
        """Count this connection against ``client``'s cap; False (and refused) when that is over it."""
        if client == self._counted:
            return True
        self._uncount()
        counts = self.per_client
        counts[client] = counts.get(client, 0) + 1
        self._counted = client
        if counts[client] <= self.limits.max_connections_per_client:
            return True
        self._note_refused_connection()
        message = "this client has too many open connections to the gateway; close some and retry"
        self._refuse(refusal(503, message, "too_many_connections"), linger=False)
        return False

    def _uncount(self) -> None:
        client = self._counted
        if client is not None:
            self._counted = None
            left = self.per_client[client] - 1
            if left:
                self.per_client[client] = left
            else:
                del self.per_client[client]

    def data_received(self, data: bytes) -> None:
        if self._refused:
            if self._lingering >= 0:
                self._lingering -= len(data)
                if self._lingering < 0:
                    self.transport.abort()
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
        if self._behind_proxy:
            client = self._forwarded_client()
            if not self._count_as(client):
                return
            self.scope["client"] = (client, 0)  # what the request's trace names as its client
        self._disarm()
        self._in_head = False
        self._head_bytes = 0
        self._body_pending = True
        path = self.url.split(b"?", 1)[0].rstrip(b"/")
        self._upload = path in self.upload_paths
        if path.startswith(b"/v1/files/") and path.endswith(b"/content"):
            self._download_done()
            self._download = self.loop.call_later(self.limits.download_timeout_s, self._download_timed_out)
        self._start_cycle()

    def _start_cycle(self) -> None:
        """uvicorn's ``on_headers_complete``, on the gateway's ``Cycle``."""
        parser = self.parser
        scope = self.scope
        http_version = parser.get_http_version()
        scope["method"] = parser.get_method().decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        if parser.should_upgrade() and self._should_upgrade():
            return
        url = httptools.parse_url(self.url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + raw_path
        scope["query_string"] = url.query or b""
        existing = self.cycle
        keep_alive = http_version != "1.0" and parser.should_keep_alive()
        default_headers = self.server_state.default_headers
        cycle = Cycle(
            scope,  # type: ignore[arg-type]
            self.transport,
            self.flow,
            self.loop,
            default_headers,
            self.expect_100_continue,
            keep_alive,
            self.on_response_complete,
        )
        self.cycle = cycle  # type: ignore[assignment]
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, self.app)  # type: ignore[arg-type]
        else:
            # A pipelined request waits for the one before it to be answered.
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.app))  # type: ignore[arg-type]

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head = True
        self._body_pending = False
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._download_done()
        cycle = self.cycle
        if cycle is not None and not cycle.keep_alive and cycle.response_complete and not self.transport.is_closing():
            # The last request's cycle left its closing answer open: its body is still arriving.
            self.server_state.total_requests += 1
            self._refused = True
            self._linger(self._unread_drop())
            return
        super().on_response_complete()

    def _forwarded_client(self) -> str:
        """The client a trusted proxy's request is for: the last ``X-Forwarded-For`` address that is
        not itself a trusted proxy (the proxy's own address without one)."""
        forwarded = [value for name, value in self.headers if name == b"x-forwarded-for"]
        hops = [hop.strip() for hop in b",".join(forwarded).decode("latin-1").split(",") if hop.strip()]
        for hop in reversed(hops[-16:]):
            if not _trusted(hop, self.proxies):
                return hop[:64]
        return self.client[0] if self.client else ""

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

    def _download_done(self) -> None:
        if self._download is not None:
            self._download.cancel()
            self._download = None

    def _download_timed_out(self) -> None:
        self._download = None
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return
        seconds = self.limits.download_timeout_s
        log.info("client_download_timeout", path=self.url[:64].decode("latin-1"), client=str(self.client))
        if cycle.response_started:
            # Aborted, not closed: a close would wait for the client to read what is buffered.
            self._disarm()
            self.transport.abort()
            return
        self._refuse(refusal(408, f"the download did not complete within {seconds:g} s", "request_timeout"))

    def _refuse(self, response: bytes, linger: bool = True) -> None:
        """Answer ``response`` and close. A refusal of a connection over a count does not linger:
        what it would hold open is what the count protects."""
        self._refused = True
        if self.cycle is not None and not self.cycle.response_complete:
            # The application sees the client gone; anything it still sends is dropped.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        if not self.transport.is_closing():
            self.transport.write(response)
        if linger:
            self._linger(self.limits.max_body_bytes)
        else:
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

    def _unread_drop(self) -> int:
        """What a lingering close drops of a body answered before it arrived: its declared length, up to
        ``max_receiving_bytes``; of a chunked one, ``max_body_bytes``."""
        limits = self.limits
        declared = next((value for name, value in self.headers if name == b"content-length"), b"")
        if declared.isdigit():
            return min(int(declared), limits.max_receiving_bytes)
        return limits.max_body_bytes

    def _linger(self, drop: int) -> None:
        """End the gateway's side once what it wrote is sent, drop what still arrives (``data_received``
        while refused) and close when the client does, at ``LINGER_S`` or past ``drop`` bytes."""
        transport = self.transport
        if transport.is_closing() or self._lingering >= 0:
            return
        if not transport.can_write_eof():
            self._close()
            return
        self._disarm()
        self._lingering = drop
        transport.write_eof()
        self.flow.resume_reading()
        self._arm(LINGER_S, transport.abort)


def _trusted(address: str, proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in proxies)


def protocol_class(limits: ClientLimits) -> type[GuardedProtocol]:
    proxies = tuple(ipaddress.ip_network(p, strict=False) for p in limits.trusted_proxies)
    attributes = {"limits": limits, "per_client": {}, "proxies": proxies}
    return type("GatewayHttpProtocol", (GuardedProtocol,), attributes)


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
