"""The hot path: OpenAI inference requests in, engine bytes out.

It parses only what routing needs (a handful of headers and the JSON body's model,
prompt and stream flag), asks the core where to go, and relays the engine's bytes,
timestamping streamed chunks for TTFT and inter-token latency.

Rules:
- Where keys are required the key is checked on the headers, before the body is read.
- Only the raw body and the routing fields in ``RouteRequest`` outlive parsing; the bodies
  waiting in a pool's queue together stay within ``limits.max_queued_bytes``.
- A client that disconnects is noticed wherever its request is: queued (its place is freed
  at once) or relayed (the engine connection is closed, so generation stops).
- Every attempt has a total deadline; an engine answer that is not what the client asked for
  (an error, not JSON, cut short) becomes an error in OpenAI's shape.
- Any other exception is a logged 500 in OpenAI's shape; every dispatch is finished exactly once.
- What the request did is written into its ``Exchange`` as it goes; when it ends, the access log
  and (with tracing on) its span read it. Every log line meanwhile carries its ``x-request-id``.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope, Send

from priority_gateway import accesslog, log
from priority_gateway.core.classes import ClassificationError, classify
from priority_gateway.core.dispatcher import Answer, Dispatch, Queued, Rejection
from priority_gateway.core.models import engine_tag
from priority_gateway.core.request import RouteRequest
from priority_gateway.errors import ApiError, error_body
from priority_gateway.http.answers import engine_error, is_event_stream, is_json, json_object, not_json
from priority_gateway.http.body import check_responses, parse_body, with_priority
from priority_gateway.http.cycle import DISCONNECT
from priority_gateway.http.exchange import USAGE_TAIL, Exchange
from priority_gateway.http.model_names import ModelNames, with_model
from priority_gateway.http.refusals import refused
from priority_gateway.http.seams import (
    AdapterLoading,
    Admission,
    EngineClients,
    Placement,
    RateLimits,
    RelayMetrics,
    TenantCounts,
)
from priority_gateway.metrics import observe_times
from priority_gateway.ratelimit import Meter
from priority_gateway.sessions import SESSION_HEADERS
from priority_gateway.upstream.h1 import ConnectError, OutOfDescriptors, ReadTimeout, Response, UpstreamError

if TYPE_CHECKING:
    from priority_gateway.auth import Authenticator, Principal
    from priority_gateway.config import UpstreamConfig
    from priority_gateway.config.limits import ClientLimits
    from priority_gateway.core.classes import Budget
    from priority_gateway.http.tracing import RequestSpan, Tracing

_SSE_HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
# Request ids the gateway makes: 32 hex digits, as a UUID's, from a random prefix of this process
# and a counter (unique across replicas and restarts, without a random draw per request).
_ID_PREFIX = os.urandom(10).hex()
_ID_SERIAL = itertools.count()
CLIENT_GONE = 499


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    required: str
    hashes_prompt: bool
    check: Callable[[dict[str, Any]], None] | None = None
    """The endpoint's own body fields, checked beyond ``required``."""
    first_token: bytes | None = None
    """A stream whose first events come before any token: what the first token's event holds."""
    path: bytes = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", self.name.encode())


ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": Endpoint("/v1/chat/completions", "messages", True),
    "/v1/completions": Endpoint("/v1/completions", "prompt", True),
    "/v1/embeddings": Endpoint("/v1/embeddings", "input", False),
    # vLLM sends response.created and response.in_progress at once: TTFT is the first text delta.
    "/v1/responses": Endpoint("/v1/responses", "input", True, check_responses, b"response.output_text.delta"),
}
_ENGINE_HEADERS = ((b"content-type", b"application/json"),)


