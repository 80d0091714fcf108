"""Structured logs: lines logged on the event loop go out together shortly after, errors at once,
and a line written per request (``formatted``) reads as any other."""

from __future__ import annotations

import asyncio
import io
import logging
import time

import pytest

from priority_gateway import log


class Stream(io.StringIO):
    """A text stream that counts its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


@pytest.fixture
def stream(monkeypatch):
    out = Stream()
    monkeypatch.setattr("sys.stderr", out)
    log.setup("info")
    yield out
    logging.getLogger("gateway").handlers[:] = []
    logging.getLogger("gateway").propagate = True


async def written(stream: Stream) -> None:
    deadline = time.monotonic() + 5
    while not stream.writes:
        assert time.monotonic() < deadline, "held lines never written"
        await asyncio.sleep(0.001)


async def test_lines_logged_on_the_loop_are_written_together_in_order(stream, monkeypatch):
    monkeypatch.setattr(log, "FLUSH_AFTER_S", 0.5)
    for i in range(50):
        log.info("step", n=i)
        log.formatted("access", f"request_id=r{i} status=200")
        await asyncio.sleep(0)  # other requests' turns in between
    assert stream.writes == 0
    await written(stream)
    assert stream.writes == 1
    lines = stream.getvalue().splitlines()
    assert len(lines) == 100
    assert [line.split(" ", 3)[2] for line in lines[:2]] == ["event=step", "event=access"]
    assert lines[-1].endswith("event=access request_id=r49 status=200")


@pytest.mark.parametrize("level", ["warning", "error"])
async def test_a_warning_or_error_is_written_at_once_after_what_came_before_it(stream, level):
    log.info("before")
    getattr(log, level)("broke", reason="x")
    assert stream.writes == 1
    assert [line.split(" ")[2] for line in stream.getvalue().splitlines()] == ["event=before", "event=broke"]


async def test_flush_writes_what_is_held(stream):
    log.info("last words")
    log.flush()
    assert stream.getvalue().splitlines()[-1].endswith("event=last words")


def test_without_a_running_loop_a_line_is_written_at_once(stream):
    log.formatted("access", "request_id=a status=200")
    log.info("other")
    assert stream.writes == 2


async def test_a_formatted_line_reads_as_a_logged_one(stream):
    log.formatted("access", "status=200")
    log.event("access", logging.INFO, False, status=200)
    await written(stream)
    direct, through_record = stream.getvalue().splitlines()
    assert direct.split(" ", 1)[1] == through_record.split(" ", 1)[1] == "level=info event=access status=200"
    assert direct.startswith("ts=") and direct[3:].split(" ")[0].endswith("Z")


async def test_a_flood_of_lines_is_written_before_the_timer_when_many_are_held(stream):
    for i in range(log.FLUSH_LINES):
        log.formatted("access", f"n={i}")
    assert stream.writes == 1
    assert len(stream.getvalue().splitlines()) == log.FLUSH_LINES
