"""Where uploaded and generated file bodies live.

By default in the store itself (Redis strings, or this process's memory): nothing else to
set up, and every replica reads every file. ``batch.files_dir`` puts them on a directory
instead, one file per body, for input files too large to keep in Redis memory; with
several replicas that directory must be shared (e.g. a ReadWriteMany volume). Writes go
to a temporary name first and are renamed into place, so a reader never sees half a body.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from pathlib import Path

_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]+$")


class DirectoryBlobs:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, blob_id: str) -> Path:
        if not _SAFE_ID.match(blob_id):
            raise ValueError(f"not a file id: {blob_id!r}")
        return self.root / blob_id

    def _write(self, blob_id: str, data: bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self._path(blob_id)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)

    def _read(self, blob_id: str) -> bytes | None:
        try:
            return self._path(blob_id).read_bytes()
        except FileNotFoundError:
            return None

    def _read_range(self, blob_id: str, start: int, length: int) -> bytes | None:
        try:
            with self._path(blob_id).open("rb") as f:
                f.seek(start)
                return f.read(length)
        except FileNotFoundError:
            return None

    def _delete(self, blob_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(blob_id).unlink()

    async def put_blob(self, blob_id: str, data: bytes) -> None:
        await asyncio.to_thread(self._write, blob_id, data)

    async def get_blob(self, blob_id: str) -> bytes | None:
        return await asyncio.to_thread(self._read, blob_id)

    async def read_blob(self, blob_id: str, start: int, length: int) -> bytes | None:
        return await asyncio.to_thread(self._read_range, blob_id, start, length)

    async def delete_blob(self, blob_id: str) -> None:
        await asyncio.to_thread(self._delete, blob_id)
