"""Precise prefix mode: which engine holds which blocks, from the engines' own KV cache events.

Rules:
- Blocks are identified by the gateway's own chained hash of their token ids (``token_block_hashes``),
  computed the same way for a request's prompt and for an engine's ``BlockStored`` event, so
  neither side needs the engine's hash function. A chain starts from a seed of the event's
  ``lora_name`` (``lora_root``), so one adapter's blocks never match another's prompt.
- An engine's block hash maps to the gateway's hash of the same block, which is how a later
  event's ``parent_block_hash`` and ``BlockRemoved`` are resolved. A stored block whose parent
  the gateway never saw (events before it subscribed, or lost) cannot be placed in a chain and
  is ignored until the engine stores it again.
- ``AllBlocksCleared`` and an engine restart empty that engine's entry.
- Nothing is guessed: routing a request records nothing here; only events change what an
  engine holds.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Sequence

from xxhash import xxh3_64_intdigest

from priority_gateway.core.affinity import AffinityIndex
from priority_gateway.core.prefix import hash_token_blocks

ROOT = xxh3_64_intdigest(b"gateway-precise-prefix")
_UNLIMITED = 1 << 62


DEFAULT_MAX_BLOCKS = 1024


def lora_root(lora_name: str | None) -> int:
    """The chain's seed: blocks of one LoRA adapter are another adapter's (or the base's) misses,
    as vLLM keys its block hashes by adapter."""
    return ROOT if lora_name is None else xxh3_64_intdigest(lora_name.encode(), ROOT)


def token_block_hashes(
    token_ids: Sequence[int], block_size: int, max_blocks: int = DEFAULT_MAX_BLOCKS, lora_name: str | None = None
) -> list[int]:
    """Chained hashes of the full ``block_size``-token blocks of a token sequence."""
    return hash_token_blocks(token_ids, lora_root(lora_name), block_size, max_blocks)


class PreciseIndex:
    def __init__(self, index: AffinityIndex | None = None) -> None:
        self.index = index or AffinityIndex(_UNLIMITED)
        self._ours: dict[str, dict[Hashable, int]] = {}
        self.unplaced = 0

    def stored(
        self,
        engine: str,
        block_hashes: Sequence[Hashable],
        parent: Hashable | None,
        token_ids: Sequence[int],
        block_size: int,
        lora_name: str | None = None,
    ) -> None:
        ours = self._ours.setdefault(engine, {})
        if parent is None:
            chain = lora_root(lora_name)
        elif parent in ours:
            chain = ours[parent]
        else:
            self.unplaced += len(block_hashes)
            return
        added = []
        for i, engine_hash in enumerate(block_hashes):
            tokens = token_ids[i * block_size : (i + 1) * block_size]
            if len(tokens) < block_size:
                break
            chain = xxh3_64_intdigest(array("I", tokens).tobytes(), chain)
            ours[engine_hash] = chain
            added.append(chain)
        if added:
            self.index.set_capacity(engine, _UNLIMITED)
            self.index.record(engine, added, len(added) * block_size, block_size)

    def removed(self, engine: str, block_hashes: Sequence[Hashable]) -> None:
        ours = self._ours.get(engine)
        if not ours:
            return
        gone = [ours.pop(h) for h in block_hashes if h in ours]
        self.index.remove(engine, gone)

    def cleared(self, engine: str) -> None:
        self._ours.pop(engine, None)
        self.index.clear(engine)

    def blocks(self, engine: str) -> int:
        return len(self._ours.get(engine, ()))
