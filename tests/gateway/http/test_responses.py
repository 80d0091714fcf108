"""``POST /v1/responses`` through the gateway: the official openai client against ``gateway serve``
in front of simulated engines, streaming and not, errors, affinity and batches."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway.batch.support import submit, wait_batch
from tests.support.observe import log_lines, wait_for
from tests.support.procs import start_engine, start_gateway

MODEL = "sim-model"
STEP_MS = 40
SYSTEM = "You answer questions about the sea, briefly and without digressions of any kind. " * 3


@pytest.fixture(scope="module")
def stack(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("responses")
    engines = [start_engine(tmp, "--token-delay-ms", str(STEP_MS)) for _ in range(2)]
    procs.extend(engines)
    for engine in engines:
        engine.wait_ready()
    config = {
        "pools": {"interactive": {"engines": [e.url for e in engines]}},
        "batch": {"poll_s": 0.1},
    }
    gateway = start_gateway(tmp, config)
    procs.append(gateway)
    return gateway.wait_ready("/ready")


@pytest.fixture
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def access(stack, request_id: str) -> dict[str, str]:
    lines: list[dict[str, str]] = []

    def logged() -> bool:
        lines[:] = [x for x in log_lines(stack.log_path.read_text(), "access") if x["request_id"] == request_id]
        return bool(lines)

    assert wait_for(logged, timeout=5)
    assert len(lines) == 1
    return lines[0]


def test_create_returns_the_engine_s_response_and_logs_its_usage(stack, client):
    raw = client.responses.with_raw_response.create(
        model=MODEL, input="Why is the sea salty?", instructions=SYSTEM, max_output_tokens=5
    )
    response = raw.parse()
    assert response.object == "response" and response.status == "incomplete"
    assert response.output_text and response.instructions == SYSTEM
    assert response.usage is not None and response.usage.output_tokens == 5
    assert raw.headers["x-gateway-class"] == "interactive"
    line = access(stack, raw.headers["x-request-id"])
    assert line["endpoint"] == "/v1/responses" and line["status"] == "200" and line["stream"] == "false"
    assert int(line["prompt_tokens"]) == response.usage.input_tokens
    assert "prompt_tokens_estimated" not in line
    assert line["completion_tokens"] == "5"
    assert line["bytes_out"] == str(len(raw.content))


def test_stream_events_arrive_in_order_and_ttft_is_the_first_text_delta(stack, client):
    with client.responses.with_streaming_response.create(
        model=MODEL,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Count the waves."}]}],
        max_output_tokens=4,
        stream=True,
        extra_headers={"x-request-id": "responses-stream-1"},
    ) as raw:
        body = raw.read()
    blocks = [b for b in body.split(b"\n\n") if b]
    kinds = [b.split(b"\n")[0].removeprefix(b"event: ").decode() for b in blocks]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds.count("response.output_text.delta") == 4
    assert kinds[-1] == "response.completed"
    line = access(stack, "responses-stream-1")
    assert line["stream"] == "true" and line["completion_tokens"] == "4"
    assert line["bytes_out"] == str(len(body))
    # response.created comes at once; the first text delta only after the engine's first step.
    assert float(line["ttft_ms"]) >= STEP_MS * 0.9


def test_the_official_client_streams_through_the_gateway(client):
    with client.responses.stream(model=MODEL, input="Tell me about tides.", max_output_tokens=6) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert len(deltas) == 6 and final.output_text == "".join(deltas)
    assert final.usage is not None and final.usage.output_tokens == 6


def test_a_conversation_s_turns_stay_on_one_engine(stack, client):
    """Turn 2 sends turn 1 back as items: rendered like chat, it shares turn 1's prefix blocks."""
    engines = []
    for n in range(6):
        question = f"Conversation {n}: " + "tell me everything about the tides and the moon. " * 4
        first = client.responses.with_raw_response.create(model=MODEL, input=question, max_output_tokens=3)
        answer = first.parse().output_text
        history = [
            {"role": "user", "content": question},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]},
            {"role": "user", "content": [{"type": "input_text", "text": "And the sun?"}]},
        ]
        second = client.responses.with_raw_response.create(model=MODEL, input=history, max_output_tokens=3)
        engines.append(
            (
                access(stack, first.headers["x-request-id"])["engine"],
                access(stack, second.headers["x-request-id"])["engine"],
            )
        )
    assert all(a == b for a, b in engines), engines
    assert len({a for a, _ in engines}) == 2, "both engines should get conversations"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": 5}, "input"),
        ({"model": MODEL, "input": ["text"]}, "input[0]"),
        ({"model": MODEL, "input": [{"role": 1, "content": "x"}]}, "input[0].role"),
        (
            {"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]},
            "input[0].content",
        ),
        ({"model": MODEL, "input": "x", "instructions": ["a"]}, "instructions"),
        ({"model": MODEL, "input": "x", "stream": "yes"}, "stream"),
    ],
)
def test_bad_bodies_are_400_in_openai_shape(stack, body, param):
    answer = httpx.post(stack.url + "/v1/responses", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


DEEP = b"[" * 1000 + b"1" + b"]" * 1000
DEEP_OBJECT = b'{"a": ' * 1000 + b"1" + b"}" * 1000
NESTED = {
    "arguments": b'{"type": "function_call", "call_id": "c1", "name": "f", "arguments": %s}' % DEEP,
    "output": b'{"type": "function_call_output", "call_id": "c1", "output": %s}' % DEEP_OBJECT,
    "name": b'{"type": "function_call", "call_id": "c1", "name": %s, "arguments": "{}"}' % DEEP,
    "output[0]": b'{"type": "function_call_output", "call_id": "c1", "output": [%s]}' % DEEP,
}


@pytest.mark.parametrize("field", list(NESTED))
def test_tool_items_nested_a_thousand_deep_are_400_naming_the_item(stack, field):
    item = NESTED[field]
    body = b'{"model": "%s", "input": [{"role": "user", "content": "hi"}, %s]}' % (MODEL.encode(), item)
    answer = httpx.post(stack.url + "/v1/responses", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["param"] == f"input[1].{field}" and error["type"] == "invalid_request_error"
    assert len(answer.content) < 1000


def test_well_formed_tool_items_are_served(client):
    response = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "What is the weather?"},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "cold"}]},
        ],
        max_output_tokens=3,
    )
    assert response.object == "response" and response.output_text


