"""Real processes on loopback for integration tests: engines, gateways, redis.

The processes themselves are ``priority_gateway.loopback``'s (the benchmarks use them too); here they run
from the repository's root, and the misbehaving engine and the one-engine stack are tests' own.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from priority_gateway import loopback
from priority_gateway.loopback import free_port, rss_bytes

ROOT = Path(__file__).resolve().parents[2]

__all__ = [
    "ROOT",
    "Proc",
    "free_port",
    "rss_bytes",
    "start_broken_engine",
    "start_engine",
    "start_gateway",
    "start_stack",
]


class Proc(loopback.Proc):
    def __init__(self, cmd: list[str], url: str, log_path: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(cmd, url, log_path, env, cwd=ROOT)


def start_engine(tmp: Path, *args: str, **options: Any) -> loopback.Proc:
    return loopback.start_engine(tmp, *args, cwd=ROOT, **options)


def start_gateway(tmp: Path, config: dict[str, Any], **options: Any) -> loopback.Proc:
    return loopback.start_gateway(tmp, config, cwd=ROOT, **options)


def start_broken_engine(tmp: Path) -> Proc:
    """An engine that misbehaves as its requests' ``x-request-id`` asks (``tests.support.broken_engine``)."""
    port = free_port()
    cmd = [sys.executable, "-m", "tests.support.broken_engine", str(port)]
    return Proc(cmd, f"http://127.0.0.1:{port}", tmp / f"broken-engine-{port}.log").start()


def start_stack(procs: list[loopback.Proc], tmp: Path, config: dict[str, Any], *engine_args: str) -> loopback.Proc:
    """One simulated engine as the ``interactive`` pool and a gateway with ``config`` in front; both ready."""
    engine = start_engine(tmp, *engine_args)
    procs.append(engine)
    engine.wait_ready()
    gateway = start_gateway(tmp, {"pools": {"interactive": {"engines": [engine.url]}}, **config})
    procs.append(gateway)
    return gateway.wait_ready("/ready")
