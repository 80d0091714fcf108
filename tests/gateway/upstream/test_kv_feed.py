"""Precise prefix mode end to end: simulated engines publish KV events, the gateway routes by them."""

from __future__ import annotations

import httpx

from tests.support.observe import metric, wait_for
from tests.support.procs import free_port, start_engine, start_gateway

MODEL = "sim-model"


def test_requests_follow_the_blocks_engines_report(procs, tmp_path):
    events_port = free_port()
    endpoint = f"tcp://127.0.0.1:{events_port}"
    ports = [free_port(), free_port()]
    engines = [
        start_engine(
            tmp_path,
            "--token-delay-ms",
            "1",
            "--kv-events-endpoint",
            endpoint,
            "--kv-events-topic",
            f"http://127.0.0.1:{port}",
            port=port,
        )
        for port in ports
    ]
    procs.extend(engines)
    for engine in engines:
        engine.wait_ready()
    config = {
        "pools": {"interactive": {"engines": [e.url for e in engines], "kv_events": endpoint, "tokenizer": "sim"}},
        "scrape": {"interval_s": 0.3},
    }
    gateway = start_gateway(tmp_path, config)
    procs.append(gateway)
    gateway.wait_ready("/ready")
    # Let both engines' publishers connect and the gateway learn their block size.
    assert wait_for(lambda: "gateway_engine_kv_cache_usage{" in httpx.get(gateway.url + "/metrics").text)

    def ask(text: str) -> httpx.Response:
        body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}
        return httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30)

    documents = [f"document {n}: " + f"the facts of case {n} in detail " * 40 for n in range(4)]
    for doc in documents:
        assert ask(doc + " question one").status_code == 200

    def affinity() -> float:
        return metric(gateway.url, "gateway_routing_decisions_total", reason="affinity")

    before_hits = sum(metric(e.url, "vllm:prefix_cache_hits_total") for e in engines)
    assert affinity() == 0  # routing alone records nothing in precise mode
    for doc in documents:
        assert ask(doc + " question two").status_code == 200
    assert affinity() >= 4
    hits = sum(metric(e.url, "vllm:prefix_cache_hits_total") for e in engines) - before_hits
    # Every follow-up found its document's blocks where the events said they were.
    assert hits >= 4 * 16 * 16
