"""The running gateway: configuration, core, engine monitor and metrics, wired together.

The HTTP layer and background loops call into one ``Gateway``; the pure core inside it
(the ``Dispatcher``) is the only place decisions are made.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from priority_gateway import log
from priority_gateway.adapters import AdapterLoader
from priority_gateway.auth import Authenticator
from priority_gateway.batch import BatchService
from priority_gateway.config import Config, ConfigError, PoolConfig
from priority_gateway.core.classes import Budget
from priority_gateway.core.dispatcher import AdmissionSettings, Dispatcher, PoolSpec
from priority_gateway.core.fleet import FleetSettings
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.fleet_channel import FleetChannel
from priority_gateway.keys import KeyAuthenticator
from priority_gateway.metrics import GatewayMetrics
from priority_gateway.models import Catalog
from priority_gateway.placement import Placement
from priority_gateway.ratelimit import RateLimiter
from priority_gateway.scheduler import Scheduler
from priority_gateway.sessions import SessionRecognition
from priority_gateway.store import describe_store, is_shared, open_store
from priority_gateway.tenant_metrics import TenantMetrics
from priority_gateway.tokenizers import load_tokenizer
from priority_gateway.upstream.h1 import EngineClient
from priority_gateway.upstream.kv_feed import KVFeed
from priority_gateway.upstream.monitor import EngineMonitor

if TYPE_CHECKING:
    from priority_gateway.http.tracing import Tracing

POLL_INTERVAL_S = 0.05
STORE_PING_S = 1.0
"""``/ready`` waits at most this long for the store to answer."""
STOP_STEP_S = 5.0
"""The most one step of ``Gateway.stop`` may take: a shutdown never waits on one part for ever."""


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
        growth=a.growth,
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
        sessions=config.sessions.settings(),
    )


def policy_options(config: Config, pool: PoolConfig) -> dict[str, object]:
    if pool.policy != "prefix":
        return {}
    options: dict[str, object] = {**asdict(config.prefix.policy), "precise": pool.kv_events is not None}
    options["prefill_chunk_tokens"] = pool.max_num_batched_tokens or 0
    if not config.admission.enabled:
        options["prefill_hold_s"] = 0.0  # a held request waits in the queue, which needs admission
    return options


def build_dispatcher(config: Config, fleet: FleetSettings | None = None) -> Dispatcher:
    return Dispatcher(
        [
            PoolSpec(
                name,
                list(pool.engines) if not pool.discovery else [],
                policy=pool.policy,
                takes_priority=pool.takes_priority,
                backfill=pool.backfill,
                accept_overflow=pool.accept_overflow,
                shares_hardware_with=pool.shares_hardware_with,
                seats=pool.max_num_seqs,
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
        fleet=fleet,
    )


def fleet_settings(config: Config) -> FleetSettings | None:
    """This replica's part in a fleet: replicas on a Redis store act as one (``fleet``); with ``sqlite`` or
    ``memory`` there is one replica."""
    fleet = config.fleet
    if not is_shared(config.store) or not fleet.enabled:
        return None
    secret = fleet.secret
    if secret is None and fleet.secret_file is not None:
        try:
            secret = Path(fleet.secret_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(
                f"cannot read the fleet's secret ({exc.strerror or exc})", ["fleet", "secret_file"]
            ) from None
    if not secret:
        log.warning(
            "fleet_channel_unsigned",
            channel=fleet.channel,
            effect="batches on the channel are not signed: set fleet.secret on every replica, and keep the channel "
            "to the gateways (Redis ACLs, network policy)",
        )
    return FleetSettings(
        os.urandom(16),
        silent_s=fleet.silent_s,
        window_s=fleet.replicas_window_s,
        settle_s=fleet.full_s,
        max_pending=fleet.max_pending,
        block_chars=config.prefix.block_chars,
        secret=secret.encode() if secret else None,
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


async def _bounded(step: str, work: Awaitable[object]) -> None:
    try:
        async with asyncio.timeout(STOP_STEP_S):
            await work
    except TimeoutError:
        log.warning("stop_step_timed_out", step=step, after_s=STOP_STEP_S)
    except Exception:
        log.error("stop_step_failed", exc_info=True, step=step)


class Gateway:
    def __init__(self, config: Config, auth: Authenticator | None = None) -> None:
        self.config = config
        self.metrics = GatewayMetrics()
        self.dispatcher = build_dispatcher(config, fleet_settings(config))
        self.metrics.watch_state(self.dispatcher.readings)
        self.tenant_metrics = TenantMetrics(self.metrics, config.tenants.metrics_limit)
        self.tenant_metrics.watch(self.dispatcher.readings)
        self.budgets: dict[str, Budget] = {cls: spec.budget for cls, spec in config.classes.by_name().items()}
        self.monitor = EngineMonitor(
            self.dispatcher,
            self._make_client,
            health_interval_s=config.health.interval_s,
            health_timeout_s=config.health.timeout_s,
            unhealthy_after=config.health.unhealthy_after,
            scrape_interval_s=config.scrape.interval_s,
        )
        self.store = open_store(config.store, config.keys.file, config.data_dir)
        self.keys = KeyAuthenticator(self.store, config.keys)
        self.auth: Authenticator = auth or self.keys
        self.limiter: RateLimiter | None = RateLimiter(self.store, decode_tokens=config.tenants.decode_tokens)
        self.batches = BatchService(self.store, config.batch, self.metrics, self.model_ids)
        self.catalog = Catalog(config, self.monitor)
        self.adapters = AdapterLoader(
            config.pools, self.dispatcher.engine, self.monitor, self.dispatcher.fleet.adapters_in_flight
        )
        self.scheduler = Scheduler(self.dispatcher)
        self._poller: asyncio.Task[None] | None = None
        self.store_answered = False
        """Whether the store has answered a ping since the start (``store_state``)."""
        self.on_stop: list[Callable[[], None]] = []
        self.tracing: Tracing | None = None
        """OpenTelemetry tracing, when the environment asks for it (``priority_gateway.http.tracing``)."""
        self.precise: dict[str, PrecisePool] = {
            name: PrecisePool(name, pool.tokenizer or "sim", self.dispatcher)
            for name, pool in config.pools.items()
            if pool.kv_events
        }
        self.placement = Placement(
            self._pool_for,
            self.catalog,
            self.precise,
            config.prefix.block_chars,
            config.prefix.block_tokens,
            SessionRecognition(config.sessions.sources, config.sessions.enabled),
        )
        self.kv_feeds: dict[str, KVFeed] = {
            name: KVFeed(name, pool.kv_events, self.dispatcher, pool.kv_events_topics, pool.kv_events_replay_port)
            for name, pool in config.pools.items()
            if pool.kv_events
        }
        self.fleet_channel: FleetChannel | None = None
        if self.dispatcher.fleet.shared:
            self.fleet_channel = FleetChannel(
                config.store, config.fleet, self.dispatcher.fleet, self.metrics, self.scheduler.carry_out
            )
        self.monitor.on_watch.append(self._engine_watched)
        self.monitor.on_unwatch.append(self._engine_unwatched)

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
        if self.fleet_channel is not None:
            self.fleet_channel.start()
        await self.store.open()
        await self.keys.start()
        self.batches.start()
        log.info(
            "gateway_started",
            pools=",".join(f"{n}:{len(p.engines) or p.discovery}" for n, p in self.config.pools.items()),
            store=describe_store(self.config.store, self.config.data_dir),
        )

    async def stop(self) -> None:
        """Stop every part, each within ``STOP_STEP_S``; a part that overruns is logged and left."""
        if self._poller is not None:
            self._poller.cancel()
            await _bounded("poller", asyncio.wait([self._poller]))
        if self.fleet_channel is not None:
            await _bounded("fleet_channel", self.fleet_channel.stop())
        await _bounded("batches", self.batches.stop())
        await _bounded("keys", self.keys.stop())
        await _bounded("store", self.store.close())
        await _bounded("monitor", self.monitor.close())
        for name, feed in self.kv_feeds.items():
            await _bounded(f"kv_feed {name}", feed.close())
        self.scheduler.close()
        for callback in self.on_stop:
            try:
                callback()
            except Exception:
                log.error("stop_callback_failed", exc_info=True)
        log.info("gateway_stopped")
        log.flush()

    async def store_state(self) -> dict[str, object]:
        """The store as ``/ready`` reports it: where it is, whether it answers now, and whether it has
        answered since the start (until then, the gateway cannot tell whether keys are required)."""
        reason = None
        try:
            async with asyncio.timeout(STORE_PING_S):
                ok = await self.store.ping()
        except TimeoutError:
            ok = False
        if ok:
            self.store_answered = True
        else:
            reason = f"no answer to a ping within {STORE_PING_S:g} s"
            if not self.store_answered:
                reason += (
                    "; none since the gateway started, so requests without a key get 503 store_unavailable,"
                    " and files, batches and keys are unavailable"
                )
        state: dict[str, object] = {"url": describe_store(self.config.store, self.config.data_dir), "ok": ok}
        if reason is not None:
            state["reason"] = reason
        return state

    async def _poll_loop(self) -> None:
        loop = asyncio.get_running_loop()
        lag = self.metrics.loop_lag
        while True:
            due = loop.time() + POLL_INTERVAL_S
            await asyncio.sleep(POLL_INTERVAL_S)
            # How late the timer ran is how long the loop was held by other work: free to measure here.
            lag.observe(max(0.0, loop.time() - due))
            self.scheduler.poll()

    # -- models ------------------------------------------------------------------------

    def model_ids(self) -> set[str]:
        return set(self.catalog.known())

    def _pool_for(self, cls: str, model: str) -> str:
        return self.dispatcher.pool_for(cls, model).name
