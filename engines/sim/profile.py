"""Engine profiles: the engine's limits and how long one engine step takes.

A profile is a YAML file in ``engines/sim/profiles/`` (see ``tiny-cpu.yaml`` for the documented
format). Step time, in milliseconds, for a step that schedules ``P`` prefill tokens, ``D`` decode
tokens (one per decoding sequence, ``1 + k`` with speculative decoding), ``S`` sequences and reads
``C`` tokens of KV context::

    compute = prefill_ms_per_token * P + decode_ms_per_token * D + attention_ms_per_ktoken * C / 1000
    memory  = weights_ms + kv_read_ms_per_ktoken * C / 1000
    step    = overhead_ms + per_seq_ms * S + max(compute, memory)
    step   *= verify_cost_factor        (only when the step verifies speculative tokens)

``memory`` is the memory-bound floor of a GPU step (weights and KV streamed once per step); a CPU
profile leaves it at zero and the step is plain compute. A step that schedules nothing takes no time.

Opt-in terms (all zero by default, which is the model above) for what real vLLM on a GPU shows
beyond the isolated parts: ``prefill_ms_per_ktoken2 * (P / 1000) ** 2`` adds to ``compute`` (per
token, a step's prefill slows as the step grows, whatever prompts share it, as measured on an
H200), ``host_ms_per_prefill_token`` adds host time per prefill token (input preparation grows with
the new tokens); ``mixed_ms + mixed_ms_per_decode_seq * D`` is what a step that mixes prefill
tokens with ``D`` decoding sequences costs over its parts; ``serial_ms`` is host time that never
overlaps the device (scheduling before the first kernel, the wait for the sampled tokens after the
last)::

    step = serial_ms + [the step above] + (mixed_ms + mixed_ms_per_decode_seq * D  if P > 0 and D > 0)

and ``tail_quantiles_ms`` is the distribution of what a step costs beyond that (evenly spaced
quantiles, from 0 to 1, of the extra milliseconds; interpolated): each step draws from it with
the engine's seeded RNG, so virtual time stays deterministic. Empty: no tail.

The first two terms are the host's part of a step (scheduling, kernel launches), ``max(compute,
memory)`` the device's: engines that share one GPU (``EngineCore(device=...)``) take turns on it
for their device parts only. With ``host_overlaps_device`` the device runs kernels while the host
is still launching them (a GPU in eager mode), and a step takes ``max(host, device)`` instead of
their sum.

Before a request reaches the engine's scheduler, the API server spends
``request_overhead_ms + request_ms_per_prompt_token * prompt_tokens`` on it (parsing, input
processing, the hop to the engine, cached tokens or not): it adds to TTFT but occupies no step.

With LoRA enabled, a step also pays for its adapters (``lora`` section, ``LoraCosts``)::

    step += swap_in_ms * rank/16    for each adapter copied into a GPU slot this step
          + load_ms * rank/16       for each adapter read from disk (not in the CPU cache) this step
          + step_overhead_ms        when the batch has any LoRA token
          + ms_per_lora_token * L   for the step's L tokens of LoRA requests
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

PROFILE_DIR = Path(__file__).parent / "profiles"


@dataclass(slots=True, frozen=True)
class Timing:
    overhead_ms: float = 0.0
    per_seq_ms: float = 0.0
    prefill_ms_per_token: float = 0.0
    decode_ms_per_token: float = 0.0
    attention_ms_per_ktoken: float = 0.0
    weights_ms: float = 0.0
    kv_read_ms_per_ktoken: float = 0.0
    prefill_attention_ms_per_mpair: float = 0.0
    """Attention of prefill chunks: per million (new token, attended token) pairs, so a long
    prompt's prefill grows with its square, as causal attention does."""
    request_overhead_ms: float = 0.0
    request_ms_per_prompt_token: float = 0.0
    host_overlaps_device: bool = False
    prefill_ms_per_ktoken2: float = 0.0
    serial_ms: float = 0.0
    host_ms_per_prefill_token: float = 0.0
    mixed_ms: float = 0.0
    mixed_ms_per_decode_seq: float = 0.0
    tail_quantiles_ms: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        tail = tuple(float(q) for q in self.tail_quantiles_ms)
        if len(tail) == 1 or any(b < a for a, b in itertools.pairwise(tail)) or any(q < 0 for q in tail):
            raise ValueError("tail_quantiles_ms: two or more non-negative values, in ascending order")
        object.__setattr__(self, "tail_quantiles_ms", tail)

    def step_s(
        self, prefill_tokens: int, decode_tokens: int, seqs: int, context_tokens: int, prefill_pairs: float = 0.0
    ) -> float:
        if seqs == 0:
            return 0.0
        host, device = self.split_s(prefill_tokens, decode_tokens, seqs, context_tokens, prefill_pairs)
        serial = self.serial_s(prefill_tokens, decode_tokens)  # one decode token per sequence here
        return serial + (max(host, device) if self.host_overlaps_device else host + device)

    def split_s(
        self, prefill_tokens: int, decode_tokens: int, seqs: int, context_tokens: int, prefill_pairs: float = 0.0
    ) -> tuple[float, float]:
        """The step's host part and device part, in seconds."""
        if seqs == 0:
            return 0.0, 0.0
        kctx = context_tokens / 1000.0
        compute = (
            self.prefill_ms_per_token * prefill_tokens
            + self.decode_ms_per_token * decode_tokens
            + self.attention_ms_per_ktoken * kctx
            + self.prefill_attention_ms_per_mpair * prefill_pairs / 1e6
            + self.prefill_ms_per_ktoken2 * (prefill_tokens / 1000.0) ** 2
        )
        memory = self.weights_ms + self.kv_read_ms_per_ktoken * kctx
        host = self.overhead_ms + self.per_seq_ms * seqs + self.host_ms_per_prefill_token * prefill_tokens
        return host / 1000.0, max(compute, memory) / 1000.0

    def serial_s(self, prefill_tokens: int, decode_seqs: int) -> float:
        """What a step costs besides its host and device parts, in seconds: the host's part that
        never overlaps the device, and the cost of mixing prefill tokens with decoding sequences."""
        ms = self.serial_ms
        if prefill_tokens and decode_seqs:
            ms += self.mixed_ms + self.mixed_ms_per_decode_seq * decode_seqs
        return ms / 1000.0

    def tail_s(self, u: float) -> float:
        """The step's extra time at quantile ``u`` (0 <= u <= 1) of ``tail_quantiles_ms``, in seconds."""
        tail = self.tail_quantiles_ms
        if not tail:
            return 0.0
        position = u * (len(tail) - 1)
        below = min(int(position), len(tail) - 2)
        return (tail[below] + (tail[below + 1] - tail[below]) * (position - below)) / 1000.0

    def request_s(self, prompt_tokens: int) -> float:
        """What the API server spends on a request before the scheduler sees it."""
        return (self.request_overhead_ms + self.request_ms_per_prompt_token * prompt_tokens) / 1000.0


