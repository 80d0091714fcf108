"""KV cache events over ZMQ, as vLLM's ``--kv-events-config`` zmq publisher sends them.

Rules:
- One PUB socket. It binds when the endpoint has a ``*`` host or is ``ipc://``/``inproc://``, and
  connects otherwise (``tcp://host:port``), so many engines can feed one gateway SUB socket.
- Each batch of events is one message of three frames: the topic, an 8-byte big-endian sequence
  number (starting at 0, one per message) and a msgpack payload ``[ts, [event, ...], dp_rank]``.
- Events are maps with a ``"type"`` key: ``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``,
  with vLLM 0.32's fields; block hashes are unsigned 64-bit ints. ``medium`` is the event's own
  (``CPU`` from the CPU tier), ``GPU`` when it names none.
- Sending never blocks the engine: a message that cannot be queued is dropped, like vLLM's.
- Replay (vLLM's ``replay_endpoint`` and ``buffer_steps``): the last ``buffer_steps`` messages are
  kept; a ROUTER socket at the replay endpoint answers a request ``[b"", start seq, 8 bytes]`` with
  every kept message from that seq on, each ``[b"", topic, seq, payload]``, then ``[b"", b"", -1 as
  8 signed bytes, b""]``. A thread serves it, as vLLM's publisher thread does, so an idle engine
  answers too.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, assert_never

import msgpack
import zmq

from priority_gateway.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


def should_bind(endpoint: str) -> bool:
    return endpoint.startswith(("ipc://", "inproc://")) or "*" in endpoint


def event_dict(event: KVEvent) -> dict[str, Any]:
    match event:
        case BlockStored():
            extra = event.extra_keys
            return {
                "type": "BlockStored",
                "block_hashes": list(event.block_hashes),
                "parent_block_hash": event.parent_block_hash,
                "token_ids": list(event.token_ids),
                "block_size": event.block_size,
                "lora_id": event.lora_id,
                "medium": event.medium or "GPU",
                "lora_name": event.lora_name,
                "extra_keys": list(extra) if extra is not None else [None] * len(event.block_hashes),
                "group_idx": 0,
                "kv_cache_spec_kind": "full_attention",
            }
        case BlockRemoved():
            medium = event.medium or "GPU"
            return {"type": "BlockRemoved", "block_hashes": list(event.block_hashes), "medium": medium, "group_idx": 0}
        case AllBlocksCleared():
            return {"type": "AllBlocksCleared"}
    assert_never(event)


def encode_batch(events: Sequence[KVEvent], ts: float, dp_rank: int = 0) -> bytes:
    packed: bytes = msgpack.packb([ts, [event_dict(e) for e in events], dp_rank])
    return packed


END_SEQ = (-1).to_bytes(8, "big", signed=True)


class ZmqPublisher:
    def __init__(
        self,
        endpoint: str,
        topic: str = "",
        hwm: int = 100_000,
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
    ) -> None:
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.seq = 0
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        if should_bind(endpoint):
            self._sock.bind(endpoint)
        else:
            self._sock.connect(endpoint)
        self._kept: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._replay: threading.Thread | None = None
        if replay_endpoint is not None:
            router = self._ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.bind(replay_endpoint)
            self._replay = threading.Thread(
                target=self._serve_replay, args=(router,), name="kv-events-replay", daemon=True
            )
            self._replay.start()

    def publish(self, events: Sequence[KVEvent]) -> None:
        if not events:
            return
        payload = encode_batch(events, time.time())
        frames = [self.topic, self.seq.to_bytes(8, "big"), payload]
        if self._replay is not None:
            with self._lock:
                self._kept.append((self.seq, payload))
        self.seq += 1
        with contextlib.suppress(zmq.Again):
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK)

    def _serve_replay(self, router: zmq.Socket[bytes]) -> None:
        try:
            while not self._stopping.is_set():
                if not router.poll(100):
                    continue
                request = router.recv_multipart()
                if len(request) != 3 or len(request[2]) != 8:
                    continue  # vLLM logs and ignores a request of another shape
                client, _, start = request
                first = int.from_bytes(start, "big")
                with self._lock:
                    kept = [(seq, payload) for seq, payload in self._kept if seq >= first]
                for seq, payload in kept:
                    router.send_multipart([client, b"", self.topic, seq.to_bytes(8, "big"), payload])
                router.send_multipart([client, b"", b"", END_SEQ, b""])
        finally:
            router.close(linger=0)

    def close(self) -> None:
        self._stopping.set()
        if self._replay is not None:
            self._replay.join(timeout=1.0)
        self._sock.close(linger=0)
