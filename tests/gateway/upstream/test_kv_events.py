"""KV event subscriber against local ZMQ publishers that speak vLLM's exact wire format.

The publishers are XPUB sockets (wire-compatible with vLLM's PUB) so a test can wait
for the subscription to arrive instead of sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio

from priority_gateway.core.kv_events import BlockRemoved as CoreBlockRemoved
from priority_gateway.engines.sim.kv_events import ZmqPublisher
from priority_gateway.loopback import free_port
from priority_gateway.upstream.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventSubscriber,
    MalformedMessage,
    decode_message,
)

HASH_A = 12546693002379343379  # above 2**63: must survive as an unsigned 64-bit int
HASH_B = 8525767285400775546


def stored(hashes: list[Any], parent: Any = None, block_size: int = 128) -> dict[str, Any]:
    """A BlockStored map as vLLM 0.32's msgspec encoder writes it."""
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": list(range(len(hashes) * block_size)),
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None] * len(hashes),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def removed(hashes: list[Any]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", "group_idx": 0}


def frames(topic: str, seq: int, events: list[Any], dp_rank: int | None = 0) -> list[bytes]:
    body: list[Any] = [time.time(), events]
    if dp_rank is not None:
        body.append(dp_rank)
    return [topic.encode(), seq.to_bytes(8, "big"), msgpack.packb(body)]


class Received:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[KVEventBatch] = asyncio.Queue()

    def __call__(self, batch: KVEventBatch) -> None:
        self.queue.put_nowait(batch)

    async def next(self) -> KVEventBatch:
        return await asyncio.wait_for(self.queue.get(), timeout=5)


@pytest.fixture
def context() -> Iterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def received() -> Received:
    return Received()


@pytest.fixture
async def subscriber(context: zmq.asyncio.Context, received: Received) -> AsyncIterator[KVEventSubscriber]:
    async with KVEventSubscriber(received, context=context) as sub:
        yield sub


async def publisher_connected_to(context: zmq.asyncio.Context, endpoint: str) -> zmq.asyncio.Socket:
    """An engine in connect mode (endpoint without ``*``): it connects to the gateway."""
    pub = context.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(endpoint)
    await asyncio.wait_for(pub.recv(), timeout=5)  # the subscription
    return pub


async def test_bound_socket_decodes_every_event_type(
    subscriber: KVEventSubscriber, context: zmq.asyncio.Context, received: Received
) -> None:
    endpoint = subscriber.bind("tcp://127.0.0.1:*")
    pub = await publisher_connected_to(context, endpoint)
    events = [stored([HASH_A, HASH_B]), stored([7], parent=HASH_B), removed([HASH_A]), {"type": "AllBlocksCleared"}]
    await pub.send_multipart(frames("e8000", 0, events))

    batch = await received.next()
    assert (batch.source, batch.topic, batch.seq, batch.dp_rank) == (endpoint, "e8000", 0, 0)
    first, second, third, fourth = batch.events
    assert isinstance(first, BlockStored)
    assert first.block_hashes == (HASH_A, HASH_B)
    assert first.parent_block_hash is None
    assert (first.block_size, first.token_count, first.medium, first.group_idx) == (128, 256, "GPU", 0)
    assert isinstance(second, BlockStored)
    assert second.parent_block_hash == HASH_B
    assert third == BlockRemoved(block_hashes=(HASH_A,), medium="GPU", group_idx=0)
    assert fourth == AllBlocksCleared()
    assert subscriber.stats.events == 4


async def test_engines_sharing_a_bound_socket_are_told_apart_by_topic(
    subscriber: KVEventSubscriber, context: zmq.asyncio.Context, received: Received
) -> None:
    endpoint = subscriber.bind("tcp://127.0.0.1:*")
    first = await publisher_connected_to(context, endpoint)
    second = await publisher_connected_to(context, endpoint)
    await first.send_multipart(frames("e1", 0, [stored([1])]))
    await second.send_multipart(frames("e2", 0, [stored([2])]))
    await first.send_multipart(frames("e1", 1, [removed([1])]))

    batches = [await received.next() for _ in range(3)]
    by_topic = {(b.topic, b.seq): b for b in batches}
    assert set(by_topic) == {("e1", 0), ("e2", 0), ("e1", 1)}
    assert by_topic[("e2", 0)].events[0].block_hashes == (2,)
    assert subscriber.stats.gaps == 0
    assert subscriber.stats.last_seq == {(endpoint, "e1"): 1, (endpoint, "e2"): 0}


async def test_connects_to_an_engine_that_binds(
    subscriber: KVEventSubscriber, context: zmq.asyncio.Context, received: Received
) -> None:
    pub = context.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:*")
    endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
    subscriber.connect(endpoint)
    await asyncio.wait_for(pub.recv(), timeout=5)
    await pub.send_multipart(frames("", 5, [stored([HASH_A])]))

    batch = await received.next()
    assert (batch.source, batch.topic, batch.seq) == (endpoint, "", 5)
    assert (batch.missed, batch.restarted) == (0, False)  # joining mid-stream is not a gap
    assert subscriber.endpoints == [endpoint]
    pub.close()


async def test_sequence_gap_is_counted_and_delivered(
    subscriber: KVEventSubscriber, context: zmq.asyncio.Context, received: Received
) -> None:
    pub = await publisher_connected_to(context, subscriber.bind("tcp://127.0.0.1:*"))
    for seq in (0, 1, 4, 5):
        await pub.send_multipart(frames("e1", seq, [stored([seq])]))

    batches = [await received.next() for _ in range(4)]
    assert [(b.seq, b.missed) for b in batches] == [(0, 0), (1, 0), (4, 2), (5, 0)]
    assert (subscriber.stats.gaps, subscriber.stats.missed, subscriber.stats.messages) == (1, 2, 4)


async def test_sequence_going_back_means_the_engine_restarted(
    subscriber: KVEventSubscriber, context: zmq.asyncio.Context, received: Received
) -> None:
    pub = await publisher_connected_to(context, subscriber.bind("tcp://127.0.0.1:*"))
    for seq in (0, 1, 2, 0, 1):
        await pub.send_multipart(frames("e1", seq, [stored([seq])]))

    batches = [await received.next() for _ in range(5)]
    assert [b.restarted for b in batches] == [False, False, False, True, False]
    assert (subscriber.stats.restarts, subscriber.stats.gaps) == (1, 0)


async def test_malformed_messages_are_counted_and_delivery_goes_on(
    subscriber: KVEventSubscriber, context: zmq.asyncio.Context, received: Received
) -> None:
    pub = await publisher_connected_to(context, subscriber.bind("tcp://127.0.0.1:*"))
    await pub.send_multipart([b"e1", (0).to_bytes(8, "big"), b"\xc1 not msgpack"])
    await pub.send_multipart([b"e1", b"short", msgpack.packb([0.0, []])])
    await pub.send_multipart([b"e1", (1).to_bytes(8, "big"), msgpack.packb([0.0, [{"type": "BlockStored"}]])])
    await pub.send_multipart(frames("e1", 2, [stored([9])]))

    batch = await received.next()
    assert batch.seq == 2
    assert subscriber.stats.malformed == 3
    assert subscriber.stats.messages == 1


async def test_callback_errors_do_not_stop_delivery(context: zmq.asyncio.Context) -> None:
    seen: list[int] = []

    def flaky(batch: KVEventBatch) -> None:
        seen.append(batch.seq)
        if batch.seq == 0:
            raise RuntimeError("index unavailable")

    async with KVEventSubscriber(flaky, context=context) as sub:
        pub = await publisher_connected_to(context, sub.bind("tcp://127.0.0.1:*"))
        await pub.send_multipart(frames("e1", 0, [stored([1])]))
        await pub.send_multipart(frames("e1", 1, [stored([2])]))
        for _ in range(500):
            if len(seen) == 2:
                break
            await asyncio.sleep(0.01)
    assert seen == [0, 1]
    assert sub.stats.callback_errors == 1


async def test_close_stops_receiving(subscriber: KVEventSubscriber, context: zmq.asyncio.Context) -> None:
    endpoint = subscriber.bind("tcp://127.0.0.1:*")
    await publisher_connected_to(context, endpoint)
    await subscriber.close()
    assert subscriber.endpoints == []


def test_payload_without_dp_rank_and_with_bytes_hashes() -> None:
    digest = bytes(range(32))
    batch = decode_message(frames("t", 3, [stored([digest], parent=b"\x01" * 32)], dp_rank=None), "src")
    assert batch.dp_rank is None
    (event,) = batch.events
    assert isinstance(event, BlockStored)
    assert event.block_hashes == (digest,)
    assert event.parent_block_hash == b"\x01" * 32


def test_unknown_event_types_are_skipped() -> None:
    batch = decode_message(frames("t", 0, [{"type": "BlockPinned", "x": 1}, removed([HASH_A])]))
    assert batch.events == (BlockRemoved(block_hashes=(HASH_A,), medium="GPU", group_idx=0),)
    assert batch.skipped_events == 1


@pytest.mark.parametrize(
    "message",
    [
        [b"t", (0).to_bytes(8, "big")],
        [b"t", (0).to_bytes(8, "big"), msgpack.packb({"ts": 0})],
        [b"t", (0).to_bytes(8, "big"), msgpack.packb([0.0, ["BlockStored"]])],
        [b"t", (0).to_bytes(8, "big"), msgpack.packb(["noon", []])],
    ],
)
def test_decode_rejects_messages_not_in_vllm_format(message: list[bytes]) -> None:
    with pytest.raises(MalformedMessage):
        decode_message(message)


async def test_binding_a_taken_endpoint_raises_and_keeps_nothing_open(
    subscriber: KVEventSubscriber, context: zmq.asyncio.Context, received: Received
) -> None:
    endpoint = subscriber.bind("tcp://127.0.0.1:*")
    async with KVEventSubscriber(received, context=context) as second:
        with pytest.raises(zmq.ZMQError):
            second.bind(endpoint)
        assert second.endpoints == []


# -- replay: the engine's replay socket fills a gap (the simulator's publisher speaks vLLM's protocol) --


def engine_with_replay(buffer_steps: int = 10_000) -> tuple[ZmqPublisher, str, str]:
    """An engine that binds its publisher and its replay socket, as ``tcp://*:PORT`` tells vLLM to."""
    port, replay_port = free_port(), free_port()
    pub = ZmqPublisher(f"tcp://*:{port}", replay_endpoint=f"tcp://*:{replay_port}", buffer_steps=buffer_steps)
    return pub, f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}"


