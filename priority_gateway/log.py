"""Structured logs: one line per event, ``key=value`` pairs after the event name.

Rules:
- One format on stderr: uvicorn's own lines (``uvicorn``, ``uvicorn.error``) go through the same
  handler, as ``event=uvicorn message=...``.
- While a request is handled, ``REQUEST_ID`` holds its ``x-request-id`` (set where the request
  starts, in its own task), and every line logged meanwhile carries it as ``request_id``; a line
  that names a request itself keeps its own.
- Lines logged while the event loop runs go out together, in the order they were logged, at most
  ``FLUSH_AFTER_S`` after the first of them (or once ``FLUSH_LINES`` are held): one write for the
  access lines of many requests, not one each. Warnings and errors, lines logged with no loop
  running (or from another thread), and ``flush()`` (the gateway's last act when it stops) write
  at once, after what was held.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import time
from contextvars import ContextVar
from typing import TextIO

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

    def timestamp(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            # One strftime a second, not one a line: an access line is written per request.
            self._second, self._stamp = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int((created - second) * 1000):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        ts = self.timestamp(record.created)
        fields = getattr(record, "fields", None)
        if fields is None and getattr(record, "text", None) is None:
            # A line of another library's logger (uvicorn): its name is the event, its text the message.
            fields = {"message": record.getMessage()}
            event = record.name.split(".", 1)[0]
        else:
            event = record.getMessage()
        parts = [f"ts={ts}", f"level={record.levelname.lower()}", f"event={event}"]
        parts.extend(f"{key}={quote(value)}" for key, value in (fields or {}).items())
        text = getattr(record, "text", None)
        if text:
            parts.append(text)
        if record.exc_info:
            parts.append("exc=" + quote(self.formatException(record.exc_info)))
        return " ".join(parts)


FLUSH_AFTER_S = 0.005
"""How long a line logged on the event loop may wait for the lines after it: one write carries them all."""
FLUSH_LINES = 512


class LoopBatchedHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that holds the lines of one event-loop iteration and writes them in one piece."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._held: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self._hold(line, record.levelno)

    def write_line(self, line: str, level: int) -> None:
        """A line formatted by the caller, as ``emit`` would have formatted it."""
        self.acquire()
        try:
            self._hold(line, level)
        finally:
            self.release()

    def _hold(self, line: str, level: int) -> None:
        held = self._held
        held.append(line)
        if level >= logging.WARNING:
            self.flush()
            return
        if len(held) == 1:
            try:
                asyncio.get_running_loop().call_later(FLUSH_AFTER_S, self.flush)
            except RuntimeError:  # no loop running in this thread
                self.flush()
        elif len(held) >= FLUSH_LINES:
            self.flush()

    def flush(self) -> None:
        self.acquire()
        try:
            if self._held:
                text = "\n".join(self._held) + "\n"
                self._held.clear()
                self.stream.write(text)
            super().flush()
        except Exception:
            # As ``logging`` does: a stream that cannot be written to never fails the caller.
            pass
        finally:
            self.release()


_direct: tuple[LoopBatchedHandler, KeyValueFormatter] | None = None
"""The handler ``setup`` installed, while it is the gateway logger's only one: lines written per request
go to it without a ``LogRecord`` (what the record holds beyond the line, no handler here reads)."""


def setup(level: str = "info") -> None:
    global _direct
    handler = LoopBatchedHandler(sys.stderr)
    formatter = KeyValueFormatter()
    handler.setFormatter(formatter)
    _direct = (handler, formatter)
    root = logging.getLogger("gateway")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    server = logging.getLogger("uvicorn")
    server.handlers[:] = [handler]
    server.propagate = False
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
        direct = _direct
        if direct is not None and len(_logger.handlers) == 1 and _logger.handlers[0] is direct[0]:
            handler, formatter = direct
            stamp = formatter.timestamp(time.time())
            handler.write_line(
                f"ts={stamp} level={_LEVELS.get(level) or logging.getLevelName(level).lower()} event={name} {text}",
                level,
            )
            return
        _emit(level, name, {"text": text})


def flush() -> None:
    """Write the lines held so far (before the process may end without another turn of the loop)."""
    for handler in _logger.handlers:
        handler.flush()


_LEVELS = {n: logging.getLevelName(n).lower() for n in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)}


def info(name: str, **fields: object) -> None:
    event(name, logging.INFO, **fields)


def warning(name: str, **fields: object) -> None:
    event(name, logging.WARNING, **fields)


def error(name: str, exc_info: bool = False, **fields: object) -> None:
    event(name, logging.ERROR, exc_info, **fields)


def debug(name: str, **fields: object) -> None:
    event(name, logging.DEBUG, **fields)
