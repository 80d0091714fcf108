"""The gateway in front of the two real engines: ``gateway serve --config`` on loopback."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import openai
import pytest

from tests.support.procs import Proc, start_gateway
from tests.vllm.client import MODEL, metric_sum, metric_values
from tests.vllm.conftest import VllmEngines, gateway_pools

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def gateway(procs: list[Proc], tmp_path_factory: pytest.TempPathFactory, vllm_engines: VllmEngines) -> Proc:
    config = {
        "pools": gateway_pools(vllm_engines),
        "health": {"interval_s": 0.5, "timeout_s": 2.0, "unhealthy_after": 2},
        # vLLM's /metrics takes 10-100 ms to render on one core: scrape no faster than 1 Hz.
        "scrape": {"interval_s": 1.0},
    }
    proc = start_gateway(tmp_path_factory.mktemp("gateway"), config)
    procs.append(proc)
    return proc.wait_ready("/ready", timeout=30)


@pytest.fixture
def client(gateway: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=60)


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def engine_successes(url: str) -> float:
    return metric_sum(httpx.get(f"{url}/metrics").text, "vllm:request_success_total")


def test_chat_goes_to_the_interactive_engine(client: openai.OpenAI, vllm_engines: VllmEngines) -> None:
    before = engine_successes(vllm_engines.interactive.url)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "def fib(n):"}],
        max_tokens=8,
        extra_body={"ignore_eos": True},
    )
    chat = raw.parse()
    assert raw.headers["x-gateway-pool"] == "interactive"
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 8
    assert chat.choices[0].finish_reason == "length"
    assert engine_successes(vllm_engines.interactive.url) == before + 1


def test_batch_class_streams_from_the_priority_engine(client: openai.OpenAI, vllm_engines: VllmEngines) -> None:
    before = engine_successes(vllm_engines.batch.url)
    with client.completions.with_streaming_response.create(
        model=MODEL,
        prompt="import sys\n",
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
        extra_headers={"X-Priority": "batch"},
    ) as response:
        assert response.headers["x-gateway-pool"] == "batch"
        chunks = list(response.parse())
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    assert engine_successes(vllm_engines.batch.url) == before + 1


def test_models_come_from_the_engines(gateway: Proc) -> None:
    models = httpx.get(f"{gateway.url}/v1/models").json()["data"]
    assert [m["id"] for m in models] == [MODEL]
    assert models[0]["max_model_len"] == 2048


def test_gateway_metrics_show_both_engines_healthy(gateway: Proc, vllm_engines: VllmEngines) -> None:
    def healthy() -> dict[str, float]:
        samples = metric_values(httpx.get(f"{gateway.url}/metrics").text, "gateway_engine_healthy")
        return {labels: value for labels, value in samples}

    assert wait_for(lambda: len(healthy()) == 2 and all(v == 1.0 for v in healthy().values()))
    labels = " ".join(healthy())
    assert vllm_engines.interactive.url in labels
    assert vllm_engines.batch.url in labels
