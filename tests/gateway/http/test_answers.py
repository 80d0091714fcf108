"""Broken and slow engines, seen through the real ``openai`` client: clean errors, bounded time."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.support.observe import log_lines, wait_for
from tests.support.procs import start_broken_engine, start_gateway

MODEL = "sim-model"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gateway(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("answers")
    engine = start_broken_engine(tmp)
    procs.append(engine)
    engine.wait_ready()
    config = {
        "pools": {"interactive": {"engines": [engine.url]}},
        "health": {"interval_s": 0.2, "timeout_s": 0.5},
        "upstream": {
            "first_byte_timeout_s": 1.0,
            "deadline_factor": 1.0,
            "min_deadline_s": 2.0,
            "max_interactive_s": 2.0,
        },
    }
    gw = start_gateway(tmp, config)
    procs.append(gw)
    gw.wait_ready("/ready")
    return gw


@pytest.fixture
def client(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=15)


def chat(client, mode: str, **kwargs):
    return client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, extra_headers={"x-request-id": mode}, **kwargs
    )


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text[:300]
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_well_behaved_answer_passes_through(client):
    assert chat(client, "fine").choices[0].message.content == "ok"


def test_an_engine_html_500_becomes_502_in_openai_shape(client):
    with pytest.raises(openai.InternalServerError) as caught:
        chat(client, "html500")
    error = assert_openai_error(caught.value.response, 502)
    assert "<html" not in caught.value.response.text
    assert error["code"] == "upstream_error"


def test_a_200_that_is_not_json_is_never_a_success(client):
    with pytest.raises(openai.InternalServerError) as caught:
        chat(client, "text200")
    assert_openai_error(caught.value.response, 502)


def test_an_engine_400_keeps_its_message(client):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, "json400")
    error = assert_openai_error(caught.value.response, 400)
    assert error["message"] == "max_tokens is too large"


def test_an_engine_401_is_the_gateways_problem_not_the_clients(client):
    with pytest.raises(openai.InternalServerError) as caught:
        chat(client, "json401")
    assert_openai_error(caught.value.response, 502)


def test_an_answer_cut_short_of_its_content_length_is_a_clean_502(gateway, client):
    with pytest.raises(openai.InternalServerError) as caught:
        chat(client, "short")
    assert_openai_error(caught.value.response, 502)
    assert "Exception in ASGI application" not in gateway.log()


def test_a_stream_cut_short_of_its_content_length_ends_with_an_error_event(gateway, client):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, stream=True, extra_headers={"x-request-id": "shortstream"}
    )
    # The engine's length is not ours to promise: the relay's framing is its own.
    assert "content-length" not in raw.headers
    with pytest.raises(openai.APIError):
        for _ in raw.parse():
            pass
    # The gateway logs the request after the client has seen the end.
    assert wait_for(lambda: any(x["request_id"] == "shortstream" for x in log_lines(gateway.log(), "access")))
    assert "Exception in ASGI application" not in gateway.log()
    assert "Traceback" not in gateway.log()


def test_a_dripping_stream_is_cut_at_its_deadline(client):
    started = time.monotonic()
    stream = chat(client, "drip", stream=True)
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass
    assert time.monotonic() - started < 6.0


@pytest.mark.parametrize(
    ("mode", "stream", "within"),
    [
        ("dripjson", False, 6.0),  # total deadline
        ("silent", True, 4.0),  # first-byte timeout
        ("silent", False, 6.0),  # total deadline
    ],
)
def test_a_slow_or_silent_engine_is_504_within_its_deadline(client, mode, stream, within):
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as caught:
        chat(client, mode, stream=stream)
    assert_openai_error(caught.value.response, 504)
    assert time.monotonic() - started < within


def _itl(gateway) -> tuple[float, float]:
    """The interactive class's ``gateway_itl_seconds`` (count, sum) from the gateway's /metrics."""
    count = total = 0.0
    for line in httpx.get(gateway.url + "/metrics").text.splitlines():
        if line.startswith("gateway_itl_seconds_count{") and 'class="interactive"' in line:
            count += float(line.rsplit(" ", 1)[1])
        elif line.startswith("gateway_itl_seconds_sum{") and 'class="interactive"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return count, total


def test_events_that_arrive_together_are_each_an_inter_token_gap(gateway, client):
    """Nine token events in three reads 0.2 s apart: the eight after the first are eight gaps that
    add up to the 0.4 s they took (as vLLM counts one per step), not two gaps of 0.2 s, which would
    read as an ITL twice what the engine ran at and make admission refuse what the engine serves."""
    before = _itl(gateway)
    events = [e for e in chat(client, "coalesced", stream=True) if e.choices]
    assert len(events) == 9
    count, total = (a - b for a, b in zip(_itl(gateway), before, strict=True))
    assert count == 8
    assert total == pytest.approx(0.4, abs=0.15)