@dataclass(slots=True, frozen=True)
class Speculative:
    """Speculative decoding (e.g. MTP): ``k`` draft tokens per decoding sequence per step.

    Each draft token is accepted with ``acceptance_rate`` until the first rejection, then one
    token is sampled, so a step yields 1 to ``k + 1`` tokens per sequence.
    """

    num_speculative_tokens: int = 0
    acceptance_rate: float = 0.0
    verify_cost_factor: float = 1.0


@dataclass(slots=True, frozen=True)
class LoraCosts:
    """What adapters add to a step's time. ``swap_in_ms`` and ``load_ms`` are for a rank-16 adapter and
    scale with the rank (both move the adapter's weights, whose size is proportional to it).

    The defaults are estimates for a 7-8B model on one GPU with LoRA on the attention projections:
    a rank-16 adapter is about 17M parameters (34 MB in bf16), about 2 ms to copy into a slot over
    PCIe and about 20 ms to read and prepare from local disk; the LoRA kernels (punica SGMV/BGMV)
    add a little per step and per token.
    """

    swap_in_ms: float = 2.0
    load_ms: float = 20.0
    step_overhead_ms: float = 0.5
    ms_per_lora_token: float = 0.0

    def scale(self, rank: int) -> float:
        return max(1, rank) / 16.0


@dataclass(slots=True, frozen=True)
class Profile:
    name: str
    block_size: int = 16
    num_blocks: int = 8192
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    enable_prefix_caching: bool = True
    kv_offloading_blocks: int = 0
    """Blocks of the CPU KV tier (``cpu_tier``; vLLM's ``--kv-offloading-size``); 0: no tier."""
    kv_bytes_per_token: int = 0
    """KV cache bytes per token (all layers), to turn GiB into blocks and time copies; 0: unknown."""
    timing: Timing = field(default_factory=Timing)
    speculative: Speculative = field(default_factory=Speculative)
    lora: LoraCosts = field(default_factory=LoraCosts)
    description: str = ""

    def with_overrides(self, **overrides: Any) -> Profile:
        """A copy with the given engine fields changed (``None`` values are ignored)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def with_tail_scaled(self, factor: float) -> Profile:
        """A copy whose steps' tail beyond their modelled cost is ``factor`` times this one's: the tail
        is the part that varies from one machine of a kind to the next."""
        tail = tuple(q * factor for q in self.timing.tail_quantiles_ms)
        return replace(self, timing=replace(self.timing, tail_quantiles_ms=tail))

    def with_constant_step(self, step_ms: float) -> Profile:
        """Every step takes ``step_ms`` whatever it does (``--token-delay-ms``)."""
        return replace(self, timing=Timing(overhead_ms=step_ms), speculative=Speculative(), lora=LoraCosts(0, 0, 0, 0))


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (``tiny-cpu``) or by path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown profile {name_or_path!r}; known: {', '.join(available_profiles())}")
    data = yaml.safe_load(path.read_text())
    return profile_from_dict(data, default_name=path.stem)


def profile_from_dict(data: dict[str, Any], default_name: str = "custom") -> Profile:
    engine = dict(data.get("engine") or {})
    known = {f.name for f in fields(Profile)} - {"name", "timing", "speculative", "lora", "description"}
    unknown = set(engine) - known
    if unknown:
        raise ValueError(f"unknown engine fields: {sorted(unknown)}")
    return Profile(
        name=str(data.get("name", default_name)),
        timing=_build(Timing, data.get("timing")),
        speculative=_build(Speculative, data.get("speculative")),
        lora=_build(LoraCosts, data.get("lora")),
        description=str(data.get("description", "")),
        **engine,
    )


def _build(cls: type, values: dict[str, Any] | None) -> Any:
    values = dict(values or {})
    unknown = set(values) - {f.name for f in fields(cls)}
    if unknown:
        raise ValueError(f"unknown {cls.__name__.lower()} fields: {sorted(unknown)}")
    return cls(**values)
