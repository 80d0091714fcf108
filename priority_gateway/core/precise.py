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
- Tiers: a block an event names with a ``medium`` other than the GPU's (vLLM's KV offloading stores
  blocks to ``CPU``) is kept in the lower tier's index (``lower``), apart from the GPU's: a hit there
  is a transfer, not a recompute, and scores between a GPU hit and a miss (``prefix_policy``).
  ``BlockRemoved`` removes from the tier it names. vLLM's offloading connector reports a block it
  stored by its hash alone (no parent, no token ids): such a block is the one the engine's GPU event
  named under that hash, now held in the tier this event names; a hash never named is not guessed.
- ``AllBlocksCleared`` and an engine restart empty that engine's entry, in every tier.
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
GPU_MEDIA = frozenset({None, "GPU", "gpu", "cuda", "CUDA"})


def is_gpu(medium: str | None) -> bool:
    return medium in GPU_MEDIA


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
        self.lower = AffinityIndex(_UNLIMITED)
        """Blocks held in a tier below the GPU (CPU offloading)."""
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
        medium: str | None = None,
    ) -> None:
        ours = self._ours.setdefault(engine, {})
        if not token_ids:
            self._stored_by_hash(engine, ours, block_hashes, block_size, medium)
            return
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
            index = self.index if is_gpu(medium) else self.lower
            index.set_capacity(engine, _UNLIMITED)
            index.record(engine, added, len(added) * block_size, block_size)

    def _stored_by_hash(
        self,
        engine: str,
        ours: dict[Hashable, int],
        block_hashes: Sequence[Hashable],
        block_size: int,
        medium: str | None,
    ) -> None:
        known = [ours[h] for h in block_hashes if h in ours]
        self.unplaced += len(block_hashes) - len(known)
        if known:
            index = self.index if is_gpu(medium) else self.lower
            index.set_capacity(engine, _UNLIMITED)
            index.record(engine, known, len(known) * block_size, block_size)

    def removed(self, engine: str, block_hashes: Sequence[Hashable], medium: str | None = None) -> None:
        ours = self._ours.get(engine)
        if not ours:
            return
        named = [h for h in block_hashes if h in ours]
        (self.index if is_gpu(medium) else self.lower).remove(engine, [ours[h] for h in named])
        for h in named:  # the engine's hash names the block while a tier holds it (a chain may go on from it)
            if not self.index.holds(engine, ours[h]) and not self.lower.holds(engine, ours[h]):
                del ours[h]

    def cleared(self, engine: str) -> None:
        self._ours.pop(engine, None)
        self.index.clear(engine)
        self.lower.clear(engine)

    def blocks(self, engine: str) -> int:
        return len(self._ours.get(engine, ()))
