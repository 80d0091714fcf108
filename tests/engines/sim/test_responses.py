"""``POST /v1/responses`` on the simulated engine, called by the official openai client."""

from __future__ import annotations

import httpx
import openai
import pytest

from priority_gateway.engines.sim import tokens
from priority_gateway.engines.sim.responses import parse_responses, prompt_messages
from tests.support.procs import start_engine

MODEL = "sim-model"


@pytest.fixture(scope="module")
def engine(procs, tmp_path_factory):
    proc = start_engine(tmp_path_factory.mktemp("responses"), "--token-delay-ms", "2", "--max-model-len", "512")
    procs.append(proc)
    return proc.wait_ready()


@pytest.fixture
def client(engine) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{engine.url}/v1", api_key="unused")


def test_create_returns_the_text_and_usage(client):
    response = client.responses.create(model=MODEL, input="Say something.", instructions="Be terse.")
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "completed" and response.incomplete_details is None
    assert response.model == MODEL and response.instructions == "Be terse."
    chat = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Say something."}]
    text = tokens.render_chat(chat)
    assert response.usage is not None
    assert response.usage.input_tokens == tokens.count_tokens(text)
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.output_text and response.output[0].type == "message"


def test_max_output_tokens_makes_an_incomplete_response(client):
    response = client.responses.create(model=MODEL, input=[{"role": "user", "content": "hi"}], max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 3
    assert response.max_output_tokens == 3


def test_stream_gives_vllm_s_events_in_order(client):
    with client.responses.stream(model=MODEL, input="Count.", max_output_tokens=5) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == 5
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == "".join(deltas)
    assert final.usage is not None and final.usage.output_tokens == 5
    # vLLM ends with response.completed even when the status is incomplete.
    assert final.status == "incomplete"


def test_raw_stream_is_sse_with_event_lines_and_no_done(engine):
    body = {"model": MODEL, "input": "x", "max_output_tokens": 2, "stream": True}
    text = httpx.post(f"{engine.url}/v1/responses", json=body).text
    blocks = [b for b in text.split("\n\n") if b]
    assert all(b.startswith("event: response.") and "\ndata: {" in b for b in blocks)
    assert "[DONE]" not in text


def test_bad_requests_get_vllm_s_errors(engine, client):
    missing = httpx.post(f"{engine.url}/v1/responses", json={"model": MODEL})
    assert (missing.status_code, missing.json()["error"]["param"]) == (400, "body.input")
    too_long = httpx.post(f"{engine.url}/v1/responses", json={"model": MODEL, "input": "x", "max_output_tokens": 600})
    assert too_long.status_code == 400
    assert too_long.json()["error"]["message"].startswith("max_output_tokens=600 cannot be greater than max_model_len")
    with pytest.raises(openai.NotFoundError, match="Valid aliases: sim-model"):
        client.responses.create(model="other", input="x")
    with pytest.raises(openai.NotFoundError, match="Response with id 'resp_1' not found"):
        client.responses.retrieve("resp_1")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_1")
    with pytest.raises(openai.BadRequestError, match="VLLM_ENABLE_RESPONSES_API_STORE"):
        client.responses.create(model=MODEL, input="x", background=True)
    deep = b'{"model": "%s", "input": "x", "user": %s}' % (MODEL.encode(), b"[" * 1000 + b"]" * 1000)
    nested = httpx.post(f"{engine.url}/v1/responses", content=deep, headers={"content-type": "application/json"})
    assert (nested.status_code, nested.json()["error"]["param"]) == (400, "user")


def test_input_items_render_as_a_chat():
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
        {"type": "reasoning", "summary": []},
        {"type": "function_call_output", "call_id": "1", "output": "42"},
    ]
    assert prompt_messages("sys", items) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "c"},
        {"role": "tool", "content": "42"},
    ]


def test_output_budget_is_what_is_left_of_the_context():
    req = parse_responses({"input": "x" * 1000, "max_output_tokens": 500}, MODEL, max_model_len=512, seed=0)
    assert req.parsed.max_tokens == 512 - req.parsed.prompt_tokens
