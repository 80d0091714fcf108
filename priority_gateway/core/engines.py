"""What the core knows about one engine.

``pending_prefill`` counts prompt tokens the engine still has to compute for requests this
gateway sent it (their uncached part, as predicted), from dispatch to first token: the
work a new request would queue behind before its own first token. ``peer_prefill`` is the same
for other replicas' requests, as they last reported it.

The gateway's own in-flight count is exact for this replica; other replicas sharing routing
(``core/fleet``) report theirs (``peer_inflight``) every few ms; the engine's scraped
``running + waiting`` counts everyone's, also clients this gateway never hears of. Load combines
them: what we have in flight now, plus what the other replicas last reported, plus what else the
engine had at the last scrape. Without the reports, replicas that see the same scrape (every
few seconds) all pile onto the engine that looked idle until the next one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from priority_gateway.core.lora import AdapterSlots, LoraInfo


@dataclass(slots=True)
class EngineMetrics:
    """A scrape of one engine's vLLM ``/metrics`` (only what routing and admission use)."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    block_size: int | None = None
    num_blocks: int | None = None
    model: str | None = None
    itl_buckets: tuple[tuple[float, float], ...] | None = None
    """``vllm:inter_token_latency_seconds``: cumulative counts by upper bound (the last is +Inf)."""
    lora: LoraInfo | None = None
    """The newest ``vllm:lora_requests_info`` series (engines with ``--enable-lora``)."""


@dataclass(slots=True, eq=False)
class EngineState:
    id: str
    pool: str
    healthy: bool = True
    inflight: int = 0
    inflight_at_scrape: int = 0
    external_load: float = 0.0
    kv_usage: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    block_size: int = 16
    num_blocks: int = 0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    scraped_at: float | None = None
    pending_prefill: int = 0
    peer_inflight: int = 0
    peer_inflight_at_scrape: int = 0
    peer_prefill: int = 0
    """Pending prefill that other gateway replicas reported for this engine."""
    held_kv: int = 0
    """Tokens of KV cache this replica's paused sessions hold there (``core.sessions``)."""
    peer_held_kv: int = 0
    """The same for other replicas' paused sessions, as they last reported it."""
    inflight_by_class: dict[str, int] = field(default_factory=dict)
    models: frozenset[str] | None = None
    """Model and adapter names the engine lists in ``/v1/models``; None until it answered once."""
    adapters: AdapterSlots = field(default_factory=AdapterSlots)

    def serves(self, model: str) -> bool:
        models = self.models
        return models is None or model in models

    @property
    def load(self) -> float:
        return self.inflight + self.peer_inflight + self.external_load

    @property
    def queued_prefill(self) -> int:
        """Prompt tokens a new request would wait behind: this replica's and the others' reported."""
        return self.pending_prefill + self.peer_prefill

    def apply_scrape(self, m: EngineMetrics, now: float) -> None:
        self.external_load = max(0.0, m.running + m.waiting - self.inflight_at_scrape - self.peer_inflight_at_scrape)
        self.kv_usage = m.kv_usage
        self.running = m.running
        self.waiting = m.waiting
        self.prefix_queries = m.prefix_queries
        self.prefix_hits = m.prefix_hits
        if m.block_size:
            self.block_size = m.block_size
        if m.num_blocks:
            self.num_blocks = m.num_blocks
        if m.lora is not None:
            self.adapters.scraped(m.lora)
        self.scraped_at = now

    def mark_scrape_start(self) -> None:
        """Called when a scrape is sent, so the reply can be compared with what we had in flight."""
        self.inflight_at_scrape = self.inflight
        self.peer_inflight_at_scrape = self.peer_inflight

    def started(self, cls: str, adapter: str | None = None) -> None:
        self.inflight += 1
        self.inflight_by_class[cls] = self.inflight_by_class.get(cls, 0) + 1
        if adapter is not None:
            self.adapters.started(adapter)

    def finished(self, cls: str, adapter: str | None = None) -> None:
        self.inflight -= 1
        self.inflight_by_class[cls] -= 1
        if adapter is not None:
            self.adapters.finished(adapter)
