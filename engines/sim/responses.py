"""The OpenAI Responses API (``POST /v1/responses``) as vLLM 0.32 serves it for a plain chat model.

Rules (after ``vllm/entrypoints/openai/responses``):
- The prompt is a chat: ``instructions`` as a system message, then ``input``: a string is one user
  message; a list holds message items (``role`` and ``content``, a string or ``input_text`` /
  ``output_text`` parts), ``function_call`` items (assistant turns) and ``function_call_output``
  items (tool turns); ``reasoning`` items are skipped. It is rendered as chat completions render.
- ``max_output_tokens`` above ``max_model_len`` is a 400; otherwise the engine generates at most
  ``min(max_output_tokens, max_model_len - prompt)`` tokens and the reply reports that number.
- Status is ``incomplete`` (``incomplete_details.reason = "max_output_tokens"``) when generation
  stopped at the token limit, ``completed`` otherwise. ``usage`` counts input, cached input and
  output tokens.
- Nothing is stored (vLLM without ``VLLM_ENABLE_RESPONSES_API_STORE``): ``store`` is ignored,
  ``previous_response_id`` and ``GET``/``cancel`` of an id are 404, ``background`` is a 400.
- A stream is SSE with ``event:`` lines: ``response.created``, ``response.in_progress``, then for the
  message ``response.output_item.added``, ``response.content_part.added``, one
  ``response.output_text.delta`` per engine step that gave text, ``response.output_text.done``,
  ``response.content_part.done``, ``response.output_item.done``, and last ``response.completed``
  (also for an incomplete response, as vLLM), with ``sequence_number`` counting from 0. No ``[DONE]``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from priority_gateway.engines.sim import tokens
from priority_gateway.engines.sim.protocol import ApiError, ParsedRequest, int_field, missing_fields

RESPONSES = "responses"
_TEXT_PARTS = ("input_text", "output_text", "text")
_ECHO_DEFAULTS: dict[str, Any] = {
    "metadata": None,
    "parallel_tool_calls": True,
    "tools": [],
    "max_tool_calls": None,
    "prompt": None,
    "reasoning": None,
    "service_tier": "auto",
    "text": None,
    "truncation": "disabled",
    "user": None,
}


@dataclass(slots=True)
class ResponsesRequest:
    parsed: ParsedRequest
    instructions: str | None
    echo: dict[str, Any] = field(default_factory=dict)
    """Request fields the reply repeats, with vLLM's defaults."""


def new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(8).hex()}"


def _item_message(item: Any) -> dict[str, str] | None:
    if not isinstance(item, dict):
        raise ApiError(400, "input items must be objects", "input")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if not isinstance(role, str):
            raise ApiError(400, "a message item needs a role", "input")
        return {"role": role, "content": _content_text(item.get("content"))}
    if kind == "function_call":
        return {"role": "assistant", "content": f"{item.get('name', '')}({item.get('arguments', '')})"}
    if kind == "function_call_output":
        output = item.get("output", "")
        return {"role": "tool", "content": output if isinstance(output, str) else orjson.dumps(output).decode()}
    if kind == "reasoning":
        return None
    raise ApiError(400, f"Unsupported input item type: {kind!r}", "input")


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict):
                raise ApiError(400, "content parts must be objects", "input")
            if part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    if content is None:
        return ""
    raise ApiError(400, "content must be a string or a list of parts", "input")


def prompt_messages(instructions: str | None, request_input: Any) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(request_input, str):
        messages.append({"role": "user", "content": request_input})
    elif isinstance(request_input, list):
        messages.extend(m for m in map(_item_message, request_input) if m is not None)
    else:
        raise ApiError(400, "input must be a string or a list of items", "input")
    return messages


