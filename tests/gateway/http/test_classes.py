"""Configured classes beyond two: each class's ``priority`` reaches the engines of every pool that runs
vLLM's priority scheduling. Real gateway and simulated engines over HTTP; only the order in which the
engine starts requests is asserted, never a duration."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

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


def gateway_before(procs, tmp, pools, classes=None):
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
    return proc


async def first_token(
    client: httpx.AsyncClient,
    url: str,
    cls: str,
    prompt: str,
    started: asyncio.Event | None = None,
    body_priority: int | None = None,
) -> tuple[float, str]:
    body: dict[str, object] = {"model": MODEL, "prompt": prompt, "max_tokens": 20, "stream": True}
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


async def order_behind_a_blocker(url: str, blocker: str, low: str, high: str) -> list[str]:
    """A ``blocker`` request runs; ``low`` then ``high`` arrive and wait in the engine: who starts first."""
    async with httpx.AsyncClient(timeout=60) as client:
        running = asyncio.Event()
        first = asyncio.create_task(first_token(client, url, blocker, "blocker " * 8, running))
        await asyncio.wait_for(running.wait(), 30)
        # The low class asks for the engine's highest priority itself: the gateway's value replaces it.
        low_task = asyncio.create_task(first_token(client, url, low, "low " * 8, body_priority=-100))
        await asyncio.sleep(0.1)
        high_task = asyncio.create_task(first_token(client, url, high, "high " * 8))
        (low_at, low_pool), (high_at, high_pool) = await asyncio.gather(low_task, high_task)
        await first
        assert low_pool == high_pool, "both classes share one pool"
        return [name for _, name in sorted([(low_at, low), (high_at, high)])]


@pytest.mark.parametrize(
    ("blocker", "low", "high"),
    [("interactive", "interactive", "realtime"), ("batch", "batch", "standard")],
    ids=["fast-pool", "slow-pool"],
)
def test_each_class_priority_reaches_the_engines_of_every_priority_pool(gateway, blocker, low, high):
    assert asyncio.run(order_behind_a_blocker(gateway.url, blocker, low, high)) == [high, low]


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


async def plain_then_jumping(url: str) -> list[str]:
    """A blocker runs; a plain request then one asking vLLM for the highest priority itself wait behind it."""
    async with httpx.AsyncClient(timeout=60) as client:
        running = asyncio.Event()
        first = asyncio.create_task(first_token(client, url, "interactive", "blocker " * 8, running))
        await asyncio.wait_for(running.wait(), 30)
        plain = asyncio.create_task(first_token(client, url, "interactive", "plain " * 8))
        await asyncio.sleep(0.1)
        jumping = asyncio.create_task(first_token(client, url, "interactive", "jump " * 8, body_priority=-100))
        (plain_at, _), (jumping_at, _) = await asyncio.gather(plain, jumping)
        await first
        return [name for _, name in sorted([(plain_at, "plain"), (jumping_at, "jumping")])]


def test_a_client_priority_does_not_reach_a_pool_the_gateway_schedules_fcfs(fcfs_gateway):
    # Priority is the gateway's to set: a client's own would let it overtake the queue on any engine
    # that honours it.
    assert asyncio.run(plain_then_jumping(fcfs_gateway.url)) == ["plain", "jumping"]
