"""Tracing against real vLLM 0.32: the gateway's span is the parent of the ``llm_request`` span
vLLM exports when started with ``--otlp-traces-endpoint``, both received by a real OTLP/HTTP
receiver on loopback; and the Responses API through the gateway, streamed and not."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import openai
import pytest

from priority_gateway.engines.vllm.serve import Engine, EngineSpec, start
from tests.support.otlp import OtlpReceiver
from tests.support.procs import Proc, free_port, start_gateway
from tests.vllm.client import MODEL

pytestmark = pytest.mark.vllm

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def traced_engine(tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver) -> Iterator[Engine]:
    spec = EngineSpec(port=free_port(), core=1, extra_args=("--otlp-traces-endpoint", receiver.url + "/v1/traces"))
    # vLLM exports over gRPC unless told otherwise; the receiver speaks OTLP/HTTP.
    with mock.patch.dict(os.environ, {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}):
        engine = start(spec, Path(tmp_path_factory.mktemp("vllm-traced")) / "engine.log")
    try:
        engine.wait_healthy(240)
        yield engine
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def gateway(procs: list[Proc], tmp_path_factory: pytest.TempPathFactory, traced_engine: Engine, receiver) -> Proc:
    config = {"pools": {"interactive": {"engines": [traced_engine.url]}}, "scrape": {"interval_s": 1.0}}
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    proc = start_gateway(tmp_path_factory.mktemp("gateway"), config, env=env)
    procs.append(proc)
    return proc.wait_ready("/ready", timeout=30)


@pytest.fixture
def client(gateway: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_vllm_puts_its_request_span_under_the_gateway_s(client: openai.OpenAI, receiver: OtlpReceiver) -> None:
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "def fib(n):"}],
        max_tokens=4,
        extra_body={"ignore_eos": True},
        extra_headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01", "x-request-id": "vllm-traced-1"},
    )
    (ours,) = receiver.wait(lambda s: s.attributes.get("gateway.request_id") == "vllm-traced-1")
    assert (ours.trace_id, ours.parent_span_id) == (TRACE_ID, CLIENT_SPAN)
    assert ours.attributes["gen_ai.usage.output_tokens"] == 4
    (engine,) = receiver.wait(lambda s: s.name == "llm_request" and s.trace_id == TRACE_ID, timeout=30)
    assert engine.parent_span_id == ours.span_id
    assert engine.attributes["gen_ai.usage.completion_tokens"] == 4


def test_responses_through_the_gateway_streamed_and_not(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="def fib(n):", max_output_tokens=6)
    assert response.object == "response" and response.usage is not None
    assert response.usage.output_tokens <= 6 and response.usage.input_tokens > 0
    with client.responses.stream(model=MODEL, input="def fib(n):", max_output_tokens=6) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final.usage is not None and final.usage.output_tokens <= 6
