"""The admin key of ``/admin/keys``: given, or kept in a file the gateway fills at its first start.

Rules:
- ``keys.admin`` set: that is the key, and no file is read.
- Else ``keys.admin_file`` set: the key is the file's content. A file that does not exist yet gets
  a fresh random key, written once (mode 0600, the directory created if needed); replicas that
  share the file end with the first one's key, since the file appears by a link that fails when
  another replica got there first. The key is never logged: the log names the file to read.
- Neither set: the admin API is off.
- A file that cannot be read or written, or that is empty, stops the gateway with an error that
  names ``keys.admin_file``: an operator who pointed at a file expects the key in it.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from pathlib import Path

from priority_gateway import log
from priority_gateway.config import Config, ConfigError

SETTING = ("keys", "admin_file")


def with_admin_key(config: Config) -> Config:
    """``config`` with ``keys.admin`` resolved as the rules say."""
    keys = config.keys
    if keys.admin or not keys.admin_file:
        return config
    return dataclasses.replace(config, keys=dataclasses.replace(keys, admin=admin_key_from(Path(keys.admin_file))))


def admin_key_from(path: Path) -> str:
    try:
        key = _read(path)
        if key is None:
            created = _create(path, secrets.token_urlsafe(32))
            key = _read(path)  # another replica's, when it created the file first
            if created:
                log.warning("admin_key_generated", file=str(path), read_it_with=f"cat {path}")
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}", SETTING) from exc
    if not key:
        raise ConfigError(f"{path} is empty: write the admin key into it, or delete it to have one generated", SETTING)
    log.info("admin_key_read", file=str(path))
    return key


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def _create(path: Path, key: str) -> bool:
    """Write ``key`` to ``path`` unless the file exists; whether this call created it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(key + "\n")
        try:
            os.link(draft, path)
        except FileExistsError:
            return False
        return True
    finally:
        draft.unlink(missing_ok=True)
