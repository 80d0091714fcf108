"""KV cache events from real engines reach the subscriber, in both endpoint styles.

A prompt of token ids lets the test check exactly which blocks an engine reports.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from priority_gateway.upstream.kv_events import BlockStored, KVEventBatch, KVEventSubscriber
from tests.vllm.client import MODEL, unique_prompt
from tests.vllm.conftest import BLOCK_SIZE, VllmEngines

pytestmark = pytest.mark.vllm


class Collected:
    def __init__(self) -> None:
        self.batches: list[KVEventBatch] = []

    def __call__(self, batch: KVEventBatch) -> None:
        self.batches.append(batch)

    def stored_for(self, prompt: list[int]) -> list[BlockStored]:
        """Stored events whose tokens are a prefix of ``prompt``'s full blocks."""
        return [
            event
            for batch in self.batches
            for event in batch.events
            if isinstance(event, BlockStored) and event.token_ids and _is_block_run_of(prompt, event)
        ]


def _is_block_run_of(prompt: list[int], event: BlockStored) -> bool:
    tokens = list(event.token_ids)
    return any(prompt[start : start + len(tokens)] == tokens for start in range(0, len(prompt), BLOCK_SIZE))


async def complete(client: httpx.AsyncClient, url: str, prompt: list[int]) -> None:
    reply = await client.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
    assert reply.status_code == 200


async def stored_blocks(
    client: httpx.AsyncClient, url: str, collected: Collected, prompt: list[int]
) -> list[BlockStored]:
    await complete(client, url, prompt)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = collected.stored_for(prompt)
        if sum(len(event.block_hashes) for event in found) >= len(prompt) // BLOCK_SIZE:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"no BlockStored events for a {len(prompt)}-token prompt from {url}")


async def until_subscribed(client: httpx.AsyncClient, url: str, collected: Collected, topic: str) -> None:
    """ZMQ connects in the background: send throwaway prompts until their events arrive."""
    for _ in range(40):
        await complete(client, url, unique_prompt(BLOCK_SIZE + 1))
        await asyncio.sleep(0.25)
        if any(batch.topic == topic for batch in collected.batches):
            return
    raise AssertionError(f"no KV events from {url}")


async def test_engine_connecting_to_a_bound_subscriber(vllm_engines: VllmEngines) -> None:
    collected = Collected()
    url = vllm_engines.interactive.url
    async with KVEventSubscriber(collected) as subscriber, httpx.AsyncClient(timeout=30) as client:
        subscriber.bind(vllm_engines.kv_endpoint)
        await until_subscribed(client, url, collected, "interactive")

        prompt = unique_prompt(3 * BLOCK_SIZE + 10)
        found = await stored_blocks(client, url, collected, prompt)
        hashes = [h for event in found for h in event.block_hashes]
        assert len(hashes) == 3
        assert [t for event in found for t in event.token_ids] == prompt[: 3 * BLOCK_SIZE]
        assert found[0].parent_block_hash is None
        assert all(event.block_size == BLOCK_SIZE for event in found)
        assert {batch.topic for batch in collected.batches} == {"interactive"}

        # A cache hit stores nothing new: by the time a fresh prompt's blocks are reported,
        # nothing more has been reported for the repeated one.
        await complete(client, url, prompt)
        await stored_blocks(client, url, collected, unique_prompt(BLOCK_SIZE + 1))
        assert [h for event in collected.stored_for(prompt) for h in event.block_hashes] == hashes

    assert subscriber.stats.gaps == 0
    assert subscriber.stats.malformed == 0
    assert subscriber.stats.unknown_events == 0


async def test_subscriber_connecting_to_a_binding_engine(vllm_engines: VllmEngines) -> None:
    collected = Collected()
    url = vllm_engines.batch.url
    async with KVEventSubscriber(collected) as subscriber, httpx.AsyncClient(timeout=30) as client:
        subscriber.connect(vllm_engines.batch_kv_endpoint)
        await until_subscribed(client, url, collected, "batch")

        prompt = unique_prompt(2 * BLOCK_SIZE)
        found = await stored_blocks(client, url, collected, prompt)
        assert [t for event in found for t in event.token_ids] == prompt
        assert {(batch.source, batch.topic) for batch in collected.batches} == {
            (vllm_engines.batch_kv_endpoint, "batch")
        }
    assert subscriber.stats.gaps == 0


async def test_engines_agree_on_block_hashes(vllm_engines: VllmEngines) -> None:
    """The prefix index may key blocks by hash across a pool: same prompt, same hashes."""
    collected = Collected()
    async with KVEventSubscriber(collected) as subscriber, httpx.AsyncClient(timeout=30) as client:
        subscriber.bind(vllm_engines.kv_endpoint)
        subscriber.connect(vllm_engines.batch_kv_endpoint)
        for engine, topic in zip(vllm_engines.both, ("interactive", "batch"), strict=True):
            await until_subscribed(client, engine.url, collected, topic)
        prompt = unique_prompt(2 * BLOCK_SIZE + 1)
        per_engine = []
        for engine in vllm_engines.both:
            collected.batches.clear()
            found = await stored_blocks(client, engine.url, collected, prompt)
            per_engine.append([h for event in found for h in event.block_hashes])
    assert per_engine[0] == per_engine[1]
    assert len(per_engine[0]) == 2
