"""Nothing waits behind what cannot start: one pool serving two models on two engines, an alias half
of whose split no engine serves, and batch jobs over them; real gateway, real HTTP, Batch API."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.gateway.batch.support import submit, wait_batch
from tests.support.flood import post_all, statuses
from tests.support.observe import metric, wait_for
from tests.support.procs import start_engine, start_gateway

BATCH = {"x-priority": "batch"}


@pytest.fixture(scope="module")
def gateway(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("queue-order")
    slow = start_engine(tmp, "--token-delay-ms", "20", model="m-a")
    fast = start_engine(tmp, "--token-delay-ms", "1", model="m-b")
    procs.extend([slow, fast])
    for engine in (slow, fast):
        engine.wait_ready()
    config = {
        # One slot per engine: a second request for an engine's model must wait.
        "pools": {"interactive": {"engines": [slow.url, fast.url], "models": ["m-a", "m-b", "m-c"]}},
        "admission": {"initial_limit": 1, "max_limit": 1},
        # Half the canary's requests go to m-c, which the pool declares but no engine lists.
        "models": {"aliases": {"canary": [{"model": "m-b", "weight": 1}, {"model": "m-c", "weight": 1}]}},
        "health": {"interval_s": 0.2},
        "batch": {"poll_s": 0.1, "retry_base_s": 0.1},
    }
    gw = start_gateway(tmp, config)
    procs.append(gw)
    gw.wait_ready("/ready")
    # Routing by model needs both engines' /v1/models.
    assert wait_for(lambda: chat(gw, "m-b", timeout=5).status_code == 200, timeout=10)
    return gw


def chat(gw, model: str, max_tokens: int = 2, timeout: float = 10, **headers: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, headers={**BATCH, **headers}, timeout=timeout)


def queued(gw) -> float:
    return metric(gw.url, "gateway_queue_depth", pool="interactive", **{"class": "batch"})


@contextlib.contextmanager
def slow_engine_busy(gw, waiting: int) -> Iterator[None]:
    """The m-a engine's one slot held by a long stream, ``waiting`` more m-a requests queued behind it."""
    body = {"model": "m-a", "prompt": "hold", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    answers: list[int] = []
    with (
        httpx.Client(timeout=120) as http,
        http.stream("POST", gw.url + "/v1/completions", json=body, headers=BATCH) as response,
    ):
        lines = response.iter_lines()  # kept: a dropped iterator closes the stream
        next(lines)
        threads = [
            threading.Thread(target=lambda: answers.append(chat(gw, "m-a", timeout=120).status_code), daemon=True)
            for _ in range(waiting)
        ]
        for thread in threads:
            thread.start()
        assert wait_for(lambda: queued(gw) >= waiting, timeout=10)
        yield
    for thread in threads:
        thread.join(timeout=60)
    assert answers == [200] * waiting


def test_a_request_for_the_idle_engine_s_model_does_not_wait_behind_the_other_model(gateway):
    with slow_engine_busy(gateway, waiting=3):
        answer = chat(gateway, "m-b")
        assert answer.status_code == 200, answer.text
        # Answered while the m-a requests still wait for their engine.
        assert queued(gateway) >= 3


def test_an_alias_half_of_which_no_engine_serves_is_answered_at_once(gateway):
    with slow_engine_busy(gateway, waiting=2):
        body = {"model": "canary", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answers = statuses(post_all(gateway.url, [(body, BATCH)] * 40))
        assert answers == {(200, None): 20, (404, "model_not_found"): 20}, answers
        # The m-a requests queued before them are still there, untouched.
        assert queued(gateway) >= 2


@pytest.fixture
def client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def line(i: int, model: str, max_tokens: int = 2) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": max_tokens}
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def test_a_batch_job_over_that_alias_completes(client):
    batch = wait_batch(client, submit(client, [line(i, "canary") for i in range(30)]).id, timeout=60)
    assert batch.status == "completed"
    assert (batch.request_counts.completed, batch.request_counts.failed) == (15, 15)


def test_cancelling_a_batch_completes_while_its_lines_are_running_and_queued(gateway, client):
    lines = [line(i, "m-a", max_tokens=3000) for i in range(30)]
    batch = submit(client, lines)
    assert wait_for(lambda: queued(gateway) >= 20, timeout=20), "the lines never reached the queue"
    client.batches.cancel(batch.id)
    done = wait_batch(client, batch.id, timeout=20)
    assert done.status == "cancelled"
    assert wait_for(lambda: queued(gateway) == 0, timeout=5)
    # The engine's slot came back: a new request for its model is served.
    assert chat(gateway, "m-a").status_code == 200
