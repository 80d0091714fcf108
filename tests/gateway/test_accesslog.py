"""The access log over real HTTP: one line per request with what it did, the request id on every
line logged while it ran, and ``access_log: false``."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.observe import log_lines, wait_for
from tests.support.procs import Proc, start_engine, start_gateway

MODEL = "sim-model"
ADMIN = "admin-secret"


@pytest.fixture(scope="module")
def stack(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("accesslog")
    engines = [start_engine(tmp, "--token-delay-ms", "5") for _ in range(2)]
    procs.extend(engines)
    for engine in engines:
        engine.wait_ready()
    config = {
        "pools": {"interactive": {"engines": [e.url for e in engines], "policy": "round_robin"}},
        # Slow probes: an engine that dies is found out by the request that tries it.
        "health": {"interval_s": 60},
        "scrape": {"interval_s": 60},
    }
    gateway = start_gateway(tmp, config, env={"GATEWAY__KEYS__ADMIN": ADMIN})
    procs.append(gateway)
    gateway.wait_ready("/ready")
    created = httpx.post(
        gateway.url + "/admin/keys", json={"name": "log-test"}, headers={"authorization": f"Bearer {ADMIN}"}
    ).json()
    return {"gateway": gateway, "engines": engines, "key": created}


def lines_of(gateway: Proc, request_id: str, event: str | None = None) -> list[dict[str, str]]:
    return [x for x in log_lines(gateway.log_path.read_text(), event) if x.get("request_id") == request_id]


def access_line(gateway: Proc, request_id: str) -> dict[str, str]:
    assert wait_for(lambda: bool(lines_of(gateway, request_id, "access")), timeout=5)
    (line,) = lines_of(gateway, request_id, "access")
    return line


def test_a_streamed_request_logs_one_line_with_what_it_did(stack):
    gateway, key = stack["gateway"], stack["key"]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Describe the harbour at dawn."}],
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"authorization": f"Bearer {key['secret']}", "x-request-id": "access-stream-1"}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, headers=headers) as answer:
        received = answer.read()
    assert answer.status_code == 200
    usage = [chunk for chunk in received.split(b"\n\n") if b'"usage"' in chunk][-1]
    line = access_line(gateway, "access-stream-1")
    assert line["key_id"] == key["id"] and line["key_name"] == "log-test"
    assert (line["cls"], line["pool"], line["status"], line["admission"]) == (
        "interactive",
        "interactive",
        "200",
        "admitted",
    )
    assert line["engine"] in {e.url for e in stack["engines"]}
    assert line["endpoint"] == "/v1/chat/completions" and line["model"] == MODEL and line["stream"] == "true"
    assert line["completion_tokens"] == "6" and f'"prompt_tokens":{line["prompt_tokens"]}'.encode() in usage
    assert line["bytes_out"] == str(len(received))
    assert 0 < float(line["ttft_ms"]) <= float(line["duration_ms"])
    assert line["queue_wait_ms"] == "0.0"


def test_a_refused_request_logs_its_error(stack):
    gateway, key = stack["gateway"], stack["key"]
    headers = {"authorization": f"Bearer {key['secret']}", "x-request-id": "access-bad-1", "x-priority": "urgent"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    answer = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers)
    assert answer.status_code == 400
    line = access_line(gateway, "access-bad-1")
    assert (line["status"], line["cls"], line["engine"], line["admission"]) == ("400", "-", "-", "-")
    assert line["error"] == answer.json()["error"]["code"]
    assert line["bytes_out"] == str(len(answer.content))


def test_every_line_logged_while_a_request_runs_carries_its_id(stack):
    """An engine dies unnoticed: the request that tries it logs the engine's fall, its retry and its
    access line, all with its x-request-id, though only the last names it itself."""
    gateway, key = stack["gateway"], stack["key"]
    stack["engines"][1].kill()
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key["secret"], max_retries=0, timeout=30)
    ids = [f"access-retry-{n}" for n in range(2)]
    for request_id in ids:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=2,
            extra_headers={"x-request-id": request_id},
        )
    retried = [rid for rid in ids if access_line(gateway, rid).get("attempts") == "2"]
    assert len(retried) == 1, "round robin sends one of the two to the dead engine"
    events = [x["event"] for x in lines_of(gateway, retried[0])]
    assert {"engine_unhealthy", "request_retried", "access"} <= set(events), events
    assert all("request_id" in x for x in log_lines(gateway.log_path.read_text(), "engine_unhealthy"))


def test_access_log_false_turns_it_off(procs, tmp_path):
    engine = start_engine(tmp_path)
    procs.append(engine)
    engine.wait_ready()
    gateway = start_gateway(tmp_path, {"pools": {"interactive": {"engines": [engine.url]}}, "access_log": False})
    procs.append(gateway)
    gateway.wait_ready("/ready")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    assert httpx.post(gateway.url + "/v1/chat/completions", json=body).status_code == 200
    gateway.stop()
    logged = log_lines(gateway.log_path.read_text())
    assert any(x["event"] == "gateway_stopped" for x in logged)
    assert not [x for x in logged if x["event"] == "access"]


def test_a_batch_line_logs_the_name_of_the_key_that_owns_the_batch(stack):
    from tests.gateway.batch.support import chat_line, submit, wait_batch

    gateway, key = stack["gateway"], stack["key"]
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key["secret"], max_retries=0)
    batch = wait_batch(client, submit(client, [chat_line(i) for i in range(2)]).id)
    assert batch.status == "completed", batch

    def logged() -> list[dict[str, str]]:
        return [x for x in log_lines(gateway.log_path.read_text(), "access") if x.get("batch_id") == batch.id]

    assert wait_for(lambda: len(logged()) == 2, timeout=5)
    assert {(x["key_id"], x["key_name"]) for x in logged()} == {(key["id"], "log-test")}
