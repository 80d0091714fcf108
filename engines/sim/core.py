"""The engine model: vLLM v1's scheduler over a paged KV cache, with time passed in.

Pure: no asyncio, no clock, no I/O. Both drivers (the real-time HTTP server and a virtual-time
simulator) use it the same way::

    core = EngineCore(load_profile("tiny-cpu"), model="tiny")
    core.add_request(EngineRequest("r1", prompt_tokens=1000, block_hashes=hashes, max_tokens=64), now)
    while core.has_work:
        result = core.step(now)        # schedule and execute one engine step starting at ``now``
        now += result.duration_s       # its tokens exist at ``now + duration_s``
        deliver(result.outputs)        # [(id, n_new_tokens, first_token, finished, finish_reason)]

``step`` advances the state to the end of the step at once; a driver delivers its outputs when
the step's time is over. ``abort`` between steps drops a request that has not finished yet.

Scheduling rules (after ``vllm/v1/core/sched/scheduler.py``):
- A step has a budget of ``max_num_batched_tokens`` tokens. Running requests are served first, in
  the order they were admitted, each asking for all its uncomputed tokens (1 when decoding, ``1 + k``
  with ``k`` speculative tokens); then waiting requests are admitted while fewer than
  ``max_num_seqs`` run and budget is left: FCFS in arrival order, or with the ``priority`` policy by
  ``(priority, arrival)``, lower first. The head of the queue blocks the rest (no skipping).
- A prompt that does not fit in the remaining budget is prefilled in chunks over several steps; a
  request emits its first token in the step that computes its last prompt token. As vLLM's
  ``vllm:iteration_tokens_total``, a step counts the tokens it generated and the prompts of the
  requests whose first token it made; a step that outputs nothing (chunks only) counts nothing.
- On admission the longest cached prefix of the request's block hashes is reused, but never the
  last token: a fully cached prompt still computes its last token (hits are whole blocks of at most
  ``num_tokens - 1`` tokens). ``prefix_cache_queries`` grows by the request's tokens and
  ``prefix_cache_hits`` by the reused tokens, on first admission only (as vLLM's counters).
- Blocks are allocated for the tokens scheduled (plus lookahead for speculative tokens) and become
  hashed, hence hittable, as soon as they are scheduled full. Generated tokens fill blocks too.
- When a running request cannot get the blocks it needs, a victim is preempted (recompute: its
  blocks are freed, its progress reset, it goes back to the front of the waiting queue): the last
  admitted running request (FCFS) or the lowest priority, latest arrival (priority). If the victim
  is the request itself, the running pass stops. Admission of waiting requests is skipped in a step
  that preempted.
- A request finishes with ``length`` at ``max_tokens`` (or ``max_model_len``), with ``stop`` at its
  natural end ``eos_at`` (not before ``min_tokens``, never with ``ignore_eos``), or with ``abort``.
- ``priority`` is ignored under the FCFS policy (as vLLM).
- Engines that share a ``SharedDevice`` (several engines on one GPU) take turns on it: a step's
  device part starts when the device is free (in the order the steps asked for it) and after its
  host part, or with it when the profile's host overlaps the device; the step ends when both have.
  A profile's serial and mixed-step costs come first, its step tail (drawn from the engine's
  seeded RNG, one draw per step) last.
- LoRA (``enable_lora``): a step's batch holds at most ``max_loras`` distinct adapters. Running
  requests are scheduled as above; a waiting request whose adapter is not among those already
  scheduled in this step while ``max_loras`` are is skipped (it keeps its place in the queue and
  counts as waiting for reason ``deferred`` until it is scheduled) and admission goes on with the
  next one. Each step brings its adapters into GPU slots (``lora.LoraSlots``) and its time grows by
  the profile's ``LoraCosts``; an adapter loaded by the API between steps is paid for by the next
  step. Block hashes of a LoRA request are keyed by the adapter's name and path, so one adapter's
  cached blocks are never hits for another or for the base model. At the end of every step the
  ``vllm:lora_requests_info`` label values are recorded with the step's end time (``lora_info``).
- CPU KV tier (``kv_offloading_blocks``, ``cpu_tier``): a waiting request's lookup goes on into the tier
  past its GPU hit; a CPU hit gets GPU blocks for both hits and waits (``loading``, counted as waiting
  for reason ``deferred``) while its blocks are copied back, then returns to the front of the queue
  with those tokens computed, their blocks in the GPU prefix cache. Every step offers the blocks its
  requests filled to the tier; the copies end after the step. A step that can schedule nothing while
  a load is under way lasts until the first load ends; one that can schedule nothing with no load under
  way first frees the blocks loaded requests hold while they wait (``_give_back_loaded_blocks``), as the
  only way forward. ``prefix_cache_hits`` stays the GPU's; the tier's hits count in
  ``external_prefix_cache_hits`` and in the request's cached tokens.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from priority_gateway.core.kv_events import KVEvent
from priority_gateway.engines.sim import tokens
from priority_gateway.engines.sim.cpu_tier import CpuTier, Offloader, transfer_s_per_block
from priority_gateway.engines.sim.kv_cache import BlockOwner, KVCache, TokenIdsOf
from priority_gateway.engines.sim.lora import (
    RUNNING_EVENT,
    WAITING_EVENT,
    Applied,
    LoraAdapter,
    LoraRequestStates,
    LoraSlots,
)
from priority_gateway.engines.sim.profile import Profile
from priority_gateway.engines.sim.stats import EngineStats, RequestTimes

FCFS = "fcfs"
PRIORITY = "priority"
_CLOCK_SLACK_S = 1e-9
LORA_INFO_SERIES = 256
"""At most this many ``vllm:lora_requests_info`` label sets are kept (vLLM keeps every one it ever
set); the least recently set goes first, so the newest series, the one readers take, is always there."""


@dataclass(slots=True, eq=False)
class EngineRequest:
    id: str
    prompt_tokens: int
    block_hashes: list[int]
    max_tokens: int
    priority: int = 0
    arrival: float = 0.0
    """Set by ``add_request`` to the time it is given."""
    min_tokens: int = 0
    ignore_eos: bool = False
    eos_at: int | None = None
    """Output length at which the model emits EOS (``None``: never)."""
    prompt_token_ids: Sequence[int] | None = None
    """Only for the token ids of ``BlockStored`` events; made up from block hashes when absent."""
    lora: LoraAdapter | None = None
    """The adapter that serves the request (``None``: the base model)."""
    cache_salt: str | None = None
    """Only for the extra keys of ``BlockStored`` events (the hashes already carry the salt)."""
    output_block_hashes: Sequence[int] = ()
    """Hashes of the blocks the reply fills past the prompt, when the caller knows its tokens (a
    conversation's next turn carries them): vLLM hashes generated blocks by their tokens, so that
    turn hits them. Past these, generated blocks get hashes of their own."""


class StepOutput(NamedTuple):
    request_id: str
    new_tokens: int
    first_token: bool
    finished: bool
    finish_reason: str | None
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache (set on the first-token output)."""


@dataclass(slots=True)
class StepResult:
    duration_s: float
    outputs: list[StepOutput] = field(default_factory=list)
    prefill_tokens: int = 0
    decode_seqs: int = 0
    scheduled_tokens: int = 0
    preempted: list[str] = field(default_factory=list)
    kv_events: list[KVEvent] = field(default_factory=list)
    lora_swaps: int = 0
    """Adapters copied into a GPU slot for this step."""
    lora_loads: int = 0
    """Adapters read from disk (not in the CPU cache) for this step."""


WAITING, RUNNING, FINISHED, LOADING = 0, 1, 2, 3


@dataclass(slots=True)
class SharedDevice:
    """One GPU several engines run on: when its current work ends."""

    free_at: float = 0.0

    def run(self, ready: float, seconds: float) -> float:
        """Device work of ``seconds`` that can start at ``ready``; when it ends."""
        self.free_at = max(ready, self.free_at) + seconds
        return self.free_at


@dataclass(slots=True, eq=False)
class _Seq:
    req: EngineRequest
    order: int
    times: RequestTimes
    status: int = WAITING
    num_computed: int = 0
    num_output: int = 0
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    num_hashed: int = 0
    num_offered: int = 0
    """Blocks offered to the CPU tier so far (vLLM's next block to store)."""
    loading: list[int] = field(default_factory=list)
    """Hashes of the blocks being loaded from the CPU tier."""
    loaded_at: float = 0.0
    """When that load ends."""
    counted: bool = False
    """Its prefix lookup is in the counters (they count a request once)."""
    stop_at: int = 0
    rng: random.Random | None = None
    lora_events: list[int] | None = None
    """Engine events not yet delivered with an output (``vllm:lora_requests_info`` bookkeeping)."""

    @property
    def num_tokens(self) -> int:
        return self.req.prompt_tokens + self.num_output

    def sort_key(self) -> tuple[int, float, int]:
        return (self.req.priority, self.req.arrival, self.order)

    def __lt__(self, other: _Seq) -> bool:
        return self.sort_key() < other.sort_key()


class EngineCore:
    def __init__(
        self,
        profile: Profile,
        *,
        model: str = "sim-model",
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        block_size: int | None = None,
        num_blocks: int | None = None,
        max_model_len: int | None = None,
        enable_prefix_caching: bool | None = None,
        scheduling_policy: str = FCFS,
        seed: int = 0,
        kv_events: bool = False,
        device: SharedDevice | None = None,
        enable_lora: bool = False,
        max_loras: int = 1,
        max_cpu_loras: int | None = None,
        max_lora_rank: int = 16,
        kv_offloading_blocks: int | None = None,
    ) -> None:
        if scheduling_policy not in (FCFS, PRIORITY):
            raise ValueError(f"scheduling_policy must be {FCFS!r} or {PRIORITY!r}")
        self.profile = profile = profile.with_overrides(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            block_size=block_size,
            num_blocks=num_blocks,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            kv_offloading_blocks=kv_offloading_blocks,
        )
        self.model = model
        self.device = device
        self.scheduling_policy = scheduling_policy
        self.seed = seed
        self.block_size = profile.block_size
        self.max_num_seqs = profile.max_num_seqs
        self.max_num_batched_tokens = profile.max_num_batched_tokens
        self.max_model_len = min(profile.max_model_len, profile.num_blocks * profile.block_size)
        self.spec_k = profile.speculative.num_speculative_tokens
        self.kv_events: list[KVEvent] | None = [] if kv_events else None
        self.cache = KVCache(profile.num_blocks, profile.block_size, profile.enable_prefix_caching, self.kv_events)
        self.offload: Offloader | None = None
        if profile.kv_offloading_blocks:
            if not profile.enable_prefix_caching:
                raise ValueError("the CPU KV tier needs prefix caching (blocks are found by their hashes)")
            tier = CpuTier(profile.kv_offloading_blocks, profile.block_size, self.kv_events)
            self.offload = Offloader(tier, transfer_s_per_block(profile.kv_bytes_per_token, profile.block_size))
        self._loading: list[_Seq] = []
        self.stats = EngineStats(self.max_model_len)
        self._seqs: dict[str, _Seq] = {}
        self._running: list[_Seq] = []
        self._fcfs: deque[_Seq] = deque()
        self._heap: list[_Seq] = []
        self._order = 0
        self._deferred: set[_Seq] = set()
        self.lora_slots = LoraSlots(max_loras, max_cpu_loras) if enable_lora else None
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.lora_states = LoraRequestStates()
        self.lora_info: dict[tuple[str, str], float] = {}
        """``(running_lora_adapters, waiting_lora_adapters)`` -> end time of the last step that had them."""
        self._pending_lora_s = 0.0
        # Its own stream, so that the tail does not shift the speculative draws (and back).
        self._tail_rng = random.Random(f"step-tail/{seed}") if profile.timing.tail_quantiles_ms else None

    # -- gauges ----------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._seqs) - len(self._running)

    @property
    def loaded_loras(self) -> list[str]:
        """Names of the adapters in GPU slots, least recently used first (none without LoRA)."""
        return [a.name for a in self.lora_slots.active] if self.lora_slots is not None else []

    @property
    def lora_swaps(self) -> int:
        """Adapters copied into a GPU slot so far (at start, by the API and by steps)."""
        return self.lora_slots.swaps if self.lora_slots is not None else 0

    @property
    def num_waiting_deferred(self) -> int:
        """Waiting requests held by a transient constraint (the LoRA budget, a load from the CPU tier),
        as vLLM's ``deferred``."""
        return len(self._deferred) + len(self._loading)

    @property
    def kv_cache_usage(self) -> float:
        return self.cache.usage

    @property
    def has_work(self) -> bool:
        return bool(self._seqs)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._seqs

    # -- requests ----------------------------------------------------------------

    def add_request(self, req: EngineRequest, now: float) -> None:
        if req.id in self._seqs:
            raise ValueError(f"duplicate request id {req.id!r}")
        if req.prompt_tokens < 1:
            raise ValueError("a request needs at least one prompt token")
        if req.prompt_tokens >= self.max_model_len:
            raise ValueError(f"prompt of {req.prompt_tokens} tokens does not fit max_model_len {self.max_model_len}")
        if req.lora is not None:
            self._check_lora(req.lora)
        req.arrival = now
        self._order += 1
        seq = _Seq(req, self._order, RequestTimes(arrival=now, max_tokens=req.max_tokens))
        seq.hashes = list(req.block_hashes[: req.prompt_tokens // self.block_size])
        if req.lora is not None:
            seq.hashes = tokens.keyed_block_hashes(seq.hashes, f"{req.lora.name}\0{req.lora.path}")
            seq.lora_events = [WAITING_EVENT]
        seq.stop_at = min(req.max_tokens, self.max_model_len - req.prompt_tokens)
        if self.spec_k:
            seq.rng = random.Random(tokens.prompt_seed(req.id, self.seed))
        self._seqs[req.id] = seq
        self._enqueue(seq)

    # -- LoRA adapters -------------------------------------------------------------

    def _check_lora(self, adapter: LoraAdapter) -> None:
        if self.lora_slots is None:
            raise ValueError("LoRA is not enabled. Use --enable-lora to enable LoRA.")
        if adapter.rank > self.max_lora_rank:
            raise ValueError(f"LoRA rank {adapter.rank} is greater than max_lora_rank {self.max_lora_rank}.")

    def add_lora(self, adapter: LoraAdapter, replace: bool = False) -> None:
        """Load an adapter into the CPU cache and a GPU slot (vLLM's ``add_lora``); the next step pays for it."""
        self._check_lora(adapter)
        assert self.lora_slots is not None
        self._pending_lora_s += self._lora_cost_s(self.lora_slots.preload(adapter, replace))

    def _lora_cost_s(self, applied: Applied) -> float:
        costs = self.profile.lora
        ms = sum(costs.load_ms * costs.scale(a.rank) for a in applied.loaded)
        ms += sum(costs.swap_in_ms * costs.scale(a.rank) for a in applied.swapped_in)
        return ms / 1000.0

    def _lora_step_s(self, scheduled: list[tuple[_Seq, int]], result: StepResult) -> float:
        assert self.lora_slots is not None
        adapters: dict[int, LoraAdapter] = {}
        lora_tokens = 0
        for seq, n in scheduled:
            adapter = seq.req.lora
            if adapter is not None:
                adapters.setdefault(adapter.int_id, adapter)
                lora_tokens += n
        if not adapters:
            return 0.0
        applied = self.lora_slots.apply(list(adapters.values()))
        result.lora_swaps = len(applied.swapped_in)
        result.lora_loads = len(applied.loaded)
        costs = self.profile.lora
        return self._lora_cost_s(applied) + (costs.step_overhead_ms + costs.ms_per_lora_token * lora_tokens) / 1000.0

    def _lora_event(self, seq: _Seq, event: int) -> None:
        if seq.lora_events is not None:
            seq.lora_events.append(event)

    def _record_lora_info(self, end: float) -> None:
        labels = self.lora_states.labels()
        info = self.lora_info
        if labels not in info and len(info) >= LORA_INFO_SERIES:
            del info[min(info, key=info.__getitem__)]
        info[labels] = end

    # -- requests (continued) ----------------------------------------------------------

    def abort(self, request_id: str, now: float) -> bool:
        """Drop a request that has not finished; ``False`` if it is unknown or already done."""
        seq = self._seqs.get(request_id)
        if seq is None:
            return False
        if seq.status == RUNNING:
            self._running.remove(seq)
        elif seq.status == LOADING:
            self._loading.remove(seq)
            assert self.offload is not None
            self.offload.tier.complete_load(seq.loading)
        else:
            self._dequeue(seq)
        self._finish(seq, "abort", now)
        return True

    def _enqueue(self, seq: _Seq, front: bool = False) -> None:
        seq.status = WAITING
        if self.scheduling_policy == PRIORITY:
            heapq.heappush(self._heap, seq)
        elif front:
            self._fcfs.appendleft(seq)
        else:
            self._fcfs.append(seq)

    def _dequeue(self, seq: _Seq) -> None:
        if self.scheduling_policy == PRIORITY:
            self._heap.remove(seq)
            heapq.heapify(self._heap)
        else:
            self._fcfs.remove(seq)

    def _peek_waiting(self) -> _Seq | None:
        if self.scheduling_policy == PRIORITY:
            return self._heap[0] if self._heap else None
        return self._fcfs[0] if self._fcfs else None

    def _pop_waiting(self) -> None:
        if self.scheduling_policy == PRIORITY:
            heapq.heappop(self._heap)
        else:
            self._fcfs.popleft()

    # -- one engine step -------------------------------------------------------

    def step(self, now: float) -> StepResult:
        if self.offload is not None:
            self.offload.finish_stores(now)
            self._finish_loads(now)
        scheduled, preempted = self._schedule(now)
        if not scheduled and not self._loading and self._give_back_loaded_blocks():
            scheduled, preempted = self._schedule(now)
        result = StepResult(0.0, preempted=[s.req.id for s in preempted])
        if not scheduled:
            if self._loading:  # nothing to run until a load ends: the engine waits for it
                result.duration_s = max(0.0, min(s.loaded_at for s in self._loading) - now)
            self._drain_events(result)
            return result
        prefill = decode_tokens = decode_seqs = context = 0
        pairs = 0.0
        spec_in_step = False
        for seq, n in scheduled:
            context += seq.num_computed + n
            if seq.num_tokens - seq.num_computed > 1:
                prefill += n
                pairs += n * (seq.num_computed + n / 2)
            else:
                decode_tokens += n
                decode_seqs += 1
                spec_in_step = spec_in_step or n > 1
        timing = self.profile.timing
        host, device = timing.split_s(prefill, decode_tokens, len(scheduled), context, pairs)
        if spec_in_step:
            host *= self.profile.speculative.verify_cost_factor
            device *= self.profile.speculative.verify_cost_factor
        serial = timing.serial_s(prefill, decode_seqs)
        start = now + serial
        if self.device is not None:
            ready = start if timing.host_overlaps_device else start + host
            duration = serial + max(host, self.device.run(ready, device) - start)
        else:
            duration = serial + (max(host, device) if timing.host_overlaps_device else host + device)
        if self._tail_rng is not None:
            duration += timing.tail_s(self._tail_rng.random())
        if self.lora_slots is not None:
            duration += self._pending_lora_s + self._lora_step_s(scheduled, result)
            self._pending_lora_s = 0.0
        end = now + duration
        if self.offload is not None:
            for seq, _ in scheduled:
                self._offer(seq, end)
        result.duration_s = duration
        result.prefill_tokens = prefill
        result.decode_seqs = decode_seqs
        result.scheduled_tokens = prefill + decode_tokens
        # As vLLM counts a step's tokens: those generated, and the prompts computed of the requests whose
        # first token it made; a step of prefill chunks that are not the last outputs nothing, counts nothing.
        counted = 0
        for seq, n in scheduled:
            output = self._advance(seq, n, end)
            if output is not None:
                result.outputs.append(output)
                counted += output.new_tokens
                if output.first_token:
                    counted += seq.req.prompt_tokens - output.cached_tokens
        if result.outputs:
            self.stats.iteration_tokens.observe(counted)
        if self.lora_slots is not None:
            self._record_lora_info(end)
        self._drain_events(result)
        return result

    def _drain_events(self, result: StepResult) -> None:
        if self.kv_events:
            result.kv_events = self.kv_events[:]
            self.kv_events.clear()

    def _schedule(self, now: float) -> tuple[list[tuple[_Seq, int]], list[_Seq]]:
        budget = self.max_num_batched_tokens
        scheduled: dict[_Seq, int] = {}
        preempted: list[_Seq] = []
        running = self._running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            want = seq.num_tokens - seq.num_computed
            lookahead = 0
            if want == 1 and self.spec_k and seq.num_output > 0:
                lookahead = min(self.spec_k, budget - 1, seq.stop_at - seq.num_output - 1)
                want += max(0, lookahead)
            n = min(want, budget)
            victim = None
            while not self._allocate(seq, n):
                victim = self._pick_victim()
                if victim in scheduled:
                    budget += scheduled.pop(victim)
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if victim is seq:
                break
            scheduled[seq] = n
            budget -= n
            # Victims may have been taken from before this request (priority policy).
            i = i + 1 if victim is None else running.index(seq) + 1
        if not preempted:
            loras = {s.req.lora.int_id for s in scheduled if s.req.lora is not None}
            skipped: list[_Seq] = []
            while budget > 0 and len(running) < self.max_num_seqs:
                waiting = self._peek_waiting()
                if waiting is None:
                    break
                seq = waiting
                lora = seq.req.lora
                if lora is not None and len(loras) >= self.max_loras and lora.int_id not in loras:
                    self._pop_waiting()
                    skipped.append(seq)
                    self._deferred.add(seq)
                    continue
                if seq.blocks:  # back from a CPU load: its blocks are held, its tokens computed
                    hit: list[int] = []
                    cached = seq.num_computed
                else:
                    hit = self.cache.find_prefix(seq.hashes, (seq.num_tokens - 1) // self.block_size)
                    cached = len(hit) * self.block_size
                    from_cpu = self._cpu_hit(seq, len(hit))
                    if from_cpu:
                        if not self.cache.can_allocate(from_cpu, hit):
                            break
                        self._start_load(seq, hit, from_cpu, now)
                        continue
                n = min(seq.num_tokens - cached, budget)
                if not self.cache.can_allocate(self._blocks_needed(cached + n, len(seq.blocks) + len(hit)), hit):
                    break
                if lora is not None:
                    loras.add(lora.int_id)
                self._admit(seq, hit, n, now)
                scheduled[seq] = n
                budget -= n
            for seq in reversed(skipped):
                self._enqueue(seq, front=True)
        return list(scheduled.items()), preempted

    def _admit(self, seq: _Seq, hit: list[int], n: int, now: float) -> None:
        """The head of the queue runs: ``hit`` (its GPU prefix hit) and blocks for ``n`` more tokens are its own."""
        self._pop_waiting()
        self._deferred.discard(seq)
        self._lora_event(seq, RUNNING_EVENT)
        if hit:
            self.cache.touch(hit)
            seq.blocks = list(hit)
            seq.num_hashed = len(hit)
            seq.num_computed = len(hit) * self.block_size
        self._record_lookup(seq, seq.num_computed, 0)  # counted already if it was loaded from the CPU tier
        self._allocate(seq, n)
        seq.status = RUNNING
        self._running.append(seq)
        if seq.times.scheduled is None:
            seq.times.scheduled = now

    def _record_lookup(self, seq: _Seq, local: int, external: int) -> None:
        """Count a request's prefix lookup, on its first admission only (as vLLM's counters)."""
        times = seq.times
        if seq.counted:
            return
        seq.counted = True
        times.cached_tokens = local + external
        times.external_tokens = external
        stats = self.stats
        stats.prefix_cache_queries += seq.num_tokens
        stats.prefix_cache_hits += local
        if self.offload is not None:
            stats.external_prefix_cache_queries += seq.num_tokens - local
            stats.external_prefix_cache_hits += external

    # -- the CPU tier ----------------------------------------------------------

    def _cpu_hit(self, seq: _Seq, gpu_blocks: int) -> int:
        """Blocks of ``seq`` the CPU tier holds right after its GPU hit (never its last token)."""
        offload = self.offload
        if offload is None:
            return 0
        offload.tier.touch(seq.hashes)
        usable = min((seq.num_tokens - 1) // self.block_size, len(seq.hashes))
        if gpu_blocks >= usable:
            return 0
        return offload.tier.lookup(seq.hashes[gpu_blocks:usable])

    def _start_load(self, seq: _Seq, hit: list[int], from_cpu: int, now: float) -> None:
        """The head of the queue waits for ``from_cpu`` blocks past its GPU ``hit`` to come back from the tier."""
        assert self.offload is not None
        self._pop_waiting()
        self._deferred.discard(seq)
        self.cache.touch(hit)
        seq.blocks = list(hit) + self.cache.allocate(from_cpu)
        seq.num_hashed = len(hit)
        seq.num_computed = len(seq.blocks) * self.block_size
        seq.num_offered = len(seq.blocks)  # the loaded blocks are in the tier already
        seq.loading = seq.hashes[len(hit) : len(seq.blocks)]
        seq.loaded_at = self.offload.load(seq.loading, now)
        seq.status = LOADING
        self._loading.append(seq)
        self._record_lookup(seq, len(hit) * self.block_size, from_cpu * self.block_size)

    def _finish_loads(self, now: float) -> None:
        """Requests whose blocks are back on the GPU go to the front of the queue, those blocks cached."""
        assert self.offload is not None
        # The step that waited for a load ends at ``now + (loaded_at - now)``, which rounding may put a hair early.
        done = [s for s in self._loading if s.loaded_at <= now + _CLOCK_SLACK_S]
        for seq in reversed(done):
            self._loading.remove(seq)
            self.offload.tier.complete_load(seq.loading)
            self._hash_blocks(seq, len(seq.blocks))
            seq.loading = []
            self._enqueue(seq, front=True)

    def _give_back_loaded_blocks(self) -> bool:
        """Free the blocks that loaded requests hold while they wait; whether any did.

        vLLM's requests keep them until they run, so loads that together hold the GPU's blocks can leave
        the first in line without room and nothing running to free any: there the simulator lets them go.
        They stay hashed, so the requests' next lookup finds them in the GPU prefix cache."""
        held = [s for s in self._seqs.values() if s.status == WAITING and s.blocks]
        for seq in held:
            self.cache.free(seq.blocks)
            seq.blocks = []
            seq.num_hashed = 0
            seq.num_computed = 0
        return bool(held)

    def _offer(self, seq: _Seq, start: float) -> None:
        """Offer the tier the blocks ``seq`` has filled since its last offer; the copy starts at ``start``."""
        assert self.offload is not None
        if seq.num_hashed <= seq.num_offered:
            return
        if self.offload.store(seq.hashes[seq.num_offered : seq.num_hashed], start):
            seq.num_offered = seq.num_hashed
            self.offload.tier.touch(seq.hashes[: seq.num_hashed])

    def _blocks_needed(self, tokens_after: int, held: int) -> int:
        return max(0, -(-tokens_after // self.block_size) - held)

    def _allocate(self, seq: _Seq, n: int) -> bool:
        """Blocks for ``n`` more tokens of ``seq`` (and hashes for the ones that become full)."""
        needed = self._blocks_needed(seq.num_computed + n, len(seq.blocks))
        if needed:
            if needed > self.cache.num_free:
                return False
            seq.blocks.extend(self.cache.allocate(needed))
        full = min(seq.num_computed + n, seq.num_tokens) // self.block_size
        self._hash_blocks(seq, min(full, len(seq.hashes)))
        return True

    def _hash_blocks(self, seq: _Seq, upto: int) -> None:
        """Give ``seq``'s blocks up to ``upto`` (full now) their hashes: GPU prefix-cache hits from now on."""
        if upto <= seq.num_hashed:
            return
        token_ids_of = owner = None
        if self.kv_events is not None:
            token_ids_of = self._token_ids_of(seq)
            owner = _owner(seq.req)
        self.cache.cache_blocks(seq.blocks, seq.hashes, seq.num_hashed, upto, token_ids_of, owner)
        seq.num_hashed = upto

    def _token_ids_of(self, seq: _Seq) -> TokenIdsOf:
        ids = seq.req.prompt_token_ids
        bs = self.block_size
        prompt_blocks = seq.req.prompt_tokens // bs

        def token_ids_of(index: int, block_hash: int) -> list[int]:
            if ids is not None and index < prompt_blocks and len(ids) >= (index + 1) * bs:
                return list(ids[index * bs : (index + 1) * bs])
            return tokens.synthetic_token_ids(block_hash, bs)

        return token_ids_of

    def _pick_victim(self) -> _Seq:
        if self.scheduling_policy == PRIORITY:
            victim = max(self._running, key=_Seq.sort_key)
            self._running.remove(victim)
            return victim
        return self._running.pop()

    def _preempt(self, seq: _Seq) -> None:
        self.cache.free(seq.blocks)
        seq.blocks = []
        seq.num_hashed = 0
        seq.num_computed = 0
        seq.times.preemptions += 1
        self.stats.preemptions += 1
        self._lora_event(seq, WAITING_EVENT)
        self._enqueue(seq, front=True)

    def _advance(self, seq: _Seq, n: int, end: float) -> StepOutput | None:
        before = seq.num_tokens
        seq.num_computed += n
        if seq.num_computed < before:
            return None  # a prefill chunk that is not the last one
        new = 1
        if n > 1 and seq.num_computed > before and seq.rng is not None:
            # Speculative tokens: each accepted until the first rejection.
            drafts = seq.num_computed - before
            accepted = 0
            rate = self.profile.speculative.acceptance_rate
            while accepted < drafts and seq.rng.random() < rate:
                accepted += 1
            new += accepted
            seq.num_computed = before  # rejected drafts are not in the KV cache
            seq.num_computed += accepted
        new, reason = self._stop(seq, new)
        if seq.lora_events:
            self._deliver_lora_events(seq)
        first = seq.num_output == 0
        self._append_output(seq, new)
        stats = self.stats
        stats.generation_tokens += new
        times = seq.times
        if first:
            times.first_token = end
            stats.ttft.observe(end - times.arrival)
            stats.prompt_tokens += seq.req.prompt_tokens
            stats.prompt_tokens_cached += times.cached_tokens
            stats.prompt_tokens_external += times.external_tokens
            stats.prompt_tokens_computed += seq.req.prompt_tokens - times.cached_tokens
        elif times.last_token is not None:
            stats.itl.observe(end - times.last_token)
        times.last_token = end
        if reason is not None:
            self._running.remove(seq)
            self._finish(seq, reason, end)
        return StepOutput(seq.req.id, new, first, reason is not None, reason, times.cached_tokens if first else 0)

    def _stop(self, seq: _Seq, new: int) -> tuple[int, str | None]:
        req = seq.req
        total = seq.num_output + new
        if not req.ignore_eos and req.eos_at is not None:
            eos = max(req.eos_at, req.min_tokens, 1)
            if eos <= seq.stop_at and total >= eos:
                return eos - seq.num_output, "stop"
        if total >= seq.stop_at:
            return seq.stop_at - seq.num_output, "length"
        return new, None

    def _append_output(self, seq: _Seq, new: int) -> None:
        seq.num_output += new
        full = seq.num_tokens // self.block_size
        known = seq.req.output_block_hashes
        prompt_blocks = seq.req.prompt_tokens // self.block_size
        while len(seq.hashes) < full:
            index = len(seq.hashes) - prompt_blocks
            if 0 <= index < len(known) and seq.req.lora is None:
                seq.hashes.append(known[index])
                continue
            parent = seq.hashes[-1] if seq.hashes else tokens.root_hash()
            seq.hashes.append(tokens.output_block_hash(parent, len(seq.hashes)))

    def _deliver_lora_events(self, seq: _Seq) -> None:
        assert seq.lora_events is not None and seq.req.lora is not None
        for event in seq.lora_events:
            self.lora_states.update(seq.req.id, seq.req.lora.name, event)
        seq.lora_events.clear()

    def _finish(self, seq: _Seq, reason: str, now: float) -> None:
        self._deferred.discard(seq)
        if seq.req.lora is not None:
            self.lora_states.update(seq.req.id, seq.req.lora.name, None)
        seq.status = FINISHED
        if seq.blocks:
            self.cache.free(seq.blocks)
            seq.blocks = []
        del self._seqs[seq.req.id]
        self.stats.record_finished(seq.times, reason, seq.req.prompt_tokens, seq.num_output, now)


def _owner(req: EngineRequest) -> BlockOwner | None:
    if req.lora is None and not req.cache_salt:
        return None
    lora = req.lora
    return BlockOwner(lora.int_id if lora else None, lora.name if lora else None, req.cache_salt)
