"""The hot path: OpenAI inference requests in, engine bytes out.

It parses only what routing needs (a handful of headers and the JSON body's model,
prompt and stream flag), asks the core where to go, and relays the engine's bytes
unchanged, timestamping streamed chunks for TTFT and inter-token latency.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from gateway import log
from gateway.core.classes import ClassificationError, classify
from gateway.core.dispatcher import Dispatch, Outcome, Queued, Rejection
from gateway.core.precise import token_block_hashes
from gateway.core.prefix import (
    TokenPromptError,
    chain_seed,
    estimate_tokens,
    hash_blocks,
    hash_token_blocks,
    prompt_text,
    token_prompt,
)
from gateway.core.request import RouteRequest
from gateway.errors import ApiError, error_body
from gateway.ratelimit import Meter
from gateway.tokenizers import prompt_token_ids
from gateway.upstream.h1 import ConnectError, ReadTimeout, Response, UpstreamError

if TYPE_CHECKING:
    from gateway.runtime import Gateway

Scope = dict[str, Any]

_PASS_HEADERS = frozenset({b"content-type", b"content-length"})
_SSE_HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
CLIENT_GONE = 499


@dataclass(frozen=True, slots=True)
class Endpoint:
    path: bytes
    required: str
    hashes_prompt: bool


ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": Endpoint(b"/v1/chat/completions", "messages", True),
    "/v1/completions": Endpoint(b"/v1/completions", "prompt", True),
    "/v1/embeddings": Endpoint(b"/v1/embeddings", "input", False),
}


class _RequestHeaders:
    __slots__ = ("authorization", "content_length", "priority", "request_id", "session", "slo_tpot", "slo_ttft")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.authorization: bytes | None = None
        self.content_length: int | None = None
        self.priority: str | None = None
        self.request_id: str | None = None
        self.session: str | None = None
        self.slo_ttft: str | None = None
        self.slo_tpot: str | None = None
        for name, value in raw:
            # ASGI servers give lower-case names; only the few we need are decoded.
            if name == b"x-priority":
                self.priority = value.decode("latin-1")
            elif name == b"content-length":
                self.content_length = int(value) if value.isdigit() else None
            elif name == b"authorization":
                self.authorization = value
            elif name == b"x-request-id":
                self.request_id = value.decode("latin-1")[:128]
            elif name == b"x-session-id":
                self.session = value.decode("latin-1")[:256]
            elif name == b"x-slo-ttft-ms":
                self.slo_ttft = value.decode("latin-1")
            elif name == b"x-slo-tpot-ms":
                self.slo_tpot = value.decode("latin-1")


class _Call:
    """One client request's relay state, shared with its disconnect watcher."""

    __slots__ = ("done", "gone", "preempted", "response", "streaming", "task")

    def __init__(self) -> None:
        self.done = False
        self.streaming = False
        self.gone = False
        self.preempted = False
        self.response: Response | None = None
        self.task = asyncio.current_task()

    def preempt(self) -> bool:
        """Stop this attempt to restart it later; False once any byte went to the client."""
        if self.done or self.streaming or self.gone:
            return False
        self.preempted = True
        if self.response is not None:
            self.response.close()
        if self.task is not None:
            self.task.cancel()
        return True


