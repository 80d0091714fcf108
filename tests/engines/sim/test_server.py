"""The simulated engine as a user runs it: ``python -m priority_gateway.engines.sim`` on loopback, the openai client."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import msgpack
import openai
import pytest
import zmq

from priority_gateway.engines.sim import tokens
from tests.support.observe import async_metric, metric, until, wait_for
from tests.support.procs import free_port, start_engine

MODEL = "sim-model"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def kv_sub():
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    port = free_port()
    sock.bind(f"tcp://127.0.0.1:{port}")
    yield sock, port
    sock.close(linger=0)


@pytest.fixture(scope="module")
def engines(procs, tmp_path_factory, kv_sub):
    tmp = tmp_path_factory.mktemp("sim")
    _, kv_port = kv_sub
    ipc = f"ipc://{tmp}/kv.sock"
    started = {
        "main": start_engine(
            tmp,
            "--token-delay-ms",
            "2",
            "--kv-events-endpoint",
            f"tcp://127.0.0.1:{kv_port}",
            "--kv-events-topic",
            "e1",
            "--enable-prompt-tokens-details",
        ),
        "priority": start_engine(
            tmp,
            "--token-delay-ms",
            "5",
            "--max-num-seqs",
            "1",
            "--scheduling-policy",
            "priority",
            "--kv-events-endpoint",
            ipc,
        ),
        "fcfs": start_engine(tmp, "--token-delay-ms", "5", "--max-num-seqs", "1"),
    }
    procs.extend(started.values())
    for proc in started.values():
        proc.wait_ready()
    return {name: proc.url for name, proc in started.items()} | {"ipc": ipc}


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_chat_completion_counts_tokens_exactly(engines):
    reply = client(engines["main"]).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, extra_body={"ignore_eos": True}
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == tokens.count_tokens(tokens.render_chat(MESSAGES))
    assert reply.usage.completion_tokens == 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 12
    again = client(engines["main"]).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, extra_body={"ignore_eos": True}
    )
    assert again.choices[0].message.content == reply.choices[0].message.content
    assert len(reply.choices[0].message.content.split()) == 12


def test_streamed_chat_matches_the_full_reply_and_ends_with_usage(engines):
    full = client(engines["main"]).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=300)
    chunks = list(
        client(engines["main"]).chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=300, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_without_ignore_eos_a_reply_stops_at_its_natural_length(engines):
    prompt = "Tell me a story about a cat."
    reply = client(engines["main"]).completions.create(model=MODEL, prompt=prompt, max_tokens=1000)
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == tokens.natural_length(tokens.prompt_seed(prompt, 0))
    assert reply.usage.prompt_tokens == tokens.count_tokens(prompt)
    short = client(engines["main"]).completions.create(model=MODEL, prompt=prompt, max_tokens=3)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3
    assert reply.choices[0].text.startswith(short.choices[0].text)


def test_prefix_cache_hits_are_reported_and_salted_apart(engines):
    api = client(engines["main"])
    prompt = "shared document. " * 40  # 680 characters: 170 tokens, 10 full blocks of 16
    hits = metric(engines["main"], "vllm:prefix_cache_hits_total")
    cold = api.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    warm = api.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    salted = api.completions.create(model=MODEL, prompt=prompt, max_tokens=1, extra_body={"cache_salt": "tenant"})
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.usage.prompt_tokens_details.cached_tokens == 160
    assert salted.usage.prompt_tokens_details.cached_tokens == 0
    assert metric(engines["main"], "vllm:prefix_cache_hits_total") == hits + 160


def test_token_id_prompts_count_exactly_and_hit_the_cache(engines):
    api = client(engines["main"])
    ids = [300 + i for i in range(40)]
    cold = api.completions.create(model=MODEL, prompt=ids, max_tokens=1)
    warm = api.completions.create(model=MODEL, prompt=[ids], max_tokens=1)  # a batch of one prompt
    assert cold.usage.prompt_tokens == warm.usage.prompt_tokens == 40
    assert (cold.usage.prompt_tokens_details.cached_tokens, warm.usage.prompt_tokens_details.cached_tokens) == (0, 32)
    one = api.completions.create(model=MODEL, prompt=[5], max_tokens=1)  # one token id, as vLLM takes it
    assert one.usage.prompt_tokens == 1
    with pytest.raises(openai.BadRequestError, match="out of vocabulary"):
        api.completions.create(model=MODEL, prompt=[1, tokens.VOCAB_SIZE], max_tokens=1)


def test_reset_prefix_cache_only_in_dev_mode(engines, procs, tmp_path):
    assert httpx.post(engines["fcfs"] + "/reset_prefix_cache", timeout=5).status_code == 404
    dev = start_engine(
        tmp_path, "--token-delay-ms", "1", "--enable-prompt-tokens-details", env={"VLLM_SERVER_DEV_MODE": "1"}
    )
    procs.append(dev)
    dev.wait_ready()
    api = client(dev.url)
    prompt = [300 + i for i in range(40)]
    api.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert api.completions.create(model=MODEL, prompt=prompt, max_tokens=1).usage.prompt_tokens_details.cached_tokens
    assert httpx.post(dev.url + "/reset_prefix_cache", timeout=5).status_code == 200
    after = api.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert after.usage.prompt_tokens_details.cached_tokens == 0


def test_streamed_completion_without_usage_ends_with_done(engines):
    with httpx.stream(
        "POST",
        engines["main"] + "/v1/completions",
        json={"model": MODEL, "prompt": "abc", "max_tokens": 4, "stream": True, "ignore_eos": True},
        timeout=10,
    ) as response:
        lines = [line for line in response.iter_lines() if line]
    assert response.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"
    assert all('"usage"' not in line for line in lines)
    assert len(lines) == 5  # one chunk per token (one token per step), then [DONE]


def test_errors_have_vllm_status_and_shape(engines):
    api = client(engines["main"])
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="other", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError) as exc:
        api.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body={"priority": "high"})
    assert "int_parsing" in str(exc.value)
    with pytest.raises(openai.BadRequestError):
        api.completions.create(model=MODEL, prompt="x" * 4 * 8192)
    with pytest.raises(openai.BadRequestError):
        api.completions.create(model=MODEL, prompt="hi", max_tokens=9000)
    bad_json = httpx.post(engines["main"] + "/v1/chat/completions", content=b"{not json", timeout=5)
    assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == 400
    missing = httpx.post(engines["main"] + "/v1/chat/completions", json={"model": MODEL}, timeout=5)
    assert missing.status_code == 400 and missing.json()["error"]["type"] == "BadRequestError"


def test_priority_is_accepted_but_ignored_on_fcfs(engines):
    reply = client(engines["fcfs"]).completions.create(
        model=MODEL, prompt="p", max_tokens=2, extra_body={"priority": 3}
    )
    assert reply.usage.completion_tokens == 2


def test_models_health_load_and_metrics(engines):
    url = engines["main"]
    models = httpx.get(url + "/v1/models", timeout=5).json()
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == 8192
    health = httpx.get(url + "/health", timeout=5)
    assert health.status_code == 200 and health.content == b""
    assert httpx.get(url + "/load", timeout=5).json() == {"server_load": 0}
    assert metric(url, "vllm:cache_config_info", block_size="16") == 1.0
    assert metric(url, "vllm:prompt_tokens_total") > 0


def test_embeddings_are_deterministic_unit_vectors(engines):
    api = client(engines["main"])
    one = api.embeddings.create(model=MODEL, input=["alpha", "beta"])
    two = api.embeddings.create(model=MODEL, input="alpha")
    assert one.data[0].embedding == two.data[0].embedding != one.data[1].embedding
    assert abs(sum(v * v for v in one.data[0].embedding) - 1.0) < 1e-9
    assert one.usage.prompt_tokens == tokens.count_tokens("alpha") + tokens.count_tokens("beta") == 3


def test_client_disconnect_aborts_the_request(engines):
    url = engines["main"]
    aborted = metric(url, "vllm:request_success_total", finished_reason="abort")
    body = {"model": MODEL, "prompt": "long", "max_tokens": 5000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=10) as response:
        lines = response.iter_lines()  # held: dropping the iterator would close the stream
        assert next(lines).startswith("data: ")
        assert metric(url, "vllm:num_requests_running") == 1
    assert wait_for(lambda: metric(url, "vllm:num_requests_running") == 0)
    assert wait_for(lambda: metric(url, "vllm:request_success_total", finished_reason="abort") == aborted + 1)


def test_non_streaming_disconnect_aborts_too(engines):
    url = engines["main"]
    aborted = metric(url, "vllm:request_success_total", finished_reason="abort")
    body = {"model": MODEL, "prompt": "slow", "max_tokens": 5000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/completions", json=body, timeout=0.3)
    assert wait_for(lambda: metric(url, "vllm:request_success_total", finished_reason="abort") == aborted + 1)
    assert metric(url, "vllm:num_requests_running") == 0


async def finish_order(url: str) -> list[str]:
    api = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    done: list[str] = []

    async def send(name: str, priority: int, max_tokens: int) -> None:
        await api.completions.create(
            model=MODEL, prompt=name, max_tokens=max_tokens, extra_body={"priority": priority, "ignore_eos": True}
        )
        done.append(name)

    async def holds(name: str, n: int) -> bool:
        return await async_metric(url, name) == n

    # One request runs (a sequence at a time) while three arrive, one after another, and wait; then
    # its client leaves, and the engine starts its queue in the order its policy puts it.
    first = asyncio.create_task(send("first", 10, 5000))
    assert await until(lambda: holds("vllm:num_requests_running", 1))
    tasks = []
    for waiting, (name, priority) in enumerate((("low1", 10), ("low2", 10), ("high", -10)), start=1):
        tasks.append(asyncio.create_task(send(name, priority, 3)))
        assert await until(lambda n=waiting: holds("vllm:num_requests_waiting", n)), f"{name} never waited"
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first
    await asyncio.gather(*tasks)
    await api.close()
    return done


def test_priority_reorders_the_queue_only_under_the_priority_policy(engines):
    assert asyncio.run(finish_order(engines["priority"])) == ["high", "low1", "low2"]
    assert asyncio.run(finish_order(engines["fcfs"])) == ["low1", "low2", "high"]


def recv_events(sock: zmq.Socket, timeout_ms: int = 3000) -> list[list[bytes]]:
    frames = []
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while poller.poll(timeout_ms):
        frames.append(sock.recv_multipart())
        timeout_ms = 200
    return frames


def test_kv_events_reach_a_bound_sub_socket(engines, kv_sub):
    sock, _ = kv_sub
    recv_events(sock, 100)  # drop what earlier tests caused
    prompt = "kv event prompt " * 20  # 320 characters: 5 full blocks of 16 tokens
    client(engines["main"]).completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    messages = recv_events(sock)
    assert messages
    seqs = [int.from_bytes(m[1], "big") for m in messages]
    assert all(m[0] == b"e1" and len(m[1]) == 8 for m in messages)
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    events = [e for m in messages for e in msgpack.unpackb(m[2])[1]]
    stored = [e for e in events if e["type"] == "BlockStored"]
    hashes = [h for e in stored for h in e["block_hashes"]]
    assert hashes == tokens.block_hashes_for_text(prompt, 16)
    assert stored[0]["parent_block_hash"] is None and stored[0]["medium"] == "GPU"
    assert stored[0]["block_size"] == 16 and len(stored[0]["token_ids"]) == 16 * len(stored[0]["block_hashes"])
    ts, _, dp_rank = msgpack.unpackb(messages[0][2])
    assert abs(ts - time.time()) < 60 and dp_rank == 0


def test_kv_events_from_a_binding_engine(engines):
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(engines["ipc"])
    try:
        # A SUB socket hears only what is published after its subscription reached the publisher:
        # completions of prompts of their own until one is heard, and whatever else they caused.
        for attempt in range(100):
            client(engines["priority"]).completions.create(model=MODEL, prompt=f"probe {attempt} " * 8, max_tokens=1)
            if recv_events(sock, 100):
                break
        recv_events(sock, 300)
        client(engines["priority"]).completions.create(model=MODEL, prompt="b" * 64 * 3, max_tokens=1)
        events = [e for m in recv_events(sock) for e in msgpack.unpackb(m[2])[1]]
        assert [e["type"] for e in events][:1] == ["BlockStored"]
        assert events[0]["block_hashes"] == tokens.block_hashes_for_text("b" * 64 * 3, 16)
    finally:
        sock.close(linger=0)


def test_the_api_servers_share_delays_the_first_token(procs, tmp_path):
    profile = tmp_path / "slow-front.yaml"
    profile.write_text("engine: {max_model_len: 2048}\ntiming: {overhead_ms: 1.0, request_overhead_ms: 150.0}\n")
    engine = start_engine(tmp_path, "--profile", str(profile))
    procs.append(engine)
    engine.wait_ready()
    started = time.perf_counter()
    client(engine.url).completions.create(model=MODEL, prompt=[300, 301, 302], max_tokens=1)
    assert time.perf_counter() - started >= 0.150
