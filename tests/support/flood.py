"""Many simultaneous requests from one test: each on a connection of its own, all sent at once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import httpx


async def _post_all(url: str, requests: Sequence[tuple[dict[str, Any], dict[str, str]]]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(requests), max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        # Every connection is opened first, so that the requests reach the gateway together.
        gate = asyncio.Event()

        async def one(body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
            await gate.wait()
            return await client.post("/v1/chat/completions", json=body, headers=headers)

        tasks = [asyncio.create_task(one(body, headers)) for body, headers in requests]
        await asyncio.sleep(0)
        gate.set()
        return list(await asyncio.gather(*tasks))


def post_all(url: str, requests: Sequence[tuple[dict[str, Any], dict[str, str]]]) -> list[httpx.Response]:
    """POST each (body, headers) to ``/v1/chat/completions`` at ``url`` at the same time."""
    return asyncio.run(_post_all(url, requests))


def statuses(responses: Sequence[httpx.Response]) -> Counter[tuple[int, str | None]]:
    """How many answers had each (status, error code)."""
    out: Counter[tuple[int, str | None]] = Counter()
    for response in responses:
        code = None
        if response.status_code != 200:
            try:
                code = response.json()["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = "not-openai-shaped"
        out[(response.status_code, code)] += 1
    return out
