"""Real processes on loopback: simulated engines, gateways and ``redis-server``, each in its own process group.

For the test suite and the benchmarks, which run the gateway as users do (real processes, real
HTTP) and must not depend on each other: both import these from the installed package.

Rules:
- Every process gets a free port on 127.0.0.1 (below the ephemeral range, which clients take from) and a
  log file; ``stop`` ends it and its children.
- ``wait_ready`` gives up with the process's log when it exits or does not answer in time.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range where it can: a port a bind to 0 returns is
    one the kernel also gives outgoing connections, so a client anywhere on the host could take it
    before the process it is meant for binds it."""
    first_ephemeral = _first_ephemeral_port()
    if first_ephemeral > _LOWEST_PORT:
        for _ in range(64):
            port = _random.randrange(_LOWEST_PORT, first_ephemeral)
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_LOWEST_PORT = 10_000
_random = random.SystemRandom()


@functools.cache
def _first_ephemeral_port() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0  # not Linux: the kernel's choice


class Proc:
    """A child process in its own process group, stopped with its children."""

    def __init__(
        self,
        cmd: Sequence[str],
        url: str,
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.cmd = list(cmd)
        self.cwd = cwd
        self.url = url
        self.log_path = log_path
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        self._log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            self.cmd, cwd=self.cwd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self

    def wait_ready(self, path: str = "/health", timeout: float = 30.0, verify: ssl.SSLContext | bool = True) -> Proc:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.popen is not None
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.cmd} exited with {self.popen.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + path, timeout=1.0, verify=verify).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.cmd} not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-4000:]
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.popen is not None and self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)
            self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(timeout=10)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                self.kill()
        self._log.close()

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


def start_engine(
    tmp: Path,
    *args: str,
    model: str = "sim-model",
    port: int | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Proc:
    """A simulated vLLM engine (``python -m priority_gateway.engines.sim``) on a free loopback port,
    its log in ``tmp``."""
    port = port or free_port()
    cmd = [
        sys.executable,
        "-m",
        "priority_gateway.engines.sim",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        model,
        *args,
    ]
    return Proc(cmd, f"http://127.0.0.1:{port}", tmp / f"engine-{port}.log", env=env, cwd=cwd).start()


def start_gateway(
    tmp: Path,
    config: dict[str, Any],
    env: dict[str, str] | None = None,
    port: int | None = None,
    cwd: Path | None = None,
) -> Proc:
    """``gateway serve`` with ``config`` (written to ``tmp``) on a free loopback port; without a
    ``data_dir`` in ``config``, the SQLite store's file is one of its own in ``tmp``."""
    port = port or free_port()
    config = {"data_dir": str(tmp / f"gateway-{port}-data"), **config}
    path = tmp / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "priority_gateway", "serve", "--config", str(path), "--port", str(port)]
    return Proc(cmd, f"http://127.0.0.1:{port}", tmp / f"gateway-{port}.log", env=env, cwd=cwd).start()


class RedisServer:
    """A ``redis-server`` on a free loopback port with its own data directory, no snapshots (with
    ``durable``, the append-only file synced on every write); ``kill`` then ``start``, or ``restart``,
    keeps its port and data directory."""

    def __init__(self, tmp: Path, binary: str = "redis-server", durable: bool = False) -> None:
        self.binary = binary
        self.dir = tmp / f"redis-{free_port()}"
        self.dir.mkdir(parents=True)
        self.port = free_port()
        self.durable = durable
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: Proc | None = None

    def _cmd(self) -> list[str]:
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir)]
        cmd += ["--save", "", "--protected-mode", "no"]
        if self.durable:
            cmd += ["--appendonly", "yes", "--appendfsync", "always"]
        return cmd

    def start(self) -> RedisServer:
        """Start it and wait until it answers PING."""
        self.proc = Proc(self._cmd(), self.url, self.dir / "redis.log").start()
        deadline = time.monotonic() + 10
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except redis.exceptions.RedisError:
                    if time.monotonic() > deadline or not self.proc.alive:
                        raise RuntimeError(f"redis-server did not start:\n{self.proc.log()}") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill(signal.SIGKILL)
            self.proc.stop()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)


def rss_bytes(proc: Proc) -> int:
    """Resident memory of a started process, from /proc."""
    assert proc.popen is not None
    for line in Path(f"/proc/{proc.popen.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")
