"""A CPU KV tier below the GPU prefix cache, after vLLM's native KV offloading (``--kv-offloading-size``).

What vLLM does, and what this module keeps of it. The ``OffloadingConnector`` came in vLLM 0.11
(v1 engine). ``--kv-offloading-size`` GiB with ``--kv-offloading-backend native`` configures it
(``cpu_bytes_to_use`` in ``kv_connector_extra_config``). The files named here are the 0.11-0.17
layout; later releases moved them under ``vllm/v1/kv_offload/cpu/`` (``spec.py``, ``manager.py``,
``policies/lru.py``) and ``kv_connector/v1/offloading/scheduler.py``, with the same rules.
- Size: ``CPUOffloadingSpec`` (``vllm/v1/kv_offload/cpu.py``) holds ``cpu_bytes_to_use // bytes per
  block`` blocks of the GPU's block size. Here: ``blocks_for_size`` with the profile's
  ``kv_bytes_per_token``, or a block count given outright.
- Store on compute, not on eviction: each step, the connector's scheduler side
  (``offloading_connector.py``, ``OffloadingConnectorScheduler._get_reqs_to_store``) offers every
  full block of each scheduled request from its next unstored one up to the step's computed tokens,
  prompt and output alike; ``LRUOffloadingManager.prepare_store`` (``vllm/v1/kv_offload/lru_manager.py``)
  skips the blocks it holds, evicts least recently used blocks that no load holds to make room
  (``BlockRemoved``, medium ``CPU``) or refuses the whole offer when it cannot (retried next step),
  and the copy runs after the step, asynchronously; ``complete_store`` makes the blocks hittable
  and reports them (``BlockStored``, medium ``CPU``, with no parent, token ids or adapter, as the
  connector's ``take_events`` builds it by default; recent releases can opt in to events carrying
  them, ``self_describing_kv_events``, not simulated). A block being stored is not a hit. After an
  offer, the request's blocks are touched (most recently used).
- Lookup after the GPU hit: ``get_num_new_matched_tokens`` touches all the request's block hashes,
  then counts the consecutive ready blocks from the first one past the GPU hit; a hit is loaded
  asynchronously: the scheduler allocates GPU blocks for the GPU hit and the CPU hit, parks the
  request in ``WAITING_FOR_REMOTE_KVS`` (counted as waiting, not running) and schedules it only in a
  step after the load finished (``prepare_load`` holds the CPU blocks against eviction until
  ``complete_load``). The loaded blocks enter the GPU prefix cache when the load ends
  (``cache_blocks`` in ``Scheduler._update_waiting_for_remote_kv``), so the GPU reports them stored.
- Counters: the scheduler records ``vllm:external_prefix_cache_queries`` (the request's tokens past
  its GPU hit) and ``vllm:external_prefix_cache_hits`` (the loaded tokens); ``vllm:prefix_cache_hits``
  stays the GPU's; a request's cached tokens (``usage.prompt_tokens_details``,
  ``vllm:prompt_tokens_cached``) are both, ``vllm:prompt_tokens_by_source`` splits them into
  ``local_cache_hit`` and ``external_kv_transfer``. The connector's own transfer metrics (later
  releases' ``OffloadPromMetrics``: bytes and time per transfer direction) are not simulated.

Transfer time, the simulator's own model: one DMA queue per direction, each copy taking
``transfer_s_per_block`` per block after the copies queued before it. A block of ``block_size``
tokens holds ``block_size * kv_bytes_per_token`` bytes, moved at ``PCIE_BYTES_PER_S``. What it leaves
out: the GPU blocks of a finished request are freed at once, not held until their copy ends (copies
take microseconds per block), and copies do not slow the steps they overlap (vLLM's DMA path was
chosen for that).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from priority_gateway.core.kv_events import BlockRemoved, BlockStored, KVEvent

CPU = "CPU"
"""The ``medium`` vLLM's CPU offloading names in its KV events (``CPULoadStoreSpec.medium()``)."""

GIB = 1 << 30

PCIE_BYTES_PER_S = 32e9
"""Host-device copy bandwidth, one direction: PCIe 4.0 x16's 16 GT/s x 16 lanes with 128b/130b
coding, about 31.5 GB/s (PCI-SIG). A PCIe 5.0 host (H100/H200 SXM) doubles the link; pinned-memory
copies reach only part of it, so the 4.0 link's figure stands for what a copy gets."""

FALLBACK_BYTES_PER_TOKEN = 131_072
"""KV bytes per token when the profile does not say: an 8B-class model in bf16 with grouped-query
attention (Llama 3.1 8B: 32 layers x 8 KV heads x 128 dims x K and V x 2 bytes)."""


def blocks_for_size(size_gib: float, bytes_per_token: int, block_size: int) -> int:
    """CPU blocks in ``size_gib`` GiB, as ``CPUOffloadingSpec``: whole blocks of the GPU's size."""
    if size_gib <= 0 or bytes_per_token <= 0 or block_size <= 0:
        raise ValueError("a KV offloading size needs a positive size, bytes per token and block size")
    return int(size_gib * GIB) // (bytes_per_token * block_size)


