import asyncio

import pytest

from gateway.auth import Principal
from gateway.core.request import RouteRequest
from gateway.errors import ApiError
from gateway.ratelimit import RateLimiter
from gateway.store import MemoryStore, StoreUnavailable


class DownStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def rate_hit(self, *args, **kwargs):
        self.calls += 1
        raise StoreUnavailable("down")


def request(prompt_tokens: int = 10, max_tokens: int | None = None) -> RouteRequest:
    req = RouteRequest("r", "interactive", "m", 0.0, prompt_tokens=prompt_tokens)
    req.max_tokens = max_tokens
    return req


async def relay(limiter: RateLimiter, principal: Principal, req: RouteRequest, chunks: list[bytes]) -> list[dict]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    metered = limiter.meter(principal, req, send)
    await metered({"type": "http.response.start", "status": 200, "headers": []})
    for i, chunk in enumerate(chunks):
        await metered({"type": "http.response.body", "body": chunk, "more_body": i < len(chunks) - 1})
    await asyncio.sleep(0)
    return sent


async def tpm_used(store: MemoryStore, key: str) -> int:
    return sum(n for (kind, _), n in store._rates.get(key, {}).items() if kind == "tpm")


async def test_keys_without_limits_pay_nothing():
    store = DownStore()
    limiter = RateLimiter(store)
    principal = Principal("k", "n")
    await limiter.admit(principal, request())
    send = object()
    assert limiter.meter(principal, request(), send) is send
    assert store.calls == 0


async def test_completion_tokens_come_from_usage_split_across_chunks():
    store = MemoryStore()
    limiter = RateLimiter(store)
    principal = Principal("k", "n", tpm=10_000)
    await limiter.admit(principal, request(prompt_tokens=7))
    body = b'data: {"choices":[]}\n\ndata: {"usage":{"prompt_tokens":7,"completion_tok'
    sent = await relay(limiter, principal, request(max_tokens=500), [body, b'ens": 42}}\n\n', b"data: [DONE]\n\n"])
    assert len(sent) == 4
    assert await tpm_used(store, "k") == 7 + 42


async def test_streams_without_usage_are_charged_max_tokens_or_events():
    store = MemoryStore()
    limiter = RateLimiter(store)
    principal = Principal("k", "n", tpm=10_000)
    await relay(limiter, principal, request(max_tokens=30), [b"data: {}\n\n"] * 3)
    assert await tpm_used(store, "k") == 30
    await relay(limiter, principal, request(), [b"data: {}\n\ndata: {}\n\n", b"data: [DONE]\n\n"])
    assert await tpm_used(store, "k") == 30 + 3


async def test_over_the_limit_is_429_and_an_unreachable_store_fails_open():
    store = MemoryStore()
    limiter = RateLimiter(store)
    principal = Principal("k", "n", rpm=1)
    await limiter.admit(principal, request())
    with pytest.raises(ApiError) as refused:
        await limiter.admit(principal, request())
    assert refused.value.status == 429 and refused.value.code == "rate_limit_exceeded"
    assert refused.value.retry_after_s > 0
    down = DownStore()
    open_limiter = RateLimiter(down, breaker_s=60)
    await open_limiter.admit(principal, request())
    await open_limiter.admit(principal, request())
    assert down.calls == 1
