"""Small engines and requests for the core's tests."""

from __future__ import annotations

from typing import Any

import xxhash

from priority_gateway.engines.sim.core import EngineCore, EngineRequest, StepOutput
from priority_gateway.engines.sim.profile import Profile, Speculative, Timing
from priority_gateway.engines.sim.tokens import block_hashes_for_trace


def small_profile(speculative: Speculative | None = None, **engine: Any) -> Profile:
    limits: dict[str, Any] = {
        "block_size": 4,
        "num_blocks": 256,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 64,
        "max_model_len": 512,
    }
    limits.update(engine)
    timing = Timing(overhead_ms=1.0, prefill_ms_per_token=0.01, decode_ms_per_token=0.1)
    return Profile("test", timing=timing, speculative=speculative or Speculative(), **limits)


def unique_hashes(rid: str, prompt: int, block_size: int = 4) -> list[int]:
    ids = [xxhash.xxh3_64_intdigest(rid.encode()), *range(prompt // block_size)]
    return block_hashes_for_trace(ids, prompt, trace_block_tokens=block_size, block_size=block_size)[
        : prompt // block_size
    ]


def shared_hashes(prompt: int, block_size: int = 4) -> list[int]:
    return block_hashes_for_trace(list(range(prompt)), prompt, trace_block_tokens=block_size, block_size=block_size)


def request(
    rid: str, prompt: int = 8, max_tokens: int = 4, hashes: list[int] | None = None, **kw: Any
) -> EngineRequest:
    return EngineRequest(rid, prompt, unique_hashes(rid, prompt) if hashes is None else hashes, max_tokens, **kw)


def run(core: EngineCore, now: float = 0.0, max_steps: int = 100_000) -> list[tuple[float, StepOutput]]:
    """Steps until the engine is idle; every output with the time it is delivered."""
    out = []
    for _ in range(max_steps):
        if not core.has_work:
            return out
        result = core.step(now)
        now += result.duration_s
        out.extend((now, o) for o in result.outputs)
    raise AssertionError("engine did not become idle")


def completion_order(outputs: list[tuple[float, StepOutput]]) -> list[str]:
    return [o.request_id for _, o in outputs if o.finished]


def tokens_of(outputs: list[tuple[float, StepOutput]], rid: str) -> int:
    return sum(o.new_tokens for _, o in outputs if o.request_id == rid)
