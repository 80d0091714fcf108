"""Requests and tokens per minute per API key, counted in the store across replicas.

Rules:
- The window is a sliding window counter (see ``priority_gateway.store.base``): a request fits when
  this minute's count plus the previous minute's, weighted by the part of it still inside
  the last 60 s, stays within the key's limit. Over the limit: 429 ``rate_limit_exceeded``
  with ``Retry-After``.
- Tokens per minute count the prompt (estimated at admission) and the completion. At admission a
  request reserves its output allowance too (its ``max_tokens`` as the engine reads it, else
  ``decode_tokens``; at most what the limit leaves beside the prompt), so requests running at the
  same time cannot together pass the limit. When the response ends, however it ends, the
  reservation is settled to the completion: from the response's ``usage`` when it has one (for
  streams, the final usage chunk that ``stream_options.include_usage`` asks for, or a Responses
  stream's ``response.completed``), else ``max_tokens`` for a stream that ran to its end, else one
  per streamed event; a stream the client leaves early, or that breaks, is charged for what it
  streamed until then, and a failed request gives its reservation back.
- Keys without limits cost nothing: no store call, no wrapper around the response.
- If the store cannot be reached, requests are admitted (limits fail open) and the store is
  not asked again for ``breaker_s``, so an outage does not slow interactive traffic. A store that
  is only busy (``StoreBusy``: every connection in use, none free in time) is load, not an
  outage: the request gets 503 ``store_busy`` with ``Retry-After`` and the limits stay closed.
"""

from __future__ import annotations

import asyncio
import re
import time

from starlette.types import Message, Send

from priority_gateway import log
from priority_gateway.auth import Principal
from priority_gateway.core.queue import DEFAULT_DECODE_TOKENS
from priority_gateway.core.request import RouteRequest
from priority_gateway.errors import ApiError
from priority_gateway.store import Store, StoreBusy, StoreUnavailable

# Chat and completions say completion_tokens; the Responses API says output_tokens.
_COMPLETION_TOKENS = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*(\d+)')
_TAIL = 64


_CHARGE_ATTEMPTS = 3


class RateLimiter:
    def __init__(self, store: Store, breaker_s: float = 1.0, decode_tokens: int = DEFAULT_DECODE_TOKENS) -> None:
        self.store = store
        self.breaker_s = breaker_s
        self.decode_tokens = decode_tokens
        self._down_until = 0.0
        self._pending: set[asyncio.Task[None]] = set()

    def _store_down(self) -> bool:
        return time.monotonic() < self._down_until

    def _trip(self, exc: Exception) -> None:
        self._down_until = time.monotonic() + self.breaker_s
        log.warning("rate_limit_store_unavailable", reason=str(exc))

    async def admit(self, principal: Principal, req: RouteRequest) -> int:
        """Count ``req`` against its key's limits (429 over them); the output tokens it reserved."""
        if principal.key_id is None or (principal.rpm is None and principal.tpm is None) or self._store_down():
            return 0
        reserved = tokens = 0
        if principal.tpm:
            allowance = req.max_tokens if req.max_tokens is not None else self.decode_tokens
            reserved = min(allowance, max(0, principal.tpm - req.prompt_tokens))
            tokens = req.prompt_tokens + reserved
        try:
            decision = await self.store.rate_hit(principal.key_id, principal.rpm, principal.tpm, tokens)
        except StoreBusy as exc:
            log.warning("rate_limit_store_busy", reason=str(exc))
            raise ApiError(
                503, "the rate limit store is busy; retry shortly", "store_busy", retry_after_s=1.0
            ) from None
        except StoreUnavailable as exc:
            self._trip(exc)
            return 0
        if not decision.allowed:
            what = "requests" if decision.limit == "rpm" else "tokens"
            limit = principal.rpm if decision.limit == "rpm" else principal.tpm
            raise ApiError(
                429,
                f"Rate limit reached for key {principal.key_id} on {what} per minute: limit {limit}. "
                f"Please try again in {decision.retry_after_s:.1f}s.",
                "rate_limit_exceeded",
                retry_after_s=decision.retry_after_s,
            )
        return reserved

    def meter(self, principal: Principal, req: RouteRequest, send: Send, reserved: int = 0) -> Meter | None:
        """A meter of the response's completion tokens when the key has a TPM limit: send through
        ``Meter.send`` and call ``Meter.close`` when the request ends, however it ends; ``reserved``:
        what ``admit`` reserved, settled then."""
        if principal.key_id is None or not principal.tpm:
            return None
        return Meter(self, principal.key_id, req.max_tokens, send, reserved)

    def _charge_later(self, key_id: str, tokens: int) -> None:
        if tokens == 0 or self._store_down():
            return
        task = asyncio.create_task(self._charge(key_id, tokens))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _charge(self, key_id: str, tokens: int) -> None:
        for attempt in range(_CHARGE_ATTEMPTS):
            try:
                await self.store.rate_charge(key_id, tokens)
                return
            except StoreBusy as exc:
                # Busy, not down: the charge waits its turn rather than being dropped.
                if attempt == _CHARGE_ATTEMPTS - 1:
                    log.warning("rate_charge_dropped", reason=str(exc), tokens=tokens)
            except StoreUnavailable as exc:
                self._trip(exc)
                return


class Meter:
    __slots__ = ("_key_id", "_limiter", "_reserved", "_send", "_usage", "charged")

    def __init__(
        self, limiter: RateLimiter, key_id: str, max_tokens: int | None, send: Send, reserved: int = 0
    ) -> None:
        self._limiter = limiter
        self._key_id = key_id
        self._send = send
        self._usage = _UsageWatch(max_tokens)
        self._reserved = reserved
        self.charged = False

    async def send(self, message: Message) -> None:
        # Counted before it goes out: a client gone by now has still been sent these tokens.
        if message["type"] == "http.response.start":
            self._usage.status = message["status"]
        elif message["type"] == "http.response.body":
            self._usage.feed(message.get("body", b""))
            if not message.get("more_body"):
                self._usage.ended = True
        await self._send(message)
        if self._usage.ended:
            self.close()

    def close(self) -> None:
        if not self.charged:
            self.charged = True
            self._limiter._charge_later(self._key_id, self._usage.tokens() - self._reserved)


class _UsageWatch:
    """Completion tokens of a response, read from the bytes on their way to the client."""

    __slots__ = ("ended", "events", "max_tokens", "reported", "status", "tail")

    def __init__(self, max_tokens: int | None) -> None:
        self.max_tokens = max_tokens
        self.status = 0
        self.reported: int | None = None
        self.events = 0
        self.ended = False
        self.tail = b""

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        data = self.tail + chunk
        found = _COMPLETION_TOKENS.findall(data)
        if found:
            self.reported = int(found[-1])
        self.events += chunk.count(b"data: ")
        self.tail = data[-_TAIL:]

    def tokens(self) -> int:
        if self.status != 200:
            return 0
        if self.reported is not None:
            return self.reported
        if self.max_tokens is None:
            return self.events
        # Cut short, a stream has generated what it streamed; run to its end, up to max_tokens.
        return self.max_tokens if self.ended else min(self.events, self.max_tokens)
