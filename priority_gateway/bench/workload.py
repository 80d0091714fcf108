"""What ``gateway bench`` sends: prompts of a given length and the output length wanted.

Rules:
- A prompt of N tokens is about 4N characters (the simulator's count; real tokenizers vary).
- Synthetic prompts differ from their first 64 characters on, so no two share a cached prefix,
  unless ``shared_prefix_len`` tokens of common text come first (a system prompt, a document).
- Every prompt carries the run's ``tag`` (random per invocation, and per level), so neither the
  next level nor a re-run against the same engine finds its prompts in the prefix cache; within a
  trace replay, prompts that share blocks still share their text after the tag.
- Synthetic lengths are drawn uniformly within ``±spread`` of the means from a seeded RNG, as
  ``gateway sim`` draws them: the same command sends the same requests.
- A trace request's prompt is its block ids as text, block by block over the whole prompt, the
  way ``gateway sim`` turns them into text (``TraceRequest.text``): equal ids give equal text, so
  prompts that share blocks in the trace share a prefix on the wire. Text is built when the
  request is sent (Mooncake prompts average 12k tokens; building them all up front is not needed).
- With ``token_ids`` a prompt is a list of token ids instead (``/v1/completions`` only), so its
  length in tokens is exact whatever the served tokenizer: a trace block is ``block_tokens`` ids
  drawn from a generator seeded with the run's tag and the block's id (equal ids, equal tokens),
  a synthetic prompt draws its ids fresh after ``shared_prefix_len`` common ones. Ids are drawn
  from ``[FIRST_ORDINARY_ID, vocab_size)``, clear of the special tokens at the bottom of a vocabulary.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from pathlib import Path

from priority_gateway.engines.sim.tokens import OUTPUT_WORDS
from priority_gateway.simulate.traces import (
    CHARS_PER_TOKEN,
    TRACE_BLOCK_TOKENS,
    TraceRequest,
    load_trace,
    parse_trace_arg,
    scale_blocks,
)

FIRST_ORDINARY_ID = 100
DEFAULT_VOCAB_SIZE = 32000


@dataclass(frozen=True, slots=True)
class RequestSpec:
    prompt: str | list[int]
    output_len: int
    cls: str | None = None
    group: str = ""


@dataclass(frozen=True, slots=True)
class TokenIds:
    """How token-id prompts are made: the vocabulary to draw from."""

    vocab_size: int = DEFAULT_VOCAB_SIZE

    def draw(self, rng: random.Random, count: int) -> list[int]:
        return [rng.randrange(FIRST_ORDINARY_ID, self.vocab_size) for _ in range(count)]

    def block(self, tag: str, block_id: int, count: int) -> list[int]:
        return list(_block_ids(tag, block_id, count, self.vocab_size))


@functools.lru_cache(maxsize=8192)
def _block_ids(tag: str, block_id: int, count: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(TokenIds(vocab_size).draw(random.Random(f"{tag}/{block_id}"), count))


class SyntheticWorkload:
    """Prompts of ``input_len`` tokens and outputs of ``output_len`` tokens, each ``±spread``."""

    def __init__(
        self,
        input_len: int,
        output_len: int,
        *,
        spread: float = 0.25,
        shared_prefix_len: int = 0,
        seed: int = 0,
        cls: str | None = None,
        group: str = "",
        tag: str = "",
        token_ids: TokenIds | None = None,
    ) -> None:
        self.input_len = input_len
        self.output_len = output_len
        self.spread = spread
        self.shared_prefix_len = shared_prefix_len
        self.cls = cls
        self.group = group
        self.tag = tag
        self.token_ids = token_ids
        self._rng = random.Random(f"bench/{seed}/{input_len}/{output_len}")
        longest = round(max(input_len, shared_prefix_len + 1) * (1.0 + spread)) * CHARS_PER_TOKEN
        self._filler = _filler(longest + 65536, seed)
        self._shared = self._filler[: shared_prefix_len * CHARS_PER_TOKEN]
        self._count = 0

    def _draw(self, mean: int) -> int:
        return max(1, round(mean * self._rng.uniform(1.0 - self.spread, 1.0 + self.spread)))

    def next(self) -> RequestSpec:
        self._count += 1
        if self.token_ids is not None:
            return self._next_ids(self.token_ids)
        prompt_chars = max(self._draw(self.input_len), self.shared_prefix_len + 1) * CHARS_PER_TOKEN
        head = f"[{self.tag}] request {self._count} {self._rng.getrandbits(64):016x}. "
        need = prompt_chars - len(self._shared) - len(head)
        start = self._rng.randrange(len(self._filler) - max(need, 0))
        prompt = self._shared + head + self._filler[start : start + need]
        return RequestSpec(prompt, self._draw(self.output_len), self.cls, self.group)

    def _next_ids(self, ids: TokenIds) -> RequestSpec:
        length = max(self._draw(self.input_len), self.shared_prefix_len + 1)
        shared = ids.block(self.tag, -1, self.shared_prefix_len) if self.shared_prefix_len else []
        # The tag and the count lead the random part, so no two prompts share a first block.
        rng = random.Random(f"{self.tag}/{self._count}/{self._rng.getrandbits(64)}")
        prompt = shared + ids.draw(rng, length - len(shared))
        return RequestSpec(prompt, self._draw(self.output_len), self.cls, self.group)


@functools.lru_cache(maxsize=4)
def _filler(chars: int, seed: int) -> str:
    rng = random.Random(f"bench/filler/{seed}")
    words: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(OUTPUT_WORDS)
        words.append(word)
        size += len(word)
    return "".join(words)


@dataclass(frozen=True, slots=True)
class TraceArrival:
    """One request of a trace replay: when to send it and what."""

    arrival: float
    request: TraceRequest
    cls: str | None
    group: str
    tag: str = ""
    token_ids: TokenIds | None = None

    def spec(self) -> RequestSpec:
        if self.token_ids is not None:
            prompt: str | list[int] = trace_token_ids(self.request, self.token_ids, self.tag)
        else:
            prompt = trace_prompt(self.request, self.tag)
        return RequestSpec(prompt, self.request.output_len, self.cls, self.group)


def trace_prompt(req: TraceRequest, tag: str = "") -> str:
    head = f"[{tag}] " if tag else ""
    chars = req.input_len * CHARS_PER_TOKEN
    blocks = -(-req.input_len // req.block_tokens)
    text = "".join(_block_text(block_id, req.block_tokens) for block_id in req.hash_ids[:blocks])
    return head + text[: max(0, chars - len(head))]


def trace_token_ids(req: TraceRequest, ids: TokenIds, tag: str = "") -> list[int]:
    """``input_len`` token ids, block by block; ids past the trace's blocks are the request's own."""
    out: list[int] = []
    for block_id in req.hash_ids[: -(-req.input_len // req.block_tokens)]:
        out += ids.block(tag, block_id, req.block_tokens)
    if len(out) < req.input_len:
        out += ids.block(f"{tag}/tail", hash(req.hash_ids) ^ req.input_len, req.input_len - len(out))
    return out[: req.input_len]


@functools.lru_cache(maxsize=4096)
def _block_text(block_id: int, block_tokens: int = TRACE_BLOCK_TOKENS) -> str:
    return TraceRequest(0.0, block_tokens, 1, (block_id,), block_tokens=block_tokens).text()


def trace_label(arg: str) -> str:
    path, cls = parse_trace_arg(arg)
    name = path.stem if path.suffix in (".jsonl", ".csv") else str(path)
    return f"{name}@{cls}" if "@" in arg else name


def load_arrivals(
    trace_args: list[str],
    rate_scale: float = 1.0,
    duration: float | None = None,
    x_priority: str | None = None,
    tag: str = "",
    token_ids: TokenIds | None = None,
    block_tokens: int | None = None,
) -> list[TraceArrival]:
    """Every trace's requests on one time line, ``rate_scale`` times faster, cut at ``duration``.

    A request's class (its ``X-Priority``) is ``x_priority`` if given, else the trace's
    ``@class`` if the argument names one, else none (the endpoint's default). ``block_tokens``
    rescales every trace block (``scale_blocks``).
    """
    out = []
    for arg in trace_args:
        path, cls = parse_trace_arg(arg)
        label = trace_label(arg)
        sent_cls = x_priority or (cls if "@" in arg else None)
        reqs = load_trace(Path(path), cls)
        if block_tokens:
            reqs = scale_blocks(reqs, block_tokens)
        out += [TraceArrival(r.arrival / rate_scale, r, sent_cls, label, tag, token_ids) for r in reqs]
    out.sort(key=lambda a: a.arrival)
    first = out[0].arrival if out else 0.0
    shifted = [TraceArrival(a.arrival - first, a.request, a.cls, a.group, tag, token_ids) for a in out]
    return [a for a in shifted if duration is None or a.arrival < duration]
