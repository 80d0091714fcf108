"""The simulator against real vLLM 0.32 (CPU) serving LoRA adapters with the same flags.

One real engine started for this module (``--enable-lora``, two ``peft`` adapters of the tiny
model from ``make vllm-setup``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) and one simulator
started alike; the same calls to both: ``/v1/models``, unknown models, adapter requests,
``vllm:lora_requests_info``, the LoRA slot budget, load/unload, and ``/v1/responses``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from priority_gateway.engines.vllm.serve import DEFAULT_MODEL, REPO, Engine, EngineSpec, start
from tests.support.procs import Proc, free_port

pytestmark = pytest.mark.vllm

LORA_DIR = REPO / ".cache" / "tiny-lora"
FLAGS = (
    "--served-model-name",
    "tiny",
    "tiny-alias",
    "--enable-lora",
    "--max-loras",
    "1",
    "--max-cpu-loras",
    "2",
    "--max-lora-rank",
    "8",
    "--lora-modules",
    f"lora0={LORA_DIR / 'lora0'}",
    json.dumps({"name": "lora1", "path": str(LORA_DIR / "lora1"), "base_model_name": "tiny-alias"}),
)


@pytest.fixture(scope="module")
def urls(procs: list[Proc], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    if not (LORA_DIR / "lora1" / "adapter_config.json").exists():
        pytest.fail(f"{LORA_DIR} has no adapters: run `make vllm-setup` first", pytrace=False)
    logs = tmp_path_factory.mktemp("lora")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
        engine: Engine = start(
            EngineSpec(port=free_port(), core=1, max_num_seqs=4, extra_args=FLAGS), logs / "vllm.log"
        )
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "priority_gateway.engines.sim",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--profile",
            "tiny-cpu",
        ]
        cmd += ["--model", str(DEFAULT_MODEL), "--max-num-seqs", "4", *FLAGS]
        sim = Proc(cmd, f"http://127.0.0.1:{port}", logs / "sim.log").start()
    procs.append(sim)
    try:
        sim.wait_ready()
        engine.wait_healthy(240)
        yield {"vllm": engine.url, "sim": sim.url}
    finally:
        engine.stop()


def both(urls: dict[str, str], method: str, path: str, **kw: Any) -> dict[str, httpx.Response]:
    return {name: httpx.request(method, url + path, timeout=60, **kw) for name, url in urls.items()}


def test_models_list_the_same_cards(urls: dict[str, str]) -> None:
    def cards(reply: httpx.Response) -> list[tuple[Any, ...]]:
        return [
            (
                c["id"],
                c["root"],
                c["parent"],
                c["owned_by"],
                c["max_model_len"] is None,
                sorted(c),
                sorted(c["permission"][0]),
            )
            for c in reply.json()["data"]
        ]

    replies = both(urls, "GET", "/v1/models")
    assert cards(replies["sim"]) == cards(replies["vllm"])
    assert [c[0] for c in cards(replies["sim"])] == ["tiny", "tiny-alias", "lora0", "lora1"]


def test_unknown_models_and_adapters_answer_alike(urls: dict[str, str]) -> None:
    for model, expected in (("nope", 404), ("lora0", 200), ("tiny-alias", 200)):
        replies = both(urls, "POST", "/v1/completions", json={"model": model, "prompt": "def f(x):", "max_tokens": 2})
        assert {r.status_code for r in replies.values()} == {expected}, model
        if expected == 404:
            assert replies["sim"].json() == replies["vllm"].json()
        else:
            assert replies["sim"].json()["model"] == replies["vllm"].json()["model"]


def lora_info(url: str) -> list[dict[str, str]]:
    page = httpx.get(f"{url}/metrics").text
    family = next(f for f in text_string_to_metric_families(page) if f.name == "vllm:lora_requests_info")
    return [s.labels for s in sorted(family.samples, key=lambda s: s.value)]


def test_lora_requests_info_has_the_same_series(urls: dict[str, str]) -> None:
    both(urls, "POST", "/v1/completions", json={"model": "lora1", "prompt": "import os", "max_tokens": 3})
    infos = {name: lora_info(url) for name, url in urls.items()}
    for name, info in infos.items():
        assert info[-1] == {"max_lora": "1", "running_lora_adapters": "", "waiting_lora_adapters": ""}, name
        assert {"max_lora": "1", "running_lora_adapters": "lora1", "waiting_lora_adapters": "lora1"} in info, name


def test_a_second_adapter_waits_deferred_on_both(urls: dict[str, str]) -> None:
    def deferred_while_two_adapters_run(url: str) -> float:
        body = {"prompt": "x = 1", "max_tokens": 300, "ignore_eos": True, "stream": True}
        completions = f"{url}/v1/completions"
        with (
            httpx.Client(timeout=60) as client,
            client.stream("POST", completions, json={**body, "model": "lora0"}) as first,
        ):
            lines = first.iter_lines()  # kept: a dropped iterator closes the response
            next(lines)
            with client.stream("POST", completions, json={**body, "model": "lora1"}):
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    page = client.get(f"{url}/metrics").text
                    line = next(ln for ln in page.splitlines() if 'reason="deferred"' in ln)
                    if line.endswith(" 1.0"):
                        break
                    time.sleep(0.1)
        return float(line.rsplit(" ", 1)[1])

    assert {name: deferred_while_two_adapters_run(url) for name, url in urls.items()} == {"vllm": 1.0, "sim": 1.0}


def test_load_and_unload_answer_alike(urls: dict[str, str]) -> None:
    path = str(LORA_DIR / "lora1")
    calls = [
        ("/v1/load_lora_adapter", {"lora_name": "extra", "lora_path": path}),
        ("/v1/load_lora_adapter", {"lora_name": "extra", "lora_path": path}),
        ("/v1/load_lora_adapter", {"lora_name": "tiny", "lora_path": path}),
        ("/v1/load_lora_adapter", {"lora_name": "ghost", "lora_path": "/nonexistent/adapter"}),
        ("/v1/load_lora_adapter", {"lora_name": "x"}),
        ("/v1/unload_lora_adapter", {"lora_name": "extra"}),
        ("/v1/unload_lora_adapter", {"lora_name": "extra"}),
    ]
    for path_, body in calls:
        replies = both(urls, "POST", path_, json=body)
        assert replies["sim"].status_code == replies["vllm"].status_code, (path_, body)
        assert replies["sim"].text == replies["vllm"].text, (path_, body)


def shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def test_responses_have_the_same_shape_and_events(urls: dict[str, str]) -> None:
    created, events = {}, {}
    for name, url in urls.items():
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        reply = client.responses.create(model="lora0", input="hello", instructions="be brief", max_output_tokens=4)
        created[name] = shape(reply.model_dump(mode="json"))
        stream = client.responses.create(
            model="tiny", input=[{"role": "user", "content": "hi"}], max_output_tokens=4, stream=True
        )
        kinds = [event.type for event in stream]
        events[name] = [k for i, k in enumerate(kinds) if k != "response.output_text.delta" or kinds[i - 1] != k]
    assert created["sim"] == created["vllm"]
    assert events["sim"] == events["vllm"]
