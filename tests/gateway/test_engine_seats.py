"""A pool that declares its engines' seats (``pools.<name>.max_num_seqs``, their ``--max-num-seqs``)
never has more requests on an engine than it runs: the rest wait in the gateway's queue, not in the
engine, where vLLM holds them for a running request to end whatever their TTFT budget. Real processes:
a simulated engine of 2 seats and ``gateway serve`` in front, with and without the setting, its limit
set well above the seats."""

from __future__ import annotations

import threading

import httpx

from tests.support.observe import metric, wait_for
from tests.support.procs import start_engine, start_gateway

SEATS = 2
REQUESTS = 6


def _stream(url: str, request_id: str, failed: list[str]) -> None:
    body = {"model": "sim-model", "prompt": "count slowly", "max_tokens": 80, "stream": True}
    try:
        with httpx.stream(
            "POST", url + "/v1/completions", json=body, headers={"x-request-id": request_id}, timeout=60
        ) as r:
            if r.status_code != 200:
                failed.append(f"{request_id}: {r.status_code}")
            for _ in r.iter_bytes():
                pass
    except httpx.HTTPError as exc:  # recorded: the test fails on it with what it was
        failed.append(f"{request_id}: {type(exc).__name__}: {exc}")


def _run(procs, tmp_path, declared: bool) -> tuple[str, str, list[threading.Thread], list[str]]:
    engine = start_engine(tmp_path, "--token-delay-ms", "20", "--max-num-seqs", str(SEATS))
    procs.append(engine)
    engine.wait_ready()
    pool: dict[str, object] = {"engines": [engine.url]}
    if declared:
        pool["max_num_seqs"] = SEATS
    config = {
        "pools": {"interactive": pool},
        "admission": {"initial_limit": 6, "min_limit": 6, "max_limit": 6},
        "classes": {"interactive": {"ttft_p99_ms": 30000, "itl_p99_ms": 1000}},
    }
    gateway = start_gateway(tmp_path, config)
    procs.append(gateway)
    gateway.wait_ready("/ready")
    failed: list[str] = []
    threads = [threading.Thread(target=_stream, args=(gateway.url, f"r{n}", failed)) for n in range(REQUESTS)]
    for thread in threads:
        thread.start()
    return engine.url, gateway.url, threads, failed


def test_a_pool_that_declares_its_engines_seats_keeps_the_rest_in_its_own_queue(procs, tmp_path):
    engine, gateway, threads, failed = _run(procs, tmp_path, declared=True)
    try:
        assert metric(gateway, "gateway_engine_concurrency_limit") == SEATS
        queued = REQUESTS - SEATS
        assert wait_for(lambda: metric(gateway, "gateway_queue_depth", pool="interactive") == queued), failed
        assert metric(engine, "vllm:num_requests_running") == SEATS
        assert metric(engine, "vllm:num_requests_waiting") == 0
    finally:
        for thread in threads:
            thread.join(timeout=60)
    assert not failed, failed


def test_without_it_the_requests_beyond_the_seats_wait_in_the_engine(procs, tmp_path):
    """The defect the setting removes: with a limit above the seats, the engine holds the rest waiting."""
    engine, gateway, threads, failed = _run(procs, tmp_path, declared=False)
    try:
        assert wait_for(lambda: metric(engine, "vllm:num_requests_waiting") == REQUESTS - SEATS), failed
        assert metric(gateway, "gateway_queue_depth", pool="interactive") == 0
    finally:
        for thread in threads:
            thread.join(timeout=60)
    assert not failed, failed
