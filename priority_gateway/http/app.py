"""The ASGI application.

Inference endpoints go straight to the ``Proxy`` (no framework work per request);
everything else (models, health, metrics, files, batches) is an ordinary FastAPI app.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match
from starlette.types import Message, Receive, Scope, Send

from priority_gateway import log
from priority_gateway.errors import ApiError, error_body, send_error
from priority_gateway.http.admin import admin_router
from priority_gateway.http.batches import batches_router
from priority_gateway.http.body_limit import BodyLimits, Receiving
from priority_gateway.http.files import FORM_OVERHEAD, caller, files_router
from priority_gateway.http.internal import batch_executor
from priority_gateway.http.proxy import ENDPOINTS, Proxy
from priority_gateway.http.responses import responses_router
from priority_gateway.runtime import Gateway
from priority_gateway.store import StoreUnavailable

_POST_ONLY = ApiError(405, "Method Not Allowed", "method_not_allowed", headers=[(b"allow", b"POST")])


def _json(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def create_api(gateway: Gateway) -> FastAPI:
    # No trailing-slash redirects: they would build a URL from the client's Host header.
    api = FastAPI(title="priority gateway", docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)
    api.state.gateway = gateway
    routes: list[APIRoute] = []  # every route, filled once all are in: a 405 names what the path takes
    _answer_errors(api, routes)
    _serve_state(api, gateway)
    _serve_models(api, gateway)
    routers = [files_router(gateway), batches_router(gateway), admin_router(gateway), responses_router(gateway)]
    for router in routers:
        api.include_router(router)
    routes.extend(
        r for r in [*api.router.routes, *(r for router in routers for r in router.routes)] if isinstance(r, APIRoute)
    )
    return api


def _answer_errors(api: FastAPI, routes: list[APIRoute]) -> None:
    """Every error in OpenAI's shape: the gateway's own, the framework's, and what nobody expected."""

    @api.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> Response:
        headers = {k.decode(): v.decode() for k, v in exc.response_headers() if k != b"content-type"}
        return _json(exc.status, exc.body(), headers)

    @api.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        headers = {name.lower(): value for name, value in (exc.headers or {}).items()}
        if exc.status_code == 405:
            # Starlette names the methods of the first route on the path; every route's count.
            headers["allow"] = ", ".join(sorted(_methods(routes, request.scope)))
        return _json(exc.status_code, error_body(exc.status_code, message, code), headers)

    @api.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return _json(400, error_body(400, str(first.get("msg", "invalid request")), "invalid_request", param))

    @api.exception_handler(ClientDisconnect)
    async def client_gone(_request: Request, _exc: ClientDisconnect) -> Response:
        # Nobody reads this answer; it ends the request without a traceback.
        return _json(400, error_body(400, "client disconnected", "client_disconnected"))

    @api.exception_handler(StoreUnavailable)
    async def store_unavailable(_request: Request, _exc: StoreUnavailable) -> Response:
        body = error_body(503, "the gateway's store is unavailable; retry shortly", "store_unavailable")
        return _json(503, body, {"retry-after": "1"})

    @api.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> Response:
        log.error("request_failed", exc_info=True, path=request.url.path[:64], reason=repr(exc)[:200])
        return _json(500, error_body(500, "the gateway failed on this request", "internal_error"))


