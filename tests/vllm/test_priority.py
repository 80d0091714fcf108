"""``priority`` reorders the waiting queue on a priority engine and is ignored on an fcfs one.

Both engines run 4 sequences at most. Eight low-priority requests go in at once; as soon
as four are running and four are waiting, one high-priority request arrives. Only the
order of first tokens is asserted, never a duration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from tests.vllm.client import Streamed, metric_sum, stream_completion, unique_prompt
from tests.vllm.conftest import MAX_NUM_SEQS, VllmEngines

pytestmark = pytest.mark.vllm

LOW, HIGH = 10, -10


async def wait_until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    for _ in range(400):
        if await condition():
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"never happened: {what}")


async def lows_then_a_high(url: str) -> tuple[list[Streamed], Streamed]:
    """Eight lows; once four stream tokens and four wait in the engine, one high."""
    async with httpx.AsyncClient(timeout=120) as client:
        body = {"max_tokens": 64, "ignore_eos": True, "temperature": 0}
        lows = [Streamed(sent_at=0.0) for _ in range(2 * MAX_NUM_SEQS)]
        tasks = [
            asyncio.create_task(
                stream_completion(client, url, into=low, prompt=unique_prompt(200), priority=LOW, **body)
            )
            for low in lows
        ]

        async def four_running() -> bool:
            return sum(low.first_token_at is not None for low in lows) >= MAX_NUM_SEQS

        async def four_waiting() -> bool:
            text = (await client.get(f"{url}/metrics")).text
            return metric_sum(text, "vllm:num_requests_waiting") >= MAX_NUM_SEQS

        await wait_until(four_running, "four lows streaming")
        await wait_until(four_waiting, "four lows waiting")
        high = await stream_completion(client, url, prompt=unique_prompt(200), priority=HIGH, **body)
        await asyncio.gather(*tasks)
        return lows, high


def started_after(lows: list[Streamed], high: Streamed) -> list[float]:
    """First-token times of the low requests that were still waiting when the high one was sent."""
    waiting = [low.first_token_at for low in lows if low.first_token_at and low.first_token_at > high.sent_at]
    assert len(waiting) >= MAX_NUM_SEQS - 1, "the scenario needs lows queued behind the running ones"
    return waiting


async def test_priority_engine_serves_the_high_request_before_queued_lows(vllm_engines: VllmEngines) -> None:
    lows, high = await lows_then_a_high(vllm_engines.batch.url)
    assert high.first_token_at is not None
    assert high.first_token_at < min(started_after(lows, high))


async def test_fcfs_engine_ignores_priority(vllm_engines: VllmEngines) -> None:
    lows, high = await lows_then_a_high(vllm_engines.interactive.url)
    assert high.first_token_at is not None
    assert high.first_token_at > max(started_after(lows, high))
