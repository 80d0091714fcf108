"""A real ``redis-server`` for tests: free port, its own temp directory, stopped with the test
(``priority_gateway.loopback.RedisServer``, the one the benchmarks use, with the installed binary)."""

from __future__ import annotations

import shutil
from pathlib import Path

from priority_gateway import loopback

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisServer(loopback.RedisServer):
    """One redis-server; ``restart`` keeps its port and data directory (AOF on when ``durable``)."""

    def __init__(self, tmp: Path, durable: bool = False) -> None:
        if not Path(REDIS_SERVER).exists():
            raise RuntimeError(
                "redis-server is not installed: the store's Redis tests need it "
                "(apt-get install redis-server; .ci/run installs it)"
            )
        super().__init__(tmp, REDIS_SERVER, durable)
