"""The gateway's own Prometheus metrics (prefix ``gateway_``), in a registry of its own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from priority_gateway.core.engines import EngineState

# Buckets resolve the SLO region finely (tens of ms for ITL, hundreds for TTFT).
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
TOKEN_BUCKETS = (0, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
SHARE_DELAY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._add_request_metrics(self.registry)
        self._add_fleet_metrics(self.registry)
        self.queued_bytes = Gauge(
            "gateway_queued_body_bytes",
            "Bytes of request bodies waiting in a pool's queue.",
            ("pool",),
            registry=self.registry,
        )
        self.loop_lag = Histogram(
            "gateway_event_loop_lag_seconds",
            "How late the event loop ran the dispatcher's poll timer (every 50 ms): how long other work held "
            "the loop, which every request waiting on it waits too.",
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )

    def _add_request_metrics(self, r: CollectorRegistry) -> None:
        """What became of requests: answers, latencies, routing and admission decisions, batch lines."""
        self.requests = Counter(
            "gateway_requests",
            "Requests answered, by class, pool and HTTP status.",
            ("class", "pool", "status"),
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_ttft_seconds",
            "Time to first token of streamed responses, as the gateway saw it.",
            ("class", "pool"),
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "gateway_itl_seconds",
            "Gaps between streamed events of a response, as the gateway saw them.",
            ("class", "pool"),
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.routing = Counter(
            "gateway_routing_decisions",
            "Engine choices, by the reason the engine was chosen.",
            ("pool", "engine", "reason"),
            registry=r,
        )
        self.predicted_cached = Histogram(
            "gateway_predicted_cached_tokens",
            "Prompt tokens the router expected the chosen engine to hold in its prefix cache.",
            ("pool",),
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.admission = Counter(
            "gateway_admission", "Admission decisions by class.", ("class", "decision"), registry=r
        )
        self.queue_wait = Histogram(
            "gateway_queue_wait_seconds",
            "Time requests waited in the gateway.",
            ("class",),
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.slo_budget = Gauge(
            "gateway_slo_budget_seconds", "Latency budget of a class (p99).", ("class", "kind"), registry=r
        )
        self.upstream_errors = Counter(
            "gateway_upstream_errors", "Failures talking to engines.", ("pool", "engine", "kind"), registry=r
        )
        self.retries = Counter("gateway_retries", "Requests retried on another engine.", ("pool",), registry=r)
        self.batch_requests = Counter(
            "gateway_batch_requests", "Batch job lines finished, by outcome.", ("status",), registry=r
        )
        self.batches = Gauge("gateway_batches", "Batch jobs by status.", ("status",), registry=r)

    def _add_fleet_metrics(self, r: CollectorRegistry) -> None:
        """The replicas' routing channel: whether it is up, who is heard, what crosses it and how late."""
        self.share_up = Gauge(
            "gateway_routing_share_up",
            "1 while this replica hears the other replicas' routing (the fleet channel over Redis), else 0.",
            registry=r,
        )
        self.safe_share = Gauge(
            "gateway_admission_safe_share",
            "Replicas each engine's concurrency limit is split among while the routing channel is down "
            "(this replica admits its share alone); 0 while admission counts every replica's in-flight.",
            registry=r,
        )
        self.share_peers = Gauge(
            "gateway_routing_share_peers", "Other replicas heard on the routing channel lately.", registry=r
        )
        self.tenant_share_replicas = Gauge(
            "gateway_tenant_share_replicas",
            "Replicas whose requests count in this replica's tenant fair shares, itself included (1: its own "
            "only, as while the routing channel is down).",
            registry=r,
        )
        self.share_batches = Counter(
            "gateway_routing_share_batches",
            "Routing batches: sent, received, dropped (not sent: channel down), missed (gaps in a peer's "
            "sequence), rejected (malformed, or another block width).",
            ("event",),
            registry=r,
        )
        self.share_facts = Counter(
            "gateway_routing_share_facts", "Routing facts sent, and received and applied.", ("direction",), registry=r
        )
        self.share_bytes = Counter(
            "gateway_routing_share_bytes", "Bytes of routing batches sent and received.", ("direction",), registry=r
        )
        self.share_delay = Histogram(
            "gateway_routing_share_delay_seconds",
            "From a routing batch's sending to its arrival here (wall clocks of two hosts).",
            buckets=SHARE_DELAY_BUCKETS,
            registry=r,
        )

    def watch_state(self, state: StateSource) -> None:
        """Export engine and queue state read at scrape time, so the hot path pays nothing for it."""
        self.registry.register(_StateCollector(state))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    @staticmethod
    def forget(metric: MetricWrapperBase, *labels: str) -> None:
        with contextlib.suppress(KeyError):
            metric.remove(*labels)


def observe_times(histogram: Any, value: float, times: int) -> None:
    """``times`` observations of ``value`` in a histogram (a labelled child) at the cost of one: the
    events of a stream that one read delivered together."""
    buckets = getattr(histogram, "_buckets", None)
    bounds = getattr(histogram, "_upper_bounds", None)
    total = getattr(histogram, "_sum", None)
    if times == 1 or buckets is None or bounds is None or total is None:
        for _ in range(times):
            histogram.observe(value)
        return
    total.inc(value * times)
    for bucket, bound in zip(buckets, bounds, strict=True):
        if value <= bound:
            bucket.inc(times)
            return


class StateSource(Protocol):
    def engines(self) -> list[EngineState]: ...

    def queue_depths(self) -> dict[tuple[str, str], int]: ...

    def prefix_hit_estimates(self) -> dict[str, float]: ...

    def concurrency_limits(self) -> dict[str, float]: ...

    def ttft_models(self) -> dict[str, tuple[float, tuple[float, float] | None]]: ...

    def held_slots(self) -> dict[str, int]: ...


