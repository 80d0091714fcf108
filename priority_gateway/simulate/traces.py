"""Request traces for the simulator: Mooncake JSONL and Azure LLM CSV, as published.

A request's prompt is known only by its length (and, for Mooncake, the ids of its
512-token blocks, where equal ids at equal positions mean equal content). The gateway
hashes prompt *text*, so each block id becomes deterministic text: shared blocks give
shared text, distinct blocks distinct text.

``agent:...`` makes agent sessions (``agent_sessions``): each a chain of turns, every turn's prompt
its session's whole context so far (its previous prompt, the reply, then a tool's output), its next
turn due a tool pause after it ends; the simulator runs them closed-loop.

``scale_blocks`` shrinks a trace to fit a smaller machine without changing which prompts share
what: every block becomes ``block_tokens`` tokens instead of 512, and every prompt shrinks by the
same ratio.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from priority_gateway.core.classes import CLASS_RANK, INTERACTIVE

TRACE_BLOCK_TOKENS = 512
CHARS_PER_TOKEN = 4
# The gateway hashes at most a few hundred 64-character blocks; text past that is never read.
MAX_TEXT_CHARS = 256 * 64


@dataclass(slots=True)
class TraceRequest:
    arrival: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]
    cls: str = INTERACTIVE
    source: str = ""
    block_tokens: int = TRACE_BLOCK_TOKENS
    """Tokens each of ``hash_ids`` stands for (512 as published; fewer after ``scale_blocks``)."""
    adapter: str | None = None
    """The LoRA adapter the request names as its model (None: the base model)."""
    tenant: str = ""
    """Who sent it, as the key store would name the tenant (fair queueing experiments)."""
    session: str | None = None
    """The agent session it is a turn of (``agent_sessions``)."""
    output_hash_ids: tuple[int, ...] = ()
    """Ids of the blocks past the prompt that the reply fills, as the session's next turn carries
    them (an engine hashes generated blocks by their tokens, so the next turn hits them)."""
    next_turn: TraceRequest | None = field(default=None, repr=False)
    """The session's next turn: it arrives ``next_turn.pause_s`` after this one ends (closed loop)."""
    pause_s: float = 0.0
    """The tool pause before this turn, from the end of the previous one."""
    turn: int = 1

    def text(self) -> str:
        """Prompt text as the gateway would see it (only the part it hashes)."""
        chars = min(self.input_len * CHARS_PER_TOKEN, MAX_TEXT_CHARS)
        per_block = self.block_tokens * CHARS_PER_TOKEN
        parts = []
        for block_id in self.hash_ids[: chars // per_block + 1]:
            unit = f"<{block_id:x}>"
            parts.append((unit * (per_block // len(unit) + 1))[:per_block])
        return "".join(parts)[:chars]


def parse_trace_arg(arg: str) -> tuple[Path, str]:
    """``FILE`` or ``FILE@class``."""
    path, _, cls = arg.rpartition("@") if "@" in arg else (arg, "", INTERACTIVE)
    cls = cls or INTERACTIVE
    if cls not in CLASS_RANK:
        raise ValueError(f"{arg}: class must be one of {', '.join(CLASS_RANK)}")
    return Path(path), cls


def load_trace(path: Path, cls: str = INTERACTIVE, minutes: float | None = None) -> list[TraceRequest]:
    if str(path).startswith("poisson:"):
        reqs = poisson(str(path), cls, minutes)
    elif str(path).startswith("hot:"):
        reqs = hot_prompts(str(path), cls, minutes)
    elif str(path).startswith("agent:"):
        reqs = agent_spec(str(path), cls, minutes)
    elif path.suffix == ".jsonl":
        reqs = list(_mooncake(path, cls))
    elif path.suffix == ".csv":
        reqs = list(_azure(path, cls))
    else:
        raise ValueError(f"{path}: expected Mooncake .jsonl or Azure .csv")
    if minutes is not None:
        reqs = [r for r in reqs if r.arrival < minutes * 60.0]
    return reqs


def _mooncake(path: Path, cls: str) -> Iterator[TraceRequest]:
    # Timestamps come in ~3 s buckets; spreading each bucket's requests uniformly over it
    # (seeded) avoids a synthetic burst every 3 s, as the trace's README recommends.
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rng = random.Random(f"{path.name}/jitter")
    stamps = sorted({r["timestamp"] for r in rows})
    width = {t: (stamps[i + 1] - t if i + 1 < len(stamps) else 3000) for i, t in enumerate(stamps)}
    for row in rows:
        t = row["timestamp"]
        arrival = (t + rng.random() * width[t]) / 1000.0
        yield TraceRequest(
            arrival, int(row["input_length"]), max(1, int(row["output_length"])), tuple(row["hash_ids"]), cls, path.stem
        )


def _azure(path: Path, cls: str) -> Iterator[TraceRequest]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        start: datetime | None = None
        # No prefix information: every request gets block ids of its own.
        next_id = 1 << 40
        for row in reader:
            stamp = datetime.fromisoformat(row["TIMESTAMP"][:26])
            start = start or stamp
            input_len = max(1, int(row["ContextTokens"]))
            blocks = -(-input_len // TRACE_BLOCK_TOKENS)
            ids = tuple(range(next_id, next_id + blocks))
            next_id += blocks
            yield TraceRequest(
                (stamp - start).total_seconds(), input_len, max(1, int(row["GeneratedTokens"])), ids, cls, path.stem
            )


def poisson(spec: str, cls: str = INTERACTIVE, minutes: float | None = None) -> list[TraceRequest]:
    """``poisson:rate=R,input=L,output=O[,minutes=M][,spread=S][,seed=N]``: Poisson arrivals at
    R requests/s with prompt and output lengths uniform within ±spread (default 25 %) of L and O,
    every prompt distinct."""
    fields = dict(part.split("=", 1) for part in spec.removeprefix("poisson:").split(",") if part)
    try:
        rate = float(fields["rate"])
        input_len, output_len = int(fields["input"]), int(fields["output"])
    except (KeyError, ValueError):
        raise ValueError(f"{spec}: expected poisson:rate=R,input=L,output=O[,minutes=M]") from None
    span = 60.0 * float(fields.get("minutes", minutes or 10.0))
    if minutes is not None:
        span = min(span, 60.0 * minutes)
    spread = float(fields.get("spread", 0.25))
    rng = random.Random(f"poisson/{spec}/{cls}")
    out: list[TraceRequest] = []
    t, next_id = 0.0, (1 << 44) + CLASS_RANK[cls] * (1 << 40)
    while True:
        t += rng.expovariate(rate)
        if t >= span:
            return out
        n = max(1, round(input_len * rng.uniform(1 - spread, 1 + spread)))
        o = max(1, round(output_len * rng.uniform(1 - spread, 1 + spread)))
        blocks = -(-n // TRACE_BLOCK_TOKENS)
        out.append(TraceRequest(t, n, o, tuple(range(next_id, next_id + blocks)), cls, "poisson"))
        next_id += blocks


def hot_prompts(spec: str, cls: str = INTERACTIVE, minutes: float | None = None) -> list[TraceRequest]:
    """``hot:rate=R,prompts=P,prompt_len=L,user_len=U,output=O[,zipf=S][,minutes=M]``: many users
    sharing a few hot system prompts (the case where naive affinity piles up): each request is
    one of ``P`` system prompts of ``L`` tokens, chosen with Zipf(``S``) popularity, followed by
    a user message of its own of about ``U`` tokens; Poisson arrivals at ``R`` per second."""
    fields = dict(part.split("=", 1) for part in spec.removeprefix("hot:").split(",") if part)
    try:
        rate, prompts = float(fields["rate"]), int(fields["prompts"])
        prompt_len, user_len, output_len = int(fields["prompt_len"]), int(fields["user_len"]), int(fields["output"])
    except (KeyError, ValueError):
        raise ValueError(f"{spec}: expected hot:rate=R,prompts=P,prompt_len=L,user_len=U,output=O") from None
    skew = float(fields.get("zipf", 1.2))
    span = 60.0 * float(fields.get("minutes", minutes or 10.0))
    if minutes is not None:
        span = min(span, 60.0 * minutes)
    rng = random.Random(f"hot/{spec}/{cls}")
    weights = [1.0 / (k + 1) ** skew for k in range(prompts)]
    shared = prompt_len // TRACE_BLOCK_TOKENS
    out: list[TraceRequest] = []
    t, next_id = 0.0, (1 << 46) + CLASS_RANK[cls] * (1 << 42)
    while True:
        t += rng.expovariate(rate)
        if t >= span:
            return out
        which = rng.choices(range(prompts), weights)[0]
        user = max(1, round(user_len * rng.uniform(0.5, 1.5)))
        total = prompt_len + user
        own = -(-total // TRACE_BLOCK_TOKENS) - shared
        ids = tuple((1 << 45) + which * 4096 + j for j in range(shared)) + tuple(range(next_id, next_id + own))
        next_id += own
        out.append(TraceRequest(t, total, output_len, ids, cls, "hot"))


@dataclass(frozen=True, slots=True)
class SessionShapes:
    """What agent sessions look like: draws for each quantity (an empirical sample, or a range drawn
    log-uniformly), the issue's ranges by default."""

    turns: Sequence[int] | tuple[int, int] = (3, 30)
    appended: Sequence[int] | tuple[int, int] = (200, 4000)
    """Tokens each turn after the first appends (the tool's output and the next instruction)."""
    output: Sequence[int] | tuple[int, int] = (24, 1120)
    pause_s: tuple[float, float] = (1.0, 60.0)
    first: Sequence[int] | tuple[int, int] = (200, 4000)
    """The first turn's own message, after the shared system prompt."""
    system_tokens: int = 2048
    """The system prompt (instructions, tool definitions) every session of one agent shares."""
    agents: int = 4
    """Distinct system prompts (agents): sessions pick one uniformly."""


def _draw(rng: random.Random, shape: Sequence[int] | tuple[int, int] | tuple[float, float]) -> float:
    if isinstance(shape, tuple) and len(shape) == 2:
        low, high = shape
        return math.exp(rng.uniform(math.log(low), math.log(high)))
    return float(rng.choice(shape))


def agent_sessions(
    sessions: int,
    rate: float,
    shapes: SessionShapes | None = None,
    seed: int = 0,
    cls: str = INTERACTIVE,
    block_tokens: int = 16,
) -> list[TraceRequest]:
    """``sessions`` agent sessions arriving as a Poisson process of ``rate`` sessions/s; the first
    turns (each carrying its session's later turns in ``next_turn``). A session's context is one
    stream of blocks of ``block_tokens`` tokens: the agent's system prompt (shared by its sessions),
    then what the session alone said and was answered, in order; each turn's prompt is the stream
    so far and its reply the blocks after, which its next turn carries."""
    shapes = shapes or SessionShapes()
    rng = random.Random(f"agent/{sessions}/{rate}/{seed}")
    system_blocks = shapes.system_tokens // block_tokens
    t = 0.0
    out: list[TraceRequest] = []
    for s in range(sessions):
        t += rng.expovariate(rate)
        agent = rng.randrange(shapes.agents)
        stream_base = (1 << 48) + s * (1 << 24)
        system = tuple((1 << 47) + agent * 4096 + j for j in range(system_blocks))
        turns = max(1, round(_draw(rng, shapes.turns)))
        length = system_blocks * block_tokens + max(1, round(_draw(rng, shapes.first)))
        chain: list[TraceRequest] = []
        for k in range(turns):
            if k:
                length += max(1, round(_draw(rng, shapes.appended)))
            output = max(1, round(_draw(rng, shapes.output)))
            blocks = -(-(length + output) // block_tokens)
            ids = system + tuple(stream_base + j for j in range(system_blocks, blocks))
            prompt_blocks = -(-length // block_tokens)
            chain.append(
                TraceRequest(
                    t if k == 0 else 0.0,
                    length,
                    output,
                    ids[:prompt_blocks],
                    cls,
                    "agent",
                    block_tokens,
                    session=f"agent-{seed}-{s}",
                    output_hash_ids=ids[prompt_blocks:],
                    pause_s=_draw(rng, shapes.pause_s) if k else 0.0,
                    turn=k + 1,
                )
            )
            length += output
        for turn, following in itertools.pairwise(chain):
            turn.next_turn = following
        out.append(chain[0])
    return out


def agent_spec(spec: str, cls: str = INTERACTIVE, minutes: float | None = None) -> list[TraceRequest]:
    """``agent:sessions=N,rate=R[,seed=S][,system=T][,agents=A]``: agent sessions in the issue's
    ranges (3-30 turns, 200-4,000 tokens appended a turn, tool pauses of 1-60 s, log-uniform)."""
    fields = dict(part.split("=", 1) for part in spec.removeprefix("agent:").split(",") if part)
    try:
        sessions, rate = int(fields["sessions"]), float(fields["rate"])
        shapes = SessionShapes(system_tokens=int(fields.get("system", 2048)), agents=int(fields.get("agents", 4)))
    except (KeyError, ValueError):
        raise ValueError(f"{spec}: expected agent:sessions=N,rate=R[,seed=S][,system=T][,agents=A]") from None
    reqs = agent_sessions(sessions, rate, shapes, int(fields.get("seed", 0)), cls)
    if minutes is not None:
        reqs = [r for r in reqs if r.arrival < minutes * 60.0]
    return reqs


def scale_blocks(trace: list[TraceRequest], block_tokens: int) -> list[TraceRequest]:
    """The same requests with every block ``block_tokens`` tokens long: prompts shrink (or grow) by
    ``block_tokens / 512``, rounded up; blocks shared before are shared after."""
    if block_tokens < 1:
        raise ValueError("block tokens must be positive")
    out = []
    for r in trace:
        scaled = -(-r.input_len * block_tokens // r.block_tokens)
        out.append(replace(r, input_len=max(1, scaled), block_tokens=block_tokens))
    return out


def merge(traces: list[list[TraceRequest]], rate_scale: float = 1.0) -> list[TraceRequest]:
    out = [r for trace in traces for r in trace]
    if rate_scale != 1.0:
        for r in out:
            r.arrival /= rate_scale
    out.sort(key=lambda r: r.arrival)
    return out
