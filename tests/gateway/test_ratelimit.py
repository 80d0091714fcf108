"""Per-key rate limits: the sliding window, what a response is charged, and (over real HTTP
with the openai client) that leaving a stream early does not escape the token limit."""

import asyncio

import httpx
import openai
import pytest

from priority_gateway.auth import Principal
from priority_gateway.core.request import RouteRequest
from priority_gateway.errors import ApiError
from priority_gateway.ratelimit import RateLimiter
from priority_gateway.store import MemoryStore, RedisStore, StoreBusy, StoreUnavailable
from tests.gateway.batch.support import MODEL, client_for, start_stack
from tests.support.flood import post_all, statuses
from tests.support.observe import metric, until, wait_for
from tests.support.redis import RedisServer


class DownStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def rate_hit(self, *_args, **_kwargs):
        self.calls += 1
        raise StoreUnavailable("down")


def request(prompt_tokens: int = 10, max_tokens: int | None = None) -> RouteRequest:
    req = RouteRequest("r", "interactive", "m", 0.0, prompt_tokens=prompt_tokens)
    req.max_tokens = max_tokens
    return req


async def relay(
    limiter: RateLimiter,
    principal: Principal,
    req: RouteRequest,
    chunks: list[bytes],
    finished: bool = True,
    reserved: int = 0,
    status: int = 200,
) -> list[dict]:
    """Send ``chunks`` through the meter; unless ``finished``, the stream stops before its last message."""
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    meter = limiter.meter(principal, req, send, reserved)
    assert meter is not None
    await meter.send({"type": "http.response.start", "status": status, "headers": []})
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
    req = request(prompt_tokens=7, max_tokens=500)
    reserved = await limiter.admit(principal, req)
    assert reserved == 500 and await tpm_used(store, "k") == 7 + 500
    body = b'data: {"choices":[]}\n\ndata: {"usage":{"prompt_tokens":7,"completion_tok'
    sent = await relay(limiter, principal, req, [body, b'ens": 42}}\n\n', b"data: [DONE]\n\n"], reserved=reserved)
    assert len(sent) == 4
    assert await tpm_used(store, "k") == 7 + 42


async def test_the_reservation_is_the_limit_s_room_at_most_and_a_failure_gives_it_back():
    store = MemoryStore()
    limiter = RateLimiter(store, decode_tokens=64)
    assert await limiter.admit(Principal("a", "n", tpm=1000), request(prompt_tokens=10)) == 64
    assert await tpm_used(store, "a") == 10 + 64
    principal = Principal("k", "n", tpm=1000)
    big = request(prompt_tokens=10, max_tokens=10**6)
    reserved = await limiter.admit(principal, big)
    assert reserved == 990 and await tpm_used(store, "k") == 1000
    with pytest.raises(ApiError):
        await limiter.admit(principal, request(prompt_tokens=1, max_tokens=1))
    await relay(limiter, principal, big, [b'{"error": {}}'], reserved=reserved, status=502)
    assert await tpm_used(store, "k") == 10


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
        # The gateway notices the client left: it ends the request on the engine, and settles its charge.
        assert wait_for(lambda: metric(slow_stack.interactive[0].url, "vllm:num_requests_running") == 0)
    # Each request costs a few prompt tokens and about 22 streamed ones: 250 tokens last ten requests at most.
    assert refused is not None, "twelve streams of 24 tokens fitted a limit of 250 tokens per minute"
    attempt, exc = refused
    assert attempt <= 10
    assert exc.code == "rate_limit_exceeded" and "tokens per minute" in exc.message


# -- under hostile load, over real HTTP, against a real redis-server ---------------------------


@pytest.fixture(scope="module")
def redis_stack(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ratelimit-redis")
    server = RedisServer(tmp).start()
    procs.append(server)
    keys = {"admin": ADMIN, "cache_s": 60, "refresh_s": 0.2}
    return start_stack(tmp, procs, store=server.url, engine_args=("--token-delay-ms", "1"), keys=keys)


def new_key(url: str, **limits: int) -> str:
    body = {"name": "flood", "classes": ["interactive", "batch"], **limits}
    created = httpx.post(url + "/admin/keys", json=body, headers={"authorization": f"Bearer {ADMIN}"})
    assert created.status_code == 201, created.text
    return created.json()["secret"]


def batch_key(secret: str) -> dict[str, str]:
    # The batch class waits for a slot instead of being refused for the TTFT budget: only the limits refuse.
    return {"authorization": f"Bearer {secret}", "x-priority": "batch"}


def chat_body(**fields: object) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "ignore_eos": True,
        **fields,
    }


