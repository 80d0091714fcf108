"""Chunked prefill under a token budget per step (``--max-num-batched-tokens``), on vLLM 0.32 and on the
simulator that stands in for it (the interactive pool runs with such a budget): a long prompt
prefills over several steps, and a request decoding beside it gets a token in each of them instead
of waiting out one long step; both count the steps alike in ``vllm:iteration_tokens_total``."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from priority_gateway.engines.vllm.serve import EngineSpec, start
from tests.support.procs import Proc, free_port
from tests.vllm.client import MODEL, metric_values, stream_completion, unique_prompt

pytestmark = pytest.mark.vllm

BUDGET = 64
PROMPT = 1000  # sixteen chunks of at most 64 tokens: 15 x 64 + 40


@pytest.fixture(scope="module")
def urls(procs: list[Proc], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    logs = tmp_path_factory.mktemp("chunked")
    budget = ("--max-num-batched-tokens", str(BUDGET))
    vllm = start(EngineSpec(port=free_port(), core=None, max_num_seqs=4, extra_args=budget), logs / "vllm.log")
    port = free_port()
    cmd = [sys.executable, "-m", "priority_gateway.engines.sim", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--profile", "tiny-cpu", "--model", MODEL, "--max-num-seqs", "4", *budget]
    sim = Proc(cmd, f"http://127.0.0.1:{port}", logs / "sim.log").start()
    procs.append(sim)
    try:
        vllm.wait_healthy()
        sim.wait_ready()
        yield {"vllm": vllm.url, "sim": sim.url}
    finally:
        vllm.stop()


def step_sizes(url: str) -> dict[float, float]:
    """Engine steps so far by the upper bound of their token count (the histogram's buckets, not cumulative)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    cumulative = sorted(
        (float(labels.split('le="', 1)[1].split('"', 1)[0]), value)
        for labels, value in metric_values(text, "vllm:iteration_tokens_total_bucket")
    )
    out, below = {}, 0.0
    for bound, count in cumulative:
        out[bound] = count - below
        below = count
    return out


async def token_times(client: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int) -> list[float]:
    """When each streamed token event of a completion arrived."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    times = []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]" and json.loads(line[6:]).get("choices"):
                times.append(time.monotonic())
    return times


def test_a_long_prompt_counts_once_when_its_first_token_comes_alike(urls: dict[str, str]) -> None:
    seen = {}
    for name, url in urls.items():
        before = step_sizes(url)

        async def one(url: str = url) -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                await stream_completion(client, url, prompt=unique_prompt(PROMPT), max_tokens=1)

        asyncio.run(one())
        after = step_sizes(url)
        seen[name] = {b: n - before.get(b, 0.0) for b, n in after.items() if n - before.get(b, 0.0)}
    assert seen["vllm"] == {1024.0: 1.0}, seen
    assert seen["sim"] == seen["vllm"], seen


def test_a_decoding_request_gets_a_token_in_every_chunk_of_a_long_prompt_alike(urls: dict[str, str]) -> None:
    """Token events of a decoding request that arrive while a 1,000-token prompt prefills (from its
    sending to its first token): one a step, sixteen steps in chunks of 64 (in one long step, vLLM
    and the simulator stream 3 to 5 in that time: the prompt's way through the API server)."""
    beside = {}
    for name, url in urls.items():

        async def run(url: str = url) -> int:
            async with httpx.AsyncClient(timeout=60) as client:
                decoding = asyncio.create_task(token_times(client, url, unique_prompt(64), 400))
                await asyncio.sleep(0.3)  # its prefill done, it decodes
                sent = time.monotonic()
                long = await token_times(client, url, unique_prompt(PROMPT), 1)
                times = await decoding
            assert len(times) > 200  # an event a step, some carrying two tokens when the client read late
            return sum(sent < t < long[0] for t in times)

        beside[name] = asyncio.run(run())
    assert beside["vllm"] >= 12, beside
    assert beside["sim"] >= 12, beside
