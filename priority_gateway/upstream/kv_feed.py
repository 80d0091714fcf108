"""Feeding engines' KV cache events into the core, for pools in precise prefix mode.

Rules:
- ``tcp://HOST:PORT`` (or ``ipc://``): the gateway binds one socket and every engine of the
  pool publishes to it with its own URL (or ``host:port``, or a topic named in
  ``kv_events_topics``) as topic.
- ``engine-port:PORT``: engines bind their publisher on PORT; the gateway subscribes to each
  engine it watches (static or discovered) at that port of the engine's host.
- A gap in an engine's sequence (lost messages) or a restart makes what the gateway knows of
  that engine unreliable: it is forgotten, and rebuilt from the events that follow.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from priority_gateway import log
from priority_gateway.core.dispatcher import Dispatcher
from priority_gateway.upstream.kv_events import KVEventBatch, KVEventSubscriber


class KVFeed:
    def __init__(self, pool: str, spec: str, dispatcher: Dispatcher, topics: dict[str, str] | None = None) -> None:
        self.pool = pool
        self.spec = spec
        self.dispatcher = dispatcher
        self.subscriber = KVEventSubscriber(self._on_batch)
        self._by_source: dict[str, str] = {}
        self._by_topic: dict[str, str] = {topic: url.rstrip("/") for topic, url in (topics or {}).items()}
        self.unknown = 0
        self.bound: str | None = None

    @property
    def connects(self) -> bool:
        return self.spec.startswith("engine-port:")

    def start(self) -> None:
        if not self.connects:
            self.bound = self.subscriber.bind(self.spec)

    def engine_added(self, engine_id: str) -> None:
        parts = urlsplit(engine_id)
        host = parts.hostname or "127.0.0.1"
        self._by_topic[engine_id] = engine_id
        self._by_topic[f"{host}:{parts.port or 80}"] = engine_id
        if self.connects:
            port = int(self.spec.removeprefix("engine-port:"))
            endpoint = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
            self._by_source[endpoint] = engine_id
            self.subscriber.connect(endpoint)

    async def engine_removed(self, engine_id: str) -> None:
        for endpoint in [s for s, e in self._by_source.items() if e == engine_id]:
            del self._by_source[endpoint]
            await self.subscriber.disconnect(endpoint)
        for topic in [t for t, e in self._by_topic.items() if e == engine_id]:
            del self._by_topic[topic]

    def _on_batch(self, batch: KVEventBatch) -> None:
        engine = self._by_source.get(batch.source) or self._by_topic.get(batch.topic)
        if engine is None:
            self.unknown += 1
            if self.unknown in (1, 100, 10_000):
                log.warning("kv_events_unknown_engine", pool=self.pool, source=batch.source, topic=batch.topic)
            return
        self.dispatcher.apply_kv_events(engine, batch.events, restarted=batch.restarted or batch.missed > 0)

    async def close(self) -> None:
        await self.subscriber.close()