def transfer_s_per_block(bytes_per_token: int, block_size: int, bytes_per_s: float = PCIE_BYTES_PER_S) -> float:
    """Seconds to copy one block between GPU and CPU memory."""
    return block_size * (bytes_per_token or FALLBACK_BYTES_PER_TOKEN) / bytes_per_s


@dataclass(slots=True)
class _Entry:
    ready: bool = False
    """Stored (hittable); a block whose copy has not ended is neither a hit nor evictable."""
    loads: int = 0
    """Loads in flight that read it; it cannot be evicted while any does."""


class CpuTier:
    """Block hashes held in CPU memory, least recently used first (``LRUOffloadingManager``).

    Rules:
    - It never holds more than ``capacity`` blocks; a store that cannot make room is refused whole.
    - ``BlockStored``/``BlockRemoved`` with medium ``CPU`` go to ``events`` (when given) as blocks
      become ready and as they are evicted.
    """

    def __init__(self, capacity: int, block_size: int, events: list[KVEvent] | None = None) -> None:
        if capacity < 1:
            raise ValueError("a CPU tier needs at least one block")
        self.capacity = capacity
        self.block_size = block_size
        self.events = events
        self._blocks: OrderedDict[int, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        entry = self._blocks.get(block_hash)
        return entry is not None and entry.ready

    def lookup(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes``, from the first, are stored and ready."""
        hits = 0
        for block_hash in hashes:
            entry = self._blocks.get(block_hash)
            if entry is None or not entry.ready:
                break
            hits += 1
        return hits

    def touch(self, hashes: Sequence[int]) -> None:
        """Most recently used: the first of ``hashes`` last, so a chain's tail is evicted before its head."""
        blocks = self._blocks
        for block_hash in reversed(hashes):
            if block_hash in blocks:
                blocks.move_to_end(block_hash)

    def prepare_load(self, hashes: Sequence[int]) -> None:
        for block_hash in hashes:
            self._blocks[block_hash].loads += 1

    def complete_load(self, hashes: Sequence[int]) -> None:
        for block_hash in hashes:
            entry = self._blocks.get(block_hash)
            if entry is not None and entry.loads > 0:
                entry.loads -= 1

    def prepare_store(self, hashes: Sequence[int]) -> list[int] | None:
        """Room for the blocks of ``hashes`` not held yet; those blocks (to copy), or ``None`` when
        too few blocks can be evicted (nothing changes then)."""
        blocks = self._blocks
        new = [h for h in dict.fromkeys(hashes) if h not in blocks]
        excess = len(blocks) + len(new) - self.capacity
        evicted: list[int] = []
        if excess > 0:
            for block_hash, entry in blocks.items():
                if entry.ready and entry.loads == 0:
                    evicted.append(block_hash)
                    if len(evicted) == excess:
                        break
            else:
                return None
        for block_hash in evicted:
            del blocks[block_hash]
        if evicted and self.events is not None:
            self.events.append(BlockRemoved(evicted, medium=CPU))
        for block_hash in new:
            blocks[block_hash] = _Entry()
        return new

    def complete_store(self, hashes: Sequence[int]) -> None:
        stored = []
        for block_hash in hashes:
            entry = self._blocks.get(block_hash)
            if entry is not None and not entry.ready:
                entry.ready = True
                stored.append(block_hash)
        if stored and self.events is not None:
            self.events.append(BlockStored(stored, None, [], self.block_size, medium=CPU))


@dataclass(slots=True)
class _Copy:
    done_at: float
    hashes: list[int]


class Offloader:
    """A ``CpuTier`` with its copies in time: stores end (and become hits) after their transfer,
    loads tell when their blocks are on the GPU. One queue per direction, copies in order."""

    def __init__(self, tier: CpuTier, s_per_block: float) -> None:
        self.tier = tier
        self.s_per_block = s_per_block
        self._stores: list[_Copy] = []
        self._store_free_at = 0.0
        self._load_free_at = 0.0

    def store(self, hashes: Sequence[int], start: float) -> bool:
        """Offer computed blocks at ``start``; ``False`` when the tier has no room (offer them again later)."""
        new = self.tier.prepare_store(hashes)
        if new is None:
            return False
        if new:
            self._store_free_at = max(start, self._store_free_at) + len(new) * self.s_per_block
            self._stores.append(_Copy(self._store_free_at, new))
        return True

    def finish_stores(self, now: float) -> None:
        """Stores whose copy has ended by ``now`` become hits (``BlockStored``)."""
        done = 0
        for copy in self._stores:  # in order of their end: the queue copies one after another
            if copy.done_at > now:
                break
            self.tier.complete_store(copy.hashes)
            done += 1
        del self._stores[:done]

    def load(self, hashes: Sequence[int], now: float) -> float:
        """Start copying ``hashes`` back to the GPU at ``now``; when the copy ends."""
        self.tier.prepare_load(hashes)
        self._load_free_at = max(now, self._load_free_at) + len(hashes) * self.s_per_block
        return self._load_free_at