def test_a_thousand_simultaneous_requests_do_not_open_the_limits(redis_stack):
    url = redis_stack.gateways[0].url
    secret = new_key(url, rpm=10)
    headers = batch_key(secret)
    assert httpx.post(url + "/v1/chat/completions", json=chat_body(), headers=headers).status_code == 200
    answers = statuses(post_all(url, [(chat_body(), headers)] * 1000))
    # One window: nine more requests fit (fewer only if a minute turns during the burst), the rest are 429.
    assert 7 <= answers[(200, None)] <= 9, answers
    assert answers[(429, "rate_limit_exceeded")] == 1000 - answers[(200, None)], answers


def test_simultaneous_first_requests_of_uncached_keys_are_all_served(redis_stack):
    url = redis_stack.gateways[0].url
    secrets_ = [new_key(url) for _ in range(150)]
    flood = [(chat_body(), batch_key(s)) for s in secrets_]
    answers = statuses(post_all(url, flood))
    assert answers == {(200, None): 150}, answers


def served_tokens(responses) -> int:
    return sum(r.json()["usage"]["completion_tokens"] for r in responses if r.status_code == 200)


def test_simultaneous_requests_reserve_their_output_under_the_token_limit(redis_stack):
    url = redis_stack.gateways[0].url
    secret = new_key(url, tpm=2000)
    responses = post_all(url, [(chat_body(max_tokens=400), batch_key(secret))] * 40)
    answers = statuses(responses)
    # Each reserves its prompt and 400 tokens at admission: four fit in 2,000, never forty.
    assert 1 <= answers[(200, None)] <= 5, answers
    assert answers[(429, "rate_limit_exceeded")] == 40 - answers[(200, None)], answers
    assert served_tokens(responses) <= 2000


def test_max_completion_tokens_is_read_before_max_tokens_as_the_engine_does(redis_stack):
    url = redis_stack.gateways[0].url
    secret = new_key(url, tpm=2000)
    body = chat_body(max_tokens=1, max_completion_tokens=400)
    responses = post_all(url, [(body, batch_key(secret))] * 12)
    answers = statuses(responses)
    assert {r.json()["usage"]["completion_tokens"] for r in responses if r.status_code == 200} == {400}
    assert 1 <= answers[(200, None)] <= 5, answers
    assert served_tokens(responses) <= 2000


async def test_a_full_connection_pool_is_load_never_an_outage(tmp_path):
    server = RedisServer(tmp_path).start()
    store = RedisStore(server.url + "?max_connections=1&timeout=0.2")
    await store.open()
    try:
        # The pool's one connection is busy until the test lets it go: the next call waits 0.2 s, then is told so.
        holder = asyncio.create_task(store.redis.blpop(["let-go"], timeout=60))
        outside = server.client()
        assert await until(lambda: outside.info("clients")["blocked_clients"] == 1), "the connection was never taken"
        with pytest.raises(StoreBusy):
            await store.rate_hit("k", 10, None, 0)
        limiter = RateLimiter(store, breaker_s=60)
        with pytest.raises(ApiError) as busy:
            await limiter.admit(Principal("k", "n", rpm=1), request())
        assert busy.value.status == 503 and busy.value.code == "store_busy" and busy.value.retry_after_s
        outside.rpush("let-go", "now")
        await holder
        # The breaker never opened: the limit binds as soon as the connection is free.
        await limiter.admit(Principal("k", "n", rpm=1), request())
        with pytest.raises(ApiError) as over:
            await limiter.admit(Principal("k", "n", rpm=1), request())
        assert over.value.code == "rate_limit_exceeded"
    finally:
        await store.close()
        server.stop()
