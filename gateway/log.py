"""Structured logs: one line per event, ``key=value`` pairs after the event name.

Rules:
- While a request is handled, ``REQUEST_ID`` holds its ``x-request-id`` (set where the request
  starts, in its own task), and every line logged meanwhile carries it as ``request_id``; a line
  that names a request itself keeps its own.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from contextvars import ContextVar

_logger = logging.getLogger("gateway")

REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)


_SPECIAL = re.compile(r'[ "=\n]')


def _quote(value: object) -> str:
    text = value if isinstance(value, str) else str(value)
    if text == "" or _SPECIAL.search(text) is not None:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        fields = getattr(record, "fields", {})
        parts = [f"ts={ts}", f"level={record.levelname.lower()}", f"event={record.getMessage()}"]
        parts.extend(f"{key}={_quote(value)}" for key, value in fields.items())
        if record.exc_info:
            parts.append("exc=" + _quote(self.formatException(record.exc_info)))
        return " ".join(parts)


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger("gateway")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def event(name: str, level: int = logging.INFO, exc_info: bool = False, **fields: object) -> None:
    if _logger.isEnabledFor(level):
        request_id = REQUEST_ID.get()
        if request_id is not None and "request_id" not in fields:
            fields = {"request_id": request_id, **fields}
        _logger.log(level, name, extra={"fields": fields}, exc_info=exc_info)


def info(name: str, **fields: object) -> None:
    event(name, logging.INFO, **fields)


def warning(name: str, **fields: object) -> None:
    event(name, logging.WARNING, **fields)


def error(name: str, exc_info: bool = False, **fields: object) -> None:
    event(name, logging.ERROR, exc_info=exc_info, **fields)


def debug(name: str, **fields: object) -> None:
    event(name, logging.DEBUG, **fields)
