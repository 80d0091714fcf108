"""A vLLM-faithful engine simulator for machines without a GPU.

One engine model (``core.EngineCore``: continuous batching, chunked prefill, a paged KV cache with
prefix caching, preemption, FCFS or priority scheduling, LoRA adapters in GPU slots, step times
from a ``profile``) driven in real time behind vLLM's OpenAI HTTP API (``python -m priority_gateway.engines.sim``)
or in virtual time by a simulator (``sweep``, ``gateway sim``).
"""

from priority_gateway.engines.sim.core import FCFS, PRIORITY, EngineCore, EngineRequest, StepOutput, StepResult
from priority_gateway.engines.sim.lora import LoraAdapter
from priority_gateway.engines.sim.profile import Profile, Speculative, Timing, available_profiles, load_profile
from priority_gateway.engines.sim.tokens import block_hashes_for_text, block_hashes_for_trace

__all__ = [
    "FCFS",
    "PRIORITY",
    "EngineCore",
    "EngineRequest",
    "LoraAdapter",
    "Profile",
    "Speculative",
    "StepOutput",
    "StepResult",
    "Timing",
    "available_profiles",
    "block_hashes_for_text",
    "block_hashes_for_trace",
    "load_profile",
]
