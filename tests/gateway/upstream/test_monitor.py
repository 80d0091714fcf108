"""Health probes against a real engine on loopback: a busy engine is not a dead one.

The engine here answers ``/health`` as told (late, or with a status) and everything else at once,
so the relay's requests and the probes can disagree.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest_asyncio

from priority_gateway.core.dispatcher import Dispatcher, PoolSpec
from priority_gateway.upstream.h1 import EngineClient
from priority_gateway.upstream.monitor import EngineMonitor


@dataclass
class Engine:
    url: str
    health_delay_s: float = 0.0
    health_status: int = 200
    connections: set[asyncio.StreamWriter] = field(default_factory=set)


async def _answer(engine: Engine, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    engine.connections.add(writer)
    try:
        while head := await reader.readuntil(b"\r\n\r\n"):
            path = head.split(b" ", 2)[1]
            status, body = 200, b"{}"
            if path == b"/health":
                await asyncio.sleep(engine.health_delay_s)
                status, body = engine.health_status, b""
            elif path == b"/stream":  # one token every 50 ms for 1.5 s, as a long generation streams
                await reader.readexactly(2)
                writer.write(b"HTTP/1.1 200 X\r\ntransfer-encoding: chunked\r\n\r\n")
                for _ in range(30):
                    writer.write(b"8\r\ndata: x\n\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.05)
                writer.write(b"0\r\n\r\n")
                continue
            if head.startswith(b"POST"):
                await reader.readexactly(2)  # the relay's body here is always ``{}``
            writer.write(b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        engine.connections.discard(writer)
        writer.close()


@pytest_asyncio.fixture(loop_scope="function")
async def engine() -> AsyncIterator[Engine]:
    holder: list[Engine] = []
    server = await asyncio.start_server(lambda r, w: _answer(holder[0], r, w), "127.0.0.1", 0)
    holder.append(Engine(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"))
    async with server:
        yield holder[0]
        for writer in list(holder[0].connections):  # each handler ends on its closed stream
            writer.transport.abort()
        await asyncio.sleep(0.05)


@pytest_asyncio.fixture(loop_scope="function")
async def monitor(engine: Engine) -> AsyncIterator[EngineMonitor]:
    dispatcher = Dispatcher([PoolSpec("interactive", [engine.url])])
    watcher = EngineMonitor(
        dispatcher,
        lambda url, _pool: EngineClient(url, read_timeout=5.0),
        health_interval_s=0.02,
        health_timeout_s=0.2,
        unhealthy_after=1,
        scrape_interval_s=60.0,
    )
    watcher.watch(engine.url, "interactive")
    yield watcher
    await watcher.close()


def healthy(monitor: EngineMonitor, url: str) -> bool:
    engine = monitor.dispatcher.engine(url)
    assert engine is not None
    return engine.healthy


async def relay_for(monitor: EngineMonitor, url: str, seconds: float) -> bool:
    """Requests to the engine back to back, as the relay sends them; False if one was not answered."""
    client = monitor.client(url)
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        response = await client.request(b"POST", b"/v1/completions", (), b"{}")
        await response.read()
        if response.status != 200:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_probes_that_time_out_while_the_engine_answers_the_relay_keep_it_in(
    monitor: EngineMonitor, engine: Engine
) -> None:
    # An engine busy with a flood answers its requests and its /health late: taking it out would
    # turn load into an outage.
    engine.health_delay_s = 1.0
    assert await relay_for(monitor, engine.url, 1.5)
    assert healthy(monitor, engine.url)


async def test_probes_that_time_out_while_the_engine_streams_an_answer_keep_it_in(
    monitor: EngineMonitor, engine: Engine
) -> None:
    engine.health_delay_s = 1.0
    response = await monitor.client(engine.url).request(b"POST", b"/stream", (), b"{}")
    assert len(await response.read()) == 30 * len(b"data: x\n")
    assert healthy(monitor, engine.url)


async def test_probes_that_time_out_with_nothing_answered_take_the_engine_out(
    monitor: EngineMonitor, engine: Engine
) -> None:
    engine.health_delay_s = 1.0
    await asyncio.sleep(0.6)
    assert not healthy(monitor, engine.url)
    engine.health_delay_s = 0.0
    await asyncio.sleep(1.5)  # the probe in flight ends at its timeout; the next one passes
    assert healthy(monitor, engine.url)


async def test_an_engine_that_says_it_is_unhealthy_is_taken_out_whatever_it_answers(
    monitor: EngineMonitor, engine: Engine
) -> None:
    engine.health_status = 503
    assert await relay_for(monitor, engine.url, 0.5)
    assert not healthy(monitor, engine.url)
