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


def quote(value: object) -> str:
    """A value as it stands after ``key=`` in a line: bare, or quoted when it holds a space, ``"``,
    ``=`` or a newline, or is empty."""
    text = value if isinstance(value, str) else str(value)
    if text == "" or _SPECIAL.search(text) is not None:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


class KeyValueFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            # One strftime a second, not one a line: an access line is written per request.
            self._second, self._stamp = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        ts = f"{self._stamp}.{int(record.msecs):03d}Z"
        fields = getattr(record, "fields", {})
        parts = [f"ts={ts}", f"level={record.levelname.lower()}", f"event={record.getMessage()}"]
        parts.extend(f"{key}={quote(value)}" for key, value in fields.items())
        text = getattr(record, "text", None)
        if text:
            parts.append(text)
        if record.exc_info:
            parts.append("exc=" + quote(self.formatException(record.exc_info)))
        return " ".join(parts)


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger("gateway")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    # Nothing here prints threads or processes: do not look them up for every record.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def _emit(level: int, name: str, extra: dict[str, object], exc_info: bool = False) -> None:
    # makeRecord and handle, not log(): log() walks the stack for the caller's file and line,
    # which no line prints and which costs more than the rest of a line together.
    record = _logger.makeRecord(_logger.name, level, "", 0, name, (), sys.exc_info() if exc_info else None, extra=extra)
    _logger.handle(record)


def event(name: str, level: int = logging.INFO, exc_info: bool = False, /, **fields: object) -> None:
    # Positional only: a field may be called anything, ``level`` and ``exc_info`` included.
    if _logger.isEnabledFor(level):
        request_id = REQUEST_ID.get()
        if request_id is not None and "request_id" not in fields:
            fields = {"request_id": request_id, **fields}
        _emit(level, name, {"fields": fields}, exc_info)


def formatted(name: str, text: str, level: int = logging.INFO) -> None:
    """An event whose ``key=value`` pairs are already written (each value through ``quote``), for
    a line written per request; the request id is the caller's to write."""
    if _logger.isEnabledFor(level):
        _emit(level, name, {"text": text})


def info(name: str, **fields: object) -> None:
    event(name, logging.INFO, **fields)


def warning(name: str, **fields: object) -> None:
    event(name, logging.WARNING, **fields)


def error(name: str, exc_info: bool = False, **fields: object) -> None:
    event(name, logging.ERROR, exc_info, **fields)


def debug(name: str, **fields: object) -> None:
    event(name, logging.DEBUG, **fields)
