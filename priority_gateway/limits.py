"""What a client may send and hold: the ``limits:`` section, every limit with its default.

How long an engine attempt may take is in ``upstream:`` (``priority_gateway.config.sections.UpstreamConfig``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from annotated_types import Gt

MIB = 1024 * 1024
Positive = Gt(0)


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """Bytes, seconds and connections a client controls; each limit's answer is in the README's
    "Security and limits"."""

    max_body_bytes: Annotated[int, Positive] = 10 * MIB
    """Request bodies on every route (``/v1/files`` uploads: ``batch.max_file_bytes``); larger
    gets 413."""
    max_header_bytes: Annotated[int, Positive] = 64 * 1024
    """The request line and headers of one request; more gets 431."""
    max_headers: Annotated[int, Positive] = 256
    """Header fields in one request; more gets 431."""
    header_timeout_s: Annotated[float, Positive] = 10.0
    """From a connection's first byte (or its opening) to the end of the request's headers."""
    body_timeout_s: Annotated[float, Positive] = 60.0
    """From the end of the headers to the end of the body."""
    upload_timeout_s: Annotated[float, Positive] = 600.0
    """The same for ``/v1/files`` uploads, which may be large."""
    keepalive_timeout_s: Annotated[float, Positive] = 30.0
    """An idle keep-alive connection is closed after this long."""
    max_connections: Annotated[int, Positive] = 4096
    """Open client connections (more are answered 503 and closed); lowered at start when the
    descriptor limit cannot hold them beside the engines' connections."""
    max_queued_bytes: Annotated[int, Positive] = 256 * MIB
    """Bodies of requests waiting in one pool's queue, together; a new request beyond it gets 429
    ``queue_full``."""
    metrics_public: bool = True
    """``/metrics`` without a key even when keys are required (Prometheus scrapes it)."""
    openapi_public: bool = False
    """``/openapi.json`` without a key even when keys are required."""
