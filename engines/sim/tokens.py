"""Deterministic tokenization and block hashing for the simulated engine.

Rules:
- The engine sees a chat request as its messages rendered with a ChatML template (what vLLM's
  chat template would produce), followed by the generation prompt ``<|im_start|>assistant\\n``.
- A token is 4 characters of that text (the last one may be shorter), so a prompt of ``c``
  characters is ``ceil(c / 4)`` tokens (at least 1) and a 16-token block is 64 characters.
- Block hashes are chained ``xxh3_64`` digests over the *full* blocks only: block ``i`` is hashed
  with the hash of block ``i - 1`` as seed; the chain starts at ``root_hash(salt)``, so two
  prompts share hash ``i`` exactly when they share the first ``i + 1`` blocks and the salt.
- Output tokens are words chosen by a hash of (prompt seed, position): the same prompt and engine
  seed always produce the same reply. Its natural length (where EOS would come) is derived from the
  prompt seed, between ``NATURAL_MIN`` and ``NATURAL_MAX`` tokens.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import xxhash

CHARS_PER_TOKEN = 4
NATURAL_MIN = 16
NATURAL_MAX = 256
VOCAB_SIZE = 32000

_ROOT = xxhash.xxh3_64_intdigest(b"engines.sim/root")
_xxh3 = xxhash.xxh3_64_intdigest
_PAIR = struct.Struct("<QQ")
_TRIPLE = struct.Struct("<QQQ")
_MASK = 0xFFFFFFFFFFFFFFFF

# Output words: each one is one token of output text (a leading space, then 3 letters or fewer).
_WORD_LIST = """
the a of to and in is it for on was as be by at or an we if so do up my no go me us he
all one can had but not you are her his has him how its may new now old see two way who
did get let put say she too use day end far few got man men off own run set sun top yes
act add age ago air arm art ask bed big box boy bus car cat cup cut dog ear eat egg eye
fan fix fly fun gas hat hot ice ink job joy key kid lab law lay leg lie lot low map mix
net oil pan pay pen pet pig pot raw red row sea sit six sky son tea ten tie toy try van
"""
OUTPUT_WORDS: tuple[str, ...] = tuple(" " + w for w in _WORD_LIST.split())


def render_chat(messages: Sequence[Mapping[str, Any]]) -> str:
    """The prompt text of a chat request, as a ChatML chat template renders it."""
    parts = []
    for message in messages:
        parts.append(f"<|im_start|>{message.get('role', 'user')}\n{content_text(message.get('content'))}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def content_text(content: Any) -> str:
    """Text of a message's content: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


def count_tokens(text: str) -> int:
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def root_hash(salt: str | None = None) -> int:
    """Seed of the chain: salted prompts never share a block hash with unsalted or other salts."""
    if not salt:
        return _ROOT
    return _xxh3(salt.encode(), seed=_ROOT)


def block_hashes_for_text(text: str, block_size: int, salt: str | None = None) -> list[int]:
    """Chained hashes of the full ``block_size``-token blocks of ``text``."""
    chars = block_size * CHARS_PER_TOKEN
    full = count_tokens(text) // block_size
    parent = root_hash(salt)
    hashes = []
    for i in range(full):
        parent = _xxh3(text[i * chars : (i + 1) * chars].encode(), seed=parent)
        hashes.append(parent)
    return hashes


def block_hashes_for_trace(
    hash_ids: Sequence[int],
    input_length: int,
    trace_block_tokens: int = 512,
    block_size: int = 16,
    salt: str | None = None,
) -> list[int]:
    """Chained block hashes for a trace request given as prefix block ids (e.g. Mooncake's).

    Trace block ``t`` covers tokens ``[t * trace_block_tokens, (t + 1) * trace_block_tokens)``;
    equal ids mean equal content. An engine block is identified by the trace blocks it overlaps
    and its offset, chained like text blocks, so equal leading ids give equal leading hashes.
    """
    covered = min(input_length, len(hash_ids) * trace_block_tokens)
    parent = root_hash(salt)
    hashes = []
    for j in range(covered // block_size):
        start = j * block_size
        first = start // trace_block_tokens
        last = (start + block_size - 1) // trace_block_tokens
        key = _TRIPLE.pack(hash_ids[first] & _MASK, hash_ids[last] & _MASK, start - first * trace_block_tokens)
        parent = _xxh3(key, seed=parent)
        hashes.append(parent)
    return hashes


def block_hashes_for_ids(ids: Sequence[int], block_size: int, salt: str | None = None) -> list[int]:
    """Chained hashes of the full blocks of a prompt given as token ids."""
    parent = root_hash(salt)
    hashes = []
    for i in range(len(ids) // block_size):
        block = ids[i * block_size : (i + 1) * block_size]
        parent = _xxh3(struct.pack(f"<{block_size}Q", *(t & _MASK for t in block)), seed=parent)
        hashes.append(parent)
    return hashes


def output_block_hash(parent: int, position: int) -> int:
    """Hash of a block completed by generated tokens (their content follows from the prefix)."""
    return _xxh3(_PAIR.pack(position, 1), seed=parent)


def prompt_seed(text: str | bytes, seed: int = 0) -> int:
    data = text.encode() if isinstance(text, str) else text
    return _xxh3(data, seed=seed & _MASK)


def natural_length(seed: int) -> int:
    """Where the model would emit EOS for a prompt with this seed (EOS included)."""
    return NATURAL_MIN + (seed >> 17) % (NATURAL_MAX - NATURAL_MIN + 1)


def _word_index(seed: int, position: int) -> int:
    return ((seed ^ (position * 0x9E3779B97F4A7C15)) * 0xBF58476D1CE4E5B9 >> 40) % len(OUTPUT_WORDS)


def output_text(seed: int, start: int, count: int) -> str:
    """Text of output tokens ``start .. start + count - 1`` of the reply to a prompt."""
    words = OUTPUT_WORDS
    return "".join([words[_word_index(seed, i)] for i in range(start, start + count)])


def token_ids(text: str) -> list[int]:
    """Token ids of ``text`` (only KV events carry them)."""
    step = CHARS_PER_TOKEN
    return [_xxh3(text[i : i + step].encode()) % VOCAB_SIZE for i in range(0, len(text), step)] or [0]


def synthetic_token_ids(block_hash: int, count: int) -> list[int]:
    """Stand-in token ids of a block known only by its hash (trace prompts, generated tokens)."""
    return [_xxh3(_PAIR.pack(i, 0), seed=block_hash) % VOCAB_SIZE for i in range(count)]


def embedding(key: bytes, dims: int) -> list[float]:
    """A deterministic unit vector for an input (equal inputs, equal vectors)."""
    raw = [(_xxh3(key, seed=i) / _MASK) * 2.0 - 1.0 for i in range(dims)]
    norm = sum(v * v for v in raw) ** 0.5 or 1.0
    return [v / norm for v in raw]


def keyed_block_hashes(hashes: Sequence[int], key: str) -> list[int]:
    """The same chain of block hashes under a key (a LoRA adapter's name and path).

    Block ``i`` of the result depends on the chained hash ``i`` (the whole prefix) and the key, so
    two prompts share it exactly when they share the prefix and the key, as vLLM's extra keys do.
    """
    seed = _xxh3(key.encode(), seed=_ROOT)
    return [_xxh3(_PAIR.pack(h & _MASK, 2), seed=seed) for h in hashes]
