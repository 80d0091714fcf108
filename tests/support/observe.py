"""Reading a running process from outside: its Prometheus metrics, and waiting for a condition."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` with these labels at ``url/metrics``."""
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
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
