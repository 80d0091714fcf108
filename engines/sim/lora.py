"""LoRA adapters in one engine: GPU slots and the CPU cache, after vLLM's ``LRUCacheWorkerLoRAManager``.

Rules:
- An adapter is known to the engine by its int id (``LoraAdapter.int_id``, 1, 2, ... in the order the
  API server registered names, as vLLM's ``lora_id_counter``); its name and path key the prefix cache.
- ``max_cpu_loras`` adapters are held in the CPU cache and ``max_loras`` of those in GPU slots; both are
  LRU. Every step the batch's adapters are applied: each one is touched in both caches; one missing
  from the CPU cache is loaded from disk (evicting the least recently used cached adapter, which also
  leaves its slot); one missing from the slots is copied into a slot (evicting the least recently used
  slot). Adapters already resident are touched before missing ones are brought in, so a step never
  evicts an adapter it needs (vLLM iterates a set hashed by name, an arbitrary order per process,
  and may now and then evict and copy back an adapter of the same step).
- ``preload`` (``/v1/load_lora_adapter`` and ``--lora-modules`` at start) loads an adapter into the CPU
  cache and a slot at once, as vLLM's ``add_lora`` does. Unloading a name from the API server leaves
  the adapter where it is until it is evicted (vLLM does not tell the engine).
- ``LoraRequestStates`` counts requests per adapter for ``vllm:lora_requests_info`` the way vLLM's
  output processor does: from the request's engine events (queued, scheduled, preempted), which only
  reach it with the request's next output, so a request is counted from its first token until it ends.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

WAITING_EVENT, RUNNING_EVENT = 0, 1


@dataclass(slots=True, frozen=True)
class LoraAdapter:
    name: str
    int_id: int
    path: str
    rank: int = 16
    base_model_name: str | None = None


@dataclass(slots=True)
class Applied:
    """What bringing one step's adapters in cost: adapters read from disk and copied into slots."""

    loaded: list[LoraAdapter] = field(default_factory=list)
    swapped_in: list[LoraAdapter] = field(default_factory=list)


class LoraSlots:
    def __init__(self, max_loras: int, max_cpu_loras: int | None = None) -> None:
        cpu = max_loras if max_cpu_loras is None else max_cpu_loras
        if max_loras < 1:
            raise ValueError(f"max_loras must be at least 1, got {max_loras}")
        if cpu < max_loras:
            raise ValueError(f"max_cpu_loras ({cpu}) must be >= max_loras ({max_loras}).")
        self.max_loras = max_loras
        self.max_cpu_loras = cpu
        self._cpu: OrderedDict[int, LoraAdapter] = OrderedDict()
        self._gpu: OrderedDict[int, LoraAdapter] = OrderedDict()
        self.loads = 0
        self.swaps = 0

    @property
    def active(self) -> list[LoraAdapter]:
        """Adapters in GPU slots, least recently used first."""
        return list(self._gpu.values())

    @property
    def cached(self) -> list[LoraAdapter]:
        """Adapters in the CPU cache, least recently used first."""
        return list(self._cpu.values())

    def is_active(self, adapter: LoraAdapter) -> bool:
        return self._gpu.get(adapter.int_id) == adapter

    def apply(self, batch: list[LoraAdapter]) -> Applied:
        """Bring a step's adapters (distinct, at most ``max_loras``) into slots."""
        if len(batch) > self.max_loras:
            raise RuntimeError(f"{len(batch)} adapters in one step, only {self.max_loras} GPU slots")
        applied = Applied()
        missing = []
        for adapter in batch:
            if self.is_active(adapter):
                self._cpu.move_to_end(adapter.int_id)
                self._gpu.move_to_end(adapter.int_id)
            else:
                missing.append(adapter)
        for adapter in missing:
            self._bring_in(adapter, applied)
        return applied

    def preload(self, adapter: LoraAdapter, replace: bool = False) -> Applied:
        applied = Applied()
        if replace:
            self._cpu.pop(adapter.int_id, None)
            self._gpu.pop(adapter.int_id, None)
        self._bring_in(adapter, applied)
        return applied

    def _bring_in(self, adapter: LoraAdapter, applied: Applied) -> None:
        key = adapter.int_id
        if self._cpu.get(key) != adapter:
            self._cpu.pop(key, None)
            self._gpu.pop(key, None)
            if len(self._cpu) >= self.max_cpu_loras:
                oldest, _ = self._cpu.popitem(last=False)
                self._gpu.pop(oldest, None)
            self._cpu[key] = adapter
            self.loads += 1
            applied.loaded.append(adapter)
        else:
            self._cpu.move_to_end(key)
        if key in self._gpu:
            self._gpu.move_to_end(key)
            return
        if len(self._gpu) >= self.max_loras:
            self._gpu.popitem(last=False)
        self._gpu[key] = adapter
        self.swaps += 1
        applied.swapped_in.append(adapter)


class LoraRequestStates:
    """Requests per adapter name, waiting or running, as vLLM's ``LoRARequestStates``."""

    def __init__(self) -> None:
        # Insertion order is the order of the gauge's label values.
        self._requests: dict[str, tuple[set[str], set[str]]] = {}

    def update(self, request_id: str, name: str, event: int | None) -> None:
        """Apply one event (``WAITING_EVENT``, ``RUNNING_EVENT``) or the end of the request (``None``)."""
        waiting, running = self._requests.setdefault(name, (set(), set()))
        if event == WAITING_EVENT:
            waiting.add(request_id)
        else:
            waiting.discard(request_id)
        if event == RUNNING_EVENT:
            running.add(request_id)
        else:
            running.discard(request_id)
        if not waiting and not running:
            del self._requests[name]

    def counts(self) -> dict[str, tuple[int, int]]:
        """``{name: (waiting, running)}``."""
        return {name: (len(w), len(r)) for name, (w, r) in self._requests.items()}

    def labels(self) -> tuple[str, str]:
        """``(running_lora_adapters, waiting_lora_adapters)`` label values.

        vLLM 0.32 fills both per-adapter dicts with every tracked adapter (a count may be 0) and
        joins the keys, so the two labels always name the same adapters.
        """
        names = ",".join(self._requests)
        return names, names
