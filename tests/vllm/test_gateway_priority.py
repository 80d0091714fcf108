"""The gateway's class priorities reach a real vLLM engine that runs ``--scheduling-policy priority``.

The batch engine runs 4 sequences at most. Through the gateway, four requests of the low class fill
it; a fifth low request then waits in the engine's own queue, and a request of the high class
arrives behind it. vLLM serves lower ``priority`` values first, and the gateway sends every request
on at once (admission off: no queue of its own to reorder), so the high request can start first
only if its class's value reached the engine. The low request asks for the engine's highest
priority itself, in the body and in vLLM's ``X-Vllm-Priority`` header: the gateway replaces the
one and does not forward the other. Only the order of first tokens is asserted, never a duration.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from tests.support.procs import Proc, start_gateway
from tests.vllm.client import MODEL, metric_sum, unique_prompt
from tests.vllm.conftest import MAX_NUM_SEQS, VllmEngines, gateway_pools
from tests.vllm.test_priority import wait_until

pytestmark = pytest.mark.vllm

CLASSES = {
    "low": {"priority": 10, "pool": "batch", "kind": "batch"},
    "high": {"priority": -10, "pool": "batch"},
}


@pytest.fixture(scope="module")
def gateway(procs: list[Proc], tmp_path_factory: pytest.TempPathFactory, vllm_engines: VllmEngines) -> Proc:
    config = {
        "pools": gateway_pools(vllm_engines),
        "classes": CLASSES,
        "admission": {"enabled": False},
        "health": {"interval_s": 0.5, "timeout_s": 2.0, "unhealthy_after": 2},
        "scrape": {"interval_s": 1.0},
    }
    proc = start_gateway(tmp_path_factory.mktemp("gateway-priority"), config)
    procs.append(proc)
    return proc.wait_ready("/ready", timeout=30)


async def first_token(
    client: httpx.AsyncClient, url: str, cls: str, max_tokens: int, **extra: Any
) -> tuple[float, str]:
    """Stream a completion of class ``cls``; when its first token came, and the pool that served it."""
    headers = {"X-Priority": cls, **extra.pop("headers", {})}
    body = {"model": MODEL, "prompt": unique_prompt(64), "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    async with client.stream("POST", f"{url}/v1/completions", json={**body, **extra}, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        at = None
        async for line in r.aiter_lines():
            if at is None and line.startswith("data: {"):
                at = time.monotonic()
        assert at is not None
        return at, r.headers["x-gateway-pool"]


async def high_behind_a_queued_low(gateway: str, engine: str) -> tuple[float, float]:
    async with httpx.AsyncClient(timeout=120) as client:

        async def engine_count(name: str) -> float:
            return metric_sum((await client.get(f"{engine}/metrics")).text, name)

        async def full() -> bool:
            return await engine_count("vllm:num_requests_running") >= MAX_NUM_SEQS

        async def one_waiting() -> bool:
            return await engine_count("vllm:num_requests_waiting") >= 1

        blockers = [asyncio.create_task(first_token(client, gateway, "low", 96)) for _ in range(MAX_NUM_SEQS)]
        await wait_until(full, "four low requests running in the engine")
        jumper = {"priority": -100, "headers": {"X-Vllm-Priority": "-100"}}
        low = asyncio.create_task(first_token(client, gateway, "low", 8, **jumper))
        await wait_until(one_waiting, "a low request waiting in the engine")
        high = asyncio.create_task(first_token(client, gateway, "high", 8))
        (low_at, low_pool), (high_at, high_pool) = await asyncio.gather(low, high)
        await asyncio.gather(*blockers)
        assert low_pool == high_pool == "batch"
        return low_at, high_at


def test_a_class_priority_reaches_the_priority_engine(gateway: Proc, vllm_engines: VllmEngines) -> None:
    low_at, high_at = asyncio.run(high_behind_a_queued_low(gateway.url, vllm_engines.batch.url))
    assert high_at < low_at