class _StateCollector(Collector):
    def __init__(self, state: StateSource) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        yield from self._admission_state()
        depth = GaugeMetricFamily("gateway_queue_depth", "Requests waiting in the gateway.", labels=("pool", "class"))
        for (pool, cls), n in self.state.queue_depths().items():
            depth.add_metric((pool, cls), n)
        yield depth
        ratio = GaugeMetricFamily(
            "gateway_prefix_hit_ratio_estimate",
            "Predicted share of prompt tokens served from engines' prefix caches.",
            labels=("pool",),
        )
        for pool, value in self.state.prefix_hit_estimates().items():
            ratio.add_metric((pool,), value)
        yield ratio
        margin = GaugeMetricFamily(
            "gateway_pool_ttft_margin",
            "What admission multiplies a predicted first token by against the TTFT budget: raised by each first"
            " token that came late, lowered slowly by those in time. High, it holds requests back (queued, then"
            " refused slo_budget_exceeded) while the engines have room.",
            labels=("pool",),
        )
        line = GaugeMetricFamily(
            "gateway_pool_first_token_line_seconds",
            "The first token admission predicts on an engine of the pool: fixed, at no prefill ahead, plus"
            " per_1k_tokens for each 1,000 uncached prompt tokens ahead (gateway_engine_pending_prefill_tokens and its"
            " own), learned from recent first tokens.",
            labels=("pool", "term"),
        )
        for pool, (value, fitted) in self.state.ttft_models().items():
            margin.add_metric((pool,), value)
            if fitted is not None:
                line.add_metric((pool, "fixed"), fitted[0])
                line.add_metric((pool, "per_1k_tokens"), 1000.0 * fitted[1])
        yield margin
        yield line
        yield from self._engine_state()

    def _admission_state(self) -> tuple[Metric, ...]:
        """What admission knows of each engine: in flight, healthy, its limit and the slots held of it."""
        inflight = GaugeMetricFamily("gateway_inflight", "Requests in flight to an engine.", labels=("pool", "engine"))
        healthy = GaugeMetricFamily(
            "gateway_engine_healthy", "1 while the engine passes health checks.", labels=("pool", "engine")
        )
        limit = GaugeMetricFamily(
            "gateway_engine_concurrency_limit",
            "Adaptive concurrency limit of an engine as admission applies it: the mean of the replicas' learned, "
            "or this replica's safe share of it while the routing channel is down.",
            labels=("pool", "engine"),
        )
        held = GaugeMetricFamily(
            "gateway_engine_held_slots",
            "Slots of the engine this replica holds, as the replicas agree through the routing channel: it fills"
            " no more (only while it hears other replicas).",
            labels=("pool", "engine"),
        )
        limits = self.state.concurrency_limits()
        holdings = self.state.held_slots()
        for engine in self.state.engines():
            inflight.add_metric((engine.pool, engine.id), engine.inflight)
            healthy.add_metric((engine.pool, engine.id), 1.0 if engine.healthy else 0.0)
            if engine.id in limits:
                limit.add_metric((engine.pool, engine.id), limits[engine.id])
            if engine.id in holdings:
                held.add_metric((engine.pool, engine.id), holdings[engine.id])
        return inflight, healthy, limit, held

    def _engine_state(self) -> tuple[Metric, ...]:
        """What each engine reported at its last scrape, and what routing counts on it."""
        kv = GaugeMetricFamily(
            "gateway_engine_kv_cache_usage",
            "The engine's own vllm:kv_cache_usage_perc at the last scrape (0-1).",
            labels=("pool", "engine"),
        )
        requests = GaugeMetricFamily(
            "gateway_engine_requests",
            "The engine's own running and waiting request counts at the last scrape (all gateway replicas).",
            labels=("pool", "engine", "state"),
        )
        pending = GaugeMetricFamily(
            "gateway_engine_pending_prefill_tokens",
            "Uncached prompt tokens this replica sent to the engine that have not reached their first token.",
            labels=("pool", "engine"),
        )
        peers = GaugeMetricFamily(
            "gateway_engine_peer_inflight",
            "Requests the other replicas last reported in flight to the engine (the fleet channel).",
            labels=("pool", "engine"),
        )
        sessions = GaugeMetricFamily(
            "gateway_engine_session_kv_held_tokens",
            "Tokens of KV cache paused agent sessions hold on the engine, by whose sessions (this replica's,"
            " the other replicas' as they last reported): what routing counts as taken, up to the engine's free"
            " KV cache.",
            labels=("pool", "engine", "replica"),
        )
        lora = GaugeMetricFamily(
            "gateway_engine_lora_adapters",
            "LoRA adapters of the engine: its max_lora slots, and those holding one (vllm:lora_requests_info at the"
            " last scrape, plus this replica's requests in flight).",
            labels=("pool", "engine", "state"),
        )
        for engine in self.state.engines():
            labels = (engine.pool, engine.id)
            if engine.adapters.max_lora is not None:
                lora.add_metric((*labels, "max_lora"), engine.adapters.max_lora)
                lora.add_metric((*labels, "busy"), len(engine.adapters.busy()))
            if engine.scraped_at is not None:
                kv.add_metric(labels, engine.kv_usage)
                requests.add_metric((*labels, "running"), engine.running)
                requests.add_metric((*labels, "waiting"), engine.waiting)
            pending.add_metric(labels, engine.pending_prefill)
            peers.add_metric(labels, engine.peer_inflight)
            sessions.add_metric((*labels, "own"), engine.held_kv)
            sessions.add_metric((*labels, "others"), engine.peer_held_kv)
        return kv, requests, pending, peers, sessions, lora
