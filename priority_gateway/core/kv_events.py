"""vLLM's KV cache events as plain data: what an engine's prefix cache stored, removed or cleared.

One set of types for both ends of the wire: the simulator's KV cache records them and its
publisher encodes them as vLLM does; the gateway's subscriber decodes vLLM's messages into them;
precise prefix mode (``prefix_policy``, ``precise``) matches on them by type. They live in the
core, which imports nothing else, so the product never imports the simulator to know them.

Fields follow vLLM 0.32's ``BlockStored``/``BlockRemoved``/``AllBlocksCleared``: block hashes are
unsigned 64-bit ints (bytes when an engine runs with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``);
``extra_keys`` holds, per block, the untagged keys that went into its hash (the adapter's name,
the ``cache_salt`` on a prompt's first block).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BlockHash = int | bytes


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: Sequence[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: Sequence[int]
    block_size: int
    lora_id: int | None = None
    lora_name: str | None = None
    extra_keys: Sequence[Sequence[str] | None] | None = None
    medium: str | None = None
    group_idx: int | None = None

    @property
    def token_count(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: Sequence[BlockHash]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