def test_engine_errors_reach_the_client_as_openai_errors(client):
    with pytest.raises(openai.NotFoundError, match="resp_unknown") as unknown:
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_unknown")
    # The engine's own error (vLLM names the id `response_id`), not an unknown model.
    error = unknown.value.body
    assert (error["param"], error["code"], error["type"]) == ("response_id", "not_found", "not_found_error")
    with pytest.raises(openai.BadRequestError, match="max_output_tokens"):
        client.responses.create(model=MODEL, input="x", max_output_tokens=10**6)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.responses.create(model="other-model", input="x")


def test_a_batch_of_responses_runs_and_logs_its_lines(stack, client):
    lines = [
        {
            "custom_id": f"resp-{i}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"model": MODEL, "input": f"Question {i} about the sea.", "max_output_tokens": 3},
        }
        for i in range(3)
    ]
    batch = submit(client, lines, endpoint="/v1/responses")
    done = wait_batch(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 3
    out = [line for line in client.files.content(done.output_file_id).text.splitlines() if line]
    assert len(out) == 3 and all('"object":"response"' in line.replace(" ", "") for line in out)
    logged = [x for x in log_lines(stack.log_path.read_text(), "access") if x.get("batch_id") == batch.id]
    assert sorted(x["custom_id"] for x in logged) == ["resp-0", "resp-1", "resp-2"]
    assert all(x["endpoint"] == "/v1/responses" and x["cls"] == "batch" for x in logged)
