"""Several models and LoRA adapters behind one gateway: real engines and gateway on loopback, the real client.

Two pools serve different base models: ``llama`` (two engines, home of both classes) and ``qwen``
(one engine with two LoRA adapters). Placement is read from the ``x-gateway-engine`` header.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from priority_gateway.core.models import engine_tag
from tests.support.lora import make_adapter
from tests.support.observe import metric, wait_for
from tests.support.procs import start_engine, start_gateway


@pytest.fixture(scope="module")
def stack(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("models")
    adapters = [f"sql={make_adapter(tmp / 'sql')}", f"chat-ft={make_adapter(tmp / 'chat-ft')}"]
    llama = [start_engine(tmp, "--token-delay-ms", "1", model="llama") for _ in range(2)]
    qwen = start_engine(
        tmp, "--token-delay-ms", "1", "--enable-lora", "--max-loras", "2", "--lora-modules", *adapters, model="qwen"
    )
    procs.extend([*llama, qwen])
    for engine in [*llama, qwen]:
        engine.wait_ready()
    config = {
        "pools": {
            "llama": {"engines": [e.url for e in llama], "models": ["llama"]},
            "qwen": {"engines": [qwen.url], "models": ["qwen"]},
        },
        "classes": {"interactive": {"pool": "llama"}, "batch": {"pool": "llama"}},
        "models": {
            "aliases": {
                "chat": "llama",
                "canary": [{"model": "llama", "weight": 90}, {"model": "qwen", "weight": 10}],
            }
        },
        "health": {"interval_s": 0.2, "timeout_s": 0.5},
        "scrape": {"interval_s": 0.2},
        "admission": {"enabled": False},
        "access_log": False,
    }
    gateway = start_gateway(tmp, config)
    procs.append(gateway)
    gateway.wait_ready("/ready")
    # Routing by model needs every engine's /v1/models: wait until the gateway lists the adapters.
    assert wait_for(lambda: "sql" in _listed(gateway.url), timeout=10)
    return {
        "gateway": gateway,
        "llama": {engine_tag(e.url) for e in llama},
        "qwen": {engine_tag(qwen.url)},
        "qwen_url": qwen.url,
    }


def _listed(url: str) -> dict[str, dict]:
    return {m["id"]: m for m in httpx.get(url + "/v1/models", timeout=5).json()["data"]}


@pytest.fixture
def client(stack):
    return openai.OpenAI(base_url=stack["gateway"].url + "/v1", api_key="unused", max_retries=0, timeout=30)


def _chat(client, model: str, **kwargs):
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=1, **kwargs
    )


def test_requests_land_on_the_pool_that_serves_their_model(stack, client):
    for model, pool in (("llama", "llama"), ("qwen", "qwen"), ("sql", "qwen")):
        for _ in range(4):
            raw = _chat(client, model)
            assert raw.headers["x-gateway-engine"] in stack[pool], model
            assert raw.headers["x-gateway-pool"] == pool
            assert raw.parse().model == model


def test_both_llama_engines_share_its_traffic(stack, client):
    # Distinct prompts go where rendezvous hashing sends them: over 16, both engines take some.
    engines = set()
    for i in range(16):
        prompt = f"conversation {i}: " * 20
        raw = client.chat.completions.with_raw_response.create(
            model="llama", messages=[{"role": "user", "content": prompt}], max_tokens=1
        )
        engines.add(raw.headers["x-gateway-engine"])
    assert engines == stack["llama"]


def test_unknown_model_is_404_listing_what_is_served(client):
    with pytest.raises(openai.NotFoundError) as caught:
        _chat(client, "no-such-model")
    error = caught.value.body
    assert error["code"] == "model_not_found"
    assert error["param"] == "model"
    for name in ("llama", "qwen", "sql", "chat-ft", "chat", "canary"):
        assert name in error["message"]


def test_alias_is_rewritten_both_ways(stack, client):
    raw = _chat(client, "chat")
    assert raw.headers["x-gateway-engine"] in stack["llama"]
    assert raw.parse().model == "chat"
    stream = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hello"}], max_tokens=4, stream=True
    )
    chunks = list(stream)
    assert chunks and all(chunk.model == "chat" for chunk in chunks)
    completion = client.completions.create(model="chat", prompt="hello", max_tokens=2)
    assert completion.model == "chat"


def test_weighted_split_over_2000_requests(client):
    def one(_: int) -> str:
        raw = _chat(client, "canary")
        assert raw.parse().model == "canary"
        return raw.headers["x-gateway-pool"]

    with ThreadPoolExecutor(16) as pool:
        counts = Counter(pool.map(one, range(2000)))
    assert counts["llama"] + counts["qwen"] == 2000
    assert abs(counts["qwen"] / 2000 - 0.10) <= 0.02, counts


def test_models_lists_adapters_as_the_engine_does(stack):
    listed = _listed(stack["gateway"].url)
    engine = {m["id"]: m for m in httpx.get(stack["qwen_url"] + "/v1/models").json()["data"]}
    fields = ("id", "object", "owned_by", "root", "parent", "max_model_len")
    for name in ("qwen", "sql", "chat-ft"):
        assert {k: listed[name].get(k) for k in fields} == {k: engine[name].get(k) for k in fields}
    assert listed["sql"]["parent"] == "qwen"
    assert listed["llama"]["owned_by"] == "vllm"
    assert listed["canary"]["owned_by"] == "gateway"
    assert httpx.get(stack["gateway"].url + "/v1/models/sql").json()["root"] == engine["sql"]["root"]


def test_the_gateway_reads_the_engines_lora_slots(stack, client):
    _chat(client, "sql")
    labels = {"pool": "qwen", "engine": stack["qwen_url"], "state": "max_lora"}
    assert wait_for(lambda: metric(stack["gateway"].url, "gateway_engine_lora_adapters", **labels) == 2, timeout=5)
