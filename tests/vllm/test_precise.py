"""Precise prefix mode against real vLLM: the gateway reads a real engine's KV events and
tokenizes prompts exactly as the engine does, so its predictions are the engine's real hits."""

from __future__ import annotations

import time

import httpx
import pytest

from priority_gateway.engines.vllm.serve import DEFAULT_MODEL
from priority_gateway.tokenizers import HFTokenizer
from tests.support.procs import Proc, start_gateway
from tests.vllm.client import MODEL, metric_sum
from tests.vllm.conftest import VllmEngines

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def precise_gateway(procs: list[Proc], tmp_path_factory: pytest.TempPathFactory, vllm_engines: VllmEngines) -> Proc:
    url = vllm_engines.interactive.url
    config = {
        "pools": {
            "interactive": {
                "engines": [url],
                "kv_events": vllm_engines.kv_endpoint,
                "kv_events_topics": {"interactive": url},
                "tokenizer": str(DEFAULT_MODEL),
            },
        },
        "scrape": {"interval_s": 1.0},
    }
    proc = start_gateway(tmp_path_factory.mktemp("precise"), config)
    procs.append(proc)
    proc.wait_ready("/ready", timeout=30)
    # The engine reconnects its publisher to the gateway's socket; give it a moment, and a scrape
    # so the gateway knows the engine's block size (128 on CPU).
    time.sleep(2.5)
    return proc


def test_gateway_tokenizes_chat_like_the_engine(vllm_engines: VllmEngines) -> None:
    messages = [{"role": "system", "content": "be terse"}, {"role": "user", "content": "def add(a, b):"}]
    ours = HFTokenizer(DEFAULT_MODEL).chat(messages)
    theirs = httpx.post(
        f"{vllm_engines.interactive.url}/tokenize",
        json={"model": MODEL, "messages": messages, "add_generation_prompt": True},
    ).json()
    assert ours == theirs["tokens"]


def test_predicted_cached_tokens_are_the_engines_real_hits(precise_gateway: Proc, vllm_engines: VllmEngines) -> None:
    doc = "import os\n" + "".join(f"def function_{i}(x):\n    return x * {i} + os.getpid()\n" for i in range(60))
    body = {"model": MODEL, "messages": [{"role": "user", "content": doc}], "max_tokens": 4, "ignore_eos": True}

    def predicted() -> float:
        text = httpx.get(f"{precise_gateway.url}/metrics").text
        return metric_sum(text, "gateway_predicted_cached_tokens_sum")

    def hits() -> float:
        return metric_sum(httpx.get(f"{vllm_engines.interactive.url}/metrics").text, "vllm:prefix_cache_hits_total")

    assert httpx.post(f"{precise_gateway.url}/v1/chat/completions", json=body, timeout=60).status_code == 200
    time.sleep(1.0)  # the BlockStored events of that prefill reach the gateway
    before_predicted, before_hits = predicted(), hits()
    assert httpx.post(f"{precise_gateway.url}/v1/chat/completions", json=body, timeout=60).status_code == 200
    gained = hits() - before_hits
    assert gained >= 128  # the engine served whole 128-token blocks from its cache
    assert predicted() - before_predicted == gained
