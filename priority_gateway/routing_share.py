"""Replicas tell each other what they routed, through a Redis pub/sub channel (``prefix.share``).

Rules:
- The core decides what to tell (``Dispatcher.take_learned``) and what another replica's batch
  changes (``Dispatcher.learn``); ``core/sharing.py`` encodes it. This module only moves bytes.
- Every ``interval_s`` whatever this replica routed since goes out in one PUBLISH; every ``full_s``
  a full batch (all its pending prefill) goes out even when nothing was routed: the heartbeat that
  tells the others it is alive, and tells itself that the channel works. Nothing here runs on a
  request's path: the request path only leaves facts in the core for the next batch.
- One connection subscribes; another publishes. The channel is down when the subscription fails,
  or when this replica has not heard its own heartbeat for ``silent_s``. Then the replica forgets
  what the others said (``Dispatcher.lost_peers``) and routes on its own knowledge, drops what it
  would have sent (counted), sets ``gateway_routing_share_up`` to 0 and logs
  ``routing_share_lost`` once; it subscribes again with backoff and logs ``routing_share_resumed``.
- Redis delivers every batch to every subscriber in one order, this replica's own included: its own
  batches come back to the dispatcher (``heard_own``, with the serial of the ``take_learned`` they
  carried) so that every replica applies the slots claimed in them in the same order
  (``core/holdings.py``); slots granted start queued requests at once (``on_granted``).
- A replica that has just started admits its safe share until ``full_s`` after the channel first
  works (it has then heard every other replica's full batch, and what it holds).
- Admission counts the others' in-flight through the channel; while it is down each replica admits
  at most its safe share of every engine's limit (``core/safe_share.py``): entering logs
  ``admission_safe_share`` with the replicas the limit is split among, and sets
  ``gateway_admission_safe_share`` to that number; leaving (``full_s`` after the channel is back, when
  the others' full batches have told their loads) logs ``admission_safe_share_ended`` and sets it to 0.
- A batch whose PUBLISH fails goes out again with the next one (after Redis restarts, the first
  PUBLISH often meets a pooled connection that died with it); if that fails too, both are dropped
  (counted). The sequence number counts only batches sent, so receivers see no gap for it.
- A gap in a publisher's sequence numbers (batches Redis dropped, or that went by while this
  replica was reconnecting) is counted (``missed``) and logged at most once per ``LOG_EVERY_S``:
  the index lacks those facts and catches up as conversations continue.
- Malformed batches, and batches of replicas hashing prompts by another block width, are ignored
  and counted (``rejected``).
- With fair queueing, each replica also publishes its tenants' requests per pool
  (``core/tenant_share.py``: changes every ``interval_s``, everything every ``full_s``) in
  batches of their own on the same channel, so every replica counts the fleet's requests in a
  tenant's share. ``gateway_tenant_share_replicas`` says how many replicas' requests count (itself
  included); while the channel is down it is 1 and ``tenant_shares_local`` is logged: shares are
  this replica's own until the others' next batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from priority_gateway import log
from priority_gateway.config import RoutingShareConfig
from priority_gateway.core import tenant_share
from priority_gateway.core.dispatcher import Dispatcher
from priority_gateway.core.sharing import Batch, Learned, decode, encode
from priority_gateway.metrics import GatewayMetrics

LOG_EVERY_S = 10.0
MAX_BACKOFF_S = 5.0
MAX_UNHEARD = 1024  # own batches remembered until heard back


class RoutingShare:
    def __init__(
        self,
        url: str,
        settings: RoutingShareConfig,
        dispatcher: Dispatcher,
        metrics: GatewayMetrics,
        block_chars: int,
        on_granted: Callable[[], None] | None = None,
    ) -> None:
        self.url = url
        self.on_granted = on_granted
        self.settings = settings
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.block_chars = block_chars
        self.publisher = os.urandom(16)
        self.up = False
        self._state = "starting"
        self._down_since = time.monotonic()
        self._sequence = 0
        self._tenant_sequence = 0
        self._unsent: Learned | None = None
        self._serials: dict[int, int] = {}  # sequence number of a batch sent -> its Learned.serial
        self._heard_self = time.monotonic()
        self._logged: dict[str, float] = {}
        self._publisher_client: aioredis.Redis | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.dispatcher.share_learning(self.settings.max_pending)
        self.metrics.share_up.set(0)
        self.metrics.safe_share.set(0)
        self.dispatcher.safe_share.window_s = self.settings.replicas_window_s
        self.dispatcher.safe_share.settle_s = self.settings.full_s
        self.dispatcher.share_joining()
        self._publisher_client = self._client()
        self._tasks = [
            asyncio.create_task(self._subscribe_loop(), name="routing share: subscribe"),
            asyncio.create_task(self._publish_loop(), name="routing share: publish"),
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
                        self._received(message["data"])
                    if time.monotonic() - self._heard_self > self.settings.silent_s:
                        raise ConnectionError(f"own heartbeat not heard for {self.settings.silent_s:g} s")
            except (RedisError, OSError) as exc:
                self._lost(f"{type(exc).__name__}: {exc}")
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves PubSub.aclose untyped
                with contextlib.suppress(RedisError, OSError):
                    await client.aclose()
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)

    def _received(self, data: bytes) -> None:
        metrics = self.metrics
        metrics.share_bytes.labels("received").inc(len(data))
        if tenant_share.is_tenant_batch(data):
            self._received_tenants(data)
            return
        try:
            batch = decode(data)
        except ValueError as exc:
            metrics.share_batches.labels("rejected").inc()
            self._log_now("routing_share_rejected", reason=str(exc))
            return
        if batch.publisher == self.publisher:
            self._heard_self = time.monotonic()
            self.dispatcher.heard_own(batch, self._serials.pop(batch.sequence, 0))
            self._granted()
            return
        metrics.share_batches.labels("received").inc()
        if batch.block_chars != self.block_chars:
            metrics.share_batches.labels("rejected").inc()
            self._log_now("routing_share_rejected", reason=f"block_chars {batch.block_chars}, ours {self.block_chars}")
            return
        metrics.share_delay.observe(max(0.0, time.time() - batch.sent_at))
        applied, missed = self.dispatcher.learn(batch, time.monotonic())
        metrics.share_facts.labels("applied").inc(applied)
        self._granted()
        if missed:
            metrics.share_batches.labels("missed").inc(missed)
            self._log_now("routing_share_missed", batches=missed, publisher=batch.publisher.hex()[:8])

    def _received_tenants(self, data: bytes) -> None:
        try:
            batch = tenant_share.decode(data)
        except ValueError as exc:
            self.metrics.share_batches.labels("rejected").inc()
            self._log_now("routing_share_rejected", reason=str(exc))
            return
        if batch.publisher != self.publisher:
            self.metrics.share_batches.labels("received").inc()
            self.dispatcher.learn_tenants(batch, time.monotonic())

    # -- sending --------------------------------------------------------------------------

    async def _publish_loop(self) -> None:
        settings = self.settings
        next_full = time.monotonic() + settings.full_s
        while True:
            await asyncio.sleep(settings.interval_s)
            now = time.monotonic()
            full = now >= next_full
            if self.dispatcher.settle_share(now):
                self.metrics.safe_share.set(0)
                log.info("admission_safe_share_ended", effect="admission counts every replica's in-flight again")
            if full:
                next_full = now + settings.full_s
                self.dispatcher.expire_peers(now, settings.silent_s)
                self.metrics.share_peers.set(self.dispatcher.peers.active(now, settings.silent_s))
            await self._publish_tenants(full)
            learned = self.dispatcher.take_learned(full, now)
            retry, self._unsent = self._unsent, None
            if retry is not None:
                retry.merge(learned)
                learned = retry
            if not learned:
                continue
            if not self.up:
                self.metrics.share_batches.labels("dropped").inc()
                continue
            data = encode(Batch(self.publisher, self._sequence + 1, time.time(), self.block_chars, learned))
            self._serials[self._sequence + 1] = learned.serial
            while len(self._serials) > MAX_UNHEARD:
                del self._serials[next(iter(self._serials))]
            assert self._publisher_client is not None
            try:
                await self._publisher_client.publish(settings.channel, data)
            except (RedisError, OSError) as exc:
                self._log_now("routing_share_publish_failed", reason=f"{type(exc).__name__}: {exc}")
                if retry is not None:
                    self.metrics.share_batches.labels("dropped").inc()
                else:
                    # Often a pooled connection that died while Redis restarted: the next try gets a new one.
                    self._unsent = learned
                continue
            self._sequence += 1
            self.metrics.share_batches.labels("sent").inc()
            self.metrics.share_facts.labels("sent").inc(len(learned.facts))
            self.metrics.share_bytes.labels("sent").inc(len(data))

    async def _publish_tenants(self, full: bool) -> None:
        """This replica's tenants per pool, if fair queueing has any to tell; a batch that cannot go is
        dropped (counted): the next full one says everything again."""
        if full:
            self.metrics.tenant_share_replicas.set(1 + len(self.dispatcher.fleet_tenants))
        told = self.dispatcher.take_tenant_shares(full)
        if not told:
            return
        if not self.up:
            self.metrics.share_batches.labels("dropped").inc()
            return
        data = tenant_share.encode(tenant_share.TenantBatch(self.publisher, self._tenant_sequence + 1, told))
        assert self._publisher_client is not None
        try:
            await self._publisher_client.publish(self.settings.channel, data)
        except (RedisError, OSError) as exc:
            self.metrics.share_batches.labels("dropped").inc()
            self._log_now("routing_share_publish_failed", reason=f"{type(exc).__name__}: {exc}")
            return
        self._tenant_sequence += 1
        self.metrics.share_batches.labels("sent").inc()
        self.metrics.share_bytes.labels("sent").inc(len(data))

    def _tenant_shares_local(self) -> None:
        self.metrics.tenant_share_replicas.set(1)
        if self.dispatcher.shares_tenants:
            log.warning(
                "tenant_shares_local",
                effect="each tenant's fair share counts this replica's requests only, until the channel is back",
            )

    def _granted(self) -> None:
        if self.on_granted is not None:
            self.on_granted()

    # -- state ----------------------------------------------------------------------------

    def _resumed(self) -> None:
        self.dispatcher.share_resumed(time.monotonic())
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
        self._serials.clear()
        self.metrics.share_up.set(0)
        if self.dispatcher.lost_peers(time.monotonic()):
            replicas = self.dispatcher.safe_share.replicas
            self.metrics.safe_share.set(replicas)
            log.warning(
                "admission_safe_share",
                replicas=replicas,
                effect=f"each engine takes at most 1/{replicas} of its concurrency limit from this replica",
            )
        if was != "down":
            self._tenant_shares_local()
            self._state = "down"
            self._down_since = time.monotonic()
            log.warning(
                "routing_share_lost",
                channel=self.settings.channel,
                reason=reason,
                effect="routing on this replica's own knowledge until the channel is back",
            )

    def _down_for(self) -> float:
        return round(time.monotonic() - self._down_since, 2)

    def _log_now(self, event: str, **fields: object) -> None:
        now = time.monotonic()
        if now - self._logged.get(event, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._logged[event] = now
            log.warning(event, **fields)
