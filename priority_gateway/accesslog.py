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

from priority_gateway import log
from priority_gateway.http.exchange import Exchange
from priority_gateway.log import quote

_logger = logging.getLogger("gateway")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _text(value: str | None) -> str:
    return "-" if value is None else quote(value)


def write(record: Exchange) -> None:
    if not _logger.isEnabledFor(logging.INFO):
        return
    prompt, completion = record.usage()
    estimated = prompt is None and record.prompt_estimate is not None
    if estimated:
        prompt = record.prompt_estimate
    # Written in one piece, not field by field: this line is paid for on every request. Values a
    # client or an engine chose are quoted; the rest are numbers and the gateway's own names.
    text = (
        f"request_id={quote(record.request_id)} endpoint={record.endpoint} key_id={_text(record.key_id)} "
        f"key_name={_text(record.key_name)} cls={record.cls} pool={record.pool} engine={quote(record.engine)} "
        f"model={_text(record.model)} stream={'true' if record.stream else 'false'} status={record.status} "
        f"admission={quote(record.admission)} queue_wait_ms={_ms(record.queue_wait_s)} ttft_ms={_ms(record.ttft_s)} "
        f"duration_ms={_ms(record.duration_s())} prompt_tokens={'-' if prompt is None else prompt} "
        f"completion_tokens={'-' if completion is None else completion} bytes_out={record.bytes_out}"
    )
    if estimated:
        text += " prompt_tokens_estimated=true"
    if record.attempts > 1:
        text += f" attempts={record.attempts}"
    if record.error is not None:
        text += f" error={quote(record.error)}"
    if record.batch_id is not None:
        text += f" batch_id={quote(record.batch_id)} custom_id={_text(record.custom_id)}"
    log.formatted("access", text)
