"""Structured logs: one line per event, ``key=value`` pairs after the event name."""

from __future__ import annotations

import logging
import sys
import time

_logger = logging.getLogger("gateway")


def _quote(value: object) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\n'):
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
        _logger.log(level, name, extra={"fields": fields}, exc_info=exc_info)


def info(name: str, **fields: object) -> None:
    event(name, logging.INFO, **fields)


def warning(name: str, **fields: object) -> None:
    event(name, logging.WARNING, **fields)


def error(name: str, exc_info: bool = False, **fields: object) -> None:
    event(name, logging.ERROR, exc_info=exc_info, **fields)


def debug(name: str, **fields: object) -> None:
    event(name, logging.DEBUG, **fields)
