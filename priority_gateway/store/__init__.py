"""Shared state: one protocol (``Store``), three backends (SQLite, in-process and Redis)."""

from __future__ import annotations

from priority_gateway.store.base import Blobs, Store, StoreBusy, StoreUnavailable
from priority_gateway.store.blobs import DirectoryBlobs
from priority_gateway.store.memory import MemoryStore
from priority_gateway.store.redis_store import RedisStore
from priority_gateway.store.sqlite_store import SqliteStore, database_path

__all__ = [
    "Blobs",
    "DirectoryBlobs",
    "MemoryStore",
    "RedisStore",
    "SqliteStore",
    "Store",
    "StoreBusy",
    "StoreUnavailable",
    "describe_store",
    "is_shared",
    "open_store",
]

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def is_shared(url: str) -> bool:
    """Whether replicas share this store (Redis), and so their routing and admission."""
    return url.startswith(REDIS_SCHEMES)


def open_store(url: str, keys_file: str | None = None, data_dir: str | None = None) -> Store:
    """The backend for ``store:``: ``sqlite`` (a file in ``data_dir``), ``sqlite://PATH``, ``memory`` or
    ``redis://...``; ``keys.file`` keeps the keys of a memory or SQLite store in a JSON file."""
    if url == "memory":
        return MemoryStore(keys_file)
    if url == "sqlite" or url.startswith("sqlite://"):
        return SqliteStore(database_path(url, data_dir), keys_file)
    if is_shared(url):
        return RedisStore(url)
    raise ValueError(f"store must be 'sqlite', 'memory' or a redis:// URL, got {url!r}")


def describe_store(url: str, data_dir: str | None = None) -> str:
    """Where the store keeps its state, for a log line: the SQLite file, or the URL without a password."""
    if url == "sqlite" or url.startswith("sqlite://"):
        return f"sqlite://{database_path(url, data_dir)}"
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url
