"""The simulated engine's HTTP server: vLLM's OpenAI API on a raw ASGI app.

Rules:
- One engine per process, driven in real time by ``RealtimeDriver``.
- Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses`` (streamed as
  SSE or not), ``POST /v1/embeddings``, ``GET /v1/models``, ``GET /health``, ``GET /metrics``, ``GET /load``,
  ``GET /version``, ``GET /ping``; ``GET /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``
  answer 404 (nothing is stored). With runtime LoRA updating (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``), also
  ``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``, which answer plain text on success.
- A request's ``model`` is resolved by ``ServedModels``: a base name or an adapter, else a 404.
- A generation request enters the engine once its body is parsed and checked; a task watches the
  connection, and a client that goes away aborts its request in the engine.
- A streamed response sends one chunk per engine step that gave the request tokens (the role
  chunk of a chat goes with the first tokens), then the usage chunk when asked, then ``[DONE]``.
- The ``priority`` field is checked always but only reaches the engine under the priority policy.
- With a ``RequestTracer`` (``--otlp-traces-endpoint``), every generation request that ends is
  an ``llm_request`` span under the trace context of its ``traceparent`` header (``tracing``).
- With ``VLLM_SERVER_DEV_MODE=1`` (as vLLM), ``POST /reset_prefix_cache`` forgets every cached
  block; like vLLM it answers 200 even when blocks still in use keep it from resetting.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from priority_gateway.engines.sim import protocol, responses, tokens
from priority_gateway.engines.sim.core import PRIORITY, EngineCore, EngineRequest
from priority_gateway.engines.sim.lora import LoraAdapter
from priority_gateway.engines.sim.metrics import MetricsPage
from priority_gateway.engines.sim.models import ServedModels
from priority_gateway.engines.sim.protocol import CHAT, COMPLETION, ApiError, ParsedRequest
from priority_gateway.engines.sim.realtime import RealtimeDriver, Stream
from priority_gateway.engines.sim.responses import ResponsesRequest
from priority_gateway.engines.sim.tracing import RequestTracer, trace_headers

_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_METRICS = b"text/plain; version=0.0.4; charset=utf-8"
_NOT_FOUND = orjson.dumps({"detail": "Not Found"})
_VERSION = orjson.dumps({"version": "0.32.0"})
_NO_TYPE: list[tuple[bytes, bytes]] = []  # vLLM answers a LoRA load or unload with a bare str Response
_RESPONSES_PREFIX = "/v1/responses/"


class SimServer:
    def __init__(
        self,
        driver: RealtimeDriver,
        *,
        seed: int = 0,
        prompt_tokens_details: bool = False,
        on_shutdown: Callable[[], None] | None = None,
        models: ServedModels | None = None,
        tracer: RequestTracer | None = None,
    ) -> None:
        self.driver = driver
        self.core: EngineCore = driver.core
        self.models = models or ServedModels([self.core.model], self.core.model, self.core.max_model_len)
        self.model = self.models.name
        self.seed = seed
        self.prompt_tokens_details = prompt_tokens_details
        self.on_shutdown = on_shutdown
        self.tracer = tracer
        self.metrics = MetricsPage(self.core, created=time.time(), wall_offset=time.time() - driver.clock())
        self.takes_priority = self.core.scheduling_policy == PRIORITY
        self.keep_token_ids = self.core.kv_events is not None
        self.dev_mode = os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
        self._created = protocol.now_created()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.driver.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.driver.stop()
                if self.on_shutdown is not None:
                    self.on_shutdown()
                if self.tracer is not None:
                    self.tracer.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        method = scope["method"]
        if method == "POST":
            trace = trace_headers(scope["headers"]) if self.tracer is not None else None
            if path == "/v1/chat/completions":
                return await self._generate(CHAT, receive, send, trace)
            if path == "/v1/completions":
                return await self._generate(COMPLETION, receive, send, trace)
            if path == "/v1/responses":
                return await self._responses(receive, send, trace)
            if path == "/v1/embeddings":
                return await self._embeddings(receive, send)
            if path == "/reset_prefix_cache" and self.dev_mode:
                self.core.cache.reset_prefix_cache()
                return await _respond(send, 200, b"", [])
            if self.models.runtime_updating and path == "/v1/load_lora_adapter":
                return await self._lora_admin(receive, send, self._load_lora)
            if self.models.runtime_updating and path == "/v1/unload_lora_adapter":
                return await self._lora_admin(receive, send, self._unload_lora)
            if path.startswith(_RESPONSES_PREFIX) and path.endswith("/cancel"):
                return await self._error(send, responses.not_found(path[len(_RESPONSES_PREFIX) : -len("/cancel")]))
        elif method == "GET":
            if path == "/health":
                return await _respond(send, 200, b"", [])
            if path == "/metrics":
                return await _respond(send, 200, self.metrics.render(), [(b"content-type", _METRICS)])
            if path == "/v1/models":
                return await _respond(send, 200, self.models.cards(self._created))
            if path == "/load":
                load = self.core.num_running + self.core.num_waiting
                return await _respond(send, 200, b'{"server_load":%d}' % load)
            if path == "/version":
                return await _respond(send, 200, _VERSION)
            if path == "/ping":
                return await _respond(send, 200, b"", [])
            if path.startswith(_RESPONSES_PREFIX):
                return await self._error(send, responses.not_found(path[len(_RESPONSES_PREFIX) :]))
        await _respond(send, 404, _NOT_FOUND)

    @staticmethod
    async def _error(send: Send, exc: ApiError) -> None:
        await _respond(send, exc.status, exc.body())

    # -- LoRA adapters ----------------------------------------------------------------

    async def _lora_admin(self, receive: Receive, send: Send, action: Callable[[dict[str, Any]], str]) -> None:
        """A load or unload: ``action`` takes the JSON body and returns the plain-text success message."""
        try:
            message = action(protocol.parse_body(await _read_body(receive)))
        except ApiError as exc:
            return await self._error(send, exc)
        await _respond(send, 200, message.encode(), _NO_TYPE)

    def _load_lora(self, body: dict[str, Any]) -> str:
        protocol.missing_fields(body, ("lora_name", "lora_path"))
        name, path = _str_field(body, "lora_name"), _str_field(body, "lora_path")
        inplace = bool(body.get("load_inplace", False))
        self.models.check_load(name, path, inplace)
        adapter = self.models.prepare(name, path)
        try:
            self.core.add_lora(adapter, replace=inplace)
        except ValueError as exc:
            raise ApiError(500, f"Call to add_lora method failed: {exc}", kind="InternalServerError") from None
        return self.models.register(adapter)

    def _unload_lora(self, body: dict[str, Any]) -> str:
        protocol.missing_fields(body, ("lora_name",))
        return self.models.unload(_str_field(body, "lora_name"))

    async def _embeddings(self, receive: Receive, send: Send) -> None:
        try:
            body = protocol.parse_body(await _read_body(receive))
            self.models.resolve(body.get("model"))
            payload = protocol.embeddings_response(body, self.model)
        except ApiError as exc:
            return await _respond(send, exc.status, exc.body())
        await _respond(send, 200, payload)

    async def _generate(self, kind: str, receive: Receive, send: Send, trace: dict[str, str] | None = None) -> None:
        try:
            body = protocol.parse_body(await _read_body(receive))
            adapter = self.models.resolve(body.get("model"))
            reply_model = self.models.reply_name(adapter)
            req = protocol.parse_generate(body, kind, reply_model, self.core.max_model_len, self.seed)
        except ApiError as exc:
            return await _respond(send, exc.status, exc.body())
        reply = self._stream if req.stream else self._complete
        await self._serve(req, adapter, receive, lambda stream, seed: reply(req, stream, seed, send), trace)

    async def _serve(
        self,
        req: ParsedRequest,
        adapter: LoraAdapter | None,
        receive: Receive,
        reply: Callable[[Stream, int], Awaitable[None]],
        trace: dict[str, str] | None = None,
    ) -> None:
        """Run one request in the engine while ``reply(stream, reply_seed)`` answers the client."""
        arrival_ns = time.time_ns()
        engine_req, reply_seed = self._engine_request(req, adapter)
        delay = self.core.profile.timing.request_s(req.prompt_tokens)
        if delay > 0:
            await asyncio.sleep(delay)  # the API server's part, before the scheduler sees the request
        stream = self.driver.submit(engine_req, stream_tokens=req.stream)
        watcher = asyncio.get_running_loop().create_task(self._watch(receive, req.id))
        try:
            await reply(stream, reply_seed)
        except OSError:
            self.driver.abort(req.id)
        finally:
            watcher.cancel()
        if trace is not None and self.tracer is not None:
            attributes = {
                "gen_ai.request.id": req.id,
                "gen_ai.response.model": req.model,
                "gen_ai.usage.prompt_tokens": req.prompt_tokens,
                "gen_ai.usage.completion_tokens": stream.total,
            }
            self.tracer.finished(trace, arrival_ns, attributes)

    def _engine_request(self, req: ParsedRequest, adapter: LoraAdapter | None = None) -> tuple[EngineRequest, int]:
        bs = self.core.block_size
        if req.prompt_ids is not None:
            hashes = tokens.block_hashes_for_ids(req.prompt_ids, bs, req.cache_salt)
            reply_seed = tokens.prompt_seed(orjson.dumps(req.prompt_ids), req.seed)
            ids: list[int] | None = req.prompt_ids
        else:
            text = req.prompt_text or ""
            hashes = tokens.block_hashes_for_text(text, bs, req.cache_salt)
            reply_seed = tokens.prompt_seed(text, req.seed)
            ids = tokens.token_ids(text) if self.keep_token_ids else None
        engine_req = EngineRequest(
            id=req.id,
            prompt_tokens=req.prompt_tokens,
            block_hashes=hashes,
            max_tokens=req.max_tokens,
            priority=req.priority if self.takes_priority else 0,
            min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos,
            eos_at=tokens.natural_length(reply_seed),
            prompt_token_ids=ids,
            lora=adapter,
            cache_salt=req.cache_salt,
        )
        return engine_req, reply_seed

    async def _responses(self, receive: Receive, send: Send, trace: dict[str, str] | None = None) -> None:
        try:
            body = protocol.parse_body(await _read_body(receive))
            adapter = self.models.resolve(body.get("model"))
            reply_model = self.models.reply_name(adapter)
            resp = responses.parse_responses(body, reply_model, self.core.max_model_len, self.seed)
        except ApiError as exc:
            return await self._error(send, exc)
        reply = self._stream_response if resp.parsed.stream else self._complete_response
        await self._serve(resp.parsed, adapter, receive, lambda stream, seed: reply(resp, stream, seed, send), trace)

    async def _complete_response(self, resp: ResponsesRequest, stream: Stream, seed: int, send: Send) -> None:
        reason = await stream.until_finished()
        if reason != "abort":
            text = tokens.output_text(seed, 0, stream.total - (reason == "stop"))
            await _respond(send, 200, responses.full_response(resp, text, reason, stream.total, stream.cached_tokens))

    async def _stream_response(self, resp: ResponsesRequest, stream: Stream, seed: int, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        writer = responses.EventWriter(resp)
        await send({"type": "http.response.body", "body": writer.start(), "more_body": True})
        async for text, finished, reason in _text_deltas(stream, seed):
            events = writer.delta(text)
            if finished:
                events += writer.finish(reason, stream.total, stream.cached_tokens)
            if events:
                await send({"type": "http.response.body", "body": events, "more_body": True})
            if finished:
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch(self, receive: Receive, request_id: str) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.driver.abort(request_id)
                return

    def _usage(self, req: ParsedRequest, stream: Stream) -> dict[str, Any]:
        cached = stream.cached_tokens if self.prompt_tokens_details else None
        return protocol.usage(req.prompt_tokens, stream.total, cached)

    async def _complete(self, req: ParsedRequest, stream: Stream, seed: int, send: Send) -> None:
        while True:
            _, finished, reason = await stream.next()
            if finished:
                break
        if reason == "abort":
            return
        text = tokens.output_text(seed, 0, stream.total - (reason == "stop"))
        cached = stream.cached_tokens if self.prompt_tokens_details else None
        payload = protocol.full_response(req, protocol.now_created(), text, reason, stream.total, cached)
        await _respond(send, 200, payload)

    async def _stream(self, req: ParsedRequest, stream: Stream, seed: int, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        writer = protocol.ChunkWriter(req, protocol.now_created())
        emitted = 0
        while True:
            n, finished, reason = await stream.next()
            if reason == "abort":
                return
            text = tokens.output_text(seed, emitted, n - (reason == "stop"))
            emitted += n
            usage = self._usage(req, stream) if req.continuous_usage else None
            chunk = writer.delta(text, reason if finished else None, usage)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if finished:
                break
        tail = protocol.DONE
        if req.include_usage:
            tail = writer.usage_chunk(self._usage(req, stream)) + tail
        await send({"type": "http.response.body", "body": tail, "more_body": False})


async def _text_deltas(stream: Stream, seed: int) -> AsyncIterator[tuple[str, bool, str | None]]:
    """``(new text, finished, reason)`` per delivery of the engine, until the end; nothing after an abort."""
    emitted = 0
    while True:
        n, finished, reason = await stream.next()
        if reason == "abort":
            return
        yield tokens.output_text(seed, emitted, n - (reason == "stop")), finished, reason
        emitted += n
        if finished:
            return


def _str_field(body: dict[str, Any], name: str) -> str:
    value = body[name]
    if not isinstance(value, str):
        detail = f"{{'type': 'string_type', 'loc': 'body.{name}', 'msg': 'Input should be a valid string'}}"
        raise ApiError(400, f"1 validation error:\n  {detail}", f"body.{name}", "Bad Request")
    return value


async def _read_body(receive: Receive) -> bytes:
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    parts = [body]
    while message.get("more_body", False):
        message = await receive()
        parts.append(message.get("body", b""))
    return b"".join(parts)


async def _respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] = _JSON) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