def parse_responses(body: dict[str, Any], reply_model: str, max_model_len: int, seed: int) -> ResponsesRequest:
    missing_fields(body, ("input",))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "instructions must be a string", "instructions")
    if body.get("background"):
        raise ApiError(
            400,
            "This vLLM engine does not support `store=True` and therefore does not support the background mode. "
            "To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when "
            "launching the vLLM server.",
            "background",
            "invalid_request_error",
        )
    previous = body.get("previous_response_id")
    if previous is not None:
        raise not_found(str(previous))
    text = tokens.render_chat(prompt_messages(instructions, body["input"]))
    prompt_tokens = tokens.count_tokens(text)
    limit = int_field(body, "max_output_tokens", None)
    if limit is not None and limit > max_model_len:
        raise ApiError(
            400,
            f"max_output_tokens={limit} cannot be greater than max_model_len={max_model_len}. Please request fewer "
            f"output tokens. (parameter=max_output_tokens, value={limit})",
            "max_output_tokens",
        )
    if limit is not None and limit < 1:
        raise ApiError(400, f"max_output_tokens must be at least 1, got {limit}.", "max_output_tokens")
    if prompt_tokens >= max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_tokens} input tokens. Please reduce the length of the input messages.",
            "input",
        )
    room = max_model_len - prompt_tokens
    salt = body.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise ApiError(400, "cache_salt must be a string", "cache_salt")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        # vLLM's model takes a string (and the reply repeats it: anything else could not be written).
        raise ApiError(400, "user must be a string", "user")
    parsed = ParsedRequest(
        kind=RESPONSES,
        id=new_id("resp"),
        model=reply_model,
        prompt_text=text,
        prompt_ids=None,
        prompt_tokens=prompt_tokens,
        max_tokens=room if limit is None else min(limit, room),
        min_tokens=0,
        ignore_eos=False,
        priority=int_field(body, "priority", 0) or 0,
        stream=bool(body.get("stream", False)),
        include_usage=False,
        continuous_usage=False,
        cache_salt=salt or None,
        seed=seed,
    )
    echo = {key: body.get(key, default) for key, default in _ECHO_DEFAULTS.items()}
    tools = echo["tools"] or []
    echo["tool_choice"] = body.get("tool_choice") or ("auto" if tools else "none")
    for key, default in (("temperature", 1.0), ("top_p", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
        value = body.get(key)
        echo[key] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default
    return ResponsesRequest(parsed, instructions, echo)


def not_found(response_id: str) -> ApiError:
    return ApiError(404, f"Response with id '{response_id}' not found.", "response_id", "invalid_request_error")


def message_item(item_id: str, text: str | None, status: str, logprobs: list[Any] | None = None) -> dict[str, Any]:
    content = [] if text is None else [{"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}]
    return {"id": item_id, "content": content, "role": "assistant", "status": status, "type": "message", "phase": None}


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": cached_tokens,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": output_tokens,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": prompt_tokens + output_tokens,
    }


def response_object(
    req: ResponsesRequest,
    created: int,
    output: list[dict[str, Any]],
    status: str,
    usage_obj: dict[str, Any] | None,
) -> dict[str, Any]:
    echo = req.echo
    return {
        "id": req.parsed.id,
        "created_at": created,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions,
        "metadata": echo["metadata"],
        "model": req.parsed.model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": echo["parallel_tool_calls"],
        "temperature": echo["temperature"],
        "tool_choice": echo["tool_choice"],
        "tools": echo["tools"],
        "top_p": echo["top_p"],
        "background": False,
        "max_output_tokens": req.parsed.max_tokens,
        "max_tool_calls": echo["max_tool_calls"],
        "previous_response_id": None,
        "prompt": echo["prompt"],
        "reasoning": echo["reasoning"],
        "service_tier": echo["service_tier"],
        "status": status,
        "text": echo["text"],
        "top_logprobs": None,
        "truncation": echo["truncation"],
        "usage": usage_obj,
        "user": echo["user"],
        "presence_penalty": echo["presence_penalty"],
        "frequency_penalty": echo["frequency_penalty"],
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def status_of(reason: str | None) -> str:
    return "incomplete" if reason == "length" else "completed"


def full_response(req: ResponsesRequest, text: str, reason: str | None, output_tokens: int, cached: int) -> bytes:
    output = [message_item(new_id("msg"), text or None, "completed")]
    used = usage(req.parsed.prompt_tokens, output_tokens, cached)
    return orjson.dumps(response_object(req, int(time.time()), output, status_of(reason), used))


class EventWriter:
    """The SSE events of one streamed response, numbered in order."""

    __slots__ = ("_created", "_item_id", "_req", "_seq", "_text")

    def __init__(self, req: ResponsesRequest) -> None:
        self._req = req
        self._created = int(time.time())
        self._seq = 0
        self._item_id: str | None = None
        self._text: list[str] = []

    def _event(self, kind: str, payload: dict[str, Any]) -> bytes:
        payload["sequence_number"] = self._seq
        payload["type"] = kind
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def start(self) -> bytes:
        initial = response_object(self._req, self._created, [], "in_progress", None)
        return self._event("response.created", {"response": initial}) + self._event(
            "response.in_progress", {"response": initial}
        )

    def delta(self, text: str) -> bytes:
        if not text:
            return b""
        out = b""
        if self._item_id is None:
            self._item_id = new_id("msg")
            item = message_item(self._item_id, None, "in_progress")
            out += self._event("response.output_item.added", {"item": item, "output_index": 0})
            part = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
            out += self._event(
                "response.content_part.added",
                {"content_index": 0, "item_id": self._item_id, "output_index": 0, "part": part},
            )
        self._text.append(text)
        return out + self._event(
            "response.output_text.delta",
            {"content_index": 0, "delta": text, "item_id": self._item_id, "logprobs": [], "output_index": 0},
        )

    def finish(self, reason: str | None, output_tokens: int, cached: int) -> bytes:
        out = b""
        output: list[dict[str, Any]] = []
        if self._item_id is not None:
            text = "".join(self._text)
            ids = {"content_index": 0, "item_id": self._item_id}
            out += self._event("response.output_text.done", {**ids, "logprobs": [], "output_index": 0, "text": text})
            part: dict[str, Any] = {"annotations": [], "text": text, "type": "output_text", "logprobs": None}
            out += self._event("response.content_part.done", {**ids, "output_index": 0, "part": part})
            item = message_item(self._item_id, text, "completed")
            out += self._event("response.output_item.done", {"item": item, "output_index": 0})
            output.append(item)
        used = usage(self._req.parsed.prompt_tokens, output_tokens, cached)
        final = response_object(self._req, self._created, output, status_of(reason), used)
        return out + self._event("response.completed", {"response": final})
