"""LoRA adapters loaded on demand: real simulator engines with runtime LoRA updating, the real client."""

from __future__ import annotations

import httpx
import openai
import pytest

from priority_gateway.core.models import engine_tag
from tests.support.lora import make_adapter
from tests.support.observe import wait_for
from tests.support.procs import start_engine, start_gateway

NAMES = ("a", "b", "c")


@pytest.fixture(scope="module")
def stack(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adapters")
    paths = {name: str(make_adapter(tmp / name)) for name in NAMES}
    paths["missing"] = str(tmp / "no-such-adapter")
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    engines = [start_engine(tmp, "--enable-lora", "--max-loras", "2", env=env) for _ in range(2)]
    procs.extend(engines)
    for engine in engines:
        engine.wait_ready()
    config = {
        "pools": {
            "interactive": {"engines": [e.url for e in engines], "lora_adapters": paths, "max_loaded_adapters": 1}
        },
        "health": {"interval_s": 0.2, "timeout_s": 0.5},
        "admission": {"enabled": False},
    }
    gateway = start_gateway(tmp, config)
    procs.append(gateway)
    gateway.wait_ready("/ready")
    assert wait_for(lambda: "sim-model" in httpx.get(gateway.url + "/v1/models").text)
    return {"gateway": gateway, "engines": {engine_tag(e.url): e.url for e in engines}}


def listed(url: str) -> set[str]:
    return {m["id"] for m in httpx.get(url + "/v1/models").json()["data"]} & set(NAMES)


def test_adapters_are_loaded_where_requests_go_and_unloaded_least_recent_first(stack):
    client = openai.OpenAI(base_url=stack["gateway"].url + "/v1", api_key="unused", max_retries=0, timeout=30)
    served = {}
    for name in (*NAMES, "a", "b", "c"):
        raw = client.completions.with_raw_response.create(model=name, prompt="hello " * 20, max_tokens=2)
        assert raw.parse().model == name
        served[name] = stack["engines"][raw.headers["x-gateway-engine"]]
        # The engine that answered holds the adapter now, and never more than one of ours.
        assert name in listed(served[name])
        for url in stack["engines"].values():
            assert len(listed(url)) <= 1
    # Three adapters served, one slot of ours per engine: at least one was unloaded to make room.
    assert sum(len(listed(url)) for url in stack["engines"].values()) <= 2


def test_an_adapter_nobody_configured_is_not_loaded(stack):
    client = openai.OpenAI(base_url=stack["gateway"].url + "/v1", api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="d", prompt="hello", max_tokens=2)


def test_an_adapter_the_engine_cannot_load_is_a_502_and_the_next_request_still_works(stack):
    client = openai.OpenAI(base_url=stack["gateway"].url + "/v1", api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(model="missing", prompt="hello", max_tokens=2)
    assert caught.value.status_code == 502
    assert caught.value.body["code"] == "upstream_error"
    assert "missing" in caught.value.body["message"]
    assert client.completions.create(model="a", prompt="hello", max_tokens=2).model == "a"


@pytest.mark.redis
def test_replicas_decide_residency_together_never_unloading_what_another_streams_on(procs, tmp_path_factory):
    """Two replicas on one Redis, one engine that keeps two of the pool's adapters: replica a streams on
    adapter "a" while replica b serves "b" then "c". b must not unload "a" (a's stream would get the
    engine's 404), and the engine never holds more than two of the pool's adapters."""
    import threading

    from tests.support.redis import RedisServer

    tmp = tmp_path_factory.mktemp("residency")
    redis_server = RedisServer(tmp / "redis").start()
    try:
        paths = {name: str(make_adapter(tmp / name)) for name in NAMES}
        env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        engine = start_engine(tmp, "--enable-lora", "--max-loras", "4", "--token-delay-ms", "40", env=env)
        procs.append(engine)
        engine.wait_ready()
        config = {
            "pools": {"interactive": {"engines": [engine.url], "lora_adapters": paths, "max_loaded_adapters": 2}},
            "store": redis_server.url,
            "admission": {"enabled": False},
        }
        a, b = (start_gateway(tmp, config) for _ in range(2))
        procs.extend([a, b])
        for gateway in (a, b):
            gateway.wait_ready("/ready")
            assert wait_for(lambda g=gateway: "sim-model" in httpx.get(g.url + "/v1/models").text)
        most, a_gone, done = [0], [False], threading.Event()

        def watch() -> None:
            while not done.is_set():
                now = listed(engine.url)
                most[0] = max(most[0], len(now))
                a_gone[0] = a_gone[0] or "a" not in now

        client_a = openai.OpenAI(base_url=a.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        client_b = openai.OpenAI(base_url=b.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        stream = client_a.completions.create(model="a", prompt="hello " * 20, max_tokens=120, stream=True)
        first = next(iter(stream))  # "a" is loaded and streaming
        assert first.model == "a"
        assert wait_for(lambda: "a" in listed(engine.url))
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        for name in ("b", "c"):
            assert client_b.completions.create(model=name, prompt="hi " * 10, max_tokens=2).model == name
        text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        done.set()
        watcher.join()
        assert text, "a's stream went on to its end"
        assert not a_gone[0], "another replica unloaded the adapter a stream was running on"
        assert most[0] <= 2, f"the engine held {most[0]} of the pool's adapters, more than max_loaded_adapters"
    finally:
        redis_server.stop()
