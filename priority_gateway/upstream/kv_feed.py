"""Feeding engines' KV cache events into the core, for pools in precise prefix mode.

Rules:
- ``tcp://HOST:PORT`` (or ``ipc://``): the gateway binds one socket and every engine of the
  pool publishes to it with its own URL (or ``host:port``, or a topic named in
  ``kv_events_topics``) as topic.
- ``engine-port:PORT``: engines bind their publisher on PORT; the gateway subscribes to each
  engine it watches (static or discovered) at that port of the engine's host.
- With ``replay_port`` (``engine-port:`` only), a gap is first filled from the engine's replay socket
  at that port (``kv_events``); what it cannot fill stands.
- A gap in an engine's sequence (lost messages) or a restart makes what the gateway knows of
  that engine unreliable: it is forgotten, and rebuilt from the events that follow.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from priority_gateway import log
from priority_gateway.core.dispatcher import Dispatcher
from priority_gateway.upstream.kv_events import KVEventBatch, KVEventSubscriber


class KVFeed:
    def __init__(
        self,
        pool: str,
        spec: str,
        dispatcher: Dispatcher,
        topics: dict[str, str] | None = None,
        replay_port: int | None = None,
    ) -> None:
        self.pool = pool
        self.spec = spec
        self.replay_port = replay_port
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
            endpoint = _tcp(host, int(self.spec.removeprefix("engine-port:")))
            self._by_source[endpoint] = engine_id
            replay = _tcp(host, self.replay_port) if self.replay_port is not None else None
            self.subscriber.connect(endpoint, replay=replay)

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


def _tcp(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
