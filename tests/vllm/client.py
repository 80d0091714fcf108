"""Small client helpers for talking to real engines: unique prompts, timed streams, metrics."""

from __future__ import annotations

import itertools
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

MODEL = "tiny"
_FIRST_ORDINARY_TOKEN = 3
_VOCAB = 4096
_prompts = itertools.count()


def unique_prompt(tokens: int) -> list[int]:
    """Token ids no other prompt of this run starts with (so no prefix-cache hit)."""
    rng = random.Random(next(_prompts))
    return [rng.randrange(_FIRST_ORDINARY_TOKEN, _VOCAB) for _ in range(tokens)]


@dataclass
class Streamed:
    sent_at: float
    first_token_at: float | None = None
    done_at: float | None = None
    chunks: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None

    @property
    def ttft(self) -> float:
        assert self.first_token_at is not None
        return self.first_token_at - self.sent_at


async def stream_completion(
    client: httpx.AsyncClient, base_url: str, into: Streamed | None = None, **body: Any
) -> Streamed:
    """POST a streaming completion; time the first token and collect every chunk.

    ``into`` lets a caller watch the stream while it is still running.
    """
    payload = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True}, **body}
    result = into or Streamed(sent_at=0.0)
    result.sent_at = time.monotonic()
    async with client.stream("POST", f"{base_url}/v1/completions", json=payload) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            result.chunks.append(chunk)
            if chunk.get("choices") and result.first_token_at is None:
                result.first_token_at = time.monotonic()
            if chunk.get("usage"):
                result.usage = chunk["usage"]
    result.done_at = time.monotonic()
    return result


def metric_values(text: str, name: str) -> list[tuple[str, float]]:
    """``(labels, value)`` of every sample of ``name`` in a Prometheus exposition."""
    found = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, value = line.rpartition(" ")
            found.append((head[len(name) :], float(value)))
    return found


def metric_sum(text: str, name: str) -> float:
    return sum(value for _, value in metric_values(text, name))
