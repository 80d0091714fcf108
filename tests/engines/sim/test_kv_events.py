"""The simulator's KV event publisher: replay as vLLM's ZmqEventPublisher answers it."""

from __future__ import annotations

from collections.abc import Iterator

import msgpack
import pytest
import zmq

from priority_gateway.core.kv_events import BlockRemoved
from priority_gateway.engines.sim.kv_events import END_SEQ, ZmqPublisher
from priority_gateway.loopback import free_port


@pytest.fixture
def publisher() -> Iterator[tuple[ZmqPublisher, str]]:
    replay = f"tcp://127.0.0.1:{free_port()}"
    pub = ZmqPublisher(f"tcp://*:{free_port()}", replay_endpoint=replay, buffer_steps=3)
    yield pub, replay
    pub.close()


def ask(replay: str, first: int) -> list[list[bytes]]:
    """A replay request as vLLM's own subscriber example sends it (DEALER, empty delimiter)."""
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.connect(replay)
    try:
        dealer.send_multipart([b"", first.to_bytes(8, "big")])
        answers = []
        while True:
            answer = dealer.recv_multipart()
            answers.append(answer)
            if answer[2] == END_SEQ:
                return answers
    finally:
        dealer.close(linger=0)


def test_replay_answers_the_kept_batches_from_the_asked_seq_then_the_end_marker(publisher):
    pub, replay = publisher
    for h in range(5):
        pub.publish([BlockRemoved([h])])
    answers = ask(replay, 3)
    assert [a[2] for a in answers] == [(3).to_bytes(8, "big"), (4).to_bytes(8, "big"), END_SEQ]
    assert all(a[0] == b"" for a in answers) and answers[-1][1] == answers[-1][3] == b""
    assert [msgpack.unpackb(a[3])[1][0]["block_hashes"] for a in answers[:-1]] == [[3], [4]]


def test_replay_keeps_only_the_last_buffer_steps_batches(publisher):
    pub, replay = publisher
    for h in range(5):
        pub.publish([BlockRemoved([h])])
    assert [int.from_bytes(a[2], "big", signed=True) for a in ask(replay, 0)] == [2, 3, 4, -1]
