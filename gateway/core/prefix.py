"""Prefix hashing: which blocks of prompt text a request shares with earlier ones.

Rules:
- The prompt is hashed as the engine would see it: chat messages in one canonical
  rendering (role and text of every message, in order), completions prompts as given.
- Blocks are fixed-size runs of UTF-8 bytes; only full blocks count, as an engine only
  caches full KV blocks.
- Hashes are chained (each block's hash seeds the next), so equal hash at position i
  means equal text up to and including block i. The chain is seeded with the model and
  ``cache_salt``, so different models or salts never share blocks.
- At most ``max_blocks`` blocks are hashed: routing needs the leading blocks, not all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from xxhash import xxh3_64_intdigest

DEFAULT_BLOCK_CHARS = 64
DEFAULT_MAX_BLOCKS = 256
CHARS_PER_TOKEN = 4.0


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


def prompt_text(body: Mapping[str, Any]) -> str:
    """The text of a chat or completions body (the request has been validated)."""
    messages = body.get("messages")
    if messages is not None:
        return render_messages(messages)
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
    n = min(len(data) // block_chars, max_blocks)
    hashes: list[int] = []
    h = seed
    for i in range(0, n * block_chars, block_chars):
        h = xxh3_64_intdigest(data[i : i + block_chars], h)
        hashes.append(h)
    return hashes


def estimate_tokens(text: str) -> int:
    return int(len(text) / CHARS_PER_TOKEN) + 1
