"""What one inference request did: filled in by the proxy as it goes, read once it ends by the
access log and the request's trace span.

Rules:
- Filling it in is attribute writes only: nothing here is computed on the relay path. The token
  counts are read from the response's ``usage`` (the last ``USAGE_TAIL`` bytes that went out)
  when the request has ended.
- A field the request never reached stays at its empty value (``None``, ``"-"``, 0).
"""

from __future__ import annotations

import re
import time

USAGE_TAIL = 4096
"""Bytes at the end of a response that hold its ``usage``: the last chunk of a chat stream, the
end of the ``response.completed`` event (the object's last fields), a JSON answer's last fields."""

_USAGE = b'"usage"'
_PROMPT_TOKENS = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*(\d+)')


class Exchange:
    __slots__ = (
        "_usage",
        "_usage_of",
        "admission",
        "attempts",
        "batch_id",
        "bytes_out",
        "cls",
        "custom_id",
        "endpoint",
        "engine",
        "error",
        "key_id",
        "key_name",
        "model",
        "pool",
        "prompt_estimate",
        "queue_wait_s",
        "request_id",
        "started",
        "status",
        "stream",
        "tail",
        "tenant",
        "ttft_s",
    )

    def __init__(self, request_id: str, endpoint: str, started: float) -> None:
        self.request_id = request_id
        self.endpoint = endpoint
        self.started = started
        self.key_id: str | None = None
        self.key_name: str | None = None
        self.tenant = ""
        self.cls = "-"
        self.pool = "-"
        self.engine = "-"
        self.model: str | None = None
        self.stream = False
        self.admission = "-"
        """``admitted`` at once, ``queued`` then admitted, or the code it was refused with."""
        self.queue_wait_s: float | None = None
        self.ttft_s: float | None = None
        self.prompt_estimate: int | None = None
        self.status = 0
        self.error: str | None = None
        self.bytes_out = 0
        self.attempts = 0
        self.tail = b""
        self.batch_id: str | None = None
        self.custom_id: str | None = None
        self._usage: tuple[int | None, int | None] = (None, None)
        self._usage_of = b""

    def duration_s(self) -> float:
        return time.monotonic() - self.started

    def usage(self) -> tuple[int | None, int | None]:
        """(prompt, completion) tokens as the engine reported them, where its answer said."""
        # Read once per tail: the relay, the tenant counters and the access log all ask.
        if self._usage_of is not self.tail:
            self._usage, self._usage_of = read_usage(self.tail), self.tail
        return self._usage


def read_usage(data: bytes) -> tuple[int | None, int | None]:
    """The token counts of the last ``usage`` object in ``data`` (chat, completions, responses)."""
    at = data.rfind(_USAGE)
    if at < 0:
        return None, None
    prompt = _PROMPT_TOKENS.search(data, at)
    completion = _COMPLETION_TOKENS.search(data, at)
    return (
        int(prompt.group(1)) if prompt else None,
        int(completion.group(1)) if completion else None,
    )
