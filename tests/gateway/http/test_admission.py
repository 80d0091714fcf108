"""SLO admission over real HTTP: refusals with Retry-After, budgets, batch preempted for interactive."""

from __future__ import annotations

import concurrent.futures as cf

import httpx
import pytest

from tests.support.observe import metric, wait_for
from tests.support.procs import start_engine, start_gateway

MODEL = "sim-model"


def engines_and_gateway(procs, tmp, admission: dict) -> dict:
    """One interactive and one batch simulated engine behind a gateway with these admission settings."""
    interactive = start_engine(tmp, "--token-delay-ms", "20")
    batch = start_engine(tmp, "--token-delay-ms", "20", "--scheduling-policy", "priority")
    procs.extend([interactive, batch])
    interactive.wait_ready()
    batch.wait_ready()
    config = {
        "pools": {
            "interactive": {"engines": [interactive.url], "policy": "least_loaded"},
            "batch": {"engines": [batch.url], "scheduling_policy": "priority", "policy": "least_loaded"},
        },
        "admission": admission,
        "health": {"interval_s": 0.5},
    }
    gateway = start_gateway(tmp, config)
    procs.append(gateway)
    gateway.wait_ready("/ready")
    return {"gateway": gateway, "interactive": interactive, "batch": batch}


@pytest.fixture(scope="module")
def tight(procs, tmp_path_factory):
    """Each engine allowed a single request at a time."""
    admission = {"initial_limit": 1, "max_limit": 1, "unbudgeted_limit": 1, "backfill_reserve": 0}
    return engines_and_gateway(procs, tmp_path_factory.mktemp("admission"), admission)


@pytest.fixture(scope="module")
def lending(procs, tmp_path_factory):
    """An interactive engine of two slots, one of which it may lend to batch, and a one-slot batch engine."""
    admission = {"initial_limit": 2, "max_limit": 2, "unbudgeted_limit": 1, "backfill_reserve": 0}
    return engines_and_gateway(procs, tmp_path_factory.mktemp("lending"), admission)


def chat(url: str, max_tokens: int, priority: str = "interactive", headers: dict | None = None) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    return httpx.post(
        url + "/v1/chat/completions", json=body, timeout=60, headers={"x-priority": priority, **(headers or {})}
    )


def running(engine) -> float:
    return metric(engine.url, "vllm:num_requests_running")


def test_over_budget_interactive_gets_429_with_retry_after(tight):
    url = tight["gateway"].url
    with cf.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: chat(url, 60), range(4)))
    statuses = sorted(r.status_code for r in answers)
    assert statuses[0] == 200
    refused = [r for r in answers if r.status_code == 429]
    assert refused, statuses
    for r in refused:
        assert int(r.headers["retry-after"]) >= 1
        error = r.json()["error"]
        assert error["code"] == "slo_budget_exceeded"
        assert set(error) == {"message", "type", "param", "code"}


def test_headers_cannot_loosen_the_budget(tight):
    url = tight["gateway"].url
    loose = {"x-slo-ttft-ms": "600000", "x-slo-tpot-ms": "100000"}
    with cf.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: chat(url, 60, headers=loose), range(4)))
    assert any(r.status_code == 429 for r in answers)


def test_backfilled_batch_is_preempted_for_interactive_and_still_completes(lending):
    url = lending["gateway"].url
    aborted_before = metric(lending["interactive"].url, "vllm:request_success_total", finished_reason="abort")
    interactive_running = running(lending["interactive"])
    with cf.ThreadPoolExecutor(4) as pool:
        first = pool.submit(chat, url, 100, "batch")  # the batch engine
        assert wait_for(lambda: running(lending["batch"]) == 1)
        second = pool.submit(chat, url, 100, "batch")  # backfilled onto the interactive engine's spare slot
        assert wait_for(lambda: running(lending["interactive"]) == interactive_running + 1)
        reserved = pool.submit(chat, url, 60, "interactive")  # the slot kept in reserve
        assert wait_for(lambda: running(lending["interactive"]) == interactive_running + 2)
        interactive = pool.submit(chat, url, 10, "interactive")  # room only by stopping the batch request
        answers = [first.result(), second.result(), reserved.result(), interactive.result()]
    assert [r.status_code for r in answers] == [200, 200, 200, 200]
    assert [r.headers["x-gateway-pool"] for r in answers[2:]] == ["interactive", "interactive"]
    assert answers[1].json()["usage"]["completion_tokens"] == 100
    aborted = metric(lending["interactive"].url, "vllm:request_success_total", finished_reason="abort")
    assert aborted == aborted_before + 1
    text = httpx.get(url + "/metrics").text
    assert 'gateway_routing_decisions_total{engine="' in text and 'reason="preempted_backfill"' in text


def test_backfill_leaves_a_one_slot_interactive_engine_alone(tight):
    url = tight["gateway"].url
    with cf.ThreadPoolExecutor(2) as pool:
        # The batch engine, for 5 s: on a busy machine the checks below can take more than a second.
        first = pool.submit(chat, url, 250, "batch")
        assert wait_for(lambda: running(tight["batch"]) == 1)
        second = pool.submit(chat, url, 10, "batch")  # waits for the batch engine, not the interactive slot
        queued = {"pool": "batch", "class": "batch"}
        assert wait_for(lambda: metric(tight["gateway"].url, "gateway_queue_depth", **queued) == 1)
        assert running(tight["interactive"]) == 0
        answers = [first.result(), second.result()]
    assert [r.headers["x-gateway-pool"] for r in answers] == ["batch", "batch"]
