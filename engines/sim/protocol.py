"""OpenAI-server request parsing and response shapes, as vLLM's API server has them.

Rules:
- Parsing never builds models: a request body is a dict from ``orjson``; only the fields the
  engine uses are read and checked, with vLLM's status codes and error shape
  ``{"error": {"message", "type", "param", "code"}}``.
- ``priority`` must parse as an int as pydantic's lax mode does (ints, integral floats, numeric
  strings, booleans); anything else is a 400 ``int_parsing``-style error.
- ``max_tokens`` defaults to what is left of ``max_model_len`` after the prompt; asking for more
  is a 400, as is a prompt of ``max_model_len`` tokens or more.
- Response bytes are built by concatenating pre-encoded pieces and ``orjson`` dumps.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import orjson

from priority_gateway.engines.sim import tokens

CHAT = "chat"
COMPLETION = "completion"


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or {404: "NotFoundError"}.get(status, "BadRequestError")

    def body(self) -> bytes:
        return orjson.dumps(
            {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}
        )


@dataclass(slots=True)
class ParsedRequest:
    kind: str
    id: str
    model: str
    prompt_text: str | None
    prompt_ids: list[int] | None
    prompt_tokens: int
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    priority: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    cache_salt: str | None
    seed: int


def _int_field(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None or isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
        kind, msg = "int_parsing", "Input should be a valid integer, unable to parse string as an integer"
    elif isinstance(value, float):
        kind, msg = "int_from_float", "Input should be a valid integer, got a number with a fractional part"
    else:
        kind, msg = "int_type", "Input should be a valid integer"
    detail = {"type": kind, "loc": ["body", name], "msg": msg, "input": value}
    try:
        message = orjson.dumps([detail]).decode()
    except orjson.JSONEncodeError:
        # Nested deeper than orjson writes (255 levels): say so rather than fail with a 500.
        message = orjson.dumps([{**detail, "input": "<nested too deeply to show>"}]).decode()
    raise ApiError(400, message, name)


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"Invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object")
    return body


def int_field(body: dict[str, Any], name: str, default: int | None) -> int | None:
    """``body[name]`` as an int, parsed as pydantic's lax mode does (a 400 otherwise)."""
    return _int_field(body, name, default)


def missing_fields(body: dict[str, Any], names: tuple[str, ...]) -> None:
    """A 400 naming the required fields ``body`` lacks, worded as vLLM's request validation error."""
    missing = [name for name in names if name not in body]
    if not missing:
        return
    items = f"'<dict of {len(body)} items>'"
    lines = [f"  {{'type': 'missing', 'loc': 'body.{n}', 'msg': 'Field required', 'input': {items}}}" for n in missing]
    count = f"{len(missing)} validation error" + ("s" if len(missing) > 1 else "")
    raise ApiError(400, "\n".join([f"{count}:", *lines]), f"body.{missing[0]}", "Bad Request")


def parse_generate(body: dict[str, Any], kind: str, served_model: str, max_model_len: int, seed: int) -> ParsedRequest:
    """A generation request; ``served_model`` is the name its reply gives (the caller resolved ``model``)."""
    prompt_ids: list[int] | None = None
    if kind == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "Field required: messages must be a list of message objects", "messages")
        chat = tokens.render_chat(messages)
        text: str | None = chat
        prompt_tokens = tokens.count_tokens(chat)
        request_id = "chatcmpl-" + os.urandom(16).hex()
    else:
        text, prompt_ids = _completion_prompt(body.get("prompt"))
        prompt_tokens = len(prompt_ids) if prompt_ids is not None else tokens.count_tokens(text or "")
        request_id = "cmpl-" + os.urandom(16).hex()
    if body.get("n", 1) not in (1, None):
        raise ApiError(400, "Only n=1 is supported", "n")
    priority = _int_field(body, "priority", 0) or 0
    if prompt_tokens >= max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_tokens} input tokens. Please reduce the length of the input messages.",
            "messages" if kind == CHAT else "prompt",
        )
    max_tokens = _int_field(body, "max_completion_tokens", None) if kind == CHAT else None
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens", None)
    room = max_model_len - prompt_tokens
    if max_tokens is None:
        max_tokens = room
    elif max_tokens < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
    elif max_tokens > room:
        raise ApiError(
            400,
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context "
            f"length is {max_model_len} tokens and your request has {prompt_tokens} input tokens "
            f"({max_tokens} > {max_model_len} - {prompt_tokens}).",
            "max_tokens",
        )
    min_tokens = _int_field(body, "min_tokens", 0) or 0
    if min_tokens < 0 or min_tokens > max_tokens:
        raise ApiError(400, f"min_tokens must be between 0 and max_tokens={max_tokens}, got {min_tokens}", "min_tokens")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    salt = body.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise ApiError(400, "cache_salt must be a string", "cache_salt")
    request_seed = _int_field(body, "seed", None)
    return ParsedRequest(
        kind=kind,
        id=request_id,
        model=served_model,
        prompt_text=text,
        prompt_ids=prompt_ids,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
        priority=priority,
        stream=bool(body.get("stream", False)),
        include_usage=bool(options.get("include_usage", False)),
        continuous_usage=bool(options.get("continuous_usage_stats", False)),
        cache_salt=salt or None,
        seed=seed if request_seed is None else request_seed,
    )