class _RequestHeaders:
    __slots__ = ("authorization", "priority", "request_id", "sessions", "slo_tpot", "slo_ttft")

    def __init__(self, raw: Sequence[tuple[bytes, bytes]]) -> None:
        self.authorization: bytes | None = None
        self.priority: str | None = None
        self.request_id: str | None = None
        self.sessions: dict[bytes, bytes] | None = None
        """The headers that may name the request's session (``SESSION_HEADERS``), for ``Placement``."""
        self.slo_ttft: str | None = None
        self.slo_tpot: str | None = None
        for name, value in raw:
            # ASGI servers give lower-case names; only the few we need are decoded.
            if name == b"x-priority":
                self.priority = value.decode("latin-1")
            elif name == b"authorization":
                self.authorization = value
            elif name == b"x-request-id":
                # Echoed in our headers and the engine's: printable ASCII only, else we make our own.
                if value and len(value) <= 128 and value.isascii() and value.decode("ascii").isprintable():
                    self.request_id = value.decode("ascii")
            elif name in SESSION_HEADERS:
                if self.sessions is None:
                    self.sessions = {}
                self.sessions.setdefault(name, value)
            elif name == b"x-slo-ttft-ms":
                self.slo_ttft = value.decode("latin-1")
            elif name == b"x-slo-tpot-ms":
                self.slo_tpot = value.decode("latin-1")


class _Call:
    """One client request's relay state, shared with its disconnect watcher and its deadline."""

    __slots__ = ("done", "events", "expired", "gone", "preempted", "response", "streaming", "task")

    def __init__(self) -> None:
        self.task = asyncio.current_task()
        self.gone = False
        self.attempt()

    def attempt(self) -> None:
        self.done = False
        self.streaming = False
        self.events = 0
        """Token events this attempt streamed (what it generated, when its answer has no usage)."""
        self.preempted = False
        self.expired = False
        self.response: Response | None = None

    def _stop(self) -> None:
        if self.response is not None:
            self.response.close()
        if self.task is not None:
            self.task.cancel()

    def preempt(self) -> bool:
        """Stop this attempt to restart it later; False once any byte went to the client."""
        if self.done or self.streaming or self.gone or self.expired:
            return False
        self.preempted = True
        self._stop()
        return True

    def disconnected(self) -> None:
        if not self.done:
            self.gone = True
            self._stop()

    def expire(self) -> None:
        """The attempt's total deadline passed: stop it, wherever it waits (engine or client)."""
        if not self.done and not self.gone and not self.preempted:
            self.expired = True
            self._stop()


