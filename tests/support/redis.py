"""A real ``redis-server`` for tests: free port, its own temp directory, stopped with the test."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import redis

from tests.support.procs import Proc, free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisServer:
    """One redis-server; ``restart`` keeps its port and data directory (AOF on when ``durable``)."""

    def __init__(self, tmp: Path, durable: bool = False) -> None:
        if not Path(REDIS_SERVER).exists():
            raise RuntimeError(
                "redis-server is not installed: the store's Redis tests need it "
                "(apt-get install redis-server; .ci/run installs it)"
            )
        self.dir = tmp / f"redis-{free_port()}"
        self.dir.mkdir(parents=True)
        self.port = free_port()
        self.durable = durable
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: Proc | None = None

    def _cmd(self) -> list[str]:
        cmd = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir)]
        cmd += ["--save", "", "--protected-mode", "no"]
        if self.durable:
            cmd += ["--appendonly", "yes", "--appendfsync", "always"]
        return cmd

    def start(self) -> RedisServer:
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

    def restart(self) -> RedisServer:
        self.kill()
        return self.start()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)