class Proxy:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.max_body = gateway.config.max_body_bytes
        self._requests: dict[tuple[str, str, int], Any] = {}
        self._ttft: dict[tuple[str, str], Any] = {}
        self._itl: dict[tuple[str, str], Any] = {}
        self._children: dict[tuple[Any, ...], Any] = {}
        # Internal ids: the caller's x-request-id is echoed, but need not be unique.
        self._ids = (f"r{n}" for n in itertools.count())

    # -- metric children, cached: label lookups are the costly part of prometheus_client

    def _count(self, cls: str, pool: str, status: int) -> None:
        key = (cls, pool, status)
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = self.gw.metrics.requests.labels(cls, pool, str(status))
        child.inc()

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
            ttft = self._ttft[key] = self.gw.metrics.ttft.labels(cls, pool)
            self._itl[key] = self.gw.metrics.itl.labels(cls, pool)
        return ttft, self._itl[key]

    # -- entry point -------------------------------------------------------------

    async def handle(self, scope: Scope, receive: Any, send: Any, endpoint: Endpoint) -> None:
        started = time.monotonic()
        headers = _RequestHeaders(scope["headers"])
        request_id = headers.request_id or uuid.uuid4().hex
        cls, pool = "-", "-"
        meter: Meter | None = None
        try:
            body = await self._read_body(receive, headers.content_length)
            parsed = self._parse(body, endpoint)
            principal = await self.gw.auth.authenticate(headers.authorization) if self.gw.auth.required else None
            try:
                cls = classify(
                    headers.priority,
                    principal.default_class if principal else "interactive",
                    principal.allowed if principal else None,
                )
                budget = self.gw.budgets[cls]
                if headers.slo_ttft is not None or headers.slo_tpot is not None:
                    budget = budget.tightened(headers.slo_ttft, headers.slo_tpot)
            except ClassificationError as exc:
                raise ApiError(exc.status, exc.message, exc.code, exc.param) from None
            model = self._model(parsed)
            req = RouteRequest(
                next(self._ids),
                cls,
                model,
                started,
                budget=budget,
                session=headers.session,
                restartable=parsed.get("stream") is not True,
            )
            max_tokens = parsed.get("max_tokens") or parsed.get("max_completion_tokens")
            if isinstance(max_tokens, int):
                req.max_tokens = max_tokens
            if endpoint.hashes_prompt:
                self._hash_prompt(req, parsed)
            if principal is not None and self.gw.limiter is not None:
                await self.gw.limiter.admit(principal, req)
                meter = self.gw.limiter.meter(principal, req, send)
                send = meter.send if meter is not None else send
            dispatch = await self._admit(req)
            pool = dispatch.pool
            while await self._relay(scope, receive, send, endpoint, dispatch, body, parsed, request_id, started):
                # Preempted to make room for interactive work: queued again, start over when our turn comes.
                dispatch = self._admitted(req, await self.gw.wait_turn(req))
                pool = dispatch.pool
        except ApiError as exc:
            self._count(cls, pool, exc.status)
            await self._send_error(send, exc, cls, pool, request_id)
        finally:
            if meter is not None:
                meter.close()  # a client gone mid-stream is charged for what it was sent

    # -- parsing -------------------------------------------------------------------

    async def _read_body(self, receive: Any, declared: int | None) -> bytes:
        if declared is not None and declared > self.max_body:
            raise ApiError(413, f"request body is {declared} bytes; the limit is {self.max_body}", "body_too_large")
        message = await receive()
        body = message.get("body", b"")
        if not message.get("more_body"):
            return body
        parts = [body]
        size = len(body)
        while message.get("more_body"):
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ApiError(400, "client disconnected while sending the body", "client_disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise ApiError(413, f"request body exceeds the limit of {self.max_body} bytes", "body_too_large")
            parts.append(chunk)
        return b"".join(parts)

    def _parse(self, body: bytes, endpoint: Endpoint) -> dict[str, Any]:
        if not body:
            raise ApiError(400, "request body is empty; expected a JSON object", "invalid_json")
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, f"request body is not valid JSON: {exc}", "invalid_json") from None
        if not isinstance(parsed, dict):
            raise ApiError(400, "request body must be a JSON object", "invalid_json")
        value = parsed.get(endpoint.required)
        if value is None:
            raise ApiError(400, f"'{endpoint.required}' is required", "missing_required_parameter", endpoint.required)
        if endpoint.required == "messages" and (not isinstance(value, list) or not value):
            raise ApiError(400, "'messages' must be a non-empty array", "invalid_value", "messages")
        if endpoint.required == "prompt" and not isinstance(value, str | list):
            raise ApiError(400, "'prompt' must be a string or an array", "invalid_value", "prompt")
        stream = parsed.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise ApiError(400, "'stream' must be a boolean", "invalid_value", "stream")
        return parsed

    def _hash_prompt(self, req: RouteRequest, parsed: dict[str, Any]) -> None:
        try:
            precise = self.gw.precise.get(self.gw.dispatcher.home[req.cls])
            if precise is not None:
                token_ids = prompt_token_ids(precise.tokenizer, parsed)
                req.prompt_tokens = len(token_ids)
                req.block_tokens = precise.block_size()
                req.prefix = token_block_hashes(token_ids, req.block_tokens)
                return
            seed = chain_seed(req.model, parsed.get("cache_salt"))
            req.block_tokens = self.gw.block_tokens
            token_ids = token_prompt(parsed)
            if token_ids is not None:
                # Token ids: exact length, blocks of the engine's own size; no text estimate.
                req.prompt_tokens = len(token_ids)
                req.prefix = hash_token_blocks(token_ids, seed, req.block_tokens)
                return
        except TokenPromptError as exc:
            raise ApiError(400, str(exc), "invalid_value", "prompt") from None
        text = prompt_text(parsed)
        req.prompt_tokens = estimate_tokens(text)
        req.prefix = hash_blocks(text, seed, self.gw.block_chars)

    def _model(self, parsed: dict[str, Any]) -> str:
        model = parsed.get("model")
        known = self.gw.model_ids()
        if model is None:
            if len(known) == 1:
                return next(iter(known))
            raise ApiError(400, "'model' is required", "missing_required_parameter", "model")
        if not isinstance(model, str):
            raise ApiError(400, "'model' must be a string", "invalid_value", "model")
        if known and model not in known:
            raise ApiError(
                404,
                f"The model '{model}' does not exist; served: {', '.join(sorted(known))}",
                "model_not_found",
                "model",
            )
        return model

    # -- admission -------------------------------------------------------------------

    async def _admit(self, req: RouteRequest) -> Dispatch:
        metrics = self.gw.metrics
        outcome = self.gw.dispatcher.submit(req, time.monotonic())
        self.gw.settle(self.gw.dispatcher.take_notices())
        if isinstance(outcome, Queued):
            metrics.admission.labels(req.cls, "queued").inc()
            waited_from = time.monotonic()
            outcome = await self.gw.wait_turn(req)
            metrics.queue_wait.labels(req.cls).observe(time.monotonic() - waited_from)
        return self._admitted(req, outcome)

    def _admitted(self, req: RouteRequest, outcome: Outcome) -> Dispatch:
        metrics = self.gw.metrics
        if not isinstance(outcome, Dispatch | Rejection):
            raise ApiError(503, "the request could not be scheduled", "not_scheduled", retry_after_s=1.0)
        if isinstance(outcome, Rejection):
            self._child(metrics.admission, req.cls, outcome.code).inc()
            log.debug("request_refused", request_id=req.id, cls=req.cls, code=outcome.code, reason=outcome.message)
            raise ApiError(outcome.status, outcome.message, outcome.code, retry_after_s=outcome.retry_after_s)
        self._child(metrics.admission, req.cls, "admitted").inc()
        self._child(metrics.routing, outcome.pool, outcome.engine.id, outcome.reason).inc()
        if req.prefix:
            self._child(metrics.predicted_cached, outcome.pool).observe(outcome.predicted_cached_tokens)
        return outcome

    def _finish(self, dispatch: Dispatch, ok: bool) -> None:
        self.gw.settle(self.gw.dispatcher.finish(dispatch, time.monotonic(), ok))

    # -- relay -----------------------------------------------------------------------

    def _upstream_body(self, dispatch: Dispatch, body: bytes, parsed: dict[str, Any]) -> bytes:
        if dispatch.priority is None:
            return body
        parsed["priority"] = dispatch.priority
        return orjson.dumps(parsed)

    async def _connect(
        self, endpoint: Endpoint, dispatch: Dispatch, body: bytes, parsed: dict[str, Any], request_id: str
    ) -> tuple[Dispatch, Response]:
        headers = ((b"content-type", b"application/json"), (b"x-request-id", request_id.encode()))
        retried = False
        while True:
            engine_id = dispatch.engine.id
            try:
                response = await self.gw.monitor.client(engine_id).request(
                    b"POST", endpoint.path, headers, self._upstream_body(dispatch, body, parsed)
                )
                return dispatch, response
            except ConnectError as exc:
                self.gw.monitor.connect_failed(engine_id, str(exc))
                self.gw.metrics.upstream_errors.labels(dispatch.pool, engine_id, "connect").inc()
                if retried:
                    self._finish(dispatch, ok=False)
                    raise ApiError(502, f"engine unreachable: {exc}", "upstream_unreachable") from None
                retried = True
                outcome = self.gw.dispatcher.retry(dispatch, time.monotonic())
                self.gw.settle(self.gw.dispatcher.take_notices())
                if isinstance(outcome, Queued):
                    outcome = await self.gw.wait_turn(dispatch.request)
                if not isinstance(outcome, Dispatch):
                    raise ApiError(502, f"engine unreachable: {exc}", "upstream_unreachable") from None
                self.gw.metrics.retries.labels(dispatch.pool).inc()
                log.info("request_retried", request_id=request_id, failed=engine_id, engine=outcome.engine.id)
                dispatch = outcome
            except ReadTimeout as exc:
                self.gw.metrics.upstream_errors.labels(dispatch.pool, engine_id, "timeout").inc()
                self._finish(dispatch, ok=False)
                raise ApiError(504, f"engine timed out: {exc}", "upstream_timeout") from None
            except UpstreamError as exc:
                self.gw.metrics.upstream_errors.labels(dispatch.pool, engine_id, "failed").inc()
                self._finish(dispatch, ok=False)
                raise ApiError(502, f"engine failed: {exc}", "upstream_error") from None

    async def _relay(
        self,
        scope: Scope,
        receive: Any,
        send: Any,
        endpoint: Endpoint,
        dispatch: Dispatch,
        body: bytes,
        parsed: dict[str, Any],
        request_id: str,
        started: float,
    ) -> bool:
        """Relay one attempt; True when it was preempted before any byte reached the client."""
        call = _Call()
        rid = dispatch.request.id
        self.gw.active[rid] = call.preempt
        watcher = asyncio.create_task(self._watch_disconnect(receive, call))
        cls = dispatch.request.cls
        response: Response | None = None
        status = 502
        failure: ApiError | None = None
        try:
            # On failure _connect has settled the dispatch and raises ApiError for handle() to answer.
            dispatch, response = await self._connect(endpoint, dispatch, body, parsed, request_id)
            call.response = response
            status = response.status
            out = [(k, v) for k, v in response.headers if k in _PASS_HEADERS]
            out += [
                (b"x-gateway-class", cls.encode()),
                (b"x-gateway-pool", dispatch.pool.encode()),
                (b"x-request-id", request_id.encode()),
            ]
            if parsed.get("stream") is True and status == 200:
                await self._stream(send, out, response, dispatch, started, call)
            else:
                payload = await response.read()
                call.done = True
                await send({"type": "http.response.start", "status": status, "headers": out})
                await send({"type": "http.response.body", "body": payload})
        except asyncio.CancelledError:
            if not (call.gone or call.preempted):
                raise
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            if call.preempted:
                log.info("request_preempted", request_id=request_id, engine=dispatch.engine.id)
                return True
            status = CLIENT_GONE
            log.debug("client_disconnected", request_id=request_id, engine=dispatch.engine.id)
        except UpstreamError as exc:
            if call.preempted:
                return True
            timeout = isinstance(exc, ReadTimeout)
            status = 504 if timeout else 502
            kind = "timeout" if timeout else "midstream"
            self.gw.metrics.upstream_errors.labels(dispatch.pool, dispatch.engine.id, kind).inc()
            log.warning("upstream_failed", request_id=request_id, engine=dispatch.engine.id, reason=str(exc))
            call.done = True
            if call.streaming:
                event = error_body(status, f"engine failed mid-stream: {exc}", "upstream_error")
                await send({"type": "http.response.body", "body": b"data: " + event + b"\n\n", "more_body": False})
            else:
                failure = ApiError(status, f"engine failed: {exc}", "upstream_timeout" if timeout else "upstream_error")
        finally:
            call.done = True
            self.gw.active.pop(rid, None)
            if not watcher.done():
                watcher.cancel()
            if response is not None:
                response.close()
            # Idempotent: a dispatch already released (preempted, or failed in _connect) gives nothing back twice.
            self._finish(dispatch, ok=status < 500)
        if failure is not None:
            raise failure
        self._count(cls, dispatch.pool, status)
        return False

    async def _stream(
        self,
        send: Any,
        headers: list[tuple[bytes, bytes]],
        response: Response,
        dispatch: Dispatch,
        started: float,
        call: _Call,
    ) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": headers + _SSE_HEADERS})
        call.streaming = True
        ttft_metric, itl_metric = self._timers(dispatch.request.cls, dispatch.pool)
        dispatcher = self.gw.dispatcher
        clock = time.monotonic
        chunk = await response.next_chunk()
        last = clock()
        if chunk is not None:
            ttft = last - started
            ttft_metric.observe(ttft)
            dispatcher.observe_ttft(dispatch, ttft, last)
        while chunk is not None:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            chunk = await response.next_chunk()
            if chunk is None:
                break
            now = clock()
            gap = now - last
            last = now
            itl_metric.observe(gap)
            dispatcher.observe_itl(dispatch, gap, now)
        call.done = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch_disconnect(self, receive: Any, call: _Call) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not call.done:
                    call.gone = True
                    if call.response is not None:
                        call.response.close()
                    if call.task is not None:
                        call.task.cancel()
                return

    async def _send_error(self, send: Any, exc: ApiError, cls: str, pool: str, request_id: str) -> None:
        headers = exc.response_headers()
        headers.append((b"x-request-id", request_id.encode()))
        if cls != "-":
            headers.append((b"x-gateway-class", cls.encode()))
        if pool != "-":
            headers.append((b"x-gateway-pool", pool.encode()))
        body = exc.body()
        try:
            await send({"type": "http.response.start", "status": exc.status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        except RuntimeError:
            log.debug("error_after_response_started", request_id=request_id, status=exc.status)