async def publish_until_received(pub: ZmqPublisher, received: Received) -> KVEventBatch:
    """Publish until a batch arrives (a new subscription takes a moment to reach the publisher)."""
    for _ in range(200):
        pub.publish([CoreBlockRemoved([pub.seq])])
        try:
            return await asyncio.wait_for(received.queue.get(), timeout=0.05)
        except TimeoutError:
            continue
    raise AssertionError("no batch arrived")


async def lose_three(subscriber: KVEventSubscriber, pub: ZmqPublisher, endpoint: str, replay: str | None) -> None:
    """The subscriber drops its connection while the engine publishes three batches, then comes back."""
    await subscriber.disconnect(endpoint)
    for _ in range(3):
        pub.publish([CoreBlockRemoved([pub.seq])])
    subscriber.connect(endpoint, replay=replay)


async def drain(received: Received) -> list[KVEventBatch]:
    out = []
    while not received.queue.empty():
        out.append(received.queue.get_nowait())
    return out


async def test_a_gap_is_filled_from_the_engines_replay_socket_in_order(
    subscriber: KVEventSubscriber, received: Received
) -> None:
    pub, endpoint, replay = engine_with_replay()
    try:
        subscriber.connect(endpoint, replay=replay)
        first = await publish_until_received(pub, received)
        await lose_three(subscriber, pub, endpoint, replay)
        after = await publish_until_received(pub, received)
        batches = [first, after, *await drain(received)]
        seqs = [b.seq for b in batches]
        # Delivered: the first, every batch lost in between (replayed), then the live one, in order.
        assert seqs == list(range(first.seq, first.seq + len(seqs)))
        assert [list(e.block_hashes) for b in batches for e in b.events] == [[s] for s in seqs]
        assert all(b.missed == 0 and not b.restarted for b in batches)
        stats = subscriber.stats
        assert (stats.gaps, stats.missed, stats.replays, stats.replay_failures) == (0, 0, 1, 0)
        assert stats.replayed >= 3
    finally:
        pub.close()


