"""What the request path needs from the rest of the gateway, as small protocols.

``Proxy`` (and through it every batch line) depends on these alone, never on the running
``Gateway``: each can be replaced in a test by a few lines, and each says what crosses it.
The running gateway wires the real ones: ``priority_gateway.scheduler.Scheduler`` (admission),
``priority_gateway.placement.Placement`` (placement), ``priority_gateway.upstream.monitor.EngineMonitor``
(engines), ``priority_gateway.ratelimit.RateLimiter`` (rate limits), ``priority_gateway.metrics.GatewayMetrics``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from starlette.types import Send

from priority_gateway.core.classes import Budget
from priority_gateway.core.dispatcher import Answer, Dispatch, Rejection
from priority_gateway.core.request import RouteRequest

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge, Histogram

    from priority_gateway.auth import Principal
    from priority_gateway.ratelimit import Meter
    from priority_gateway.upstream.h1 import Headers, Response


class Admission(Protocol):
    """Admission and routing: the core's dispatcher, its decisions carried out on the wall clock."""

    def home(self, cls: str) -> str: ...

    def submit(self, req: RouteRequest) -> Answer: ...

    def wait_turn(self, req: RouteRequest) -> Awaitable[Dispatch | Rejection]: ...

    def retry(self, dispatch: Dispatch) -> Answer: ...

    def finish(self, dispatch: Dispatch, ok: bool, generated: int | None = None, prompt: int | None = None) -> None: ...

    def cancel(self, req: RouteRequest) -> None: ...

    def running(self, req: RouteRequest, stop: Callable[[], bool]) -> None: ...

    def stopped(self, req: RouteRequest) -> None: ...

    def observe_ttft(self, dispatch: Dispatch, seconds: float) -> None: ...

    def observe_itl(self, dispatch: Dispatch, seconds: float, now: float, times: int = 1) -> None: ...


class Placement(Protocol):
    """What the core needs to know of a request, read from its body: model, prompt, prefix."""

    def route_request(
        self,
        parsed: Mapping[str, Any],
        hashes_prompt: bool,
        cls: str,
        budget: Budget,
        session_headers: Mapping[bytes, bytes] | None,
        arrival: float,
    ) -> RouteRequest: ...


class EngineClient(Protocol):
    async def request(
        self,
        method: bytes,
        path: bytes,
        headers: Headers = (),
        body: bytes = b"",
        first_byte_timeout: float | None = None,
    ) -> Response: ...


class EngineClients(Protocol):
    """The connection pools to the engines, and where to report one that cannot be reached."""

    def client(self, engine_id: str) -> EngineClient: ...

    def connect_failed(self, engine_id: str, reason: str) -> None: ...


class AdapterLoading(Protocol):
    """LoRA adapters loaded on demand on the engine a request was sent to (``priority_gateway.adapters``)."""

    def wanted(self, dispatch: Dispatch) -> bool: ...

    def ensure(self, dispatch: Dispatch) -> Awaitable[None]: ...


class RateLimits(Protocol):
    """Requests and tokens per minute of an API key."""

    def admit(self, principal: Principal, req: RouteRequest) -> Awaitable[int]:
        """Count the request (429 over a limit); the output tokens it reserved under the token limit."""
        ...

    def meter(self, principal: Principal, req: RouteRequest, send: Send, reserved: int = 0) -> Meter | None: ...


class TenantCounts(Protocol):
    """Per-tenant counters (``priority_gateway.tenant_metrics``): one call per answer."""

    def answered(
        self,
        tenant: str,
        cls: str,
        status: int,
        ttft_s: float | None,
        ttft_budget_s: float | None,
        usage: tuple[int | None, int | None],
        stream: bool,
    ) -> None: ...


class RelayMetrics(Protocol):
    """The Prometheus families the request path writes (labels in ``priority_gateway.metrics``)."""

    requests: Counter
    ttft: Histogram
    itl: Histogram
    routing: Counter
    predicted_cached: Histogram
    admission: Counter
    queue_wait: Histogram
    upstream_errors: Counter
    retries: Counter
    queued_bytes: Gauge
