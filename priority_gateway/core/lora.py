"""Which LoRA adapters an engine holds, and whether it has a slot for one more.

Rules:
- vLLM runs a batch with at most ``max_lora`` distinct adapters (``--max-loras``); a request for
  another one waits until a slot frees, and bringing an adapter into a slot (a swap) costs step time.
  What holds a slot now is the engine's ``vllm:lora_requests_info`` at the last scrape (its running
  and waiting adapters) plus the adapters of this gateway's requests in flight there.
- An adapter stays in its GPU slot after its requests end, until a newer one evicts it (least
  recently used). So an engine is modelled as *resident* for the ``max_lora`` adapters most
  recently sent to it or seen running on it: a request for one of those needs no swap.
- An engine whose ``max_lora`` is unknown (no scrape yet, or LoRA off) always has room.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

DEFAULT_SLOTS = 1
"""Slots assumed before ``max_lora`` is scraped: vLLM's ``--max-loras`` default."""


@dataclass(slots=True, frozen=True)
class LoraInfo:
    """The newest ``vllm:lora_requests_info`` series of one engine."""

    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    max_lora: int | None = None


@dataclass(slots=True)
class AdapterSlots:
    max_lora: int | None = None
    active: frozenset[str] = frozenset()
    """Running and waiting adapters at the last scrape."""
    inflight: dict[str, int] = field(default_factory=dict)
    """This gateway's requests in flight on the engine, by adapter."""
    recent: OrderedDict[str, None] = field(default_factory=OrderedDict)
    """Adapters most recently used there, oldest first: what its GPU slots most likely hold."""

    def scraped(self, info: LoraInfo) -> None:
        if info.max_lora is not None:
            self.max_lora = info.max_lora
        self.active = frozenset(info.running) | frozenset(info.waiting)
        for name in info.running:
            self._touch(name)

    def started(self, adapter: str) -> None:
        self.inflight[adapter] = self.inflight.get(adapter, 0) + 1
        self._touch(adapter)

    def finished(self, adapter: str) -> None:
        left = self.inflight.get(adapter, 0) - 1
        if left > 0:
            self.inflight[adapter] = left
        else:
            self.inflight.pop(adapter, None)

    def _touch(self, adapter: str) -> None:
        recent = self.recent
        recent[adapter] = None
        recent.move_to_end(adapter)
        while len(recent) > (self.max_lora or DEFAULT_SLOTS):
            recent.popitem(last=False)

    def resident(self, adapter: str) -> bool:
        """The adapter is most likely in a GPU slot: no swap to serve it."""
        return adapter in self.inflight or adapter in self.active or adapter in self.recent

    def busy(self) -> set[str]:
        """Adapters that hold a slot now (in a running batch or waiting for one)."""
        return set(self.inflight) | self.active

    def has_room(self, adapter: str) -> bool:
        """The engine can run ``adapter`` now without waiting for another adapter's slot."""
        if self.max_lora is None or adapter in self.inflight or adapter in self.active:
            return True
        return len(self.busy()) < self.max_lora
