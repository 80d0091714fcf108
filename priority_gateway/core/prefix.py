"""Prefix hashing: which blocks of prompt text a request shares with earlier ones.

Rules:
- The prompt is hashed as the engine would see it: chat messages in one canonical
  rendering (role and text of every message, in order), completions prompts as given. A
  Responses API request is the chat vLLM makes of it (``instructions`` as the system message,
  then ``input``'s items) in the same rendering, so a conversation's turns share blocks
  whichever of the two APIs carries them.
- Blocks are fixed-size runs of UTF-8 bytes; only full blocks count, as an engine only
  caches full KV blocks.
- Hashes are chained (each block's hash seeds the next), so equal hash at position i
  means equal text up to and including block i. The chain is seeded with the model and
  ``cache_salt``, so different models or salts never share blocks.
- At most ``max_blocks`` blocks are hashed: routing needs the leading blocks, not all.
- A completions prompt given as token ids is hashed by blocks of ``block_tokens`` ids, not as
  text: its length in tokens is known exactly, and equal ids mean equal blocks for the engine too.
  Ids must be integers in ``[0, 2**32)`` (no vocabulary is larger); anything else is refused.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from xxhash import xxh3_64_intdigest

DEFAULT_BLOCK_CHARS = 64
DEFAULT_MAX_BLOCKS = 256
CHARS_PER_TOKEN = 4.0
MAX_TOKEN_ID = (1 << 32) - 1


def render_messages(messages: Iterable[Mapping[str, Any]]) -> str:
    parts: list[str] = []
    for message in messages:
        parts.append("<|im_start|>")
        parts.append(str(message.get("role", "")))
        parts.append("\n")
        parts.append(content_text(message.get("content")))
        parts.append("<|im_end|>\n")
    return "".join(parts)


def content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping):
                if part.get("type") == "text":
                    texts.append(str(part.get("text", "")))
                else:
                    texts.append(f"<{part.get('type', 'part')}>")
            else:
                texts.append(str(part))
        return "".join(texts)
    return str(content)


_TEXT_PARTS = ("input_text", "output_text", "text")


def response_messages(instructions: Any, request_input: Any) -> list[dict[str, str]]:
    """The chat messages of a Responses API request, as vLLM turns ``instructions`` and ``input``
    into a chat: a string is one user message; message items keep their role and the text of
    their parts, a ``function_call`` is an assistant turn, its output a tool turn, and other
    items (reasoning) add nothing."""
    messages = [{"role": "system", "content": instructions}] if isinstance(instructions, str) and instructions else []
    if isinstance(request_input, str):
        messages.append({"role": "user", "content": request_input})
        return messages
    if not isinstance(request_input, list):
        return messages
    for item in request_input:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, list):
                content = "".join(
                    str(part.get("text", ""))
                    for part in content
                    if isinstance(part, Mapping) and part.get("type") in _TEXT_PARTS
                )
            messages.append({"role": str(item.get("role", "")), "content": content_text(content)})
        elif kind == "function_call":
            messages.append({"role": "assistant", "content": f"{item.get('name', '')}({item.get('arguments', '')})"})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": content_text(item.get("output"))})
    return messages


def prompt_text(body: Mapping[str, Any]) -> str:
    """The text of a chat, completions or responses body (the request has been validated)."""
    messages = body.get("messages")
    if messages is not None:
        return render_messages(messages)
    if "input" in body and "prompt" not in body:
        # Responses (embeddings' ``input`` is never hashed).
        return render_messages(response_messages(body.get("instructions"), body["input"]))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        # A batch of prompts or token ids: route on the first, which leads the engine's work.
        first = prompt[0] if prompt else ""
        if isinstance(first, str):
            return first
        if isinstance(first, int):
            return " ".join(str(t) for t in prompt)
        if isinstance(first, list):
            return " ".join(str(t) for t in first)
    return ""


def chain_seed(model: str, salt: str | None = None) -> int:
    return xxh3_64_intdigest(f"{model}\0{salt or ''}".encode())


def hash_blocks(
    text: str,
    seed: int,
    block_chars: int = DEFAULT_BLOCK_CHARS,
    max_blocks: int = DEFAULT_MAX_BLOCKS,
) -> list[int]:
    # Only the leading blocks are hashed: never encode more of a long prompt than they can hold.
    data = text[: max_blocks * block_chars].encode("utf-8", "surrogatepass")
    return _chain(data, block_chars, min(len(data) // block_chars, max_blocks), seed)


def _chain(data: bytes, width: int, blocks: int, seed: int) -> list[int]:
    """Chained hashes of the first ``blocks`` runs of ``width`` bytes of ``data``."""
    hashes: list[int] = []
    h = seed
    for i in range(0, blocks * width, width):
        h = xxh3_64_intdigest(data[i : i + width], h)
        hashes.append(h)
    return hashes


def estimate_tokens(text: str) -> int:
    return int(len(text) / CHARS_PER_TOKEN) + 1


class TokenPromptError(ValueError):
    """A prompt given as a list that is neither text nor valid token ids."""


def token_prompt(body: Mapping[str, Any]) -> list[int] | None:
    """The token ids of a completions prompt given as ids (``[1, 2]``, or ``[[1, 2], ...]``: the
    first, which leads the engine's work); ``None`` for text and chat."""
    if body.get("messages") is not None:
        return None
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        return None
    first = prompt[0]
    if isinstance(first, str):
        return None
    if isinstance(first, list):
        prompt = first
    for token in prompt:
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token <= MAX_TOKEN_ID:
            raise TokenPromptError(f"prompt token ids must be integers from 0 to {MAX_TOKEN_ID}; got {token!r}")
    return prompt


def hash_token_blocks(
    token_ids: Sequence[int], seed: int, block_tokens: int, max_blocks: int = DEFAULT_MAX_BLOCKS
) -> list[int]:
    """Chained hashes of the full ``block_tokens``-id blocks of a token-id prompt."""
    n = min(len(token_ids) // block_tokens, max_blocks)
    if n == 0:
        return []
    return _chain(array("I", token_ids[: n * block_tokens]).tobytes(), block_tokens * 4, n, seed)
