"""The access log: one structured line per inference request, when it has ended.

Rules:
- One ``event=access`` line at info level per request (a batch line is a request too, and names
  its ``batch_id`` and ``custom_id``); ``access_log: false`` turns it off, as does a ``log_level``
  above info.
- Fields a request never reached are ``-``; times are milliseconds; tokens are the engine's own
  counts from the response's ``usage``, else the gateway's estimate of the prompt
  (``prompt_tokens_estimated=true``) and nothing for the completion.
"""

from __future__ import annotations

import logging

from gateway import log
from gateway.http.exchange import Exchange

_logger = logging.getLogger("gateway")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _or_dash(value: object) -> object:
    return "-" if value is None else value


def write(record: Exchange) -> None:
    if not _logger.isEnabledFor(logging.INFO):
        return
    prompt, completion = record.usage()
    fields: dict[str, object] = {
        "request_id": record.request_id,
        "endpoint": record.endpoint,
        "key_id": _or_dash(record.key_id),
        "key_name": _or_dash(record.key_name),
        "cls": record.cls,
        "pool": record.pool,
        "engine": record.engine,
        "model": _or_dash(record.model),
        "stream": str(record.stream).lower(),
        "status": record.status,
        "admission": record.admission,
        "queue_wait_ms": _ms(record.queue_wait_s),
        "ttft_ms": _ms(record.ttft_s),
        "duration_ms": _ms(record.duration_s()),
        "prompt_tokens": _or_dash(prompt if prompt is not None else record.prompt_estimate),
        "completion_tokens": _or_dash(completion),
        "bytes_out": record.bytes_out,
    }
    if prompt is None and record.prompt_estimate is not None:
        fields["prompt_tokens_estimated"] = "true"
    if record.attempts > 1:
        fields["attempts"] = record.attempts
    if record.error is not None:
        fields["error"] = record.error
    if record.batch_id is not None:
        fields["batch_id"] = record.batch_id
        fields["custom_id"] = _or_dash(record.custom_id)
    log.info("access", **fields)