class Proxy:
    """The request path, on small seams: it sees admission, placement, engines, rate limits and
    metrics through the protocols of ``seams``, never the whole running gateway."""

    def __init__(
        self,
        *,
        admission: Admission,
        placement: Placement,
        engines: EngineClients,
        metrics: RelayMetrics,
        auth: Authenticator,
        rate_limits: RateLimits | None,
        budgets: Mapping[str, Budget],
        limits: ClientLimits,
        deadlines: UpstreamConfig,
        access_log: bool = False,
        tracing: Tracing | None = None,
        adapters: AdapterLoading | None = None,
        engine_header: bool = True,
        tenants: TenantCounts | None = None,
    ) -> None:
        self.admission = admission
        self.placement = placement
        self.engines = engines
        self.metrics = metrics
        self.auth = auth
        self.rate_limits = rate_limits
        self.budgets = budgets
        self.limits = limits
        self.deadlines = deadlines
        self.access_log = access_log
        self.tracing = tracing
        self.adapters = adapters
        self.engine_header = engine_header
        self.tenants = tenants
        self._queued_bytes: dict[str, int] = {}
        self._requests: dict[tuple[str, str, int], Any] = {}
        self._ttft: dict[tuple[str, str], Any] = {}
        self._itl: dict[tuple[str, str], Any] = {}
        self._children: dict[tuple[Any, ...], Any] = {}

    # -- metric children, cached: label lookups are the costly part of prometheus_client

    def _count(self, record: Exchange, status: int) -> None:
        record.status = status
        key = (record.cls, record.pool, status)
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = self.metrics.requests.labels(record.cls, record.pool, str(status))
        child.inc()
        if self.tenants is None:
            return
        budget = self.budgets.get(record.cls)
        self.tenants.answered(
            record.tenant,
            record.cls,
            status,
            record.ttft_s,
            budget.ttft_s if budget is not None else None,
            record.usage() if status == 200 else (None, None),
            record.stream,
        )

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _timers(self, cls: str, pool: str) -> tuple[Any, Any]:
        key = (cls, pool)
        ttft = self._ttft.get(key)
        if ttft is None:
            ttft = self._ttft[key] = self.metrics.ttft.labels(cls, pool)
            self._itl[key] = self.metrics.itl.labels(cls, pool)
        return ttft, self._itl[key]

    # -- entry point -------------------------------------------------------------

    async def handle(self, scope: Scope, receive: Receive, send: Send, endpoint: Endpoint) -> None:
        """An ASGI request: its body read from ``receive``, which is then watched for a disconnect."""
        await self._serve(endpoint, scope["headers"], send, receive, scope)

    async def call(
        self,
        endpoint: Endpoint,
        body: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        send: Send,
        line: tuple[str, str] | None = None,
    ) -> None:
        """A request from inside the process (a batch line, ``line`` its batch id and custom_id):
        the same path as a client's, with the body in hand and no connection to watch."""
        scope = {"method": "POST", "path": endpoint.name, "scheme": "internal"}
        await self._serve(endpoint, headers, send, body, scope, line)

    async def _serve(
        self,
        endpoint: Endpoint,
        raw_headers: Sequence[tuple[bytes, bytes]],
        send: Send,
        source: Receive | bytes,
        scope: Mapping[str, Any],
        line: tuple[str, str] | None = None,
    ) -> None:
        started = time.monotonic()
        headers = _RequestHeaders(raw_headers)
        request_id = headers.request_id or f"{_ID_PREFIX}{next(_ID_SERIAL):012x}"
        record = Exchange(request_id, endpoint.name, started)
        logged = log.REQUEST_ID.set(request_id)
        span = self.tracing.request(scope, raw_headers) if self.tracing is not None else None
        if line is not None:
            record.batch_id, record.custom_id = line
        meter: Meter | None = None
        call = _Call()
        watcher: asyncio.Task[None] | None = None
        try:
            # The key is judged on the headers, before any of the body is read: a caller without
            # one never makes the gateway hold what it sends.
            principal = await self.auth.authenticate(headers.authorization) if self.auth.required else None
            body = source if isinstance(source, bytes) else await self._read_body(source)
            parsed = parse_body(body, endpoint.required, endpoint.check)
            req = self._route_request(endpoint, headers, parsed, principal, record, started)
            stream = record.stream = parsed.get("stream") is True
            own_priority = "priority" in parsed
            body, names = _renamed(body, parsed, req)
            # Only the raw bytes wait in the queue; what routing needed is in ``req``.
            del parsed
            if principal is not None and self.rate_limits is not None:
                send, meter = await self._metered(self.rate_limits, principal, req, send)
            if not isinstance(source, bytes):
                watcher = self._watch_client(source, scope, call)
            dispatch = await self._admit(req, len(body), record)
            record.pool = dispatch.pool
            engine_headers = _engine_headers(request_id, span)
            upstream = _Upstream(endpoint, body, stream, own_priority, request_id, started, record, engine_headers)
            upstream.names, upstream.engine_header = names, self.engine_header
            while await self._relay(send, upstream, dispatch, call):
                # Preempted to make room for interactive work: queued again, start over when our turn comes.
                dispatch = self._admitted(req, await self._wait(req, len(body), refuse=False), record)
                record.pool = dispatch.pool
        except ApiError as exc:
            call.done = True
            self._count(record, exc.status)
            await self._send_error(send, exc, record)
        except asyncio.CancelledError:
            if not call.gone:
                raise
            _uncancel()
            self._count(record, CLIENT_GONE)
            log.debug("client_disconnected", cls=record.cls, pool=record.pool)
        except Exception as exc:
            call.done = True
            self._count(record, 500)
            log.error("request_failed", exc_info=True, cls=record.cls, pool=record.pool, reason=repr(exc))
            failure = ApiError(500, f"the gateway failed on this request (request id {request_id})", "internal_error")
            await self._send_error(send, failure, record)
        finally:
            self._ended(record, watcher, meter, span, logged)

    def _route_request(
        self,
        endpoint: Endpoint,
        headers: _RequestHeaders,
        parsed: Mapping[str, Any],
        principal: Principal | None,
        record: Exchange,
        started: float,
    ) -> RouteRequest:
        """What routing needs of the request: its class and budget (its key's and its headers'), and
        from its body the model, prompt and session, the session kept within the key's tenant."""
        if principal is not None:
            record.key_id, record.key_name, record.tenant = principal.key_id, principal.name, principal.tenant
        try:
            cls = record.cls = classify(
                headers.priority,
                principal.default_class if principal else "interactive",
                principal.allowed if principal else None,
                self.budgets,
            )
            budget = self.budgets[cls]
            if headers.slo_ttft is not None or headers.slo_tpot is not None:
                budget = budget.tightened(headers.slo_ttft, headers.slo_tpot)
        except ClassificationError as exc:
            raise refused(exc.reason, exc.message, exc.param) from None
        req = self.placement.route_request(parsed, endpoint.hashes_prompt, cls, budget, headers.sessions, started)
        if principal is not None:
            req.tenant, req.weight, req.max_concurrency = principal.tenant, principal.weight, principal.max_concurrency
            if req.session is not None:
                req.session = f"{principal.tenant}\0{req.session}"  # one tenant's ids never meet another's
        record.model = req.model
        record.prompt_estimate = req.prompt_tokens or None
        return req

    @staticmethod
    async def _metered(
        rate_limits: RateLimits, principal: Principal, req: RouteRequest, send: Send
    ) -> tuple[Send, Meter | None]:
        """The key's rate limits admit the request (or refuse it); what it is sent is then charged."""
        reserved = await rate_limits.admit(principal, req)
        meter = rate_limits.meter(principal, req, send, reserved)
        return (meter.send if meter is not None else send), meter

    def _watch_client(self, receive: Receive, scope: Mapping[str, Any], call: _Call) -> asyncio.Task[None] | None:
        """Notice the client leaving while its request waits or runs: a task reading ``receive``, None
        where the server tells of a disconnect itself (no task waiting on ``receive`` for it)."""
        watch = scope.get("extensions", {}).get(DISCONNECT)
        if watch is not None:
            watch(call.disconnected)
            return None
        return asyncio.create_task(self._watch_disconnect(receive, call))

    def _ended(
        self,
        record: Exchange,
        watcher: asyncio.Task[None] | None,
        meter: Meter | None,
        span: RequestSpan | None,
        logged: contextvars.Token[str | None],
    ) -> None:
        """However the request ended: its watcher stopped, its use charged, its access log line and span written."""
        if watcher is not None:
            watcher.cancel()
        if meter is not None:
            meter.close()  # a client gone mid-stream is charged for what it was sent
        if self.access_log:
            accesslog.write(record)
        if span is not None:
            span.end(record)
        log.REQUEST_ID.reset(logged)

    # -- parsing -------------------------------------------------------------------

    async def _read_body(self, receive: Receive) -> bytes:
        # The size limit is the ASGI app's (before any route reads); this only collects the parts.
        message = await receive()
        body: bytes = message.get("body", b"")
        if not message.get("more_body"):
            return body
        parts = [body]
        while message.get("more_body"):
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ApiError(400, "client disconnected while sending the body", "client_disconnected")
            parts.append(message.get("body", b""))
        return b"".join(parts)

    # -- admission -------------------------------------------------------------------

    async def _admit(self, req: RouteRequest, size: int, record: Exchange) -> Dispatch:
        metrics = self.metrics
        outcome: Answer = self.admission.submit(req)
        if isinstance(outcome, Queued):
            record.admission = "queued"
            metrics.admission.labels(req.cls, "queued").inc()
            waited_from = time.monotonic()
            outcome = await self._wait(req, size, refuse=True)
            record.queue_wait_s = time.monotonic() - waited_from
            metrics.queue_wait.labels(req.cls).observe(record.queue_wait_s)
        return self._admitted(req, outcome, record)

    async def _wait(self, req: RouteRequest, size: int, refuse: bool) -> Dispatch | Rejection:
        """Wait in the queue, the body's bytes counted against its pool's budget.

        ``refuse``: a new request over the budget is turned away; one already accepted (queued
        again after a preemption or a failed connection) always keeps its place.
        """
        pool = self.admission.home(req.cls)
        held = self._queued_bytes.get(pool, 0)
        limit = self.limits.max_queued_bytes
        if refuse and held + size > limit:
            self.admission.cancel(req)
            raise ApiError(
                429,
                f"the {pool!r} queue already holds {held} bytes of request bodies (limit {limit}); retry shortly",
                "queue_full",
                retry_after_s=1.0,
            )
        self._queued_bytes[pool] = held + size
        gauge = self._child(self.metrics.queued_bytes, pool)
        gauge.inc(size)
        try:
            return await self.admission.wait_turn(req)
        finally:
            self._queued_bytes[pool] -= size
            gauge.dec(size)

    def _admitted(self, req: RouteRequest, outcome: Answer, record: Exchange) -> Dispatch:
        metrics = self.metrics
        if isinstance(outcome, Queued):
            raise ApiError(503, "the request could not be scheduled", "not_scheduled", retry_after_s=1.0)
        if isinstance(outcome, Rejection):
            record.admission = outcome.reason
            self._child(metrics.admission, req.cls, outcome.reason).inc()
            log.debug("request_refused", cls=req.cls, code=outcome.reason, reason=outcome.message)
            raise refused(outcome.reason, outcome.message, retry_after_s=outcome.retry_after_s)
        if record.admission == "-":
            record.admission = "admitted"
            record.queue_wait_s = 0.0
        self._child(metrics.admission, req.cls, "admitted").inc()
        self._child(metrics.routing, outcome.pool, outcome.engine.id, outcome.reason).inc()
        if req.prefix:
            self._child(metrics.predicted_cached, outcome.pool).observe(outcome.predicted_cached_tokens)
        return outcome

    def _finish(self, dispatch: Dispatch, ok: bool, generated: int | None = None, prompt: int | None = None) -> None:
        self.admission.finish(dispatch, ok, generated, prompt)

    # -- relay -----------------------------------------------------------------------

    async def _connect(self, upstream: _Upstream, dispatch: Dispatch) -> tuple[Dispatch, Response]:
        headers = upstream.headers
        record = upstream.record
        # A streamed answer starts at once (vLLM sends its head before the first token); a plain
        # one comes whole at the end, so only the attempt's total deadline bounds it.
        first_byte = self.deadlines.first_byte_timeout_s if upstream.stream else None
        path = upstream.endpoint.path
        retried = False
        while True:
            engine_id = record.engine = dispatch.engine.id
            record.attempts += 1
            if self.adapters is not None and self.adapters.wanted(dispatch):
                await self.adapters.ensure(dispatch)
            body = upstream.body_for(dispatch)
            try:
                response = await self.engines.client(engine_id).request(b"POST", path, headers, body, first_byte)
                return dispatch, response
            except ConnectError as exc:
                self.engines.connect_failed(engine_id, str(exc))
                self.metrics.upstream_errors.labels(dispatch.pool, engine_id, "connect").inc()
                if retried:
                    self._finish(dispatch, ok=False)
                    raise ApiError(502, f"engine unreachable: {exc}", "upstream_unreachable") from None
                retried = True
                outcome: Answer = self.admission.retry(dispatch)
                if isinstance(outcome, Queued):
                    outcome = await self._wait(dispatch.request, len(upstream.body), refuse=False)
                if not isinstance(outcome, Dispatch):
                    raise ApiError(502, f"engine unreachable: {exc}", "upstream_unreachable") from None
                self.metrics.retries.labels(dispatch.pool).inc()
                log.info("request_retried", failed=engine_id, engine=outcome.engine.id)
                dispatch = outcome
            except OutOfDescriptors as exc:
                # Our own sockets ran out: the engine is fine, so it keeps its health.
                self._finish(dispatch, ok=True)
                log.warning("out_of_descriptors", reason=str(exc))
                message = "the gateway is out of connections; retry shortly"
                raise ApiError(503, message, "overloaded", retry_after_s=1.0) from None
            except ReadTimeout as exc:
                self.metrics.upstream_errors.labels(dispatch.pool, engine_id, "timeout").inc()
                self._finish(dispatch, ok=False)
                raise ApiError(504, f"engine timed out: {exc}", "upstream_timeout") from None
            except UpstreamError as exc:
                self.metrics.upstream_errors.labels(dispatch.pool, engine_id, "failed").inc()
                self._finish(dispatch, ok=False)
                raise ApiError(502, f"engine failed: {exc}", "upstream_error") from None

    async def _relay(self, send: Send, upstream: _Upstream, dispatch: Dispatch, call: _Call) -> bool:
        """Relay one attempt; True when it was preempted before any byte reached the client."""
        call.attempt()
        req = dispatch.request
        self.admission.running(req, call.preempt)
        deadline_s = self.deadlines.attempt_s(req.budget, req.max_tokens, req.arrival, time.monotonic())
        deadline = asyncio.get_running_loop().call_later(deadline_s, call.expire)
        response: Response | None = None
        status = 502
        failure: ApiError | None = None
        try:
            # On failure _connect has settled the dispatch and raises ApiError for handle() to answer.
            dispatch, response = await self._connect(upstream, dispatch)
            call.response = response
            status = response.status
            content_type = response.header(b"content-type")
            if upstream.stream and status == 200 and is_event_stream(content_type):
                await self._stream(send, upstream, response, dispatch, call)
            else:
                failure = await self._whole(send, upstream, response, dispatch, call, content_type)
                if failure is not None:
                    status = failure.status
        except asyncio.CancelledError:
            if call.preempted:
                _uncancel()
                log.info("request_preempted", engine=dispatch.engine.id)
                return True
            if call.gone:
                status = CLIENT_GONE
                raise
            if not call.expired:
                raise
            _uncancel()
            status = 504
            reason = f"the request exceeded its deadline of {deadline_s:g} s"
            failure = await self._cut_short(send, upstream, dispatch, call, reason, timed_out=True)
        except UpstreamError as exc:
            if call.preempted:
                return True
            timeout = isinstance(exc, ReadTimeout) or call.expired
            status = 504 if timeout else 502
            failure = await self._cut_short(send, upstream, dispatch, call, str(exc), timeout)
        except ApiError as exc:
            status = exc.status
            raise
        finally:
            deadline.cancel()
            call.done = True
            self.admission.stopped(req)
            if response is not None:
                response.close()
            # Idempotent: a dispatch already released (preempted, or failed in _connect) gives nothing back twice.
            prompt, generated = _used(upstream.record, call)
            self._finish(dispatch, status < 500, generated, prompt)
        if failure is not None:
            raise failure
        upstream.record.pool = dispatch.pool
        self._count(upstream.record, status)
        return False

    async def _whole(
        self,
        send: Send,
        upstream: _Upstream,
        response: Response,
        dispatch: Dispatch,
        call: _Call,
        content_type: bytes | None,
    ) -> ApiError | None:
        """An answer that is not streamed, relayed in one piece; the error to answer instead when it is
        not what the client asked for (an engine error, or not the JSON object expected)."""
        payload = await response.read()
        call.done = True
        status = response.status
        failure = None
        if status != 200:
            failure = engine_error(status, content_type, payload)
        elif upstream.stream or not is_json(content_type) or json_object(payload) is None:
            failure = not_json(status, content_type)
        if failure is not None:
            self._engine_failed(dispatch, f"engine answered {status}", "answer")
            return failure
        if upstream.names is not None:
            payload = upstream.names.restore(payload)
        head = upstream.head(dispatch, content_type, payload)
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": payload})
        upstream.record.bytes_out = len(payload)
        upstream.record.tail = payload
        return None

    def _engine_failed(self, dispatch: Dispatch, reason: str, kind: str) -> None:
        self.metrics.upstream_errors.labels(dispatch.pool, dispatch.engine.id, kind).inc()
        log.warning("upstream_failed", engine=dispatch.engine.id, reason=reason)

    async def _cut_short(
        self, send: Send, upstream: _Upstream, dispatch: Dispatch, call: _Call, reason: str, timed_out: bool
    ) -> ApiError | None:
        """An attempt that failed or ran out of time: the error to answer, or None when the
        stream had started and ends with an error event instead."""
        status = 504 if timed_out else 502
        self._engine_failed(dispatch, reason, "timeout" if timed_out else "midstream")
        call.done = True
        if not call.streaming:
            code = "upstream_timeout" if timed_out else "upstream_error"
            return ApiError(status, f"engine failed: {reason}", code)
        event = error_body(status, f"engine failed mid-stream: {reason}", "upstream_error")
        # The blank lines end whatever partial event the engine left, so the error event stands alone.
        message = b"\n\ndata: " + event + b"\n\n"
        try:
            # A client that stopped reading must not hold this request past its deadline either.
            async with asyncio.timeout(1.0):
                await send({"type": "http.response.body", "body": message, "more_body": False})
            upstream.record.bytes_out += len(message)
        except TimeoutError:
            log.info("client_not_reading")
        return None

    async def _stream(
        self, send: Send, upstream: _Upstream, response: Response, dispatch: Dispatch, call: _Call
    ) -> None:
        headers = upstream.head(dispatch, response.header(b"content-type"), None)
        await send({"type": "http.response.start", "status": 200, "headers": headers + _SSE_HEADERS})
        call.streaming = True
        record = upstream.record
        ttft_metric, itl_metric = self._timers(dispatch.request.cls, dispatch.pool)
        admission = self.admission
        clock = time.monotonic
        names = upstream.names
        next_chunk = response.next_chunk if names is None else _restoring(response, names)
        chunk = await next_chunk()
        # Bytes sent and the last two chunks (where the usage is), in locals while the stream runs.
        sent = 0
        older = previous = b""
        try:
            first_token = upstream.endpoint.first_token
            if first_token is not None:
                # Events before the first token (a response's created/in_progress) are relayed untimed.
                while chunk is not None and first_token not in chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    sent += len(chunk)
                    older, previous = previous, chunk
                    chunk = await next_chunk()
            last = clock()
            if chunk is not None:
                call.events = 1
                ttft = record.ttft_s = last - upstream.started
                ttft_metric.observe(ttft)
                admission.observe_ttft(dispatch, ttft)
            while chunk is not None:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                sent += len(chunk)
                older, previous = previous, chunk
                chunk = await next_chunk()
                if chunk is None:
                    break
                events = _token_events(chunk)
                if events <= 0:
                    continue  # part of an event, or only the stream's end: its gap ends with the next event
                call.events += events
                now = clock()
                # Events the network delivered together were produced a step apart each (vLLM counts
                # one gap per step): one gap per read would read as a slower engine than it is.
                gap = (now - last) / events
                last = now
                observe_times(itl_metric, gap, events)
                admission.observe_itl(dispatch, gap, now, events)
        finally:
            record.bytes_out += sent
            record.tail = older[-USAGE_TAIL:] + previous
        call.done = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch_disconnect(self, receive: Receive, call: _Call) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                call.disconnected()
                return

    async def _send_error(self, send: Send, exc: ApiError, record: Exchange) -> None:
        record.error = exc.code or str(exc.status)
        headers = exc.response_headers()
        headers.append((b"x-request-id", record.request_id.encode()))
        if record.cls != "-":
            headers.append((b"x-gateway-class", record.cls.encode()))
        if record.pool != "-":
            headers.append((b"x-gateway-pool", record.pool.encode()))
        body = exc.body()
        try:
            await send({"type": "http.response.start", "status": exc.status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            record.bytes_out += len(body)
        except RuntimeError:
            log.debug("error_after_response_started", status=exc.status)


def _used(record: Exchange, call: _Call) -> tuple[int | None, int | None]:
    """(prompt, generated) tokens of an attempt: the answer's usage, else the token events it streamed."""
    prompt, generated = record.usage() if record.tail else (None, None)
    if generated is None and call.streaming:
        generated = call.events
    return prompt, generated


def _token_events(chunk: bytes) -> int:
    """How many events of a streamed read carry tokens: every complete event but ``[DONE]`` and the
    usage event (``"choices":[]``). JSON escapes newlines, so a blank line only ends an event."""
    ends = chunk.count(b"\n\n") or chunk.count(b"\r\n\r\n")
    if not ends:
        return 0
    return ends - chunk.count(b"data: [DONE]") - chunk.count(b'"choices":[]')


def _restoring(response: Response, names: ModelNames) -> Callable[[], Awaitable[bytes | None]]:
    """``response.next_chunk`` with the public model name put back, whatever the chunks' boundaries."""
    held = b""
    ended = False

    async def next_chunk() -> bytes | None:
        nonlocal held, ended
        if ended:
            return None
        chunk = await response.next_chunk()
        if chunk is None:
            ended = True
            return held or None
        out, held = names.restore_stream(held + chunk)
        return out

    return next_chunk


def _uncancel() -> None:
    current = asyncio.current_task()
    if current is not None:
        current.uncancel()


def _renamed(body: bytes, parsed: dict[str, Any], req: RouteRequest) -> tuple[bytes, ModelNames | None]:
    """The body the engine is sent, naming the served model where the client named an alias, and the
    names to restore in what the engine answers (None: no alias, nothing rewritten)."""
    if req.alias is None:
        return body, None
    return with_model(parsed, req.model), ModelNames(req.alias, req.model)


def _engine_headers(request_id: str, span: RequestSpan | None) -> tuple[tuple[bytes, bytes], ...]:
    """What every attempt of a request sends the engine beside its body: content type, ``x-request-id``,
    and the trace context of the request's span."""
    headers: tuple[tuple[bytes, bytes], ...] = (*_ENGINE_HEADERS, (b"x-request-id", request_id.encode()))
    if span is not None:
        headers += tuple(span.engine_headers())
    return headers


@dataclass(slots=True)
class _Upstream:
    """What every attempt of one request sends to an engine, and the head of what it answers."""

    endpoint: Endpoint
    body: bytes
    stream: bool
    own_priority: bool
    request_id: str
    started: float
    record: Exchange
    headers: tuple[tuple[bytes, bytes], ...]
    """What every attempt sends the engine: content type, ``x-request-id``, the trace context."""
    names: ModelNames | None = None
    """An aliased request's served and public model names (None: no alias, nothing rewritten)."""
    engine_header: bool = True

    def body_for(self, dispatch: Dispatch) -> bytes:
        if dispatch.priority is None and not self.own_priority:
            return self.body
        return with_priority(self.body, dispatch.priority, replace=self.own_priority)

    def head(self, dispatch: Dispatch, content_type: bytes | None, payload: bytes | None) -> list[tuple[bytes, bytes]]:
        headers = [
            (b"content-type", content_type or b"application/json"),
            (b"x-gateway-class", dispatch.request.cls.encode()),
            (b"x-gateway-pool", dispatch.pool.encode()),
            (b"x-request-id", self.request_id.encode()),
        ]
        if self.engine_header:
            headers.append((b"x-gateway-engine", engine_tag(dispatch.engine.id).encode()))
        if payload is not None:
            # Our own length, never the engine's: what we send is exactly ``payload``.
            headers.append((b"content-length", str(len(payload)).encode()))
        return headers
