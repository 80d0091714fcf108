"""The HTTP clients ``gateway bench`` drives an endpoint with.

Rules:
- ``http://`` endpoints get the lean client the gateway relays with (``priority_gateway.upstream.h1``): on
  loopback or a LAN the load generator's own CPU is the limit, and that client costs the least per
  request (docs/architecture.md has the measurement).
- ``https://`` endpoints get httpx: any server's TLS, the system's trust store (``SSL_CERT_FILE``
  honoured) or ``--ca-file``, and ``HTTPS_PROXY``/``NO_PROXY`` from the environment, where an
  endpoint across the internet makes a few microseconds per request beside the point.
- Both answer alike (``Client``): a response's status, headers, chunks as they arrive, and
  ``UpstreamError``s (``ConnectError``, ``ReadTimeout``) for what went wrong on the way.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from priority_gateway.upstream.h1 import ConnectError, EngineClient, Headers, ReadTimeout, UpstreamError


class Reply(Protocol):
    status: int

    def header(self, name: bytes) -> bytes | None: ...

    async def next_chunk(self) -> bytes | None: ...

    async def read(self) -> bytes: ...

    async def aclose(self) -> None: ...


class Client(Protocol):
    async def request(self, method: bytes, path: bytes, headers: Headers = (), body: bytes = b"") -> Reply: ...

    async def get(self, path: bytes, timeout_s: float | None = None) -> tuple[int, bytes]: ...

    async def aclose(self) -> None: ...


def open_client(
    url: str, *, read_timeout: float, connections: int, api_key: str | None, ca_file: str | None = None
) -> Client:
    """The client for ``url`` (see the module's rules); ``ValueError`` for a URL neither serves."""
    scheme = urlsplit(url).scheme
    if scheme == "https":
        return HttpxClient(url, read_timeout=read_timeout, connections=connections, api_key=api_key, ca_file=ca_file)
    if scheme != "http":
        raise ValueError(f"--url must be an http:// or https:// URL, got {url!r}")
    if ca_file is not None:
        raise ValueError("--ca-file is for https:// URLs")
    return EngineClient(url, read_timeout=read_timeout, max_idle=connections, api_key=api_key)


def _upstream_error(exc: httpx.HTTPError, url: str) -> UpstreamError:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.ProxyError):
        return ConnectError(f"cannot connect to {url}: {exc or type(exc).__name__}")
    if isinstance(exc, httpx.TimeoutException):
        return ReadTimeout(f"{url}: {exc or type(exc).__name__}")
    return UpstreamError(f"{url}: {exc or type(exc).__name__}")


class HttpxReply:
    __slots__ = ("_chunks", "_response", "status")

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._chunks: AsyncIterator[bytes] = response.aiter_raw()
        self.status = response.status_code

    def header(self, name: bytes) -> bytes | None:
        value = self._response.headers.get(name.decode("latin-1"))
        return None if value is None else value.encode("latin-1")

    async def next_chunk(self) -> bytes | None:
        try:
            return await anext(self._chunks)
        except StopAsyncIteration:
            return None
        except httpx.HTTPError as exc:
            raise _upstream_error(exc, str(self._response.url)) from exc

    async def read(self) -> bytes:
        parts = []
        while (chunk := await self.next_chunk()) is not None:
            parts.append(chunk)
        return b"".join(parts)

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxClient:
    def __init__(
        self, base_url: str, *, read_timeout: float, connections: int, api_key: str | None, ca_file: str | None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"authorization": f"Bearer {api_key}"} if api_key else None,
            verify=verify,
            timeout=httpx.Timeout(read_timeout, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=connections),
            trust_env=True,
        )

    async def request(self, method: bytes, path: bytes, headers: Headers = (), body: bytes = b"") -> HttpxReply:
        request = self._client.build_request(method.decode(), path.decode(), headers=list(headers), content=body)
        try:
            return HttpxReply(await self._client.send(request, stream=True))
        except httpx.HTTPError as exc:
            raise _upstream_error(exc, f"{self.base_url}{path.decode()}") from exc

    async def get(self, path: bytes, timeout_s: float | None = None) -> tuple[int, bytes]:
        try:
            response = await self._client.get(path.decode(), timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise _upstream_error(exc, f"{self.base_url}{path.decode()}") from exc
        return response.status_code, response.content

    async def aclose(self) -> None:
        await self._client.aclose()
