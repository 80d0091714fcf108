"""The fleet's channel over Redis pub/sub: bytes between the replicas' ``Fleet``s, nothing more (``fleet``).

Rules:
- Every rule of what to tell and what a batch heard changes is the core's (``core/fleet``); this
  module moves bytes, keeps the wall clock, carries the decisions out and says what happened.
- Every ``interval_s`` the fleet's ``outgoing`` batch goes out in one PUBLISH; every ``full_s`` a full
  one (everything this replica has, also its heartbeat), even when nothing changed. Nothing here runs
  on a request's path: the request path only leaves state in the core for the next batch.
- One connection subscribes; another publishes. Redis delivers every batch to every subscriber in one
  order, this replica's own included, and every batch goes to the fleet as it comes (``receive``):
  slots granted start queued requests at once.
- The channel is down when the subscription fails, or when this replica has not heard its own
  heartbeat for ``silent_s``: the fleet is told (``channel_lost``), ``gateway_routing_share_up`` goes
  to 0 and ``routing_share_lost`` is logged once; it subscribes again with backoff, tells the fleet
  (``channel_up``) and logs ``routing_share_resumed``. The safe share's start and end are logged
  (``admission_safe_share``, ``admission_safe_share_ended``) and set ``gateway_admission_safe_share``.
- A batch whose PUBLISH fails goes out again before the next one (after Redis restarts, the first
  PUBLISH often meets a pooled connection that died with it); if that fails too, it is dropped
  (counted): the next full batch says everything again.
- Batches the fleet refuses (malformed, forged, of another version or secret, another block width)
  and batches missed (gaps in a publisher's sequence) are counted and logged at most once per
  ``LOG_EVERY_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from priority_gateway import log
from priority_gateway.config import FleetConfig
from priority_gateway.core.decisions import Decisions
from priority_gateway.core.fleet import Fleet, FleetDecisions
from priority_gateway.core.fleet.replica import Dropped, Heard, Missed, Rejected, SafeShareBegan, SafeShareEnded, Sent
from priority_gateway.metrics import GatewayMetrics

LOG_EVERY_S = 10.0
MAX_BACKOFF_S = 5.0


class FleetChannel:
    def __init__(
        self,
        url: str,
        settings: FleetConfig,
        fleet: Fleet,
        metrics: GatewayMetrics,
        carry_out: Callable[[Decisions], None],
    ) -> None:
        self.url = url
        self.settings = settings
        self.fleet = fleet
        self.metrics = metrics
        self.carry_out = carry_out
        self.up = False
        self._state = "starting"
        self._down_since = time.monotonic()
        self._heard_self = time.monotonic()
        self._unsent: bytes | None = None
        self._logged: dict[str, float] = {}
        self._publisher_client: aioredis.Redis | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.metrics.share_up.set(0)
        self.metrics.safe_share.set(0)
        self._publisher_client = self._client()
        self._tasks = [
            asyncio.create_task(self._subscribe_loop(), name="fleet channel: subscribe"),
            asyncio.create_task(self._publish_loop(), name="fleet channel: publish"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._publisher_client is not None:
            await self._publisher_client.aclose()

    def _client(self) -> aioredis.Redis:
        return aioredis.Redis.from_url(self.url, socket_connect_timeout=1.0, socket_timeout=2.0)

    # -- receiving -----------------------------------------------------------------------

    async def _subscribe_loop(self) -> None:
        backoff = 0.1
        while True:
            client = self._client()
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.settings.channel)
                self._heard_self = time.monotonic()
                self._resumed()
                backoff = 0.1
                while True:
                    message = await pubsub.get_message(timeout=self.settings.full_s)
                    if message is not None and message.get("type") == "message":
                        data = message["data"]
                        self.metrics.share_bytes.labels("received").inc(len(data))
                        self._carry(self.fleet.receive(data, time.monotonic()))
                    if time.monotonic() - self._heard_self > self.settings.silent_s:
                        raise ConnectionError(f"own heartbeat not heard for {self.settings.silent_s:g} s")
            except (RedisError, OSError) as exc:
                self._lost(f"{type(exc).__name__}: {exc}")
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # untyped before redis-py 8.2
                with contextlib.suppress(RedisError, OSError):
                    await client.aclose()
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)

    # -- sending --------------------------------------------------------------------------

    async def _publish_loop(self) -> None:
        settings = self.settings
        next_full = time.monotonic() + settings.full_s
        while True:
            await asyncio.sleep(settings.interval_s)
            now = time.monotonic()
            full = now >= next_full
            if full:
                next_full = now + settings.full_s
            decided = self.fleet.outgoing(now, full, sent_at=time.time())
            self._carry(decided)
            if full:
                self.metrics.share_peers.set(self.fleet.peers)
                self.metrics.tenant_share_replicas.set(1 + self.fleet.peers if self.fleet.shares_tenants else 1)
            if self._unsent is not None:
                retry, self._unsent = self._unsent, None
                if not await self._publish(retry):
                    self.metrics.share_batches.labels("dropped").inc()
            if decided.send is not None and not await self._publish(decided.send):
                # Often a pooled connection that died while Redis restarted: the next try gets a new one.
                self._unsent = decided.send

    async def _publish(self, data: bytes) -> bool:
        assert self._publisher_client is not None
        try:
            await self._publisher_client.publish(self.settings.channel, data)
        except (RedisError, OSError) as exc:
            self._log_now("routing_share_publish_failed", reason=f"{type(exc).__name__}: {exc}")
            return False
        self.metrics.share_batches.labels("sent").inc()
        self.metrics.share_bytes.labels("sent").inc(len(data))
        return True

    # -- what the fleet decided -------------------------------------------------------------

    def _carry(self, decided: FleetDecisions) -> None:
        self.carry_out(decided)
        for change in decided.limit_changes:
            log.info("concurrency_limit", engine=change.engine, old=change.old, new=change.new, reason=change.reason)
        for event in decided.events:
            self._said(event)

    def _said(self, event: object) -> None:
        metrics = self.metrics
        if isinstance(event, Heard):
            if event.publisher == self.fleet.own:
                self._heard_self = time.monotonic()
                return
            metrics.share_batches.labels("received").inc()
            metrics.share_facts.labels("applied").inc(event.facts)
            metrics.share_delay.observe(max(0.0, time.time() - event.sent_at))
        elif isinstance(event, Sent):
            metrics.share_facts.labels("sent").inc(event.facts)
        elif isinstance(event, Dropped):
            metrics.share_batches.labels("dropped").inc()
        elif isinstance(event, Rejected):
            metrics.share_batches.labels("rejected").inc()
            self._log_now("routing_share_rejected", reason=event.reason)
        elif isinstance(event, Missed):
            metrics.share_batches.labels("missed").inc(event.batches)
            self._log_now("routing_share_missed", batches=event.batches, publisher=event.publisher.hex()[:8])
        elif isinstance(event, SafeShareBegan):
            metrics.safe_share.set(event.replicas)
            log.warning(
                "admission_safe_share",
                replicas=event.replicas,
                effect=f"each engine takes at most 1/{event.replicas} of its concurrency limit from this replica",
            )
        elif isinstance(event, SafeShareEnded):
            metrics.safe_share.set(0)
            log.info("admission_safe_share_ended", effect="admission fills engines within the slots it holds again")

    # -- state ----------------------------------------------------------------------------

    def _resumed(self) -> None:
        self._carry(self.fleet.channel_up(time.monotonic()))
        self.up = True
        self.metrics.share_up.set(1)
        if self._state == "down":
            log.info("routing_share_resumed", channel=self.settings.channel, down_s=self._down_for())
        else:
            log.info("routing_share_started", channel=self.settings.channel)
        self._state = "up"

    def _lost(self, reason: str) -> None:
        was = self._state
        self.up = False
        self.metrics.share_up.set(0)
        self._carry(self.fleet.channel_lost(time.monotonic()))
        if was != "down":
            self.metrics.tenant_share_replicas.set(1)
            if self.fleet.shares_tenants:
                log.warning(
                    "tenant_shares_local",
                    effect="each tenant's fair share counts this replica's requests only, until the channel is back",
                )
            self._state = "down"
            self._down_since = time.monotonic()
            log.warning(
                "routing_share_lost",
                channel=self.settings.channel,
                reason=reason,
                effect="routing on this replica's own knowledge, admitting its safe share, until the channel is back",
            )

    def _down_for(self) -> float:
        return round(time.monotonic() - self._down_since, 2)

    def _log_now(self, event: str, **fields: object) -> None:
        now = time.monotonic()
        if now - self._logged.get(event, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._logged[event] = now
            log.warning(event, **fields)
