"""The simulator's ``tiny-cpu`` profile against the real engine it stands in for.

One short scenario on both: the same response shapes, the metric names the gateway
reads, and a prefix-cache effect on TTFT in the same direction and of roughly the
same size.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from typing import Any

import httpx
import pytest

from tests.support.procs import Proc, free_port
from tests.vllm.client import MODEL, metric_values, stream_completion, unique_prompt
from tests.vllm.conftest import VllmEngines
from tests.vllm.test_metrics import GATEWAY_SIGNALS

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def sim(procs: list[Proc], tmp_path_factory: pytest.TempPathFactory) -> Proc:
    port = free_port()
    cmd = [sys.executable, "-m", "priority_gateway.engines.sim", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--profile", "tiny-cpu", "--model", MODEL, "--enable-prompt-tokens-details"]
    proc = Proc(cmd, f"http://127.0.0.1:{port}", tmp_path_factory.mktemp("sim") / "sim.log").start()
    procs.append(proc)
    return proc.wait_ready()


@pytest.fixture
def urls(sim: Proc, vllm_engines: VllmEngines) -> dict[str, str]:
    return {"vllm": vllm_engines.interactive.url, "sim": sim.url}


# Fields vLLM sets that neither the gateway nor OpenAI clients read. The simulator does not
# mirror ``created_cache_tokens`` (chat usage, when a reply created cache blocks) either.
VLLM_ONLY = {
    "system_fingerprint",
    "service_tier",
    "kv_transfer_params",
    "prompt_logprobs",
    "prompt_token_ids",
    "created_cache_tokens",
}


def shape(value: Any) -> Any:
    """Keys and value types, recursively: what a client relies on, not what it says."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items() if item is not None and key not in VLLM_ONLY}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def common_openai_shape(vllm: Any, sim: Any) -> tuple[Any, Any]:
    """Both shapes cut to the keys vLLM sets, so the simulator's gaps show as differences."""
    if isinstance(vllm, dict) and isinstance(sim, dict):
        pairs = {key: common_openai_shape(vllm[key], sim.get(key)) for key in vllm}
        return {k: a for k, (a, _) in pairs.items()}, {k: b for k, (_, b) in pairs.items()}
    if isinstance(vllm, list) and isinstance(sim, list) and vllm and sim:
        a, b = common_openai_shape(vllm[0], sim[0])
        return [a], [b]
    return vllm, sim


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_replies_have_the_same_shape(urls: dict[str, str], path: str) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 4, "ignore_eos": True}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "print('hello')"}]
    else:
        body["prompt"] = "print('hello')"
    replies = {name: httpx.post(url + path, json=body).json() for name, url in urls.items()}
    vllm, sim = common_openai_shape(shape(replies["vllm"]), shape(replies["sim"]))
    assert sim == vllm


def test_streams_have_the_same_shape(urls: dict[str, str]) -> None:
    async def chunks(url: str) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=30) as client:
            streamed = await stream_completion(client, url, prompt="x = 1\n", max_tokens=5, ignore_eos=True)
        return streamed.chunks

    streams = {name: asyncio.run(chunks(url)) for name, url in urls.items()}
    for name in ("vllm", "sim"):
        stream = streams[name]
        # A chunk per token, except that vLLM holds back a token that ends inside a UTF-8 character
        # and sends it with the next (a random-weight model samples byte tokens): 5 tokens come in at
        # most 5 content chunks, then the usage chunk.
        assert 1 <= len(stream) - 1 <= 5 and all(len(c["choices"]) == 1 for c in stream[:-1]), name
        assert stream[-1]["choices"] == [], name
        assert stream[-2]["choices"][0]["finish_reason"] == "length", name
        assert stream[-1]["usage"]["completion_tokens"] == 5, name
    first = common_openai_shape(shape(streams["vllm"][0]), shape(streams["sim"][0]))
    assert first[1] == first[0]


def test_gateway_signals_are_named_alike(urls: dict[str, str]) -> None:
    texts = {name: httpx.get(f"{url}/metrics").text for name, url in urls.items()}
    for signal in GATEWAY_SIGNALS:
        assert metric_values(texts["sim"], signal), f"the simulator lacks {signal}"
    labels = {name: metric_values(text, "vllm:cache_config_info")[0][0] for name, text in texts.items()}
    for needed in ('block_size="128"', 'enable_prefix_caching="True"'):
        assert needed in labels["vllm"]
        assert needed in labels["sim"]


def test_prefix_cache_cuts_ttft_alike(urls: dict[str, str]) -> None:
    """Cold and warm TTFT of 1000-token prompts: the ratio, not the durations, must agree."""

    async def cold_over_warm(url: str) -> float:
        cold: list[float] = []
        warm: list[float] = []
        async with httpx.AsyncClient(timeout=30) as client:
            for _ in range(3):
                prompt = unique_prompt(1000)
                cold.append((await stream_completion(client, url, prompt=prompt, max_tokens=1)).ttft)
                for _ in range(3):
                    streamed = await stream_completion(client, url, prompt=prompt, max_tokens=1)
                    assert streamed.usage is not None
                    assert streamed.usage["prompt_tokens_details"]["cached_tokens"] == 896
                    warm.append(streamed.ttft)
        return statistics.median(cold) / statistics.median(warm)

    ratios = {name: asyncio.run(cold_over_warm(url)) for name, url in urls.items()}
    assert ratios["vllm"] > 1.5, ratios
    assert ratios["sim"] > 1.5, ratios
    # Of roughly the same size, within a factor of three: the profile's step costs were fitted on one
    # host, and vLLM's ratio moves with the host's arithmetic (what the cache saves is compute, a
    # step's fixed cost is not). Within 2x on the host of the fit; on an AMD EPYC host vLLM measured
    # 8.3 and 8.4 against the simulator's 3.7 and 3.8.
    assert 1 / 3 < ratios["sim"] / ratios["vllm"] < 3.0, ratios
