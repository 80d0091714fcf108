"""An approximate map of which engine holds which prompt blocks in its prefix cache.

Rules:
- Learned from the gateway's own routing: routing a request to an engine records its
  prefix blocks there, most recently used last.
- Each engine's cache holds ``capacity`` blocks; beyond that its least recently used
  blocks are forgotten, as the engine would evict them.
- Block hashes are chained, so an engine that holds block *i* of a prompt is taken to
  hold blocks *0..i* as well: a match is the length of the leading run an engine holds.
- Engines are bits in an integer mask, so a lookup walks the prompt once whatever the
  pool size.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class AffinityIndex:
    def __init__(self, default_capacity: int = 8192) -> None:
        self.default_capacity = default_capacity
        self._holders: dict[int, int] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._bit: dict[str, int] = {}
        self._capacity: dict[str, int] = {}
        self._free_bits: list[int] = []
        self._next_bit = 0

    def _bit_of(self, engine: str) -> int:
        bit = self._bit.get(engine)
        if bit is None:
            index = self._free_bits.pop() if self._free_bits else self._next_bit
            if index == self._next_bit:
                self._next_bit += 1
            bit = self._bit[engine] = 1 << index
            self._lru[engine] = OrderedDict()
        return bit

    def set_capacity(self, engine: str, blocks: int) -> None:
        self._bit_of(engine)
        self._capacity[engine] = max(1, blocks)
        self._evict(engine)

    def capacity(self, engine: str) -> int:
        return self._capacity.get(engine, self.default_capacity)

    def size(self, engine: str) -> int:
        lru = self._lru.get(engine)
        return len(lru) if lru is not None else 0

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

    def record(self, engine: str, prefix: Sequence[int]) -> None:
        if not prefix:
            return
        bit = self._bit_of(engine)
        lru = self._lru[engine]
        holders = self._holders
        for h in prefix:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                holders[h] = holders.get(h, 0) | bit
        self._evict(engine)

    def remove(self, engine: str, blocks: Sequence[int]) -> None:
        bit = self._bit.get(engine)
        if bit is None:
            return
        lru = self._lru[engine]
        for h in blocks:
            if h in lru:
                del lru[h]
                self._drop_holder(h, bit)

    def clear(self, engine: str) -> None:
        bit = self._bit.get(engine)
        if bit is None:
            return
        for h in self._lru[engine]:
            self._drop_holder(h, bit)
        self._lru[engine].clear()

    def forget(self, engine: str) -> None:
        bit = self._bit.get(engine)
        if bit is None:
            return
        self.clear(engine)
        del self._bit[engine], self._lru[engine]
        self._capacity.pop(engine, None)
        self._free_bits.append(bit.bit_length() - 1)

    def _drop_holder(self, h: int, bit: int) -> None:
        mask = self._holders.get(h, 0) & ~bit
        if mask:
            self._holders[h] = mask
        else:
            self._holders.pop(h, None)

    def _evict(self, engine: str) -> None:
        lru = self._lru[engine]
        over = len(lru) - self._capacity.get(engine, self.default_capacity)
        if over <= 0:
            return
        bit = self._bit[engine]
        for _ in range(over):
            h, _ = lru.popitem(last=False)
            self._drop_holder(h, bit)
