"""Precise prefix mode end to end: simulated engines publish KV events, the gateway routes by them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from priority_gateway.core.kv_events import BlockRemoved
from priority_gateway.engines.sim.kv_events import ZmqPublisher
from priority_gateway.upstream.kv_feed import KVFeed
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


class AppliedEvents:
    """Where the feed hands each engine's events (the dispatcher's ``apply_kv_events``)."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[object], bool]] = []

    def apply_kv_events(self, engine: str, events: list[object], restarted: bool) -> None:
        self.batches.append((engine, list(events), restarted))


async def publish_until(engine: ZmqPublisher, arrived: Callable[[], bool]) -> None:
    for _ in range(250):
        engine.publish([BlockRemoved([engine.seq])])
        await asyncio.sleep(0.02)
        if arrived():
            return
    raise AssertionError("no events arrived")


async def test_with_a_replay_port_a_gap_in_an_engines_events_is_replayed_not_forgotten():
    port, replay_port = free_port(), free_port()
    engine = ZmqPublisher(f"tcp://*:{port}", replay_endpoint=f"tcp://*:{replay_port}")
    applied = AppliedEvents()
    feed = KVFeed("interactive", f"engine-port:{port}", applied, replay_port=replay_port)  # type: ignore[arg-type]
    url = "http://127.0.0.1:8101"
    try:
        feed.engine_added(url)
        await publish_until(engine, lambda: bool(applied.batches))  # a subscription takes a moment
        await feed.engine_removed(url)  # the gateway loses the engine's events for a while
        lost = [engine.seq + i for i in range(3)]
        for h in lost:
            engine.publish([BlockRemoved([h])])
        feed.engine_added(url)
        seen = len(applied.batches)
        await publish_until(engine, lambda: len(applied.batches) > seen)
        hashes = [e.block_hashes[0] for _, events, _ in applied.batches for e in events]  # type: ignore[attr-defined]
        assert all(h in hashes for h in lost)
        assert hashes == sorted(hashes) and len(hashes) == len(set(hashes))
        assert not any(restarted for _, _, restarted in applied.batches)  # nothing forgotten
        assert (feed.subscriber.stats.replays, feed.subscriber.stats.gaps) == (1, 0)
    finally:
        await feed.close()
        engine.close()
