"""Several names and LoRA adapters in one simulated engine, over HTTP, spelled as ``vllm serve``."""

from __future__ import annotations

import json
import sys

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.lora import make_adapter
from tests.support.procs import Proc, free_port

ROOT = "/models/base-7b"


def start(tmp, *args: str, runtime_updating: bool = False) -> Proc:
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
        ROOT,
        *args,
    ]
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True" if runtime_updating else "0"}
    return Proc(cmd, f"http://127.0.0.1:{port}", tmp / f"engine-{port}.log", env=env).start()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adapters")
    return {
        name: make_adapter(tmp / name, rank) for name, rank in (("sql", 8), ("chat", 16), ("extra", 8), ("big", 64))
    }


@pytest.fixture(scope="module")
def engine(procs, tmp_path_factory, adapters):
    tmp = tmp_path_factory.mktemp("lora-engine")
    proc = start(
        tmp,
        "--served-model-name",
        "base",
        "base-alias",
        "--enable-lora",
        "--max-loras",
        "1",
        "--max-cpu-loras",
        "2",
        "--lora-modules",
        f"sql={adapters['sql']}",
        json.dumps({"name": "chat", "path": str(adapters["chat"]), "base_model_name": "base-alias"}),
        "--token-delay-ms",
        "5",
        runtime_updating=True,
    )
    procs.append(proc)
    return proc.wait_ready()


@pytest.fixture(scope="module")
def plain_engine(procs, tmp_path_factory, adapters):
    proc = start(tmp_path_factory.mktemp("plain"), "--enable-lora", "--lora-modules", f"sql={adapters['sql']}")
    procs.append(proc)
    return proc.wait_ready()


def completion(url: str, model: str, max_tokens: int = 3) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "SELECT 1", "max_tokens": max_tokens})


def test_models_lists_every_name_then_the_adapters_as_vllm_does(engine, adapters):
    cards = httpx.get(f"{engine.url}/v1/models").json()["data"]
    assert [(c["id"], c["root"], c["parent"], c["owned_by"]) for c in cards] == [
        ("base", ROOT, None, "vllm"),
        ("base-alias", ROOT, None, "vllm"),
        ("sql", str(adapters["sql"]), "base", "vllm"),
        ("chat", str(adapters["chat"]), "base-alias", "vllm"),
    ]
    assert [c["max_model_len"] for c in cards] == [8192, 8192, None, None]
    assert all(c["permission"][0]["object"] == "model_permission" for c in cards)


def test_requests_are_served_by_alias_and_by_adapter(engine):
    assert completion(engine.url, "base-alias").json()["model"] == "base"
    assert completion(engine.url, "sql").json()["model"] == "sql"
    client = openai.OpenAI(base_url=f"{engine.url}/v1", api_key="unused")
    reply = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.model == "chat"


def test_an_unknown_model_is_vllm_s_404(engine):
    reply = completion(engine.url, "nope")
    assert reply.status_code == 404
    assert reply.json() == {
        "error": {
            "message": "The model `nope` does not exist. Valid aliases: base, base-alias.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


def test_lora_metrics_name_the_adapters_of_the_running_batch(engine):
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST",
            f"{engine.url}/v1/completions",
            json={"model": "sql", "prompt": "x", "max_tokens": 200, "stream": True, "ignore_eos": True},
        ) as stream,
    ):
        lines = stream.iter_lines()  # kept: a dropped iterator closes the response
        next(lines)
        page = client.get(f"{engine.url}/metrics").text
    family = next(f for f in text_string_to_metric_families(page) if f.name == "vllm:lora_requests_info")
    newest = max(family.samples, key=lambda s: s.value)
    assert newest.labels == {"max_lora": "1", "running_lora_adapters": "sql", "waiting_lora_adapters": "sql"}


