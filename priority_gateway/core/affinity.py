"""An approximate map of which engine holds which prompt blocks in its prefix cache.

Rules:
- Learned from the gateway's own routing: routing a request to an engine records its
  prefix blocks there, most recently used last.
- Capacity is counted in tokens, as the engine's KV cache is: each recorded block stands
  for an equal share of its request's prompt (the gateway hashes only the leading part of
  long prompts, but the engine caches all of it). Past ``capacity_tokens`` the least
  recently used blocks are forgotten, as the engine would evict them.
- Block hashes are chained, so an engine that holds block *i* of a prompt is taken to
  hold blocks *0..i* as well: a match is the length of the leading run an engine holds.
- For prompts longer than what was hashed, the prompt length recorded at the last hashed
  block tells how far a full match really reaches.
- Engines are bits in an integer mask, so a lookup walks the prompt once whatever the
  pool size.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class AffinityIndex:
    def __init__(self, default_capacity_tokens: int = 1 << 20) -> None:
        self.default_capacity = default_capacity_tokens
        self._holders: dict[int, int] = {}
        self._lru: dict[str, OrderedDict[int, float]] = {}
        self._used: dict[str, float] = {}
        self._bit: dict[str, int] = {}
        self._capacity: dict[str, int] = {}
        self._extent: dict[int, int] = {}
        self._free_bits: list[int] = []
        self._next_bit = 0

    def _bit_of(self, engine: str) -> int:
        bit = self._bit.get(engine)
        if bit is None:
            if self._free_bits:
                index = self._free_bits.pop()
            else:
                index = self._next_bit
                self._next_bit += 1
            bit = self._bit[engine] = 1 << index
            self._lru[engine] = OrderedDict()
            self._used[engine] = 0.0
        return bit

    def set_capacity(self, engine: str, tokens: int) -> None:
        self._bit_of(engine)
        self._capacity[engine] = max(1, tokens)
        self._evict(engine)

    def capacity(self, engine: str) -> int:
        return self._capacity.get(engine, self.default_capacity)

    def holds(self, engine: str, block: int) -> bool:
        return block in self._lru.get(engine, ())

    def used(self, engine: str) -> float:
        return self._used.get(engine, 0.0)

    def match(self, prefix: Sequence[int], engines: Sequence[str]) -> list[int]:
        """Leading blocks of ``prefix`` each engine holds, in the order of ``engines``."""
        bits = [self._bit.get(e, 0) for e in engines]
        alive = 0
        for bit in bits:
            alive |= bit
        depth: dict[int, int] = {}
        holders = self._holders
        n = 0
        for h in prefix:
            mask = holders.get(h, 0) & alive
            if mask != alive:
                gone = alive & ~mask
                for bit in bits:
                    if bit & gone:
                        depth[bit] = n
                alive = mask
                if not alive:
                    break
            n += 1
        return [depth.get(bit, n) if bit else 0 for bit in bits]

    def extent(self, last_block: int) -> int | None:
        """Prompt tokens of the longest recorded request whose hashed prefix ended here."""
        return self._extent.get(last_block)

    def record(self, engine: str, prefix: Sequence[int], prompt_tokens: int, block_tokens: int) -> None:
        if not prefix:
            return
        bit = self._bit_of(engine)
        lru = self._lru[engine]
        holders = self._holders
        weight = max(float(block_tokens), prompt_tokens / len(prefix))
        added = 0.0
        for h in prefix:
            old = lru.get(h)
            if old is None:
                holders[h] = holders.get(h, 0) | bit
                lru[h] = weight
                added += weight
            else:
                lru.move_to_end(h)
                if weight > old:
                    lru[h] = weight
                    added += weight - old
        self._used[engine] += added
        last = prefix[-1]
        if prompt_tokens > self._extent.get(last, 0):
            self._extent[last] = prompt_tokens
        self._evict(engine)

    def remove(self, engine: str, blocks: Sequence[int]) -> None:
        bit = self._bit.get(engine)
        if bit is None:
            return
        lru = self._lru[engine]
        for h in blocks:
            weight = lru.pop(h, None)
            if weight is not None:
                self._used[engine] -= weight
                self._drop_holder(h, bit)

    def clear(self, engine: str) -> None:
        bit = self._bit.get(engine)
        if bit is None:
            return
        for h in self._lru[engine]:
            self._drop_holder(h, bit)
        self._lru[engine].clear()
        self._used[engine] = 0.0

    def forget(self, engine: str) -> None:
        bit = self._bit.get(engine)
        if bit is None:
            return
        self.clear(engine)
        del self._bit[engine], self._lru[engine], self._used[engine]
        self._capacity.pop(engine, None)
        self._free_bits.append(bit.bit_length() - 1)

    def _drop_holder(self, h: int, bit: int) -> None:
        mask = self._holders.get(h, 0) & ~bit
        if mask:
            self._holders[h] = mask
        else:
            self._holders.pop(h, None)
            self._extent.pop(h, None)

    def _evict(self, engine: str) -> None:
        capacity = self._capacity.get(engine, self.default_capacity)
        if self._used[engine] <= capacity:
            return
        lru = self._lru[engine]
        bit = self._bit[engine]
        used = self._used[engine]
        while used > capacity and lru:
            h, weight = lru.popitem(last=False)
            used -= weight
            self._drop_holder(h, bit)
        self._used[engine] = used
