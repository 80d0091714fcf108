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
"""

from __future__ import annotations

import contextlib
import time
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


class ZmqPublisher:
    def __init__(self, endpoint: str, topic: str = "", hwm: int = 100_000) -> None:
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

    def publish(self, events: Sequence[KVEvent]) -> None:
        if not events:
            return
        frames = [self.topic, self.seq.to_bytes(8, "big"), encode_batch(events, time.time())]
        self.seq += 1
        with contextlib.suppress(zmq.Again):
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK)

    def close(self) -> None:
        self._sock.close(linger=0)
