"""OpenAI's Files API: ``/v1/files`` (upload, list, retrieve, content, delete).

Rules:
- An upload is read only up to what it may be (the file size limit, or what the key's quota
  leaves, plus room for the form around it); past that the gateway stops reading and answers
  413 ``file_too_large`` or 400 ``file_quota_exceeded``, whether or not the client declared
  a ``Content-Length``.
- The small JSON bodies of the control endpoints (batches, admin) are read up to
  ``MAX_JSON_BODY`` bytes, the same way.
- A download streams the file from the store in pieces as the client reads it; at most
  ``limits.max_downloads`` run at once (one more gets 503 ``too_many_downloads``), each for at most
  ``limits.download_timeout_s`` (``priority_gateway.http.connection`` closes it then).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.datastructures import UploadFile
from starlette.types import Message, Receive, Scope, Send

from priority_gateway.auth import Principal
from priority_gateway.batch.service import expires_after_seconds
from priority_gateway.errors import ApiError
from priority_gateway.keys import caller_of
from priority_gateway.store.records import Page

if TYPE_CHECKING:
    from priority_gateway.runtime import Gateway

# Room for the multipart framing and the other form fields around the file itself.
FORM_OVERHEAD = 64 * 1024
MAX_JSON_BODY = 64 * 1024
MAX_FILENAME = 255


class CappedBody:
    """A request's receive channel that ends the body once it passes ``cap`` bytes."""

    def __init__(self, receive: Receive, cap: int) -> None:
        self.receive = receive
        self.cap = cap
        self.size = 0
        self.over = False

    async def __call__(self) -> Message:
        if self.over:
            return {"type": "http.request", "body": b"", "more_body": False}
        message = await self.receive()
        if message["type"] == "http.request":
            self.size += len(message.get("body", b""))
            if self.size > self.cap:
                self.over = True
                return {"type": "http.request", "body": b"", "more_body": False}
        return message


async def read_json_object(request: Request, empty: dict[str, Any] | None = None) -> dict[str, Any]:
    """The request's JSON object body, read up to ``MAX_JSON_BODY`` bytes (413 past it)."""
    too_large = ApiError(413, f"request body exceeds the limit of {MAX_JSON_BODY} bytes", "body_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_JSON_BODY:
        raise too_large
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_JSON_BODY:
            raise too_large
        parts.append(chunk)
    data = b"".join(parts)
    if not data and empty is not None:
        return empty
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", "invalid_json")
    return body


class Downloads:
    """Downloads in progress, at most ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0

    def take(self) -> None:
        if self.running >= self.limit:
            message = f"{self.limit} file downloads are in progress already; retry shortly"
            raise ApiError(503, message, "too_many_downloads", retry_after_s=1.0)
        self.running += 1

    def give_back(self) -> None:
        self.running -= 1


class DownloadResponse(StreamingResponse):
    """A file's body streamed as it is read from the store; its download slot is given back when it ends."""

    def __init__(self, pieces: AsyncIterator[bytes], size: int, downloads: Downloads) -> None:
        super().__init__(pieces, media_type="application/octet-stream", headers={"content-length": str(size)})
        self.downloads = downloads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.downloads.give_back()


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def page_response(page: Page) -> Response:
    data = [item.to_api() for item in page.items]
    return json_response(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": page.has_more,
        }
    )


def page_limit(request: Request, default: int, most: int) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise ApiError(400, f"'limit' must be an integer from 1 to {most}", "invalid_value", "limit")
    return int(raw)


async def caller(gateway: Gateway, request: Request) -> Principal:
    """The request's principal; 401 when keys are required and it has none that is valid."""
    authorization = request.headers.get("authorization")
    return await caller_of(gateway.auth, authorization.encode("latin-1") if authorization else None)


async def owner_of(gateway: Gateway, request: Request) -> str:
    return (await caller(gateway, request)).key_id or ""


async def _upload_fields(form: Any) -> tuple[bytes, str, str, int | None]:
    """(data, filename, purpose, expires_after_s) of an upload form."""
    upload = form.get("file")
    purpose = form.get("purpose")
    expires_after_s = None
    if form.get("expires_after[anchor]") is not None or form.get("expires_after[seconds]") is not None:
        policy = {"anchor": form.get("expires_after[anchor]"), "seconds": form.get("expires_after[seconds]")}
        expires_after_s = expires_after_seconds(policy, "expires_after")
    if not isinstance(upload, UploadFile):
        raise ApiError(400, "'file' is required (a multipart file field)", "missing_required_parameter", "file")
    if not isinstance(purpose, str) or not purpose:
        raise ApiError(400, "'purpose' is required", "missing_required_parameter", "purpose")
    filename = upload.filename or "upload.jsonl"
    if len(filename) > MAX_FILENAME:
        raise ApiError(400, f"the file name is longer than {MAX_FILENAME} characters", "invalid_value", "file")
    return await upload.read(), filename, purpose, expires_after_s


def files_router(gateway: Gateway) -> APIRouter:
    router = APIRouter()
    service = gateway.batches
    downloads = Downloads(gateway.config.limits.max_downloads)

    @router.post("/v1/files")
    async def upload(request: Request) -> Response:
        owner = await owner_of(gateway, request)
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise ApiError(400, "upload the file as multipart/form-data with 'file' and 'purpose'", "invalid_request")
        room = await service.upload_room(owner)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > room + FORM_OVERHEAD:
            raise await service.too_large(owner, None)
        body = CappedBody(request.receive, room + FORM_OVERHEAD)
        try:
            async with Request(request.scope, body).form(max_files=1, max_fields=16) as form:
                data, filename, purpose, expires_after_s = await _upload_fields(form)
        except Exception:
            if not body.over:
                raise
        if body.over:
            raise await service.too_large(owner, None)
        record = await service.create_file(owner, filename, purpose, data, expires_after_s)
        return json_response(record.to_api())

    @router.get("/v1/files")
    async def list_files(request: Request) -> Response:
        owner = await owner_of(gateway, request)
        order = request.query_params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, "'order' must be asc or desc", "invalid_value", "order")
        limit = page_limit(request, 10000, 10000)
        page = await service.list_files(
            owner, request.query_params.get("after"), limit, order == "desc", request.query_params.get("purpose")
        )
        return page_response(page)

    @router.get("/v1/files/{file_id}")
    async def retrieve(file_id: str, request: Request) -> Response:
        record = await service.get_file(await owner_of(gateway, request), file_id)
        return json_response(record.to_api())

    @router.get("/v1/files/{file_id}/content")
    async def content(file_id: str, request: Request) -> Response:
        owner = await owner_of(gateway, request)
        downloads.take()
        try:
            size, pieces = await service.file_content(owner, file_id)
        except BaseException:
            downloads.give_back()
            raise
        return DownloadResponse(pieces, size, downloads)

    @router.delete("/v1/files/{file_id}")
    async def delete(file_id: str, request: Request) -> Response:
        await service.delete_file(await owner_of(gateway, request), file_id)
        return json_response({"id": file_id, "object": "file", "deleted": True})

    return router
