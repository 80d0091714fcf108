"""Shared state: one protocol (``Store``), two backends (in-process and Redis)."""

from __future__ import annotations

from priority_gateway.store.base import Blobs, Store, StoreUnavailable
from priority_gateway.store.blobs import DirectoryBlobs
from priority_gateway.store.memory import MemoryStore
from priority_gateway.store.redis_store import RedisStore

__all__ = ["Blobs", "DirectoryBlobs", "MemoryStore", "RedisStore", "Store", "StoreUnavailable", "open_store"]


def open_store(url: str, keys_file: str | None = None) -> Store:
    """The backend for ``store:`` (``memory`` or ``redis://...``); ``keys.file`` keeps a memory store's keys."""
    if url == "memory":
        return MemoryStore(keys_file)
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(url)
    raise ValueError(f"store must be 'memory' or a redis:// URL, got {url!r}")
