"""The gateway as a drop-in OpenAI endpoint: real gateway and engine processes on loopback."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

from tests.support.observe import metric, wait_for
from tests.support.procs import start_engine, start_gateway

MODEL = "sim-model"


@pytest.fixture(scope="module")
def stack(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stack")
    interactive = [start_engine(tmp, "--token-delay-ms", "2") for _ in range(2)]
    batch = [start_engine(tmp, "--token-delay-ms", "2", "--scheduling-policy", "priority")]
    procs.extend(interactive + batch)
    for engine in interactive + batch:
        engine.wait_ready()
    config = {
        "pools": {
            "interactive": {"engines": [e.url for e in interactive]},
            "batch": {"engines": [e.url for e in batch], "scheduling_policy": "priority"},
        },
        "health": {"interval_s": 0.2, "timeout_s": 0.5, "unhealthy_after": 1},
        "scrape": {"interval_s": 0.5},
        "max_body_bytes": 200_000,
    }
    gateway = start_gateway(tmp, config)
    procs.append(gateway)
    gateway.wait_ready("/ready")
    return {"gateway": gateway, "interactive": interactive, "batch": batch}


@pytest.fixture
def client(stack):
    return openai.OpenAI(base_url=stack["gateway"].url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_chat_non_streaming(client):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=8
    )
    chat = raw.parse()
    assert chat.choices[0].message.content
    assert chat.usage.completion_tokens == 8
    assert raw.headers["x-gateway-class"] == "interactive"
    assert raw.headers["x-gateway-pool"] == "interactive"
    assert raw.headers["x-request-id"]


def test_chat_streaming_with_usage(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "stream to me"}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def test_completions_streaming_and_not(client):
    done = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5)
    assert done.choices[0].text and done.usage.completion_tokens == 5
    streamed = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices)


def test_request_id_is_echoed(stack):
    r = httpx.post(
        stack["gateway"].url + "/v1/completions",
        json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
        headers={"x-request-id": "caller-chosen-id"},
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "caller-chosen-id"


def test_batch_header_lands_on_the_batch_pool(stack, client):
    batch_url = stack["batch"][0].url
    interactive_urls = [e.url for e in stack["interactive"]]
    before_batch = metric(batch_url, "vllm:request_success_total")
    before_interactive = sum(metric(u, "vllm:request_success_total") for u in interactive_urls)
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "offline work"}],
            max_tokens=4,
            extra_headers={"X-Priority": "BATCH"},
        )
        assert raw.headers["x-gateway-class"] == "batch"
        assert raw.headers["x-gateway-pool"] == "batch"
    assert metric(batch_url, "vllm:request_success_total") == before_batch + 3
    assert sum(metric(u, "vllm:request_success_total") for u in interactive_urls) == before_interactive


def test_models_health_ready_metrics(stack):
    url = stack["gateway"].url
    models = httpx.get(url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert httpx.get(url + "/health").status_code == 200
    ready = httpx.get(url + "/ready").json()
    assert ready["ready"] is True and ready["pools"] == {"interactive": True, "batch": True}
    assert ready["store"]["ok"] is True and ready["store"]["url"].startswith("sqlite://"), ready
    text = httpx.get(url + "/metrics").text
    for name in (
        "gateway_requests_total",
        "gateway_ttft_seconds",
        "gateway_itl_seconds",
        "gateway_inflight",
        "gateway_engine_healthy",
    ):
        assert name in text


def test_engine_state_read_from_vllm_metrics_is_exported(stack):
    url = stack["gateway"].url
    assert wait_for(lambda: "gateway_engine_kv_cache_usage{" in httpx.get(url + "/metrics").text, timeout=5)
    text = httpx.get(url + "/metrics").text
    assert 'gateway_engine_requests{engine="' in text and 'state="waiting"' in text
    assert "gateway_engine_pending_prefill_tokens" in text
    assert 'gateway_pool_ttft_margin{pool="interactive"}' in text


def test_ttft_and_itl_are_observed_for_streams(stack, client):
    url = stack["gateway"].url
    before = metric(url, "gateway_itl_seconds_count", **{"class": "interactive", "pool": "interactive"})
    list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=10, stream=True
        )
    )
    assert metric(url, "gateway_ttft_seconds_count", **{"class": "interactive"}) >= 1
    assert metric(url, "gateway_itl_seconds_count", **{"class": "interactive", "pool": "interactive"}) > before


# -- errors -------------------------------------------------------------------------------


def post(stack, path, content, headers=None):
    return httpx.post(stack["gateway"].url + path, content=content, headers=headers or {}, timeout=10)


def assert_openai_error(response, status, code=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if code is not None:
        assert error["code"] == code


def test_invalid_json_is_400(stack):
    assert_openai_error(post(stack, "/v1/chat/completions", b"{not json"), 400, "invalid_json")


def test_missing_messages_or_prompt_is_400(stack):
    assert_openai_error(post(stack, "/v1/chat/completions", b'{"model": "sim-model"}'), 400)
    assert_openai_error(post(stack, "/v1/completions", b'{"model": "sim-model"}'), 400)


def test_unknown_model_is_404_for_the_openai_client(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])


def test_bad_priority_header_is_400(stack):
    r = post(stack, "/v1/completions", b'{"model": "sim-model", "prompt": "x"}', {"x-priority": "urgent"})
    assert_openai_error(r, 400, "invalid_priority")


def test_body_over_the_limit_is_413(stack):
    big = b'{"model": "sim-model", "prompt": "' + b"a" * 300_000 + b'"}'
    assert_openai_error(post(stack, "/v1/completions", big), 413, "body_too_large")


def test_unknown_path_is_404_in_openai_shape(stack):
    assert_openai_error(httpx.get(stack["gateway"].url + "/v1/nothing"), 404)


def test_token_id_prompts_keep_a_shared_prefix_on_one_engine(stack, client):
    engines = stack["interactive"]
    before = [metric(e.url, "vllm:prefix_cache_hits_total") for e in engines]
    shared = [1000 + i for i in range(128)]  # eight full blocks of 16 tokens
    for i in range(6):
        reply = client.completions.create(model=MODEL, prompt=shared + [5000 + i] * 8, max_tokens=2)
        assert reply.usage.prompt_tokens == 136
    gained = sorted(metric(e.url, "vllm:prefix_cache_hits_total") - b for e, b in zip(engines, before, strict=True))
    assert gained == [0, 5 * 128]


@pytest.mark.parametrize("prompt", [b"[1, -3]", b'[1, "x"]', b"[[4294967296]]"])
def test_invalid_token_ids_are_400(stack, prompt):
    r = post(stack, "/v1/completions", b'{"model": "sim-model", "max_tokens": 2, "prompt": ' + prompt + b"}")
    assert_openai_error(r, 400, "invalid_value")
    assert r.json()["error"]["param"] == "prompt"


# -- faults -------------------------------------------------------------------------------


def test_no_healthy_engine_is_503_and_not_ready(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dead")
    from tests.support.procs import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    config = {
        "pools": {"interactive": {"engines": [dead]}},
        "health": {"interval_s": 0.1, "timeout_s": 0.2, "unhealthy_after": 1},
    }
    gateway = start_gateway(tmp, config)
    procs.append(gateway)
    gateway.wait_ready("/health")
    assert wait_for(lambda: httpx.get(gateway.url + "/ready").status_code == 503)
    r = httpx.post(gateway.url + "/v1/completions", json={"model": "m", "prompt": "x"})
    assert_openai_error(r, 503, "no_healthy_engine")
    assert "retry-after" in r.headers


def test_engine_killed_mid_stream_gives_a_clean_error_and_serving_continues(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kill")
    victim = start_engine(tmp, "--token-delay-ms", "50")
    survivor = start_engine(tmp, "--token-delay-ms", "1")
    procs.extend([victim, survivor])
    victim.wait_ready()
    survivor.wait_ready()
    config = {
        "pools": {"interactive": {"engines": [victim.url, survivor.url], "policy": "round_robin"}},
        "health": {"interval_s": 0.2, "timeout_s": 0.5, "unhealthy_after": 1},
    }
    gateway = start_gateway(tmp, config)
    procs.append(gateway)
    gateway.wait_ready("/ready")
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=30)
    # Find a stream that lands on the slow victim (round robin alternates).
    for _ in range(2):
        stream = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "long answer"}],
            max_tokens=200,
            stream=True,
        )
        chunks = stream.parse()
        first = next(iter(chunks))
        assert first is not None
        if metric(victim.url, "vllm:num_requests_running") >= 1:
            break
        chunks.close()
    else:
        pytest.fail("no stream reached the victim engine")
    victim.kill()
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for _ in chunks:
            pass
    # The gateway keeps serving on the survivor.
    for _ in range(4):
        done = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert done.choices[0].message.content is not None
    assert httpx.get(gateway.url + "/health").status_code == 200


def test_client_disconnect_stops_generation(stack):
    engine_urls = [e.url for e in stack["interactive"]]

    def running() -> float:
        return sum(metric(u, "vllm:num_requests_running") for u in engine_urls)

    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "go on forever"}],
        "max_tokens": 5000,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", stack["gateway"].url + "/v1/chat/completions", json=body) as response,
    ):
        lines = response.iter_lines()
        for _ in range(3):
            next(lines)
        assert running() >= 1
    assert wait_for(lambda: running() == 0, timeout=5), "engine kept generating after the client left"


def test_concurrent_streams_all_complete(client):
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            chunks = list(
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"n{i}"}], max_tokens=20, stream=True
                )
            )
            assert chunks
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
