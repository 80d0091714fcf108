"""OpenAI's Batches API: ``/v1/batches`` (create, retrieve, list, cancel)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import Response

from priority_gateway.core.classes import BATCH
from priority_gateway.errors import ApiError
from priority_gateway.http.files import caller, json_response, page_limit, page_response, read_json_object

if TYPE_CHECKING:
    from priority_gateway.runtime import Gateway


def batches_router(gateway: Gateway) -> APIRouter:
    router = APIRouter()
    service = gateway.batches

    async def owner(request: Request, creating: bool = False) -> str:
        principal = await caller(gateway, request)
        if creating and principal.allowed is not None and BATCH not in principal.allowed:
            raise ApiError(403, "this API key may not use the 'batch' class", "class_not_allowed")
        return principal.key_id or ""

    @router.post("/v1/batches")
    async def create(request: Request) -> Response:
        who = await owner(request, creating=True)
        record = await service.create_batch(who, await read_json_object(request))
        return json_response(record.to_api())

    @router.get("/v1/batches")
    async def list_batches(request: Request) -> Response:
        limit = page_limit(request, 20, 100)
        page = await service.list_batches(await owner(request), request.query_params.get("after"), limit)
        return page_response(page)

    @router.get("/v1/batches/{batch_id}")
    async def retrieve(batch_id: str, request: Request) -> Response:
        return json_response((await service.get_batch(await owner(request), batch_id)).to_api())

    @router.post("/v1/batches/{batch_id}/cancel")
    async def cancel(batch_id: str, request: Request) -> Response:
        return json_response((await service.cancel_batch(await owner(request), batch_id)).to_api())

    return router
