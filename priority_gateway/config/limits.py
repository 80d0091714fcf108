"""What a client may send and hold: the ``limits:`` section, every limit with its default.

How long an engine attempt may take is in ``upstream:`` (``priority_gateway.config.sections.UpstreamConfig``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Annotated

from annotated_types import Gt

from priority_gateway.config.schema import Check

MIB = 1024 * 1024
Positive = Gt(0)


def _is_network(value: object) -> bool:
    try:
        ipaddress.ip_network(str(value), strict=False)
    except ValueError:
        return False
    return isinstance(value, str)


IP_NETWORK = Check(_is_network, "an IP address or network (10.0.0.0/8)")


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """Bytes, seconds and connections a client controls; each limit's answer is in the README's
    "Security and limits"."""

    max_body_bytes: Annotated[int, Positive] = 10 * MIB
    """Request bodies on every route (``/v1/files`` uploads: ``batch.max_file_bytes``); larger
    gets 413."""
    max_receiving_bytes: Annotated[int, Positive] = 256 * MIB
    """Bodies being received on all connections together (a declared length counts whole from its
    head on, a chunked body as it arrives); a body that does not fit gets 503 ``bodies_in_flight``
    with ``Retry-After``, one larger than this 413. Keep it above the largest upload
    (``batch.max_file_bytes``)."""
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
    max_connections_per_client: Annotated[int, Positive] = 1024
    """Open connections from one client address (at most ``max_connections``); more from it are
    answered 503 and closed, so one client cannot keep the others out. Behind a proxy, list it in
    ``trusted_proxies``, or every client behind it counts as the proxy."""
    trusted_proxies: list[Annotated[str, IP_NETWORK]] = field(default_factory=list)
    """Addresses or networks (``10.0.0.0/8``) of proxies in front of the gateway: their connections
    count against the cap of the client their request's ``X-Forwarded-For`` names (the last address
    in it that is not itself a trusted proxy), not against the proxy's."""
    max_queued_bytes: Annotated[int, Positive] = 256 * MIB
    """Bodies of requests waiting in one pool's queue, together; a new request beyond it gets 429
    ``queue_full``."""
    max_downloads: Annotated[int, Positive] = 16
    """File downloads (``GET /v1/files/{id}/content``) in progress at once; each is streamed from
    the store in 1 MiB pieces. One more gets 503 ``too_many_downloads`` with ``Retry-After``."""
    download_timeout_s: Annotated[float, Positive] = 600.0
    """How long one download may take (a client that reads slowly holds its download no longer);
    then the connection is closed."""
    metrics_public: bool = True
    """``/metrics`` without a key even when keys are required (Prometheus scrapes it); false: an API
    key or the admin key (``keys.admin``) is needed. Its tenant series name tenants, and key ids
    for keys without one (``tenants.metrics_limit: 0`` labels every tenant ``other``)."""
    openapi_public: bool = False
    """``/openapi.json`` without a key even when keys are required."""
