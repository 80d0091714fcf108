"""Chunked prefill under a token budget per step (``--max-num-batched-tokens``), on vLLM 0.32 and on the
simulator that stands in for it (the interactive pool runs with such a budget): a prompt prefills in
the same chunks, and beside a request that decodes, each step gives it its token and the prompt the
rest of the budget. Compared through the engines' own ``vllm:iteration_tokens_total`` histogram."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator

import httpx
import pytest

from priority_gateway.engines.vllm.serve import EngineSpec, start
from tests.support.procs import Proc, free_port
from tests.vllm.client import MODEL, metric_values, stream_completion, unique_prompt

pytestmark = pytest.mark.vllm

BUDGET = 128
PROMPT = 1000  # eight chunks of at most 128 tokens: 7 x 128 + 104


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


def steps_of(url: str, run: object) -> dict[float, float]:
    """The steps ``run`` (a coroutine function of a client) made the engine take, by size."""
    before = step_sizes(url)

    async def go() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            await run(client)  # type: ignore[operator]

    asyncio.run(go())
    after = step_sizes(url)
    return {bound: n - before.get(bound, 0.0) for bound, n in after.items() if n - before.get(bound, 0.0)}


def test_a_long_prompt_prefills_in_chunks_of_the_budget_alike(urls: dict[str, str]) -> None:
    seen = {}
    for name, url in urls.items():

        async def run(client: httpx.AsyncClient, url: str = url) -> None:
            await stream_completion(client, url, prompt=unique_prompt(PROMPT), max_tokens=1)

        seen[name] = steps_of(url, run)
    # Eight steps of 65 to 128 tokens, none larger: the budget cuts the prompt, on both.
    assert seen["vllm"] == {128.0: 8.0}, seen
    assert seen["sim"] == seen["vllm"], seen


def test_a_decoding_request_keeps_its_token_in_every_step_beside_a_chunk_alike(urls: dict[str, str]) -> None:
    seen = {}
    for name, url in urls.items():

        async def run(client: httpx.AsyncClient, url: str = url) -> None:
            decoding = asyncio.create_task(
                stream_completion(client, url, prompt=unique_prompt(64), max_tokens=48, ignore_eos=True)
            )
            await asyncio.sleep(0.3)  # its prefill done, it decodes
            await stream_completion(client, url, prompt=unique_prompt(PROMPT), max_tokens=1)
            streamed = await decoding
            assert streamed.usage is not None and streamed.usage["completion_tokens"] == 48

        seen[name] = steps_of(url, run)
    # The long prompt's chunks: 127 tokens beside the other request's one, never more than the budget.
    for name, sizes in seen.items():
        assert max(sizes) <= BUDGET, (name, sizes)
        assert sizes.get(128.0) == 8.0, (name, sizes)
