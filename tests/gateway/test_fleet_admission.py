"""Two ``gateway serve`` replicas on one real ``redis-server`` admit to one simulated engine together:
with clients spread across them, the engine never holds more than one replica's limit; with Redis
killed mid-run each falls back to its safe share of the limit, says so, and still serves."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from tests.support.observe import log_lines, metric, wait_for
from tests.support.procs import Proc, start_engine, start_gateway
from tests.support.redis import RedisServer

pytestmark = pytest.mark.redis

LIMIT = 4  # the engine's limit, pinned: what is measured here is who fills it, not how it is learned
CLIENTS_PER_REPLICA = 6


class Load:
    """Streaming clients spread over the replicas, and the engine's own count of what it holds."""

    def __init__(self, replicas: list[Proc], engine: Proc) -> None:
        self.replicas = replicas
        self.engine = engine
        self.peak = 0.0
        self.samples = 0
        self.over = 0
        """Samples of the engine holding more than ``LIMIT``."""
        self.served = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Load:
        self._threads = [threading.Thread(target=self._watch, daemon=True)]
        for replica in self.replicas:
            for n in range(CLIENTS_PER_REPLICA):
                self._threads.append(threading.Thread(target=self._client, args=(replica, n), daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def measure(self, seconds: float) -> None:
        """Count the engine's peak afresh over the next ``seconds``."""
        self.peak, self.samples, self.over = 0.0, 0, 0
        time.sleep(seconds)

    def _client(self, replica: Proc, n: int) -> None:
        client = openai.OpenAI(base_url=replica.url + "/v1", api_key="none", max_retries=0, timeout=30)
        while not self._stop.is_set():
            try:
                stream = client.chat.completions.create(
                    model="sim-model",
                    messages=[{"role": "user", "content": f"client {n}: count slowly " * 8}],
                    max_tokens=24,
                    stream=True,
                )
                text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
                assert text
                self.served += 1
            except Exception as exc:  # recorded: the test fails on it with what it was
                self.failed.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.1)

    def _watch(self) -> None:
        with httpx.Client(timeout=5) as http:
            while not self._stop.is_set():
                text = http.get(self.engine.url + "/metrics").text
                held = sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))
                )
                self.peak = max(self.peak, held)
                self.samples += 1
                self.over += held > LIMIT
                time.sleep(0.005)


def test_replicas_fill_one_replicas_limit_together_and_a_safe_share_without_redis(procs, tmp_path):
    redis_server = RedisServer(tmp_path).start()
    try:
        engine = start_engine(tmp_path, "--token-delay-ms", "10")
        procs.append(engine)
        engine.wait_ready()
        config = {
            "pools": {"interactive": {"engines": [engine.url]}},
            "store": redis_server.url,
            "classes": {"interactive": {"ttft_p99_ms": 30000, "itl_p99_ms": 1000}},
            "admission": {"initial_limit": LIMIT, "min_limit": LIMIT, "max_limit": LIMIT},
        }
        replicas = [start_gateway(tmp_path, config) for _ in range(2)]
        procs.extend(replicas)
        for replica in replicas:
            replica.wait_ready("/ready")
            assert wait_for(lambda r=replica: metric(r.url, "gateway_routing_share_up") == 1), replica.log()
            assert wait_for(lambda r=replica: metric(r.url, "gateway_routing_share_peers") == 1, timeout=5)

        with Load(replicas, engine) as shared:
            # Twelve clients start at once, six on each replica: before either has heard of the
            # other's first requests, each may start only what it holds of the engine's slots.
            shared.measure(4)
        assert not shared.failed, shared.failed[:3]
        assert shared.served > 20
        # Twelve clients want more than the engine's limit: it is full, and never fuller than one
        # replica fills it (without sharing each replica fills the whole limit: twice as full).
        assert shared.peak == LIMIT, (shared.peak, shared.over, shared.samples)
        held = [metric(replica.url, "gateway_engine_held_slots") for replica in replicas]
        assert sum(held) <= LIMIT and all(held), held  # what each may fill: its own slots of the engine

        redis_server.kill()
        for replica in replicas:
            entered = wait_for(lambda r=replica: metric(r.url, "gateway_admission_safe_share") == 2, timeout=10)
            assert entered, replica.log()[-3000:]
            assert metric(replica.url, "gateway_engine_concurrency_limit") == LIMIT / 2
        with Load(replicas, engine) as alone:
            alone.measure(3)
        assert not alone.failed, alone.failed[:3]
        assert alone.served > 10
        assert alone.peak <= LIMIT, alone.peak  # each its own share: no race left
        for replica in replicas:
            entered = log_lines(replica.log_path.read_text(), "admission_safe_share")
            assert len(entered) == 1 and entered[0]["replicas"] == "2", entered

        redis_server.start()
        for replica in replicas:
            assert wait_for(lambda r=replica: metric(r.url, "gateway_admission_safe_share") == 0, timeout=15)
            assert wait_for(lambda r=replica: bool(log_lines(r.log_path.read_text(), "admission_safe_share_ended")))
            assert metric(replica.url, "gateway_engine_concurrency_limit") == LIMIT
    finally:
        redis_server.stop()
