"""The running gateway: configuration, core, engine monitor and metrics, wired together.

The HTTP layer and background loops call into one ``Gateway``; the pure core inside it
(the ``Dispatcher``) is the only place decisions are made.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING

from priority_gateway import log
from priority_gateway.adapters import AdapterLoader
from priority_gateway.auth import Authenticator
from priority_gateway.batch import BatchService
from priority_gateway.config import Config, PoolConfig
from priority_gateway.core.classes import Budget
from priority_gateway.core.dispatcher import AdmissionSettings, Dispatcher, PoolSpec
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.keys import KeyAuthenticator
from priority_gateway.metrics import GatewayMetrics
from priority_gateway.models import Catalog
from priority_gateway.placement import Placement
from priority_gateway.ratelimit import RateLimiter
from priority_gateway.routing_share import RoutingShare
from priority_gateway.scheduler import Scheduler
from priority_gateway.store import open_store
from priority_gateway.tenant_metrics import TenantMetrics
from priority_gateway.tokenizers import load_tokenizer
from priority_gateway.upstream.h1 import EngineClient
from priority_gateway.upstream.kv_feed import KVFeed
from priority_gateway.upstream.monitor import EngineMonitor

if TYPE_CHECKING:
    from priority_gateway.http.tracing import Tracing

POLL_INTERVAL_S = 0.05


def admission_settings(config: Config) -> AdmissionSettings:
    a = config.admission
    limits = LimitSettings(
        initial=a.initial_limit,
        minimum=a.min_limit,
        maximum=a.max_limit,
        interval_s=a.interval_s,
        cooldown_s=a.cooldown_s,
        window_s=a.window_s,
        recover_s=a.recover_s,
        min_samples=a.min_samples,
        unbudgeted=a.unbudgeted_limit,
    )
    return AdmissionSettings(
        enabled=a.enabled,
        limits=limits,
        max_queue=a.max_queue,
        backfill_reserve=a.backfill_reserve,
        fair=config.tenants.fair,
        decode_tokens=config.tenants.decode_tokens,
    )


def policy_options(config: Config, pool: PoolConfig) -> dict[str, object]:
    if pool.policy != "prefix":
        return {}
    return {**asdict(config.prefix.policy), "precise": pool.kv_events is not None}


def build_dispatcher(config: Config) -> Dispatcher:
    return Dispatcher(
        [
            PoolSpec(
                name,
                list(pool.engines) if not pool.discovery else [],
                policy=pool.policy,
                takes_priority=pool.takes_priority,
                backfill=pool.backfill,
                accept_overflow=pool.accept_overflow,
                policy_options=policy_options(config, pool),
                models=(*pool.models, *([pool.model] if pool.model else [])),
                loadable=tuple(pool.lora_adapters),
            )
            for name, pool in config.pools.items()
        ],
        home=config.home_pools(),
        budgets={cls: spec.budget.itl_s for cls, spec in config.classes.by_name().items()},
        admission=admission_settings(config),
        classes=config.classes.table(),
    )


class PrecisePool:
    """What the request path needs for a pool in precise prefix mode."""

    def __init__(self, name: str, tokenizer: str, dispatcher: Dispatcher) -> None:
        self.name = name
        self.tokenizer = load_tokenizer(tokenizer)
        self._dispatcher = dispatcher

    def block_size(self) -> int:
        """The engines' KV block size (from ``vllm:cache_config_info``; vLLM's GPU default before a scrape)."""
        sizes = [e.block_size for e in self._dispatcher.pools[self.name].engines if e.scraped_at is not None]
        return max(sizes) if sizes else 16


class Gateway:
    def __init__(self, config: Config, auth: Authenticator | None = None) -> None:
        self.config = config
        self.metrics = GatewayMetrics()
        self.dispatcher = build_dispatcher(config)
        self.metrics.watch_state(self.dispatcher)
        self.tenant_metrics = TenantMetrics(self.metrics, config.tenants.metrics_limit)
        self.tenant_metrics.watch(self.dispatcher)
        self.budgets: dict[str, Budget] = {cls: spec.budget for cls, spec in config.classes.by_name().items()}
        self.monitor = EngineMonitor(
            self.dispatcher,
            self._make_client,
            health_interval_s=config.health.interval_s,
            health_timeout_s=config.health.timeout_s,
            unhealthy_after=config.health.unhealthy_after,
            scrape_interval_s=config.scrape.interval_s,
        )
        self.store = open_store(config.store, config.keys.file)
        self.keys = KeyAuthenticator(self.store, config.keys)
        self.auth: Authenticator = auth or self.keys
        self.limiter: RateLimiter | None = RateLimiter(self.store)
        self.batches = BatchService(self.store, config.batch, self.metrics, self.model_ids)
        self.catalog = Catalog(config, self.monitor)
        self.adapters = AdapterLoader(config.pools, self.dispatcher.engine, self.monitor)
        self.scheduler = Scheduler(self.dispatcher)
        self._poller: asyncio.Task[None] | None = None
        self.on_stop: list[Callable[[], None]] = []
        self.tracing: Tracing | None = None
        """OpenTelemetry tracing, when the environment asks for it (``priority_gateway.http.tracing``)."""
        self.precise: dict[str, PrecisePool] = {
            name: PrecisePool(name, pool.tokenizer or "sim", self.dispatcher)
            for name, pool in config.pools.items()
            if pool.kv_events
        }
        self.placement = Placement(
            self._pool_for, self.catalog, self.precise, config.prefix.block_chars, config.prefix.block_tokens
        )
        self.kv_feeds: dict[str, KVFeed] = {
            name: KVFeed(name, pool.kv_events, self.dispatcher, pool.kv_events_topics)
            for name, pool in config.pools.items()
            if pool.kv_events
        }
        self.routing_share = self._routing_share(config)
        self.monitor.on_watch.append(self._engine_watched)
        self.monitor.on_unwatch.append(self._engine_unwatched)

    def _routing_share(self, config: Config) -> RoutingShare | None:
        """Replicas on Redis share what they route (``prefix.share``), their load and their tenants, whatever
        the pools' routing policy; with ``memory`` there is one replica."""
        share = config.prefix.share
        if config.store == "memory" or not share.enabled:
            return None
        return RoutingShare(
            config.store,
            share,
            self.dispatcher,
            self.metrics,
            config.prefix.block_chars,
            on_granted=self.scheduler.admit_granted,
        )

    def _engine_watched(self, engine_id: str, pool: str) -> None:
        feed = self.kv_feeds.get(pool)
        if feed is not None:
            feed.engine_added(engine_id)

    async def _engine_unwatched(self, engine_id: str, pool: str) -> None:
        feed = self.kv_feeds.get(pool)
        if feed is not None:
            await feed.engine_removed(engine_id)

    def _make_client(self, engine_id: str, pool: str) -> EngineClient:
        return EngineClient(
            engine_id,
            connect_timeout=self.config.upstream.connect_timeout_s,
            read_timeout=self.config.upstream.read_timeout_s,
            api_key=self.config.pools[pool].api_key,
            ca_file=self.config.pools[pool].ca_file,
        )

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        for cls, budget in self.budgets.items():
            for kind, value in (("ttft_p99", budget.ttft_s), ("itl_p99", budget.itl_s)):
                if value is not None:
                    self.metrics.slo_budget.labels(cls, kind).set(value)
        for feed in self.kv_feeds.values():
            feed.start()
        for name, pool in self.config.pools.items():
            if pool.discovery:
                self.monitor.discover(name, pool.discovery, pool.discovery_interval_s)
            else:
                for url in pool.engines:
                    self.monitor.watch(url, name)
        self._poller = asyncio.create_task(self._poll_loop(), name="dispatcher poll")
        if self.routing_share is not None:
            self.routing_share.start()
        await self.store.open()
        await self.keys.start()
        self.batches.start()
        log.info(
            "gateway_started",
            pools=",".join(f"{n}:{len(p.engines) or p.discovery}" for n, p in self.config.pools.items()),
            store=self.config.store,
        )

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self.routing_share is not None:
            await self.routing_share.stop()
        await self.batches.stop()
        await self.keys.stop()
        await self.store.close()
        await self.monitor.close()
        for feed in self.kv_feeds.values():
            await feed.close()
        self.scheduler.close()
        for callback in self.on_stop:
            callback()
        log.info("gateway_stopped")

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            self.scheduler.poll()

    # -- models ------------------------------------------------------------------------

    def model_ids(self) -> set[str]:
        return set(self.catalog.known())

    def _pool_for(self, cls: str, model: str) -> str:
        return self.dispatcher.pool_for(cls, model).name
