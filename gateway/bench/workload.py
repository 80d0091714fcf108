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
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from pathlib import Path

from engines.sim.tokens import OUTPUT_WORDS
from gateway.simulate.traces import CHARS_PER_TOKEN, TRACE_BLOCK_TOKENS, TraceRequest, load_trace, parse_trace_arg


@dataclass(frozen=True, slots=True)
class RequestSpec:
    prompt: str
    output_len: int
    cls: str | None = None
    group: str = ""


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
    ) -> None:
        self.input_len = input_len
        self.output_len = output_len
        self.spread = spread
        self.shared_prefix_len = shared_prefix_len
        self.cls = cls
        self.group = group
        self.tag = tag
        self._rng = random.Random(f"bench/{seed}/{input_len}/{output_len}")
        longest = round(max(input_len, shared_prefix_len + 1) * (1.0 + spread)) * CHARS_PER_TOKEN
        self._filler = _filler(longest + 65536, seed)
        self._shared = self._filler[: shared_prefix_len * CHARS_PER_TOKEN]
        self._count = 0

    def _draw(self, mean: int) -> int:
        return max(1, round(mean * self._rng.uniform(1.0 - self.spread, 1.0 + self.spread)))

    def next(self) -> RequestSpec:
        self._count += 1
        prompt_chars = max(self._draw(self.input_len), self.shared_prefix_len + 1) * CHARS_PER_TOKEN
        head = f"[{self.tag}] request {self._count} {self._rng.getrandbits(64):016x}. "
        need = prompt_chars - len(self._shared) - len(head)
        start = self._rng.randrange(len(self._filler) - max(need, 0))
        prompt = self._shared + head + self._filler[start : start + need]
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

    def spec(self) -> RequestSpec:
        return RequestSpec(trace_prompt(self.request, self.tag), self.request.output_len, self.cls, self.group)


def trace_prompt(req: TraceRequest, tag: str = "") -> str:
    head = f"[{tag}] " if tag else ""
    chars = req.input_len * CHARS_PER_TOKEN
    blocks = -(-req.input_len // TRACE_BLOCK_TOKENS)
    return head + "".join(_block_text(block_id) for block_id in req.hash_ids[:blocks])[: max(0, chars - len(head))]


@functools.lru_cache(maxsize=4096)
def _block_text(block_id: int) -> str:
    return TraceRequest(0.0, TRACE_BLOCK_TOKENS, 1, (block_id,)).text()


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
) -> list[TraceArrival]:
    """Every trace's requests on one time line, ``rate_scale`` times faster, cut at ``duration``.

    A request's class (its ``X-Priority``) is ``x_priority`` if given, else the trace's
    ``@class`` if the argument names one, else none (the endpoint's default).
    """
    out = []
    for arg in trace_args:
        path, cls = parse_trace_arg(arg)
        label = trace_label(arg)
        sent_cls = x_priority or (cls if "@" in arg else None)
        out += [TraceArrival(r.arrival / rate_scale, r, sent_cls, label, tag) for r in load_trace(Path(path), cls)]
    out.sort(key=lambda a: a.arrival)
    first = out[0].arrival if out else 0.0
    shifted = [TraceArrival(a.arrival - first, a.request, a.cls, a.group, tag) for a in out]
    return [a for a in shifted if duration is None or a.arrival < duration]
