"""A lean HTTP/1.1 client for talking to engines, built for relaying bytes.

Rules:
- One ``EngineClient`` per engine holds a pool of keep-alive connections.
- A response body is delivered as the bytes that arrive (chunked encoding removed): all
  that one read brought at once, so a streaming relay adds no buffering of its own and
  writes as often as the engine's bytes arrive, not once per HTTP chunk.
- A connection goes back to the pool only after its response was read to the end;
  anything else (client gone, error, timeout) aborts it, which is how the engine learns
  to stop generating.
- The response's head must come within the read timeout, or within ``first_byte_timeout``
  when the caller gives one; the body's reads each within the read timeout.
- ``OutOfDescriptors`` means this process could not open a socket: not the engine's fault.
- ``ConnectError`` means nothing reached the engine: safe to retry elsewhere. A request
  on a reused connection that the engine had already closed is retried once on a fresh
  connection, as no byte of it was processed.
"""

from __future__ import annotations

import asyncio
import errno
import ssl
from collections import deque
from collections.abc import AsyncIterator, Sequence
from urllib.parse import urlsplit

import httptools

Headers = Sequence[tuple[bytes, bytes]]


class UpstreamError(Exception):
    """The engine failed after the request was (possibly) sent."""


class ConnectError(UpstreamError):
    """The engine could not be reached; nothing was sent."""


class ReadTimeout(UpstreamError):
    """The engine sent nothing for longer than the read timeout."""


class OutOfDescriptors(UpstreamError):
    """This process could not open a socket: the gateway's fault, not the engine's."""


_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class _Connection(asyncio.Protocol):
    __slots__ = (
        "_body_done",
        "_chunks",
        "_header_list",
        "_headers_waiter",
        "_loop",
        "_owner",
        "_parser",
        "_paused",
        "_pending",
        "_read_timeout",
        "_waiter",
        "buffered",
        "closed",
        "error",
        "got_bytes",
        "keep_alive",
        "status",
        "transport",
    )

    HIGH_WATER = 1 << 20

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float, owner: EngineClient) -> None:
        self._loop = loop
        self._owner = owner
        self._read_timeout = read_timeout
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.error: BaseException | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self._header_list: list[tuple[bytes, bytes]] = []
        self._headers_waiter: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self.buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._body_done = False
        self._pending = False
        self._paused = False
        self.got_bytes = False
        self.keep_alive = False

    # -- asyncio.Protocol ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self._owner.reads += 1
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"malformed response from engine: {exc}"))
            if self.transport is not None:
                self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self._body_done and self._pending:
            self._fail(UpstreamError("engine closed the connection" + (f": {exc}" if exc else "")))

    # -- httptools callbacks ----------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_list.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        # Read now: httptools resets the flag once the message is complete.
        self.keep_alive = self._parser.should_keep_alive()
        waiter = self._headers_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self.buffered += len(body)
        if self.buffered > self.HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._body_done = True
        self._wake()

    # -- helpers ----------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        for waiter in (self._headers_waiter, self._waiter):
            if waiter is not None and not waiter.done():
                waiter.set_exception(exc)

    def _on_timeout(self, seconds: float, what: str) -> None:
        self._fail(ReadTimeout(f"engine sent {what} for {seconds:g} s"))
        if self.transport is not None:
            self.transport.abort()

    async def _wait(self, fut: asyncio.Future[None], limit_s: float | None = None, what: str = "nothing") -> None:
        seconds = self._read_timeout if limit_s is None else limit_s
        timer = self._loop.call_later(seconds, self._on_timeout, seconds, what)
        try:
            await fut
        finally:
            timer.cancel()

    def send(self, data: bytes) -> None:
        self._reset()
        self._pending = True
        assert self.transport is not None
        self.transport.write(data)

    async def wait_headers(self, limit_s: float | None = None) -> None:
        if self.status:
            return
        if self.error is not None:
            raise self.error
        self._headers_waiter = self._loop.create_future()
        await self._wait(self._headers_waiter, limit_s, "no first byte" if limit_s is not None else "nothing")

    async def next_chunk(self) -> bytes | None:
        while True:
            if self._chunks:
                chunks = self._chunks
                # Everything that arrived together leaves together: one write downstream, not one per
                # HTTP chunk (an engine under load packs many stream events into one read).
                chunk = (
                    chunks.popleft() if len(chunks) == 1 else b"".join([chunks.popleft() for _ in range(len(chunks))])
                )
                self.buffered -= len(chunk)
                if self._paused and self.buffered < self.HIGH_WATER // 2 and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                return chunk
            if self._body_done:
                self._pending = False
                return None
            if self.error is not None:
                raise self.error
            self._waiter = self._loop.create_future()
            await self._wait(self._waiter)

    @property
    def reusable(self) -> bool:
        return self._body_done and not self.closed and self.error is None and self.keep_alive

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Response:
    """An engine's response; iterate it for body chunks, or ``read()`` it whole."""

    __slots__ = ("_client", "_conn", "_done", "headers", "status")

    def __init__(self, client: EngineClient, conn: _Connection) -> None:
        self._client = client
        self._conn = conn
        self._done = False
        self.status = conn.status
        self.headers: list[tuple[bytes, bytes]] = conn._header_list

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def next_chunk(self) -> bytes | None:
        try:
            chunk = await self._conn.next_chunk()
        except BaseException:
            self.close()
            raise
        if chunk is None:
            self._release()
        return chunk

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self.next_chunk()) is not None:
            yield chunk

    async def read(self) -> bytes:
        parts = []
        while (chunk := await self.next_chunk()) is not None:
            parts.append(chunk)
        return b"".join(parts)

    def _release(self) -> None:
        if not self._done:
            self._done = True
            self._client._release(self._conn)

    def close(self) -> None:
        """Abort unless the body was read to the end (then the connection is reused)."""
        if not self._done:
            self._done = True
            if self._conn.reusable:
                self._client._release(self._conn)
            else:
                self._conn.abort()

    async def aclose(self) -> None:
        """``close``, for callers that also hold other clients' responses (``priority_gateway.bench``)."""
        self.close()