async def test_a_gap_the_engine_no_longer_keeps_stands(subscriber: KVEventSubscriber, received: Received) -> None:
    pub, endpoint, replay = engine_with_replay(buffer_steps=1)
    try:
        subscriber.connect(endpoint, replay=replay)
        first = await publish_until_received(pub, received)
        await lose_three(subscriber, pub, endpoint, replay)
        after = await publish_until_received(pub, received)
        assert after.missed == after.seq - first.seq - 1 >= 3  # nothing replayed: the gap is reported
        stats = subscriber.stats
        assert (stats.gaps, stats.replays, stats.replay_failures, stats.replayed) == (1, 0, 1, 0)
    finally:
        pub.close()


def replay_socket(context: zmq.asyncio.Context) -> tuple[zmq.asyncio.Socket, str]:
    """A replay endpoint the test answers (or does not) itself, and its address."""
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


async def test_a_replay_socket_that_does_not_answer_costs_its_timeout_and_the_gap_stands(
    context: zmq.asyncio.Context, received: Received
) -> None:
    pub, endpoint, _ = engine_with_replay()
    silent, nowhere = replay_socket(context)  # takes the request, never answers
    try:
        async with KVEventSubscriber(received, context=context, replay_timeout_s=0.2) as subscriber:
            subscriber.connect(endpoint, replay=nowhere)
            first = await publish_until_received(pub, received)
            await lose_three(subscriber, pub, endpoint, nowhere)
            started = time.monotonic()
            after = await publish_until_received(pub, received)
            assert time.monotonic() - started < 3
            assert after.missed >= 3 and after.seq > first.seq + 3
            assert (subscriber.stats.replay_failures, subscriber.stats.replays) == (1, 0)
    finally:
        silent.close()
        pub.close()


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(lambda first: [[b"", b"", (first + 1).to_bytes(8, "big"), b"x"]], id="skips-the-first-missed"),
        pytest.param(lambda first: [[b"", b"", first.to_bytes(8, "big")]], id="malformed"),
        pytest.param(lambda first: [[b"", b"", first.to_bytes(8, "big"), b"not msgpack"]] * 50, id="repeats-forever"),
    ],
)
async def test_a_replay_answer_that_does_not_hold_the_gap_in_order_leaves_the_gap_standing(
    context: zmq.asyncio.Context, received: Received, answer
) -> None:
    """An engine's replay socket is not trusted to be right: an answer that skips, breaks the format or
    repeats itself delivers nothing of it, and the batch that opened the gap says what was missed."""
    pub, endpoint, _ = engine_with_replay()
    liar, replay = replay_socket(context)

    async def serve() -> None:
        while True:
            client, _, start = await liar.recv_multipart()
            for frames in answer(int.from_bytes(start, "big")):
                await liar.send_multipart([client, *frames])

    server = asyncio.get_running_loop().create_task(serve())
    try:
        async with KVEventSubscriber(received, context=context, replay_timeout_s=0.3) as subscriber:
            subscriber.connect(endpoint, replay=replay)
            first = await publish_until_received(pub, received)
            await lose_three(subscriber, pub, endpoint, replay)
            after = await publish_until_received(pub, received)
            assert after.missed == after.seq - first.seq - 1 >= 3
            stats = subscriber.stats
            assert (stats.replay_failures, stats.replays, stats.replayed, stats.malformed) == (1, 0, 0, 0)
    finally:
        server.cancel()
        liar.close()
        pub.close()
