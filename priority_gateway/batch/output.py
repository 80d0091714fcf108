"""Lines of a batch's output and error files, in OpenAI's shape:
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``."""

from __future__ import annotations

import uuid

import orjson


def request_id() -> str:
    return "batch_req_" + uuid.uuid4().hex


def response_line(line_id: str, custom_id: str, status: int, request_id: str, body: bytes) -> bytes:
    try:
        orjson.loads(body)
        payload = body
    except orjson.JSONDecodeError:
        payload = orjson.dumps(body.decode("utf-8", "replace"))
    return (
        b'{"id":'
        + orjson.dumps(line_id)
        + b',"custom_id":'
        + orjson.dumps(custom_id)
        + b',"response":{"status_code":'
        + str(status).encode()
        + b',"request_id":'
        + orjson.dumps(request_id)
        + b',"body":'
        + payload
        + b'},"error":null}'
    )


def error_line(custom_id: str, code: str, message: str) -> bytes:
    return orjson.dumps(
        {"id": request_id(), "custom_id": custom_id, "response": None, "error": {"code": code, "message": message}}
    )


def jsonl(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)
