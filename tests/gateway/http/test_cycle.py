"""The gateway's ASGI cycle on a recording transport: what goes out in how many writes, what
``receive`` says when, the disconnect callback, and nothing of a request left to the collector."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
from uvicorn.protocols.http.flow_control import FlowControl

from priority_gateway.http.cycle import DISCONNECT, Cycle


class Transport:
    """What a cycle writes, one entry per ``write``."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def cycle(method: str = "POST", keep_alive: bool = True) -> tuple[Cycle, Transport, list[str]]:
    transport = Transport()
    responses: list[str] = []
    scope = {"type": "http", "method": method, "path": "/v1/chat/completions", "headers": []}
    made = Cycle(
        scope,
        transport,  # type: ignore[arg-type]
        FlowControl(transport),  # type: ignore[arg-type]
        asyncio.get_running_loop(),
        [],
        False,
        keep_alive,
        lambda: responses.append("done"),
    )
    return made, transport, responses


def arrived(c: Cycle, body: bytes, complete: bool = True) -> None:
    """What the protocol does as the request's body arrives."""
    c.body += body
    if complete:
        c.more_body = False
    c.message_event.set()


async def plain(_scope, receive, send) -> None:
    message = await receive()
    body = b'{"echo": %d}' % len(message["body"])
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def test_a_plain_answer_is_one_write_of_head_and_body():
    c, transport, responses = cycle()
    arrived(c, b'{"model": "m"}')
    await c.run_asgi(plain)
    (written,) = transport.writes
    head, body = written.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 12" in head
    assert body == b'{"echo": 14}'
    assert responses == ["done"] and c.response_complete and not transport.closed


async def test_a_head_whose_body_does_not_follow_goes_out_at_the_end_of_the_loop_iteration():
    c, transport, _ = cycle()
    arrived(c, b"{}")
    first_token = asyncio.Event()

    async def stream(_scope, receive, send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await first_token.wait()
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    task = asyncio.create_task(c.run_asgi(stream))
    for _ in range(3):
        await asyncio.sleep(0)  # the task's first step, then the loop iteration's end
    (head,) = transport.writes
    assert head.endswith(b"\r\n\r\n") and b"transfer-encoding: chunked" in head
    first_token.set()
    await task
    assert transport.writes[1:] == [b"9\r\ndata: 1\n\n\r\n", b"0\r\n\r\n"]


async def test_receive_hands_over_a_body_that_came_with_the_head_then_waits_for_the_end():
    c, _, _ = cycle()
    arrived(c, b"whole")
    assert await c.receive() == {"type": "http.request", "body": b"whole", "more_body": False}
    # Nothing more to say until the answer completes: no busy loop of empty bodies.
    waiting = asyncio.create_task(c.receive())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()
    c.response_complete = True
    c.message_event.set()
    assert await waiting == {"type": "http.disconnect"}


async def test_receive_waits_for_a_body_sent_after_the_head():
    c, _, _ = cycle()
    waiting = asyncio.create_task(c.receive())
    await asyncio.sleep(0)
    assert not waiting.done()
    arrived(c, b"part", complete=False)
    assert await waiting == {"type": "http.request", "body": b"part", "more_body": True}
    arrived(c, b"end")
    assert await c.receive() == {"type": "http.request", "body": b"end", "more_body": False}


async def test_the_disconnect_callback_is_told_once_of_a_client_gone():
    c, _, _ = cycle()
    gone: list[str] = []
    c.scope["extensions"][DISCONNECT](lambda: gone.append("gone"))
    c.disconnected = True
    c.message_event.set()
    c.message_event.set()
    assert gone == ["gone"]
    # A client already gone when the callback comes is told at once.
    late: list[str] = []
    c.scope["extensions"][DISCONNECT](lambda: late.append("gone"))
    assert late == ["gone"]


async def test_a_completed_answer_tells_no_disconnect():
    c, _, _ = cycle()
    gone: list[str] = []
    arrived(c, b"{}")

    async def app(scope, receive, send) -> None:
        scope["extensions"][DISCONNECT](lambda: gone.append("gone"))
        await plain(scope, receive, send)

    await c.run_asgi(app)
    c.disconnected = True
    c.message_event.set()
    assert gone == []


async def test_nothing_of_a_request_waits_for_the_garbage_collector():
    c, transport, _ = cycle()
    arrived(c, b"{}")

    async def app(scope, receive, send) -> None:
        scope["extensions"][DISCONNECT](lambda: None)
        await plain(scope, receive, send)

    await c.run_asgi(app)
    await asyncio.sleep(0)  # the head's flush, already written with the body, runs and lets go
    assert len(transport.writes) == 1
    freed = weakref.ref(c)
    gc.disable()
    try:
        del c
        assert freed() is None, "a reference loop keeps the cycle until a collection"
    finally:
        gc.enable()


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ([(b"x-bad", b"one\r\ninjected: two")], "value"),
        ([(b"bad name", b"x")], "name"),
    ],
)
async def test_a_header_that_would_break_the_head_is_refused(headers, problem):
    c, transport, _ = cycle()
    with pytest.raises(RuntimeError, match=problem):
        await c.send({"type": "http.response.start", "status": 200, "headers": headers})
    assert transport.writes == []


async def test_a_body_longer_or_shorter_than_its_length_is_an_error():
    c, _, _ = cycle()
    await c.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"3")]})
    with pytest.raises(RuntimeError, match="longer"):
        await c.send({"type": "http.response.body", "body": b"four"})
    c, _, _ = cycle()
    await c.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"3")]})
    with pytest.raises(RuntimeError, match="shorter"):
        await c.send({"type": "http.response.body", "body": b"tw"})


async def test_an_application_that_fails_before_answering_gets_a_500_and_the_connection_closes():
    c, transport, _ = cycle()
    arrived(c, b"{}")

    async def broken(_scope, _receive, _send) -> None:
        raise ValueError("boom")

    await c.run_asgi(broken)
    (written,) = transport.writes
    assert written.startswith(b"HTTP/1.1 500 ") and written.endswith(b"Internal Server Error")
    assert transport.closed


async def test_head_answers_carry_no_body_and_a_closing_answer_closes():
    c, transport, _ = cycle(method="HEAD", keep_alive=False)
    arrived(c, b"")
    await c.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    await c.send({"type": "http.response.body", "body": b"hello"})
    (written,) = transport.writes
    assert written.endswith(b"connection: close\r\n\r\n")
    assert transport.closed


async def test_a_closing_answer_before_the_body_has_arrived_leaves_the_close_to_the_protocol():
    # Closed now, the unread rest of the body would answer with a reset; the protocol lingers instead.
    c, transport, responses = cycle(keep_alive=False)
    arrived(c, b'{"par', complete=False)
    await c.send({"type": "http.response.start", "status": 413, "headers": [(b"content-length", b"2")]})
    await c.send({"type": "http.response.body", "body": b"{}"})
    assert c.response_complete and responses == ["done"]
    assert not transport.closed