class EngineClient:
    """Keep-alive connections to one engine."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 2.0,
        read_timeout: float = 300.0,
        max_idle: int = 256,
        api_key: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"engines must be http:// or https:// URLs, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.host = parts.hostname or "127.0.0.1"
        # https: the system's trust store (SSL_CERT_FILE is honoured) or the given CA bundle,
        # with the host name checked, as any HTTPS client would.
        self._tls = ssl.create_default_context(cafile=ca_file) if parts.scheme == "https" else None
        self.port = parts.port or (443 if self._tls else 80)
        self.prefix = parts.path.rstrip("/").encode()
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_idle = max_idle
        host_header = parts.netloc.encode()
        self._fixed = b"host: " + host_header + b"\r\n"
        if api_key:
            self._fixed += b"authorization: Bearer " + api_key.encode() + b"\r\n"
        self._idle: list[_Connection] = []
        self._closed = False
        self.reads = 0
        """Reads of what the engine sent, on any connection: its sign of life, which a late health probe
        does not undo."""

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation that arrives
            # as the awaited call finishes, and a shutdown then waits on a task that never ends.
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop, self.read_timeout, self),
                    self.host,
                    self.port,
                    ssl=self._tls,
                    server_hostname=self.host if self._tls else None,
                )
        except OSError as exc:  # TimeoutError, and ssl.SSLError (a bad certificate), are OSErrors too
            if exc.errno in _OUT_OF_DESCRIPTORS:
                raise OutOfDescriptors(f"cannot open a connection to {self.base_url}: {exc}") from exc
            raise ConnectError(f"cannot connect to {self.base_url}: {exc or type(exc).__name__}") from exc
        return conn

    def _release(self, conn: _Connection) -> None:
        if conn.reusable and not self._closed and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.abort()

    def _encode(self, method: bytes, path: bytes, headers: Headers, body: bytes) -> bytes:
        head = [method, b" ", self.prefix, path, b" HTTP/1.1\r\n", self._fixed]
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        if body or method == b"POST":
            head += (b"content-length: ", str(len(body)).encode(), b"\r\n")
        head.append(b"\r\n")
        head.append(body)
        return b"".join(head)

    async def request(
        self,
        method: bytes,
        path: bytes,
        headers: Headers = (),
        body: bytes = b"",
        first_byte_timeout: float | None = None,
    ) -> Response:
        """Send a request and wait for the response's head: ``first_byte_timeout`` at most, if
        given, else the read timeout."""
        data = self._encode(method, path, headers, body)
        while self._idle:
            conn = self._idle.pop()
            if conn.closed:
                continue
            conn.send(data)
            try:
                await conn.wait_headers(first_byte_timeout)
            except UpstreamError:
                conn.abort()
                if conn.got_bytes or isinstance(conn.error, ReadTimeout):
                    raise
                # The engine closed this idle connection as we reused it; nothing was processed.
                continue
            except BaseException:
                # Cancelled (client gone, preempted): closing the connection tells the engine to stop.
                conn.abort()
                raise
            return Response(self, conn)
        conn = await self._connect()
        conn.send(data)
        try:
            await conn.wait_headers(first_byte_timeout)
        except BaseException:
            conn.abort()
            raise
        return Response(self, conn)

    async def get(self, path: bytes, timeout_s: float | None = None) -> tuple[int, bytes]:
        async def go() -> tuple[int, bytes]:
            response = await self.request(b"GET", path)
            try:
                return response.status, await response.read()
            finally:
                response.close()

        if timeout_s is None:
            return await go()
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: see _connect
                return await go()
        except TimeoutError as exc:
            raise ReadTimeout(f"{self.base_url}{path.decode()} took longer than {timeout_s:g} s") from exc

    def close(self) -> None:
        self._closed = True
        for conn in self._idle:
            conn.abort()
        self._idle.clear()

    async def aclose(self) -> None:
        self.close()
