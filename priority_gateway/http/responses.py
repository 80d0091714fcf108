"""The Responses API's ids: ``GET``/``DELETE /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``.

The gateway keeps no responses; the engines may (vLLM with ``VLLM_ENABLE_RESPONSES_API_STORE``).
These calls go to a healthy engine of the interactive class's pool and its answer comes back: a
JSON object as it is, a refusal (400, 404) with the engine's message in OpenAI's shape, so a client
gets the engine's own 404 for an id it does not know; other answers as ``http.answers`` judges them.

Rules:
- The key is checked as on every ``/v1`` route; the id travels percent-encoded, at most
  ``MAX_ID`` characters; nothing of the client's body is sent on.
- No healthy engine: 503; an engine that cannot be reached or fails: 502; silence past the
  upstream deadlines: 504.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import Response

from priority_gateway.core.classes import INTERACTIVE
from priority_gateway.core.models import engine_tag
from priority_gateway.errors import ApiError
from priority_gateway.http.answers import engine_error, engine_message, is_json, json_object, not_json
from priority_gateway.http.body import echo
from priority_gateway.http.files import caller
from priority_gateway.upstream.h1 import ReadTimeout, UpstreamError

if TYPE_CHECKING:
    from priority_gateway.runtime import Gateway

MAX_ID = 256
_CLIENT_FAULTS = {400: (400, "invalid_request"), 422: (400, "invalid_request"), 404: (404, "not_found")}
_CLIENT_FAULTS[405] = (404, "not_found")  # an engine without the route knows no such response either


def responses_router(gateway: Gateway) -> APIRouter:
    router = APIRouter()
    turns = itertools.count()

    async def relay(request: Request, method: bytes, response_id: str, tail: bytes = b"") -> Response:
        await caller(gateway, request)
        if len(response_id) > MAX_ID:
            raise ApiError(400, f"a response id has at most {MAX_ID} characters", "invalid_value", "response_id")
        pool = gateway.dispatcher.pool_for(INTERACTIVE)
        engines = pool.healthy()
        if not engines:
            raise ApiError(503, f"no healthy engine in pool {pool.name!r}", "no_healthy_engine", retry_after_s=1.0)
        engine = engines[next(turns) % len(engines)]
        path = b"/v1/responses/" + quote(response_id, safe="").encode() + tail
        query = request.url.query.encode("latin-1")
        if query:
            path += b"?" + query
        deadlines = gateway.config.upstream
        try:
            answer = await gateway.monitor.client(engine.id).request(
                method, path, first_byte_timeout=deadlines.first_byte_timeout_s
            )
            try:
                payload = await answer.read()
            finally:
                answer.close()
        except ReadTimeout as exc:
            raise ApiError(504, f"engine timed out: {exc}", "upstream_timeout") from None
        except UpstreamError as exc:
            raise ApiError(502, f"engine failed: {exc}", "upstream_error") from None
        content_type = answer.header(b"content-type")
        if answer.status == 200 and is_json(content_type) and json_object(payload) is not None:
            headers = {"x-gateway-engine": engine_tag(engine.id)}
            return Response(payload, status_code=200, media_type="application/json", headers=headers)
        if answer.status in _CLIENT_FAULTS:
            # The engine's own refusal (an id it does not know, a method it does not take), in OpenAI's shape.
            status, code = _CLIENT_FAULTS[answer.status]
            message = (
                engine_message(payload) if is_json(content_type) else None
            ) or f"Response with id '{echo(response_id)}' not found."
            tag = [(b"x-gateway-engine", engine_tag(engine.id).encode())]
            raise ApiError(status, message, code, "response_id" if status == 404 else None, headers=tag)
        if answer.status == 200:
            raise not_json(200, content_type)
        raise engine_error(answer.status, content_type, payload)

    @router.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request) -> Response:
        return await relay(request, b"GET", response_id)

    @router.delete("/v1/responses/{response_id}")
    async def delete(response_id: str, request: Request) -> Response:
        return await relay(request, b"DELETE", response_id)

    @router.post("/v1/responses/{response_id}/cancel")
    async def cancel(response_id: str, request: Request) -> Response:
        return await relay(request, b"POST", response_id, b"/cancel")

    return router