def _serve_state(api: FastAPI, gateway: Gateway) -> None:
    """Health, readiness, metrics and the OpenAPI document."""
    limits = gateway.config.limits

    @api.get("/health")
    async def health() -> Response:
        return _json(200, b'{"status":"ok"}')

    @api.get("/ready")
    async def ready() -> Response:
        # Ready: every pool has a healthy engine, and the store has answered since the start (an outage
        # after that leaves inference to known callers running, so it is reported, not a reason to stop).
        pools = gateway.dispatcher.ready()
        store = await gateway.store_state()
        ok = all(pools.values()) and gateway.store_answered
        body = {"ready": ok, "pools": pools, "store": store}
        return JSONResponse(body, status_code=200 if ok else 503)

    @api.get("/metrics")
    async def metrics(request: Request) -> Response:
        authorization = request.headers.get("authorization")
        if not limits.metrics_public and not gateway.keys.is_admin(authorization.encode() if authorization else None):
            await caller(gateway, request)
        return Response(gateway.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @api.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> Response:
        if not limits.openapi_public:
            await caller(gateway, request)
        return JSONResponse(api.openapi())


def _serve_models(api: FastAPI, gateway: Gateway) -> None:
    """``/v1/models``: the models and adapters the engines serve, as vLLM lists them."""

    @api.get("/v1/models")
    async def models(request: Request) -> Response:
        await caller(gateway, request)
        return JSONResponse({"object": "list", "data": gateway.catalog.listing()})

    @api.get("/v1/models/{model:path}")
    async def model(model: str, request: Request) -> Response:
        await caller(gateway, request)
        entry = gateway.catalog.entry(model)
        if entry is not None:
            return JSONResponse(entry)
        raise ApiError(404, f"The model '{model}' does not exist", "model_not_found", "model")


def _methods(routes: list[APIRoute], scope: Scope) -> set[str]:
    """The methods the routes on ``scope``'s path take."""
    methods: set[str] = set()
    for route in routes:
        if route.matches(scope)[0] != Match.NONE:
            methods |= route.methods or set()
    return methods


def build_proxy(gateway: Gateway) -> Proxy:
    """The request path, wired to the running gateway's parts."""
    return Proxy(
        admission=gateway.scheduler,
        placement=gateway.placement,
        engines=gateway.monitor,
        metrics=gateway.metrics,
        auth=gateway.auth,
        rate_limits=gateway.limiter,
        budgets=gateway.budgets,
        limits=gateway.config.limits,
        deadlines=gateway.config.upstream,
        access_log=gateway.config.access_log,
        tracing=gateway.tracing,
        adapters=gateway.adapters,
        engine_header=gateway.config.models.engine_header,
        tenants=gateway.tenant_metrics,
    )


class GatewayApp:
    """The ASGI entry point: lifespan, the hot path, then FastAPI for the rest."""

    def __init__(self, gateway: Gateway, api: FastAPI | None = None) -> None:
        self.gateway = gateway
        self.api = api or create_api(gateway)
        self.proxy = build_proxy(gateway)
        limits = gateway.config.limits
        upload = gateway.batches.settings.max_file_bytes + FORM_OVERHEAD
        self.body_limits = BodyLimits(
            limits.max_body_bytes, {"/v1/files": max(upload, limits.max_body_bytes)}, limits.max_receiving_bytes
        )
        gateway.batches.attach(batch_executor(self.proxy, gateway.keys.internal_authorization, gateway.tracing))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            if len(path) > 1 and path[-1] == "/":
                # One route per resource, with or without the slash: no redirect to a Host we were told.
                path = path.rstrip("/") or "/"
                scope = {**scope, "path": path, "raw_path": scope.get("raw_path", b"").rstrip(b"/") or b"/"}
            try:
                receive = self.body_limits.bounded(scope, receive)
            except ApiError as exc:
                await send_error(send, exc)
                return
            try:
                endpoint = ENDPOINTS.get(path)
                if endpoint is not None:
                    if scope["method"] == "POST":
                        await self.proxy.handle(scope, receive, send, endpoint)
                    else:
                        await send_error(send, _POST_ONLY)
                    return
                await self._api(scope, receive, send)
            finally:
                if isinstance(receive, Receiving):
                    receive.release()  # a body never read whole (refused on its headers, client gone)
            return
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        await self.api(scope, receive, send)

    async def _api(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.api(scope, receive, tracked)
        except Exception:
            # FastAPI has answered (and logged) through the Exception handler, then re-raised.
            if not started:
                await send_error(send, ApiError(500, "the gateway failed on this request", "internal_error"))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.gateway.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.gateway.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return
