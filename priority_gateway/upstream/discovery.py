"""Engine discovery from DNS: a headless Service's A records are the pool's engines.

Re-resolved periodically, so scaling a pool needs no gateway restart. A failed lookup
keeps the last known list (a DNS blip must not empty a pool).
"""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlsplit


def parse_dns_target(target: str) -> tuple[str, int]:
    parts = urlsplit(target)
    if parts.scheme != "dns" or not parts.hostname:
        raise ValueError(f"discovery must look like dns://host:port, got {target!r}")
    return parts.hostname, parts.port or 8000


async def resolve_engines(target: str) -> list[str]:
    host, port = parse_dns_target(target)
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = sorted({str(info[4][0]) for info in infos})
    return [f"http://[{addr}]:{port}" if ":" in addr else f"http://{addr}:{port}" for addr in addresses]
