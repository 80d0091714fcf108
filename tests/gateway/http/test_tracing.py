"""OpenTelemetry tracing: ``gateway serve`` and a simulated engine that traces as vLLM does
(``--otlp-traces-endpoint``) export to a real OTLP/HTTP receiver on loopback, which decodes the
protobuf that arrives."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import openai
import pytest

from priority_gateway.http.tracing import TracingError, from_environment, wanted
from tests.gateway.batch.support import chat_line, submit, wait_batch
from tests.support.otlp import OtlpReceiver
from tests.support.procs import ROOT, free_port, start_engine, start_gateway

MODEL = "sim-model"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}


@pytest.fixture(scope="module")
def receiver():
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def stack(procs, tmp_path_factory, receiver):
    tmp = tmp_path_factory.mktemp("tracing")
    engine_env = {**FAST_EXPORT, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}
    engine = start_engine(
        tmp, "--token-delay-ms", "5", "--otlp-traces-endpoint", receiver.url + "/v1/traces", env=engine_env
    )
    procs.append(engine)
    engine.wait_ready()
    config = {"pools": {"interactive": {"engines": [engine.url]}}, "batch": {"poll_s": 0.1}}
    gateway_env = {**FAST_EXPORT, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
    gateway = start_gateway(tmp, config, env=gateway_env)
    procs.append(gateway)
    gateway.wait_ready("/ready")
    return {"gateway": gateway, "engine": engine}


def gateway_span(receiver: OtlpReceiver, request_id: str):
    (span,) = receiver.wait(lambda s: s.attributes.get("gateway.request_id") == request_id)
    return span


def test_a_request_span_joins_the_client_s_trace_and_the_engine_joins_it(stack, receiver):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Trace this."}],
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {
        "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01",
        "tracestate": "vendor=abc",
        "x-request-id": "traced-1",
        "user-agent": "trace-test/1.0",
    }
    with httpx.stream("POST", stack["gateway"].url + "/v1/chat/completions", json=body, headers=headers) as answer:
        received = answer.read()
    assert answer.status_code == 200
    span = gateway_span(receiver, "traced-1")
    assert span.service == "priority-gateway" and span.kind == "SPAN_KIND_SERVER"
    assert span.name == "POST /v1/chat/completions"
    assert (span.trace_id, span.parent_span_id) == (TRACE_ID, CLIENT_SPAN)
    a = span.attributes
    assert a["http.response.status_code"] == 200 and a["http.request.method"] == "POST"
    assert a["http.route"] == "/v1/chat/completions" and a["user_agent.original"] == "trace-test/1.0"
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == MODEL
    assert (a["gateway.class"], a["gateway.pool"], a["gateway.engine"]) == (
        "interactive",
        "interactive",
        stack["engine"].url,
    )
    assert a["gateway.admission"] == "admitted" and a["gateway.queue_wait_s"] == 0.0
    assert (
        a["gen_ai.usage.output_tokens"] == 5
        and f'"prompt_tokens":{a["gen_ai.usage.input_tokens"]}'.encode() in received
    )
    assert 0 < a["gen_ai.latency.time_to_first_token"] < 5
    assert span.status_code == "STATUS_CODE_UNSET"
    # The engine got the gateway span's context: its own span is the gateway span's child.
    (engine,) = receiver.wait(lambda s: s.name == "llm_request" and s.trace_id == TRACE_ID)
    assert engine.parent_span_id == span.span_id and engine.kind == "SPAN_KIND_SERVER"
    assert engine.attributes["gen_ai.usage.completion_tokens"] == 5


def test_without_a_traceparent_the_gateway_starts_the_trace(stack, receiver):
    client = openai.OpenAI(base_url=stack["gateway"].url + "/v1", api_key="x", max_retries=0)
    client.responses.create(
        model=MODEL, input="Start a trace.", max_output_tokens=3, extra_headers={"x-request-id": "traced-2"}
    )
    span = gateway_span(receiver, "traced-2")
    assert span.parent_span_id == "" and span.name == "POST /v1/responses"
    assert span.attributes["gen_ai.usage.output_tokens"] == 3 and span.attributes["gen_ai.operation.name"] == "chat"
    (engine,) = receiver.wait(lambda s: s.name == "llm_request" and s.trace_id == span.trace_id)
    assert engine.parent_span_id == span.span_id


def test_a_span_names_the_forwarded_client_only_behind_a_trusted_proxy(stack, receiver, tmp_path):
    forwarded = {"x-forwarded-for": "203.0.113.7"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Who asks?"}], "max_tokens": 1}
    # Not trusted (none is by default, loopback included): the header names nobody.
    plain = httpx.post(
        stack["gateway"].url + "/v1/chat/completions", json=body, headers={**forwarded, "x-request-id": "fwd-1"}
    )
    assert plain.status_code == 200
    assert gateway_span(receiver, "fwd-1").attributes["client.address"] == "127.0.0.1"
    config = {
        "pools": {"interactive": {"engines": [stack["engine"].url]}},
        "limits": {"trusted_proxies": ["127.0.0.1"]},
    }
    gateway = start_gateway(tmp_path, config, env={**FAST_EXPORT, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
    try:
        gateway.wait_ready("/ready")
        proxied = httpx.post(
            gateway.url + "/v1/chat/completions", json=body, headers={**forwarded, "x-request-id": "fwd-2"}
        )
        assert proxied.status_code == 200
        assert gateway_span(receiver, "fwd-2").attributes["client.address"] == "203.0.113.7"
    finally:
        gateway.stop()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("baggage", "k=" + "v" * 60_000),
        ("baggage", ",".join(f"bad member {i}" for i in range(170))),  # under the size limit, each invalid
        ("tracestate", "vendor=" + "x" * 20_000),
        ("tracestate", ",".join(f"Bad Key {i}=x" for i in range(30))),
        ("traceparent", f"00-{TRACE_ID}-{CLIENT_SPAN}-01-" + "f" * 20_000),
    ],
)
def test_oversized_or_malformed_trace_headers_are_dropped_with_one_short_log_line(stack, receiver, name, value):
    gateway = stack["gateway"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    before = gateway.log_path.stat().st_size
    for n in range(20):
        headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01", name: value, "x-request-id": f"{name}-{n}"}
        answer = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=10)
        assert answer.status_code == 200, answer.text
    span = gateway_span(receiver, f"{name}-19")
    grew = gateway.log_path.stat().st_size - before
    # Twenty access lines and at most one short line about the headers; never what the client sent.
    assert grew < 20 * 800 + 500, f"the log grew {grew} bytes for 20 requests"
    if name != "traceparent":
        assert span.trace_id == TRACE_ID, "the valid traceparent beside it still counts"


def test_errors_set_the_status_code_and_5xx_marks_the_span_failed(stack, receiver):
    bad = httpx.post(
        stack["gateway"].url + "/v1/chat/completions",
        json={"model": MODEL, "messages": "no"},
        headers={"x-request-id": "traced-400"},
    )
    assert bad.status_code == 400
    span = gateway_span(receiver, "traced-400")
    assert span.attributes["http.response.status_code"] == 400 and span.status_code == "STATUS_CODE_UNSET"
    assert span.attributes["gateway.error"] == "invalid_value"


def test_batch_lines_have_spans_that_name_their_batch(stack, receiver):
    client = openai.OpenAI(base_url=stack["gateway"].url + "/v1", api_key="x", max_retries=0)
    batch = submit(client, [chat_line(i, max_tokens=2) for i in range(2)])
    assert wait_batch(client, batch.id).status == "completed"
    lines = receiver.wait(
        lambda s: s.attributes.get("gateway.batch.id") == batch.id and s.kind == "SPAN_KIND_INTERNAL", 2
    )
    assert sorted(s.attributes["gateway.batch.custom_id"] for s in lines) == ["req-0", "req-1"]
    assert all(s.name == f"batch line {batch.id}" and s.attributes["http.response.status_code"] == 200 for s in lines)
    for line in lines:
        (request,) = receiver.wait(lambda s, line=line: s.parent_span_id == line.span_id)
        assert request.kind == "SPAN_KIND_SERVER" and request.trace_id == line.trace_id
        assert request.attributes["gateway.class"] == "batch"
        assert request.attributes["gateway.batch.custom_id"] == line.attributes["gateway.batch.custom_id"]


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "gw"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_tracing_is_off_unless_the_environment_asks(environ, on):
    assert wanted(environ) is on


def test_what_cannot_run_is_refused_with_what_to_do(monkeypatch):
    with pytest.raises(TracingError, match="'otlp' or 'console'"):
        from_environment({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(TracingError, match="http/json"):
        from_environment({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(TracingError, match=r"priority-gateway\[otel\]"):
        from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})


def test_gateway_serve_refuses_to_start_when_tracing_cannot_run(tmp_path):
    config = tmp_path / "gateway.yaml"
    config.write_text("pools:\n  interactive:\n    engines: ['http://127.0.0.1:9']\n")
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "jaeger"}
    cmd = [sys.executable, "-m", "priority_gateway", "serve", "--config", str(config), "--port", str(free_port())]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "OTEL_TRACES_EXPORTER='jaeger'" in done.stderr


def test_tracing_off_loads_no_sdk():
    """Off, the request path never touches OpenTelemetry's tracing: neither the SDK's tracer nor an
    exporter is even imported (redis imports the SDK's metrics for its own use when installed)."""
    script = (
        "import sys\n"
        "from priority_gateway.config import load_config\n"
        "from priority_gateway.http.app import GatewayApp\n"
        "from priority_gateway.runtime import Gateway\n"
        "from priority_gateway.http.tracing import from_environment\n"
        "config = load_config(base={'pools': {'interactive': {'engines': ['http://127.0.0.1:9']}}})\n"
        "gateway = Gateway(config)\n"
        "gateway.tracing = from_environment()\n"
        "app = GatewayApp(gateway)\n"
        "assert app.proxy.tracing is None\n"
        "tracing = ('opentelemetry.sdk.trace', 'opentelemetry.exporter')\n"
        "print(sorted(m for m in sys.modules if m.startswith(tracing)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
