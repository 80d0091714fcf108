"""Reading a running process from outside: its Prometheus metrics, and waiting for a condition."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import shlex
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

import httpx
from prometheus_client.parser import text_string_to_metric_families


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` with these labels at ``url/metrics``."""
    return _summed(httpx.get(url + "/metrics", timeout=5).text, name, labels)


async def async_metric(url: str, name: str, **labels: str) -> float:
    """``metric`` without blocking the event loop the test's own requests run on."""
    async with httpx.AsyncClient(timeout=5) as client:
        return _summed((await client.get(url + "/metrics")).text, name, labels)


def _summed(text: str, name: str, labels: dict[str, str]) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05) -> bool:
    """Whether ``predicate`` came true within ``timeout``: how a test waits for something to have
    happened in another process (never a sleep of a guessed length)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


async def until(predicate: Callable[[], bool | Awaitable[bool]], within_s: float = 10.0, every_s: float = 0.02) -> bool:
    """``wait_for`` on a running event loop: the loop's other tasks (the requests a test has in flight)
    go on while it waits. ``predicate`` may be a coroutine function (``async_metric``)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        result = predicate()
        if await result if inspect.isawaitable(result) else result:
            return True
        await asyncio.sleep(every_s)
    return False


def log_lines(text: str, event: str | None = None) -> list[dict[str, str]]:
    """The gateway's structured log lines (``key=value``, values quoted where needed) as dicts."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("ts="):
            continue
        fields = dict(part.split("=", 1) for part in shlex.split(line) if "=" in part)
        if event is None or fields.get("event") == event:
            lines.append(fields)
    return lines


class Peak:
    """The highest value a reading took while sampled (every 20 ms)."""

    def __init__(self, read: Callable[[], float]) -> None:
        self.read = read
        self.before = read()
        self.peak = self.before
        self._done = threading.Event()

    @property
    def growth(self) -> float:
        return self.peak - self.before

    def sample(self) -> None:
        self.peak = max(self.peak, self.read())

    def _run(self) -> None:
        while not self._done.wait(0.02):
            self.sample()


@contextlib.contextmanager
def peak_of(read: Callable[[], float]) -> Iterator[Peak]:
    """Sample ``read()`` in a thread while the block runs."""
    peak = Peak(read)
    thread = threading.Thread(target=peak._run, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        peak._done.set()
        thread.join()
        peak.sample()


def peak_memory(read: Callable[[], int]) -> contextlib.AbstractContextManager[Peak]:
    """The most resident memory a process had while the block ran, in MiB (``read()``: bytes)."""
    return peak_of(lambda: read() / 2**20)
