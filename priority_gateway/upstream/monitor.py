"""Background watch over engines: health probes, ``/metrics`` scrapes, models, discovery.

Rules:
- An engine turns unhealthy after ``unhealthy_after`` failed probes in a row, or at once
  when the relay cannot connect to it; one passing probe makes it healthy again. A probe this
  process could not even open a socket for (out of descriptors) counts for nothing, and so does
  one that timed out while the engine sent anything else (an answer, a streamed token): under a
  flood an engine answers ``/health`` late too, and taking a busy engine out would turn load into
  an outage. An engine that answers ``/health`` with an error is out, however much else it answers.
- Scrapes run at their own, slower interval (vLLM's ``/metrics`` is not free to render).
- ``close`` cancels every loop and waits at most ``CLOSE_WAIT_S`` for them: a probe stuck in a
  call that ignores cancellation cannot hold the gateway's shutdown.
- The models an engine serves are read from its ``/v1/models`` until it answers once,
  then refreshed every ``models_every`` probes; the core's engine state gets their names, and
  ``models_version`` moves whenever any engine's list changed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import orjson

from priority_gateway import log
from priority_gateway.core.dispatcher import Dispatcher
from priority_gateway.upstream.discovery import resolve_engines
from priority_gateway.upstream.h1 import EngineClient, OutOfDescriptors, ReadTimeout, UpstreamError
from priority_gateway.upstream.scrape import parse_vllm_metrics

CLOSE_WAIT_S = 2.0


@dataclass(slots=True)
class EngineWatch:
    client: EngineClient
    pool: str
    failures: int = 0
    models: list[dict[str, Any]] = field(default_factory=list)
    probes: int = 0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class EngineMonitor:
    def __init__(
        self,
        dispatcher: Dispatcher,
        make_client: Callable[[str, str], EngineClient],
        *,
        health_interval_s: float = 2.0,
        health_timeout_s: float = 1.0,
        unhealthy_after: int = 2,
        scrape_interval_s: float = 2.0,
        models_every: int = 15,
    ) -> None:
        self.dispatcher = dispatcher
        self.make_client = make_client
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.unhealthy_after = unhealthy_after
        self.scrape_interval_s = scrape_interval_s
        self.models_every = models_every
        self.watches: dict[str, EngineWatch] = {}
        self.models_version = 0
        self._discovery: list[asyncio.Task[None]] = []
        self.on_watch: list[Callable[[str, str], None]] = []
        self.on_unwatch: list[Callable[[str, str], Coroutine[Any, Any, None]]] = []
        # The event loop keeps only weak references to tasks: these keep the callbacks alive.
        self._callbacks: set[asyncio.Task[None]] = set()

    # -- lifecycle ---------------------------------------------------------------

    def watch(self, engine_id: str, pool: str) -> EngineClient:
        existing = self.watches.get(engine_id)
        if existing is not None:
            return existing.client
        w = EngineWatch(self.make_client(engine_id, pool), pool)
        self.watches[engine_id] = w
        w.tasks = [
            asyncio.create_task(self._health_loop(engine_id, w), name=f"health {engine_id}"),
            asyncio.create_task(self._scrape_loop(engine_id, w), name=f"scrape {engine_id}"),
        ]
        for callback in self.on_watch:
            callback(engine_id, pool)
        return w.client

    def unwatch(self, engine_id: str) -> None:
        w = self.watches.pop(engine_id, None)
        if w is None:
            return
        for task in w.tasks:
            task.cancel()
        w.client.close()
        for callback in self.on_unwatch:
            self._spawn(callback(engine_id, w.pool))

    def _spawn(self, callback: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(callback)
        self._callbacks.add(task)
        task.add_done_callback(self._callbacks.discard)

    def discover(self, pool: str, target: str, interval_s: float) -> None:
        self._discovery.append(asyncio.create_task(self._discovery_loop(pool, target, interval_s)))

    async def close(self) -> None:
        tasks = [t for w in self.watches.values() for t in w.tasks] + self._discovery
        for task in tasks:
            task.cancel()
        waiting = [*tasks, *self._callbacks]
        if waiting:
            done, stuck = await asyncio.wait(waiting, timeout=CLOSE_WAIT_S)
            for task in done:
                if not task.cancelled():
                    task.exception()  # retrieved: a loop that failed as it stopped needs no traceback
            if stuck:
                log.warning(
                    "monitor_tasks_left", tasks=",".join(sorted(t.get_name() for t in stuck)), after_s=CLOSE_WAIT_S
                )
        for w in self.watches.values():
            w.client.close()
        self.watches.clear()

    def client(self, engine_id: str) -> EngineClient:
        return self.watches[engine_id].client

    # -- what the relay reports ---------------------------------------------------

    def connect_failed(self, engine_id: str, reason: str) -> None:
        w = self.watches.get(engine_id)
        if w is None:
            return
        w.failures = max(w.failures, self.unhealthy_after)
        self._set_health(engine_id, w, False, reason)

    # -- models ---------------------------------------------------------------------

    def models(self) -> list[dict[str, Any]]:
        seen: dict[str, dict[str, Any]] = {}
        for w in self.watches.values():
            for model in w.models:
                seen.setdefault(str(model.get("id")), model)
        return list(seen.values())

    def model_ids(self) -> set[str]:
        return {str(m.get("id")) for w in self.watches.values() for m in w.models}

    # -- loops ------------------------------------------------------------------------

    def _set_health(self, engine_id: str, w: EngineWatch, healthy: bool, reason: str) -> None:
        engine = self.dispatcher.engine(engine_id)
        if engine is None or engine.healthy == healthy:
            return
        self.dispatcher.set_health(engine_id, healthy)
        if healthy:
            log.info("engine_healthy", engine=engine_id, pool=w.pool, reason=reason)
        else:
            log.warning("engine_unhealthy", engine=engine_id, pool=w.pool, reason=reason, failures=w.failures)

    async def probe(self, engine_id: str, w: EngineWatch) -> None:
        reads = w.client.reads
        try:
            status, _ = await w.client.get(b"/health", timeout_s=self.health_timeout_s)
            ok, reason = status == 200, f"/health answered {status}"
        except OutOfDescriptors as exc:
            # This process is out of sockets, which says nothing about the engine.
            log.warning("health_probe_skipped", engine=engine_id, reason=str(exc))
            return
        except ReadTimeout as exc:
            if w.client.reads > reads:
                log.debug("health_probe_late", engine=engine_id, reason=str(exc))
                return
            ok, reason = False, str(exc)
        except UpstreamError as exc:
            ok, reason = False, str(exc)
        if ok:
            w.failures = 0
            self._set_health(engine_id, w, True, "health probe passed")
            if not w.models or w.probes % self.models_every == 0:
                await self._read_models(engine_id, w)
            w.probes += 1
        else:
            w.failures += 1
            if w.failures >= self.unhealthy_after:
                self._set_health(engine_id, w, False, reason)

    async def _read_models(self, engine_id: str, w: EngineWatch) -> None:
        try:
            status, body = await w.client.get(b"/v1/models", timeout_s=self.health_timeout_s * 5)
            if status == 200:
                data = orjson.loads(body).get("data") or []
                models = [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
                if models != w.models:
                    w.models = models
                    self.models_version += 1
                engine = self.dispatcher.engine(engine_id)
                if engine is not None:
                    engine.models = frozenset(m["id"] for m in models)
        except (UpstreamError, orjson.JSONDecodeError, AttributeError) as exc:
            log.debug("models_read_failed", engine=w.client.base_url, reason=str(exc))

    async def _health_loop(self, engine_id: str, w: EngineWatch) -> None:
        while True:
            await self.probe(engine_id, w)
            await asyncio.sleep(self.health_interval_s)

    async def _scrape_loop(self, engine_id: str, w: EngineWatch) -> None:
        engine = self.dispatcher.engine(engine_id)
        while True:
            await asyncio.sleep(self.scrape_interval_s)
            if engine is None or not engine.healthy:
                engine = self.dispatcher.engine(engine_id)
                continue
            self.dispatcher.scrape_sent(engine_id)
            try:
                status, body = await w.client.get(b"/metrics", timeout_s=max(self.scrape_interval_s, 1.0))
            except UpstreamError as exc:
                log.debug("scrape_failed", engine=engine_id, reason=str(exc))
                continue
            if status == 200:
                self.dispatcher.apply_scrape(engine_id, parse_vllm_metrics(body.decode()), time.monotonic())

    async def _discovery_loop(self, pool: str, target: str, interval_s: float) -> None:
        known: list[str] | None = None
        while True:
            try:
                urls = await resolve_engines(target)
            except OSError as exc:
                log.warning("discovery_failed", pool=pool, target=target, reason=str(exc), kept=len(known or []))
                urls = known or []
            if urls != known:
                added = sorted(set(urls) - set(known or []))
                removed = sorted(set(known or []) - set(urls))
                self.dispatcher.set_pool_engines(pool, urls)
                for url in removed:
                    self.unwatch(url)
                for url in added:
                    self.watch(url, pool)
                log.info("pool_engines_changed", pool=pool, target=target, added=added, removed=removed)
                known = urls
            await asyncio.sleep(interval_s)
