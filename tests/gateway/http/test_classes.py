"""Configured classes beyond two: each class's ``priority`` reaches the engines of every pool that runs
vLLM's priority scheduling. Real gateway and simulated engines over HTTP; only the order in which the
engine starts requests is asserted, never a duration."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import httpx
import pytest

from tests.support.observe import async_metric, until
from tests.support.procs import start_engine, start_gateway

MODEL = "sim-model"
CLASSES = {
    "realtime": {"priority": 0, "pool": "fast", "ttft_p99_ms": 200},
    "interactive": {"priority": 1, "pool": "fast"},
    "standard": {"priority": 2, "pool": "slow"},
    "batch": {"priority": 3, "pool": "slow"},
}


@pytest.fixture(scope="module")
def gateway(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("classes")
    engines = {pool: priority_engine(procs, tmp) for pool in ("fast", "slow")}
    pools = {pool: {"engines": [e.url], "scheduling_policy": "priority"} for pool, e in engines.items()}
    return gateway_before(procs, tmp, pools, CLASSES)


def priority_engine(procs, tmp):
    # One sequence at a time, so whatever arrives while one runs waits in the engine's own queue.
    engine = start_engine(tmp, "--max-num-seqs", "1", "--token-delay-ms", "15", "--scheduling-policy", "priority")
    procs.append(engine)
    engine.wait_ready()
    return engine


@dataclass
class Front:
    """A gateway's URL and the URLs of the engines behind it."""

    url: str
    engines: list[str]

    async def waiting(self, n: int) -> bool:
        """Whether ``n`` requests wait in the engines' own queues."""
        return sum([await async_metric(engine, "vllm:num_requests_waiting") for engine in self.engines]) == n


def gateway_before(procs, tmp, pools, classes=None) -> Front:
    config = {
        "pools": pools,
        # The engines order the queue here, not the gateway: every request goes to its engine at once.
        "admission": {"enabled": False},
        "health": {"interval_s": 0.2, "timeout_s": 0.5},
    }
    if classes is not None:
        config["classes"] = classes
    proc = start_gateway(tmp, config)
    procs.append(proc)
    proc.wait_ready("/ready")
    return Front(proc.url, [engine for pool in pools.values() for engine in pool["engines"]])


async def first_token(
    client: httpx.AsyncClient,
    url: str,
    cls: str,
    prompt: str,
    started: asyncio.Event | None = None,
    body_priority: int | None = None,
    max_tokens: int = 20,
    ignore_eos: bool = False,
) -> tuple[float, str]:
    body: dict[str, object] = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    if ignore_eos:
        body["ignore_eos"] = True
    if body_priority is not None:
        body["priority"] = body_priority
    async with client.stream("POST", url + "/v1/completions", json=body, headers={"X-Priority": cls}) as r:
        assert r.status_code == 200, await r.aread()
        pool = r.headers["x-gateway-pool"]
        at = None
        async for line in r.aiter_lines():
            if line.startswith("data: {") and at is None:
                at = time.monotonic()
                if started is not None:
                    started.set()
        assert at is not None
        return at, pool


async def blocking(client: httpx.AsyncClient, front: Front, cls: str) -> asyncio.Task[tuple[float, str]]:
    """A request that holds the engine, running, until its client leaves (``release``)."""
    running = asyncio.Event()
    # ignore_eos: its prompt's natural end comes at 157 tokens (2.4 s), which a busy machine outlasts.
    blocker = first_token(client, front.url, cls, "blocker " * 8, running, max_tokens=2000, ignore_eos=True)
    task = asyncio.create_task(blocker)
    await asyncio.wait_for(running.wait(), 30)
    return task


async def release(front: Front, blocker: asyncio.Task[tuple[float, str]], waiting: int) -> None:
    """Once ``waiting`` requests wait in the engine's queue, the blocker's client leaves: the engine
    starts the one its policy puts first."""
    assert await until(lambda: front.waiting(waiting)), f"{waiting} requests never waited in the engine's queue"
    blocker.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await blocker


async def order_behind_a_blocker(front: Front, blocker: str, low: str, high: str) -> list[str]:
    """A ``blocker`` request runs; ``low`` then ``high`` arrive and wait in the engine: who starts first."""
    async with httpx.AsyncClient(timeout=60) as client:
        first = await blocking(client, front, blocker)
        # The low class asks for the engine's highest priority itself: the gateway's value replaces it.
        low_task = asyncio.create_task(first_token(client, front.url, low, "low " * 8, body_priority=-100))
        assert await until(lambda: front.waiting(1)), "the low request never reached its engine's queue"
        high_task = asyncio.create_task(first_token(client, front.url, high, "high " * 8))
        await release(front, first, 2)
        (low_at, low_pool), (high_at, high_pool) = await asyncio.gather(low_task, high_task)
        assert low_pool == high_pool, "both classes share one pool"
        return [name for _, name in sorted([(low_at, low), (high_at, high)])]


@pytest.mark.parametrize(
    ("blocker", "low", "high"),
    [("interactive", "interactive", "realtime"), ("batch", "batch", "standard")],
    ids=["fast-pool", "slow-pool"],
)
def test_each_class_priority_reaches_the_engines_of_every_priority_pool(gateway, blocker, low, high):
    assert asyncio.run(order_behind_a_blocker(gateway, blocker, low, high)) == [high, low]


def test_an_unconfigured_class_is_refused_with_the_configured_ones_named(gateway):
    r = httpx.post(
        gateway.url + "/v1/completions", json={"model": MODEL, "prompt": "x"}, headers={"X-Priority": "urgent"}
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "invalid_priority"
    assert all(name in error["message"] for name in CLASSES)


@pytest.fixture(scope="module")
def fcfs_gateway(procs, tmp_path_factory):
    """A pool the gateway schedules first come, first served, in front of an engine that would honour a
    ``priority`` (an operator's engine flags need not match the gateway's view of its pool)."""
    tmp = tmp_path_factory.mktemp("fcfs")
    return gateway_before(procs, tmp, {"interactive": {"engines": [priority_engine(procs, tmp).url]}})


async def plain_then_jumping(front: Front) -> list[str]:
    """A blocker runs; a plain request then one asking vLLM for the highest priority itself wait behind it."""
    async with httpx.AsyncClient(timeout=60) as client:
        first = await blocking(client, front, "interactive")
        plain = asyncio.create_task(first_token(client, front.url, "interactive", "plain " * 8))
        assert await until(lambda: front.waiting(1)), "the plain request never reached its engine's queue"
        jumping = asyncio.create_task(first_token(client, front.url, "interactive", "jump " * 8, body_priority=-100))
        await release(front, first, 2)
        (plain_at, _), (jumping_at, _) = await asyncio.gather(plain, jumping)
        return [name for _, name in sorted([(plain_at, "plain"), (jumping_at, "jumping")])]


def test_a_client_priority_does_not_reach_a_pool_the_gateway_schedules_fcfs(fcfs_gateway):
    # Priority is the gateway's to set: a client's own would let it overtake the queue on any engine
    # that honours it.
    assert asyncio.run(plain_then_jumping(fcfs_gateway)) == ["plain", "jumping"]
