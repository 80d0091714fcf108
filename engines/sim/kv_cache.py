"""A paged KV cache with prefix caching, after vLLM v1's ``BlockPool``.

Rules:
- The cache has ``num_blocks`` blocks of ``block_size`` tokens. A block is either in use (its
  reference count is the number of requests holding it) or free.
- A full block can carry a hash (see ``tokens``); while it does, a request whose prompt has
  that hash may reuse it instead of computing it again (a cache hit). Free blocks keep their hash
  until they are reused for something else, so a finished request's blocks can still be hit.
- Free blocks form one queue in eviction order. A request's blocks are freed tail first, so the
  ends of prompts are evicted before their shared beginnings. Allocation takes from the head of
  the queue; taking a block that carries a hash evicts it (``BlockRemoved``).
- A hit on a free block takes it out of the free queue (it is in use again).
- Usage is the share of blocks not free, as ``vllm:kv_cache_usage_perc``.
- When ``events`` is a list, ``BlockStored``/``BlockRemoved``/``AllBlocksCleared`` records (the
  gateway's own event types, ``priority_gateway.core.kv_events``) are
  appended to it in the order they happen, as vLLM's KV event publisher reports them. A stored
  block carries its request's LoRA adapter (``lora_id``, ``lora_name``) and, per block, vLLM's
  untagged extra keys: the adapter's name, then the ``cache_salt`` on a prompt's first block.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from priority_gateway.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


@dataclass(slots=True, frozen=True)
class BlockOwner:
    """Who stores blocks, as far as KV events tell: the request's adapter and cache salt."""

    lora_id: int | None = None
    lora_name: str | None = None
    cache_salt: str | None = None

    def extra_keys(self, index: int) -> list[str] | None:
        keys = [self.lora_name] if self.lora_name is not None else []
        if index == 0 and self.cache_salt:
            keys.append(self.cache_salt)
        return keys or None


TokenIdsOf = Callable[[int, int], list[int]]
"""``(block_index, block_hash) -> token ids`` of a block, for ``BlockStored`` events."""


class KVCache:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        events: list[KVEvent] | None = None,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.events = events
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        # dict keeps insertion order: the first key is the next block to hand out.
        # An OrderedDict, not a dict: taking from the front of a plain dict leaves holes that
        # every later ``next(iter(...))`` walks over, which made allocation O(free blocks).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}

    def __deepcopy__(self, memo: dict[int, object]) -> KVCache:
        # Block tables of ints and Nones: a slice copies them a hundred times faster than deepcopy.
        twin = KVCache.__new__(KVCache)
        memo[id(self)] = twin
        twin.num_blocks = self.num_blocks
        twin.block_size = self.block_size
        twin.enable_prefix_caching = self.enable_prefix_caching
        twin.events = copy.deepcopy(self.events, memo)
        twin._ref = self._ref[:]
        twin._hash = self._hash[:]
        twin._free = OrderedDict(self._free)
        twin._cached = dict(self._cached)
        return twin

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def find_prefix(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """The cached blocks matching the longest prefix of ``hashes`` (at most ``max_blocks``)."""
        if not self.enable_prefix_caching:
            return []
        found = []
        cached = self._cached
        for i in range(min(max_blocks, len(hashes))):
            block = cached.get(hashes[i])
            if block is None:
                break
            found.append(block)
        return found

    def can_allocate(self, num_new: int, hit_blocks: Sequence[int] = ()) -> bool:
        # A hit on a free block takes it out of the free queue, so it cannot be allocated as well.
        reusable_free = sum(1 for b in hit_blocks if self._ref[b] == 0)
        return num_new <= len(self._free) - reusable_free

    def touch(self, blocks: Sequence[int]) -> None:
        ref = self._ref
        for block in blocks:
            if ref[block] == 0:
                del self._free[block]
            ref[block] += 1

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise RuntimeError(f"cannot allocate {count} blocks, {len(self._free)} free")
        free = self._free
        out = []
        for _ in range(count):
            block, _ = free.popitem(last=False)
            self._evict(block)
            self._ref[block] = 1
            out.append(block)
        return out

    def _evict(self, block: int) -> None:
        block_hash = self._hash[block]
        if block_hash is None:
            return
        self._hash[block] = None
        if self._cached.get(block_hash) == block:
            del self._cached[block_hash]
        if self.events is not None:
            self.events.append(BlockRemoved([block_hash]))

    def cache_blocks(
        self,
        blocks: Sequence[int],
        hashes: Sequence[int],
        start: int,
        end: int,
        token_ids_of: TokenIdsOf | None = None,
        owner: BlockOwner | None = None,
    ) -> None:
        """Give ``blocks[start:end]`` (now full) their hashes ``hashes[start:end]``."""
        if not self.enable_prefix_caching or end <= start:
            return
        cached = self._cached
        for i in range(start, end):
            block, block_hash = blocks[i], hashes[i]
            self._hash[block] = block_hash
            cached.setdefault(block_hash, block)
        if self.events is not None:
            new_hashes = list(hashes[start:end])
            token_ids: list[int] = []
            if token_ids_of is not None:
                for i in range(start, end):
                    token_ids.extend(token_ids_of(i, hashes[i]))
            parent = hashes[start - 1] if start > 0 else None
            self.events.append(_stored(new_hashes, parent, token_ids, self.block_size, owner, start))

    def free(self, blocks: Sequence[int]) -> None:
        """Release a request's blocks, tail first (the tail is evicted before the shared head)."""
        ref = self._ref
        free = self._free
        for block in reversed(blocks):
            ref[block] -= 1
            if ref[block] == 0:
                free[block] = None

    def reset_prefix_cache(self) -> bool:
        """Forget every hash; only possible while no block is in use (as vLLM's reset)."""
        if len(self._free) != self.num_blocks:
            return False
        self._cached.clear()
        self._hash = [None] * self.num_blocks
        if self.events is not None:
            self.events.append(AllBlocksCleared())
        return True


def _stored(
    hashes: list[int], parent: int | None, token_ids: list[int], block_size: int, owner: BlockOwner | None, start: int
) -> BlockStored:
    if owner is None:
        return BlockStored(hashes, parent, token_ids, block_size)
    extra = [owner.extra_keys(start + i) for i in range(len(hashes))]
    return BlockStored(hashes, parent, token_ids, block_size, owner.lora_id, owner.lora_name, extra)


def lru_hit_ratio(prompts: Iterable[tuple[int, Sequence[int]]], capacity_blocks: float, block_size: int) -> float:
    """Prefix hit ratio of one LRU prefix cache of ``capacity_blocks`` blocks fed ``prompts`` in order.

    Each prompt is ``(tokens, chained block hashes)``. Hits follow vLLM's rule: whole leading
    blocks, never the prompt's last token. ``capacity_blocks`` may be ``math.inf``.
    """
    lru: OrderedDict[int, None] = OrderedDict()
    hits = total = 0
    for tokens, hashes in prompts:
        usable = (tokens - 1) // block_size
        n = 0
        for h in hashes[:usable]:
            if h not in lru:
                break
            n += 1
        hits += n * block_size
        total += tokens
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)
    return hits / total if total else 0.0
