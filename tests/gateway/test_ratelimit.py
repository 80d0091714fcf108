"""Per-key rate limits: the sliding window, what a response is charged, and (over real HTTP
with the openai client) that leaving a stream early does not escape the token limit."""

import asyncio
import time

import httpx
import openai
import pytest

from priority_gateway.auth import Principal
from priority_gateway.core.request import RouteRequest
from priority_gateway.errors import ApiError
from priority_gateway.ratelimit import RateLimiter
from priority_gateway.store import MemoryStore, StoreUnavailable
from tests.gateway.batch.support import MODEL, client_for, start_stack


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


async def relay(
    limiter: RateLimiter, principal: Principal, req: RouteRequest, chunks: list[bytes], finished: bool = True
) -> list[dict]:
    """Send ``chunks`` through the meter; unless ``finished``, the stream stops before its last message."""
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    meter = limiter.meter(principal, req, send)
    assert meter is not None
    await meter.send({"type": "http.response.start", "status": 200, "headers": []})
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        if last and not finished:
            break
        await meter.send({"type": "http.response.body", "body": chunk, "more_body": not last})
    meter.close()
    await asyncio.sleep(0)
    return sent


async def tpm_used(store: MemoryStore, key: str) -> int:
    return sum(n for (kind, _), n in store._rates.get(key, {}).items() if kind == "tpm")


async def test_keys_without_limits_pay_nothing():
    store = DownStore()
    limiter = RateLimiter(store)
    principal = Principal("k", "n")
    await limiter.admit(principal, request())
    assert limiter.meter(principal, request(), object()) is None
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


async def test_a_responses_stream_is_charged_its_output_tokens_not_its_limit():
    store = MemoryStore()
    limiter = RateLimiter(store)
    principal = Principal("k", "n", tpm=10_000)
    created = b'event: response.created\ndata: {"response":{"max_output_tokens":500,"usage":null}}\n\n'
    completed = (
        b'event: response.completed\ndata: {"response":{"max_output_tokens":500,"usage":{"input_tokens":9,'
        b'"output_tokens":12,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":21}}}\n\n'
    )
    await relay(limiter, principal, request(max_tokens=500), [created, b"event: x\ndata: {}\n\n" * 3, completed])
    assert await tpm_used(store, "k") == 12


async def test_streams_without_usage_are_charged_max_tokens_or_events():
    store = MemoryStore()
    limiter = RateLimiter(store)
    principal = Principal("k", "n", tpm=10_000)
    await relay(limiter, principal, request(max_tokens=30), [b"data: {}\n\n"] * 3)
    assert await tpm_used(store, "k") == 30
    await relay(limiter, principal, request(), [b"data: {}\n\ndata: {}\n\n", b"data: [DONE]\n\n"])
    assert await tpm_used(store, "k") == 30 + 3


async def test_a_stream_cut_short_is_charged_what_it_streamed_once():
    store = MemoryStore()
    limiter = RateLimiter(store)
    principal = Principal("k", "n", tpm=10_000)
    await relay(limiter, principal, request(max_tokens=500), [b"data: {}\n\n"] * 7, finished=False)
    assert await tpm_used(store, "k") == 6
    await relay(limiter, principal, request(max_tokens=4), [b"data: {}\n\n"] * 7, finished=False)
    assert await tpm_used(store, "k") == 6 + 4


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


ADMIN = "admin-secret-for-tests"


@pytest.fixture(scope="module")
def slow_stack(procs, tmp_path_factory):
    # Tokens come 20 ms apart, so a client can leave a stream before its last one.
    keys = {"admin": ADMIN, "cache_s": 0.2, "refresh_s": 0.2}
    return start_stack(tmp_path_factory.mktemp("tpm"), procs, engine_args=("--token-delay-ms", "20"), keys=keys)


def test_leaving_streams_just_before_their_end_does_not_escape_the_token_limit(slow_stack):
    url = slow_stack.gateways[0].url
    created = httpx.post(
        url + "/admin/keys",
        json={"name": "tpm", "classes": ["interactive"], "tpm": 250},
        headers={"authorization": f"Bearer {ADMIN}"},
    )
    assert created.status_code == 201, created.text
    client = client_for(slow_stack.gateways[0], created.json()["secret"])
    max_tokens = 24
    refused = None
    for attempt in range(12):
        try:
            stream = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=max_tokens,
                stream=True,
                stream_options={"include_usage": True},
            )
        except openai.RateLimitError as exc:
            refused = (attempt, exc)
            break
        with stream:
            tokens = 0
            for chunk in stream:
                assert chunk.usage is None, "the stream ran to its end"
                if chunk.choices and chunk.choices[0].delta.content:
                    tokens += 1
                if tokens == max_tokens - 2:
                    break  # leave before the last tokens and the usage chunk
        time.sleep(0.2)  # the gateway notices the client left
    # Each request costs a few prompt tokens and about 22 streamed ones: 250 tokens last ten requests at most.
    assert refused is not None, "twelve streams of 24 tokens fitted a limit of 250 tokens per minute"
    attempt, exc = refused
    assert attempt <= 10
    assert exc.code == "rate_limit_exceeded" and "tokens per minute" in exc.message