def test_an_adapter_beyond_the_slot_budget_waits_as_deferred(engine):
    with httpx.Client(timeout=30) as client:
        body = {"prompt": "x", "max_tokens": 400, "stream": True, "ignore_eos": True}
        with client.stream("POST", f"{engine.url}/v1/completions", json={**body, "model": "sql"}) as first:
            lines = first.iter_lines()  # kept: a dropped iterator closes the response
            next(lines)
            with client.stream("POST", f"{engine.url}/v1/completions", json={**body, "model": "chat"}) as second:
                page = _wait_for_metric(client, engine.url, 'reason="deferred"} 1.0')
                assert 'vllm:num_requests_running{engine="0",model_name="base"} 1.0' in page
                second.close()
            first.close()


def _wait_for_metric(client: httpx.Client, url: str, needle: str) -> str:
    for _ in range(200):
        page = client.get(f"{url}/metrics").text
        if needle in page:
            return page
    raise AssertionError(f"{needle!r} never appeared")


def test_load_and_unload_answer_as_vllm(engine, adapters):
    load, unload = f"{engine.url}/v1/load_lora_adapter", f"{engine.url}/v1/unload_lora_adapter"
    reply = httpx.post(load, json={"lora_name": "extra", "lora_path": str(adapters["extra"])})
    assert (reply.status_code, reply.text) == (200, "Success: LoRA adapter 'extra' added successfully.")
    assert "content-type" not in reply.headers
    assert completion(engine.url, "extra").json()["model"] == "extra"
    assert "extra" in [c["id"] for c in httpx.get(f"{engine.url}/v1/models").json()["data"]]

    again = httpx.post(load, json={"lora_name": "extra", "lora_path": str(adapters["extra"])})
    assert again.status_code == 400
    assert again.json()["error"]["message"].startswith("The lora adapter 'extra' has already been loaded.")
    clash = httpx.post(load, json={"lora_name": "base-alias", "lora_path": str(adapters["extra"])})
    assert clash.json()["error"] == {
        "message": "The lora adapter 'base-alias' conflicts with a served base model.",
        "type": "InvalidUserInput",
        "param": None,
        "code": 400,
    }
    missing = httpx.post(load, json={"lora_name": "ghost", "lora_path": "/nonexistent/adapter"})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "Loading lora ghost failed: No adapter found for /nonexistent/adapter"
    too_big = httpx.post(load, json={"lora_name": "big", "lora_path": str(adapters["big"])})
    assert too_big.status_code == 500
    assert too_big.json()["error"]["message"] == (
        "Call to add_lora method failed: LoRA rank 64 is greater than max_lora_rank 16."
    )
    no_path = httpx.post(load, json={"lora_name": "x"})
    assert (no_path.status_code, no_path.json()["error"]["param"]) == (400, "body.lora_path")

    gone = httpx.post(unload, json={"lora_name": "extra"})
    assert (gone.status_code, gone.text) == (200, "Success: LoRA adapter 'extra' removed successfully.")
    assert completion(engine.url, "extra").status_code == 404
    twice = httpx.post(unload, json={"lora_name": "extra"})
    assert (twice.status_code, twice.json()["error"]["message"]) == (404, "The lora adapter 'extra' cannot be found.")


def test_load_and_unload_need_runtime_updating(plain_engine, adapters):
    reply = httpx.post(
        f"{plain_engine.url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(adapters["extra"])}
    )
    assert (reply.status_code, reply.json()) == (404, {"detail": "Not Found"})
    assert httpx.post(f"{plain_engine.url}/v1/unload_lora_adapter", json={"lora_name": "sql"}).status_code == 404
    assert completion(plain_engine.url, "sql").json()["model"] == "sql"


def test_a_bad_adapter_at_start_stops_the_engine(tmp_path):
    proc = start(tmp_path, "--enable-lora", "--lora-modules", "ghost=/nonexistent/adapter")
    assert proc.popen is not None
    assert proc.popen.wait(timeout=30) != 0
    assert "No adapter found for /nonexistent/adapter" in proc.log()
