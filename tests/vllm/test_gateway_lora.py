"""The gateway routing by model and LoRA adapter in front of real vLLM 0.32 (CPU) serving an adapter.

Pool ``lora``: one real engine with ``--enable-lora --lora-modules lora0=<tiny-lora/lora0>``.
Pool ``other``: a simulator serving another model, the home of both classes. A request for the
adapter must leave the home pool for the real engine, and the gateway must read the engine's
``vllm:lora_requests_info`` (its ``max_lora``) and list the adapter as vLLM does.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import httpx
import openai
import pytest

from priority_gateway.core.models import engine_tag
from priority_gateway.engines.vllm.serve import REPO, Engine, EngineSpec, start
from tests.support.observe import metric, wait_for
from tests.support.procs import Proc, free_port, start_gateway

pytestmark = pytest.mark.vllm

LORA_DIR = REPO / ".cache" / "tiny-lora"
FLAGS = ("--enable-lora", "--max-loras", "1", "--max-lora-rank", "8", "--lora-modules", f"lora0={LORA_DIR / 'lora0'}")


@pytest.fixture(scope="module")
def stack(procs: list[Proc], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    if not (LORA_DIR / "lora0" / "adapter_config.json").exists():
        pytest.fail(f"{LORA_DIR} has no adapters: run `make vllm-setup` first", pytrace=False)
    logs = tmp_path_factory.mktemp("gateway-lora")
    engine: Engine = start(EngineSpec(port=free_port(), core=1, max_num_seqs=4, extra_args=FLAGS), logs / "vllm.log")
    try:
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "priority_gateway.engines.sim",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            "other",
        ]
        sim = Proc(cmd, f"http://127.0.0.1:{port}", logs / "sim.log").start()
        procs.append(sim)
        sim.wait_ready()
        engine.wait_healthy(240)
        config = {
            "pools": {"other": {"engines": [sim.url]}, "lora": {"engines": [engine.url]}},
            "classes": {"interactive": {"pool": "other"}, "batch": {"pool": "other"}},
            "health": {"interval_s": 0.5, "timeout_s": 2.0},
            "scrape": {"interval_s": 1.0},
        }
        gateway = start_gateway(logs, config)
        procs.append(gateway)
        gateway.wait_ready("/ready", timeout=30)
        assert wait_for(lambda: "lora0" in httpx.get(gateway.url + "/v1/models").text, timeout=30)
        yield {"gateway": gateway.url, "vllm": engine.url, "sim": sim.url}
    finally:
        engine.stop()


def test_an_adapter_request_reaches_the_engine_that_serves_it(stack: dict[str, str]) -> None:
    client = openai.OpenAI(base_url=stack["gateway"] + "/v1", api_key="unused", max_retries=0, timeout=120)
    raw = client.completions.with_raw_response.create(model="lora0", prompt="def f(x):", max_tokens=4)
    assert raw.headers["x-gateway-engine"] == engine_tag(stack["vllm"])
    assert raw.headers["x-gateway-pool"] == "lora"
    assert raw.parse().model == "lora0"
    other = client.completions.with_raw_response.create(model="other", prompt="def f(x):", max_tokens=4)
    assert other.headers["x-gateway-engine"] == engine_tag(stack["sim"])


def test_the_gateway_reads_vllm_lora_requests_info(stack: dict[str, str]) -> None:
    labels = {"pool": "lora", "engine": stack["vllm"], "state": "max_lora"}
    assert wait_for(lambda: metric(stack["gateway"], "gateway_engine_lora_adapters", **labels) == 1, timeout=15)


def test_models_lists_the_adapter_as_vllm_does(stack: dict[str, str]) -> None:
    listed = {m["id"]: m for m in httpx.get(stack["gateway"] + "/v1/models").json()["data"]}
    engine = {m["id"]: m for m in httpx.get(stack["vllm"] + "/v1/models").json()["data"]}
    for field in ("root", "parent", "owned_by"):
        assert listed["lora0"][field] == engine["lora0"][field]
    assert engine["lora0"]["parent"] in listed