def _completion_prompt(prompt: Any) -> tuple[str | None, list[int] | None]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one prompt; ``[5]`` is one token id
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        for token in prompt:
            if not 0 <= token < tokens.VOCAB_SIZE:
                raise ApiError(400, f"Token id {token} is out of vocabulary", "prompt")
        return None, prompt
    if prompt is None:
        raise ApiError(400, "Field required: prompt", "prompt")
    raise ApiError(400, "prompt must be a string, a list of one string, or a list of token ids", "prompt")


# -- responses ----------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None if cached_tokens is None else {"cached_tokens": cached_tokens},
    }
    return out


def full_response(
    req: ParsedRequest, created: int, text: str, reason: str | None, completion_tokens: int, cached: int | None
) -> bytes:
    if req.kind == CHAT:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": [],
                "reasoning_content": None,
            },
            "logprobs": None,
            "finish_reason": reason,
            "stop_reason": None,
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": reason,
            "stop_reason": None,
            "prompt_logprobs": None,
        }
        obj = "text_completion"
    return orjson.dumps(
        {
            "id": req.id,
            "object": obj,
            "created": created,
            "model": req.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage(req.prompt_tokens, completion_tokens, cached),
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
    )


_ROLE_CHOICE = b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'


class ChunkWriter:
    """SSE chunks of one streamed response, with the constant JSON around the delta pre-encoded."""

    __slots__ = ("_head", "_req", "_role_sent")

    def __init__(self, req: ParsedRequest, created: int) -> None:
        self._req = req
        obj = "chat.completion.chunk" if req.kind == CHAT else "text_completion"
        self._head = (
            b'data: {"id":"'
            + req.id.encode()
            + b'","object":"'
            + obj.encode()
            + b'","created":'
            + str(created).encode()
            + b',"model":'
            + orjson.dumps(req.model)
            + b',"choices":'
        )
        self._role_sent = False

    def delta(self, text: str, reason: str | None, usage_obj: dict[str, Any] | None = None) -> bytes:
        text_json = orjson.dumps(text)
        finish = b"null" if reason is None else orjson.dumps(reason)
        if self._req.kind == CHAT:
            parts = []
            if not self._role_sent:
                self._role_sent = True
                parts.append(self._head + _ROLE_CHOICE)
            choice = b'[{"index":0,"delta":{"content":' + text_json + b'},"logprobs":null,"finish_reason":' + finish
        else:
            parts = []
            choice = b'[{"index":0,"text":' + text_json + b',"logprobs":null,"finish_reason":' + finish
        tail = b',"stop_reason":null}]'
        if usage_obj is not None:
            tail += b',"usage":' + orjson.dumps(usage_obj)
        parts.append(self._head + choice + tail + b"}\n\n")
        return b"".join(parts)

    def usage_chunk(self, usage_obj: dict[str, Any]) -> bytes:
        return self._head + b'[],"usage":' + orjson.dumps(usage_obj) + b"}\n\n"


DONE = b"data: [DONE]\n\n"


def now_created() -> int:
    return int(time.time())


def embeddings_response(body: dict[str, Any], served_model: str, dims: int = 256) -> bytes:
    inputs = body.get("input")
    if isinstance(inputs, str) or (isinstance(inputs, list) and inputs and isinstance(inputs[0], int)):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs:
        raise ApiError(400, "Field required: input", "input")
    data = []
    total = 0
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            key = item.encode()
            total += tokens.count_tokens(item)
        elif isinstance(item, list) and all(isinstance(t, int) for t in item):
            key = orjson.dumps(item)
            total += len(item)
        else:
            raise ApiError(400, "input must be a string, a list of strings or token ids", "input")
        data.append({"index": i, "object": "embedding", "embedding": tokens.embedding(key, dims)})
    return orjson.dumps(
        {
            "id": "embd-" + os.urandom(16).hex(),
            "object": "list",
            "created": now_created(),
            "model": served_model,
            "data": data,
            "usage": usage(total, 0),
        }
    )
