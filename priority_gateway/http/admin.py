"""API key administration over HTTP: ``/admin/keys``, guarded by ``keys.admin``.

The same operations as ``gateway keys``, for setups where the gateway's store is the only
place keys can live (an in-process store without ``keys.file``) or no shell is at hand.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from priority_gateway.errors import ApiError, excerpt
from priority_gateway.http.files import json_response, read_json_object
from priority_gateway.keys import KeySpecError, new_key

if TYPE_CHECKING:
    from priority_gateway.runtime import Gateway


def _limit(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be an integer", "invalid_value", name)
    return value


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name, default)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be a number", "invalid_value", name)
    return float(value)


def admin_router(gateway: Gateway) -> APIRouter:
    router = APIRouter()
    keys = gateway.keys
    store = gateway.store

    def check(request: Request) -> None:
        if not keys.admin_secret:
            raise ApiError(403, "the admin API is off: set keys.admin (GATEWAY__KEYS__ADMIN)", "admin_disabled")
        authorization = request.headers.get("authorization")
        if not keys.is_admin(authorization.encode("latin-1") if authorization else None):
            raise ApiError(401, "this endpoint needs the admin key as 'Authorization: Bearer ...'", "invalid_api_key")

    @router.post("/admin/keys")
    async def create(request: Request) -> Response:
        check(request)
        body = await read_json_object(request, empty={})
        classes = body.get("classes", ["interactive", "batch"])
        if isinstance(classes, str):
            classes = classes.split(",")
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise ApiError(400, "'classes' must be a list of class names", "invalid_value", "classes")
        default = body.get("default_class")
        if default is not None and not isinstance(default, str):
            raise ApiError(400, "'default_class' must be a class name", "invalid_value", "default_class")
        name = body.get("name") or ""
        if not isinstance(name, str):
            raise ApiError(400, "'name' must be a string", "invalid_value", "name")
        tenant = body.get("tenant")
        if tenant is not None and not isinstance(tenant, str):
            raise ApiError(400, "'tenant' must be a string", "invalid_value", "tenant")
        try:
            key, secret = new_key(
                name,
                classes,
                default,
                _limit(body, "rpm"),
                _limit(body, "tpm"),
                tenant=tenant,
                weight=_number(body, "weight", 1.0),
                max_concurrency=_limit(body, "max_concurrency"),
                known=tuple(gateway.budgets),
            )
        except KeySpecError as exc:
            raise ApiError(400, str(exc), "invalid_value") from None
        await store.put_key(key)
        keys.noted_new_key()
        return json_response({**key.to_api(), "secret": secret}, status=201)

    @router.get("/admin/keys")
    async def list_keys(request: Request) -> Response:
        check(request)
        return json_response({"object": "list", "data": [k.to_api() for k in await store.list_keys()]})

    @router.delete("/admin/keys/{key_id}")
    async def revoke(key_id: str, request: Request) -> Response:
        check(request)
        if not await store.revoke_key(key_id, int(time.time())):
            existing = await store.get_key(key_id)
            if existing is None:
                raise ApiError(404, f"No such key: {excerpt(key_id)}", "not_found", "key_id")
        key = await store.get_key(key_id)
        assert key is not None
        return json_response(key.to_api())

    return router
