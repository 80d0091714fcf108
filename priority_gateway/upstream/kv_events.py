"""Subscriber for vLLM's KV cache events (ZMQ PUB/SUB, msgpack).

Wire format of vLLM's ``ZmqEventPublisher`` (``--kv-events-config``): each message has
three frames ``[topic, seq, payload]``. ``seq`` is an 8-byte big-endian counter that
starts at 0 in every engine process; ``payload`` is msgpack ``[ts, [event, ...], dp_rank]``
(``dp_rank`` may be absent); every event is a map whose ``"type"`` is ``BlockStored``,
``BlockRemoved`` or ``AllBlocksCleared``, decoded into the core's types of the same names
(``priority_gateway.core.kv_events``). Block hashes are uint64 ints by default (bytes
when the engine runs with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``).

Two endpoint styles, one subscriber:

- ``bind(endpoint)``: one SUB socket that engines connect to. vLLM connects when its
  endpoint has no ``*`` (``tcp://gateway:5557``). Engines are told apart by topic only,
  so every engine needs its own topic.
- ``connect(endpoint)``: one SUB socket per engine that binds (``tcp://*:5557`` on the
  engine). The batch's ``source`` is that endpoint.

Rules this module owns:

- A stream is one ``(source, topic)`` pair; its ``seq`` must grow by exactly one.
- A jump forward is a gap: the batch is still delivered, with ``missed`` = number of
  lost messages; ``stats.gaps`` and ``stats.missed`` count them and a warning is logged.
- Replay (``connect(..., replay=ENDPOINT)``, vLLM's ``replay_endpoint``): before a batch that
  opens a gap is delivered, the engine's replay socket is asked for the missed batches
  (``[b"", first missed seq]`` on a DEALER; answers ``[b"", topic, seq, payload]`` up to
  ``[b"", b"", -1, b""]``), at most ``max_replay`` of them and within ``replay_timeout_s``; when
  they come back whole and in order they are delivered first, as if never lost, and the gap closes.
  Otherwise (the engine keeps fewer, no answer in time) nothing of the answer is delivered and the
  gap stands. Meanwhile that engine's live batches wait in its socket, so order holds.
- A step back (or repeat) means the engine restarted and its cache is empty: the batch
  is delivered with ``restarted=True`` and tracking restarts from its ``seq``.
- The first message of a stream is neither (a late subscriber joins mid-stream).
- A message that does not decode is counted in ``stats.malformed`` and logged; unknown
  event types are skipped and counted, so newer engines do not break older gateways.
- An exception raised by the callback is logged and counted; delivery goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from priority_gateway import log
from priority_gateway.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVEvent",
    "KVEventBatch",
    "KVEventSubscriber",
    "MalformedMessage",
    "decode_message",
]


@dataclasses.dataclass(frozen=True, slots=True)
class KVEventBatch:
    """One published message: the events of one engine step, in order."""

    source: str
    topic: str
    seq: int
    ts: float
    dp_rank: int | None
    events: tuple[KVEvent, ...]
    skipped_events: int = 0
    missed: int = 0
    restarted: bool = False


@dataclasses.dataclass
class SubscriberStats:
    messages: int = 0
    events: int = 0
    gaps: int = 0
    missed: int = 0
    restarts: int = 0
    malformed: int = 0
    unknown_events: int = 0
    callback_errors: int = 0
    replays: int = 0
    """Gaps closed by replaying what was missed."""
    replayed: int = 0
    """Messages delivered from replays."""
    replay_failures: int = 0
    """Replays that did not close their gap (answer short, out of order or late)."""
    last_seq: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)


class MalformedMessage(ValueError):
    pass


def decode_message(frames: Sequence[bytes], source: str = "") -> KVEventBatch:
    """Decode one ``[topic, seq, payload]`` message; raises ``MalformedMessage``.

    Events of unknown types are left out and counted in ``skipped_events``.
    """
    if len(frames) != 3 or len(frames[1]) != 8:
        raise MalformedMessage(f"expected [topic, 8-byte seq, payload], got {len(frames)} frames")
    topic, seq_bytes, payload = frames
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as error:
        raise MalformedMessage(f"payload is not msgpack: {error}") from error
    if not isinstance(body, list) or len(body) not in (2, 3) or not isinstance(body[1], list):
        raise MalformedMessage("payload is not [ts, [events], dp_rank]")
    events: list[KVEvent] = []
    unknown = 0
    for raw in body[1]:
        event = _decode_event(raw)
        if event is None:
            unknown += 1
        else:
            events.append(event)
    try:
        ts = float(body[0])
    except (TypeError, ValueError) as error:
        raise MalformedMessage(f"timestamp {body[0]!r} is not a number") from error
    return KVEventBatch(
        source=source,
        topic=bytes(topic).decode("utf-8", errors="replace"),
        seq=int.from_bytes(seq_bytes, "big"),
        ts=ts,
        dp_rank=body[2] if len(body) == 3 else None,
        events=tuple(events),
        skipped_events=unknown,
    )


def _decode_event(raw: Any) -> KVEvent | None:
    if not isinstance(raw, Mapping):
        raise MalformedMessage(f"event is not a map: {type(raw).__name__}")
    kind = raw.get("type")
    try:
        if kind == "BlockStored":
            return BlockStored(
                block_hashes=tuple(raw["block_hashes"]),
                parent_block_hash=raw.get("parent_block_hash"),
                token_ids=tuple(raw.get("token_ids") or ()),
                block_size=int(raw["block_size"]),
                lora_name=raw.get("lora_name"),
                medium=raw.get("medium"),
                group_idx=raw.get("group_idx"),
            )
        if kind == "BlockRemoved":
            return BlockRemoved(
                block_hashes=tuple(raw["block_hashes"]),
                medium=raw.get("medium"),
                group_idx=raw.get("group_idx"),
            )
    except (KeyError, TypeError, ValueError) as error:
        raise MalformedMessage(f"{kind} event lacks a field: {error}") from error
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


class KVEventSubscriber:
    """Receives KV event messages on SUB sockets and hands each decoded batch to ``on_batch``.

    ``bind`` and ``connect`` need a running event loop; ``close`` stops every socket.
    """

    def __init__(
        self,
        on_batch: Callable[[KVEventBatch], None],
        *,
        context: zmq.asyncio.Context | None = None,
        receive_hwm: int = 100_000,
        replay_timeout_s: float = 1.0,
        max_replay: int = 10_000,
    ) -> None:
        self._on_batch = on_batch
        self._context = context or zmq.asyncio.Context.instance()
        self._receive_hwm = receive_hwm
        self._replay_timeout_s = replay_timeout_s
        self._max_replay = max_replay
        self._sockets: dict[str, tuple[zmq.asyncio.Socket, asyncio.Task[None]]] = {}
        self._replays: dict[str, str] = {}
        self.stats = SubscriberStats()

    @property
    def endpoints(self) -> list[str]:
        return list(self._sockets)

    def bind(self, endpoint: str) -> str:
        """Bind one SUB socket for engines to connect to; returns the bound endpoint.

        ``tcp://127.0.0.1:*`` picks a free port.
        """
        socket = self._socket("")
        try:
            socket.bind(endpoint)
        except zmq.ZMQError:
            socket.close(linger=0)
            raise
        bound = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._start(bound, socket)
        log.info("kv_events_bound", endpoint=bound)
        return bound

    def connect(self, endpoint: str, topic: str = "", replay: str | None = None) -> None:
        """Subscribe to an engine that binds its publisher; ``topic`` filters by prefix; ``replay``:
        the engine's replay endpoint, asked for what a gap missed."""
        if endpoint in self._sockets:
            return
        socket = self._socket(topic)
        socket.connect(endpoint)
        if replay is not None:
            self._replays[endpoint] = replay
        self._start(endpoint, socket)
        log.info("kv_events_connected", endpoint=endpoint, topic=topic, replay=replay)

    async def disconnect(self, endpoint: str) -> None:
        self._replays.pop(endpoint, None)
        entry = self._sockets.pop(endpoint, None)
        if entry is not None:
            await _stop(*entry)

    async def close(self) -> None:
        entries = list(self._sockets.values())
        self._sockets.clear()
        for socket, task in entries:
            await _stop(socket, task)

    async def __aenter__(self) -> KVEventSubscriber:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def _socket(self, topic: str) -> zmq.asyncio.Socket:
        socket = self._context.socket(zmq.SUB)
        socket.setsockopt(zmq.RCVHWM, self._receive_hwm)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
        return socket

    def _start(self, source: str, socket: zmq.asyncio.Socket) -> None:
        task = asyncio.get_running_loop().create_task(self._pump(source, socket), name=f"kv-events {source}")
        self._sockets[source] = (socket, task)

    async def _pump(self, source: str, socket: zmq.asyncio.Socket) -> None:
        while True:
            frames = await socket.recv_multipart()
            replay = self._replays.get(source)
            if replay is not None:
                await self._fill_gap(source, frames, replay)
            self.receive(source, frames)

    async def _fill_gap(self, source: str, frames: Sequence[bytes], replay: str) -> None:
        """When ``frames`` would open a gap in its stream, deliver what the gap missed from ``replay``."""
        if len(frames) != 3 or len(frames[1]) != 8:
            return  # ``receive`` counts it as malformed
        topic = bytes(frames[0]).decode("utf-8", errors="replace")
        previous = self.stats.last_seq.get((source, topic))
        seq = int.from_bytes(frames[1], "big")
        if previous is None or not previous + 1 < seq <= previous + 1 + self._max_replay:
            return
        missed = await self._replayed(replay, previous + 1, seq)
        if missed is None:
            self.stats.replay_failures += 1
            log.warning("kv_events_replay_failed", source=source, topic=topic, first_seq=previous + 1, seq=seq)
            return
        for message in missed:
            self.receive(source, message)
        self.stats.replays += 1
        self.stats.replayed += len(missed)
        log.info("kv_events_replayed", source=source, topic=topic, first_seq=previous + 1, messages=len(missed))

    async def _replayed(self, endpoint: str, first: int, stop: int) -> list[list[bytes]] | None:
        """Messages ``first`` to ``stop - 1`` from the replay socket at ``endpoint``, in order; None when
        the answer does not hold them all within ``replay_timeout_s``."""
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._replay_timeout_s
        got: list[list[bytes]] = []
        try:
            socket.connect(endpoint)
            await socket.send_multipart([b"", first.to_bytes(8, "big")])
            while (left := deadline - loop.time()) > 0 and await socket.poll(left * 1000):
                answer = await socket.recv_multipart()
                if len(answer) != 4 or len(answer[2]) != 8 or answer[2] == _END_SEQ:
                    break
                seq = int.from_bytes(answer[2], "big")
                if seq >= stop:
                    continue  # the live socket brings these
                if seq != first + len(got):
                    return None
                got.append(answer[1:])
        except zmq.ZMQError:
            return None
        finally:
            socket.close(linger=0)
        return got if len(got) == stop - first else None

    def receive(self, source: str, frames: Sequence[bytes]) -> KVEventBatch | None:
        """Decode, sequence-check and deliver one message (the socket pump calls this)."""
        try:
            batch = decode_message(frames, source)
        except MalformedMessage as error:
            self.stats.malformed += 1
            log.warning("kv_events_malformed", source=source, error=error)
            return None
        stats = self.stats
        stats.messages += 1
        stats.events += len(batch.events)
        stats.unknown_events += batch.skipped_events
        missed, restarted = self._track(source, batch.topic, batch.seq)
        if missed or restarted:
            batch = dataclasses.replace(batch, missed=missed, restarted=restarted)
        try:
            self._on_batch(batch)
        except Exception:
            stats.callback_errors += 1
            log.error("kv_events_callback_failed", exc_info=True, source=source, topic=batch.topic)
        return batch

    def _track(self, source: str, topic: str, seq: int) -> tuple[int, bool]:
        stream = (source, topic)
        previous = self.stats.last_seq.get(stream)
        self.stats.last_seq[stream] = seq
        if previous is None or seq == previous + 1:
            return 0, False
        if seq <= previous:
            self.stats.restarts += 1
            log.warning("kv_events_restart", source=source, topic=topic, previous_seq=previous, seq=seq)
            return 0, True
        missed = seq - previous - 1
        self.stats.gaps += 1
        self.stats.missed += missed
        log.warning("kv_events_gap", source=source, topic=topic, expected_seq=previous + 1, seq=seq, missed=missed)
        return missed, False


_END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The seq frame that ends a replay's answer (vLLM's ``ZmqEventPublisher.END_SEQ``)."""


async def _stop(socket: zmq.asyncio.Socket, task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    socket.close(linger=0)
