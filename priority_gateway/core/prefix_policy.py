"""The ``prefix`` policy: send a request where its prompt prefix is cached, within a load bound.

Rules:
- Load bound (consistent hashing with bounded loads): an engine is eligible only while
  ``load + 1 <= ceil(load_factor * (total_load + 1) / n)``, load being requests in flight.
  The least loaded engine is always eligible, and no engine is ever chosen above the bound
  for a cache hit.
- A pinned session (``sessions.sources``) stays on its engine while that engine is eligible;
  otherwise the pin moves to wherever the request goes. A turn that continues a paused session
  (``RouteRequest.continuing``) stays within twice the load bound: its context is its own, so
  following it piles nobody else onto that engine, and moving it computes the whole context again.
- Each eligible engine gets a cost in prompt tokens: the prefill already queued on it
  (``queued_prefill``: this replica's, and what other replicas reported), plus this prompt, minus
  ``cache_weight`` times what it holds of the prompt in cache, plus ``decode_cost_tokens`` per
  request in flight, plus a penalty that grows with KV cache pressure. A cached token counts
  ``cache_weight`` times: a hit kept also serves the conversation's next turns, and work not
  repeated is capacity left for everyone; but a long enough queue still sends the request
  elsewhere, as waiting behind it costs more.
- Paused agent sessions' blocks count as held (``retention_weight``; ``sessions``): on an engine whose
  free KV blocks, less those its paused sessions hold (``sessions.retained``: bounded by its KV
  cache), cannot take this request's new blocks (its uncached prompt and its output), every held
  token it would push out costs ``retention_weight x cache_weight``: the session's next turn would
  compute it again. So cold prompts go where they evict no paused session while an engine has room,
  and a continuing turn (its session's hold released when it arrived) is not charged for its own.
- Tiers (precise mode): blocks past an engine's GPU hit that its CPU tier holds (vLLM's KV offloading,
  events with ``medium``) count ``lower_tier_weight`` of a cached token each: between a hit and a miss.
- Engines within ``tolerance`` of this prompt's size of the cheapest are equally good: among them the one holding
  the most of the prompt wins, then rendezvous hashing of the prompt's first distinctive
  blocks decides. So a prefix nobody has seen goes to the same engine from every replica
  (when loads are alike), and a conversation's later turns follow its first.
- The index holds what the engine's cache holds (``num_blocks`` x ``block_size`` tokens) plus the
  prompts routed there that the engine has not computed yet (``queued_prefill``): recorded at
  routing, they take no cache space until the engine gets to them, and under a queue the index
  would otherwise forget, ahead of the engine, what the engine still holds.
- The engines' real prefix-cache counters keep the index honest: an engine whose real
  hit ratio falls well below what the index predicted gets its modelled capacity shrunk
  (another gateway replica or tenant fills the same cache); a counter that goes backwards
  means the engine restarted with an empty cache. The engine counts a request's hits when
  it schedules it, so a prediction is weighed when the request has started, not when it
  was routed (under a queue the two sets differ and the index would shrink for nothing),
  and only over a sample of prompt tokens worth ``honesty_share`` of the engine's cache: a
  handful of long prompts says nothing about a cache of a million tokens.
- Replicas share what routing teaches the index (approximate mode; in precise mode routing
  teaches it nothing): once ``share`` is on, every record made by routing is also kept as a fact
  (``RoutedBlocks``) for ``take_learned``, at most ``max_pending`` of them (the oldest are dropped
  and counted when nobody takes them); ``learn`` applies another replica's fact as if this replica
  had routed the request itself.
- Prefill-aware (``prefill_chunk_tokens``, the engines' ``--max-num-batched-tokens``; 0: off): for a
  request with an ITL budget, each eligible engine's stall is predicted from the prompt's uncached
  part there (``priority_gateway.core.prefill``), and only the engines of the best rank stay
  candidates (keeping both budgets, else the fewest decoders' gaps broken); when none keeps the ITL
  budget and ``prefill_hold_s`` allows, the request is held (``choose`` returns None and ``holds``
  says so: the dispatcher queues it rather than stopping backfilled work for it; with admission on).
- LoRA (``lora_aware``): a request for an adapter goes only to engines with a free adapter slot
  for it (``priority_gateway.core.lora``) while any candidate has one, so no engine gets more distinct
  adapters at once than its ``max_lora`` while another has room; and an engine that must swap the
  adapter in costs ``lora_swap_tokens`` more than one that holds it.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from xxhash import xxh3_64_intdigest

from priority_gateway.core.affinity import AffinityIndex
from priority_gateway.core.classes import BATCH
from priority_gateway.core.engines import EngineState
from priority_gateway.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from priority_gateway.core.precise import PreciseIndex
from priority_gateway.core.prefill import PrefillModel
from priority_gateway.core.queue import DEFAULT_DECODE_TOKENS
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.routing import Choice, RoutedBlocks
from priority_gateway.core.sessions import kv_capacity_tokens, retained


@dataclass(slots=True)
class _Honesty:
    """Predicted versus real prefix-cache hits of one engine since the last scrape."""

    predicted_tokens: float = 0.0
    prompt_tokens: float = 0.0
    last_queries: float = -1.0
    """The counters when the current sample began."""
    last_hits: float = 0.0
    seen_queries: float = -1.0
    """The query counter at the previous scrape: one going back means a restart."""


def rendezvous_weight(key: int, engine_id: str) -> int:
    return xxh3_64_intdigest(engine_id.encode(), key)


class PrefixAffinity:
    name = "prefix"

    def __init__(
        self,
        load_factor: float = 2.0,
        cache_weight: float = 10.0,
        queue_weight: float = 1.0,
        decode_cost_tokens: float = 512.0,
        kv_cost_tokens: float = 4096.0,
        tolerance: float = 0.02,
        tolerance_tokens: float = 512.0,
        rendezvous_blocks: int = 8,
        default_capacity_tokens: int = 1 << 20,
        max_sessions: int = 100_000,
        precise: bool = False,
        honesty_share: float = 0.5,
        lora_aware: bool = True,
        lora_swap_tokens: float = 2048.0,
        prefill_chunk_tokens: int = 0,
        prefill_hold_s: float = 0.0,
        retention_weight: float = 1.0,
        lower_tier_weight: float = 0.5,
    ) -> None:
        if load_factor < 1.0:
            raise ValueError("load_factor must be at least 1")
        self.load_factor = load_factor
        self.cache_weight = cache_weight
        self.queue_weight = queue_weight
        self.decode_cost_tokens = decode_cost_tokens
        self.kv_cost_tokens = kv_cost_tokens
        self.tolerance = tolerance
        self.tolerance_tokens = tolerance_tokens
        self.rendezvous_blocks = rendezvous_blocks
        self.default_capacity_tokens = default_capacity_tokens
        self.honesty_share = honesty_share
        self.lora_aware = lora_aware
        self.lora_swap_tokens = lora_swap_tokens
        self.retention_weight = retention_weight
        self.lower_tier_weight = lower_tier_weight
        self.index = AffinityIndex(default_capacity_tokens)
        # Precise mode: the index holds what the engines' KV events say, nothing guessed.
        self.precise = PreciseIndex(self.index) if precise else None
        self._bound = 1
        self.sessions: OrderedDict[str, str] = OrderedDict()
        self.max_sessions = max_sessions
        self._honesty: dict[str, _Honesty] = {}
        self._modelled: dict[str, int] = {}
        self.predicted_tokens = 0.0
        self.prompt_tokens = 0.0
        # The highest (load after the choice) / (bound) seen: never above 1 by construction.
        self.max_bound_ratio = 0.0
        self._outbox: deque[RoutedBlocks] | None = None
        self.learned_dropped = 0
        self.prefill = PrefillModel(prefill_chunk_tokens, max_hold_s=prefill_hold_s) if prefill_chunk_tokens else None
        self._held: str | None = None
        self.prefill_held = 0
        self.prefill_steered = 0
        """Requests held, and requests kept off some candidate, by the prefill prediction."""

    # -- choice --------------------------------------------------------------------

    def eligible(self, candidates: Sequence[EngineState]) -> list[EngineState]:
        total = 0.0
        for engine in candidates:
            total += engine.load
        bound = math.ceil(self.load_factor * (total + 1) / len(candidates) - 1e-9)
        self._bound = bound
        return [e for e in candidates if e.load + 1 <= bound + 1e-9]

    def _relaxed(self, candidates: Sequence[EngineState]) -> list[EngineState]:
        """The candidates within twice the load bound (after ``eligible``)."""
        return [e for e in candidates if e.load + 1 <= 2 * self._bound + 1e-9]

    def choose(self, req: RouteRequest, candidates: Sequence[EngineState], now: float) -> Choice | None:
        self._held = None
        if not candidates:
            return None
        eligible = self.eligible(candidates)
        adapter = req.adapter if self.lora_aware else None
        if adapter is not None:
            eligible = _with_slot(adapter, eligible, candidates)
        prefix = req.prefix
        depths = self.index.match(prefix, [e.id for e in eligible]) if prefix else [0] * len(eligible)
        cached = [self._cached_tokens(req, d) for d in depths]
        if self.precise is not None and prefix:
            cached = self._with_lower_tier(req, eligible, depths, cached)
        if self.prefill is not None and req.budget.itl_s is not None:
            keep = self._prefill_keep(req, eligible, cached, now)
            if keep is None:
                self._held = req.id
                self.prefill_held += 1
                return None
            if len(keep) < len(eligible):
                self.prefill_steered += 1
                eligible, depths, cached = (
                    [eligible[i] for i in keep],
                    [depths[i] for i in keep],
                    [cached[i] for i in keep],
                )
        if req.session is not None:
            pinned = self._session_engine(req.session, req, candidates, eligible)
            if pinned is not None:
                return pinned
        costs, resident = self._costs(req, eligible, cached, adapter)
        cheapest = min(costs)
        slack = max(self.tolerance_tokens, self.tolerance * req.prompt_tokens)
        floor = min(cached)
        distinct = min(len(prefix), min(depths) + self.rendezvous_blocks) if prefix else 0
        key = prefix[distinct - 1] if distinct else 0
        best: tuple[int, bool, int] | None = None
        chosen = near = 0
        for i, engine in enumerate(eligible):
            if costs[i] > cheapest + slack:
                continue
            near += 1
            rank = (cached[i], resident[i], rendezvous_weight(key, engine.id))
            if best is None or rank > best:
                best, chosen = rank, i
        self.max_bound_ratio = max(self.max_bound_ratio, (eligible[chosen].load + 1) / self._bound)
        if cached[chosen] > floor:
            reason = "affinity"
        elif adapter is not None and resident[chosen] and not all(resident):
            reason = "adapter"
        elif near > 1:
            reason = "rendezvous"
        else:
            reason = "least_cost"
        return Choice(eligible[chosen], cached[chosen], reason)

    def _session_engine(
        self, session: str, req: RouteRequest, candidates: Sequence[EngineState], eligible: list[EngineState]
    ) -> Choice | None:
        """The engine the request's session last ran on, while within the load bound (twice the bound
        for a turn that continues a paused session, whose KV waits there)."""
        pinned = self.sessions.get(session)
        if pinned is None:
            return None
        prefix = req.prefix
        for engine in self._relaxed(candidates) if req.continuing else eligible:
            if engine.id == pinned:
                depth = self.index.match(prefix, [engine.id])[0] if prefix else 0
                return Choice(engine, self._cached_tokens(req, depth), "session")
        return None

    def _costs(
        self, req: RouteRequest, eligible: list[EngineState], cached: list[int], adapter: str | None
    ) -> tuple[list[float], list[bool]]:
        """Each eligible engine's cost in tokens of work (the request's uncached prefill, the queue and
        decoding ahead of it, KV pressure, a session's KV it would evict, a LoRA swap), and whether the
        request's adapter is resident there."""
        costs = [
            self.queue_weight * e.queued_prefill
            + req.prompt_tokens
            - self.cache_weight * c
            + self.decode_cost_tokens * e.load
            + self.kv_cost_tokens * max(0.0, e.kv_usage - 0.8) * 5
            + self._retention_cost(req, e, c)
            for e, c in zip(eligible, cached, strict=True)
        ]
        resident = [True] * len(eligible)
        if adapter is not None:
            for i, engine in enumerate(eligible):
                if not engine.adapters.resident(adapter):
                    resident[i] = False
                    costs[i] += self.lora_swap_tokens
                if not engine.serves(adapter):
                    costs[i] += self.lora_swap_tokens  # to be loaded on demand first
        return costs, resident

    def _with_lower_tier(
        self, req: RouteRequest, eligible: Sequence[EngineState], depths: list[int], cached: list[int]
    ) -> list[int]:
        """GPU hits, plus ``lower_tier_weight`` of the blocks past them that a lower tier (CPU) holds:
        loading them back costs a transfer, less than computing them, more than a GPU hit."""
        lower = self.precise.lower.match(req.prefix, [e.id for e in eligible]) if self.precise else []
        if not self.lower_tier_weight or not any(lower):
            return cached
        return [
            c + int(self.lower_tier_weight * max(0, self._cached_tokens(req, low) - c))
            for c, low, d in zip(cached, lower, depths, strict=True)
        ]

    def _retention_cost(self, req: RouteRequest, engine: EngineState, cached: int) -> float:
        """What the paused sessions' held tokens this request would push out of ``engine`` are worth."""
        if not self.retention_weight or not (held := retained(engine)):
            return 0.0
        free = kv_capacity_tokens(engine) * (1.0 - engine.kv_usage) - engine.queued_prefill
        need = req.prompt_tokens - cached + (req.max_tokens or DEFAULT_DECODE_TOKENS)
        evicted = min(held, max(0.0, need - (free - held)))
        return self.retention_weight * self.cache_weight * evicted

    def _cached_tokens(self, req: RouteRequest, depth: int) -> int:
        """Prompt tokens an engine holding ``depth`` leading blocks would serve from cache."""
        prefix = req.prefix
        if depth and depth == len(prefix) and self.precise is None:
            extent = self.index.extent(prefix[-1])
            if extent is not None:
                return max(depth * req.block_tokens, min(extent, req.prompt_tokens - 1))
        # Like vLLM: whole blocks only, and never the prompt's last token (it must be computed).
        usable = max(0, req.prompt_tokens - 1) // max(1, req.block_tokens)
        return min(depth, usable) * req.block_tokens

    def _prefill_keep(
        self, req: RouteRequest, eligible: list[EngineState], cached: list[int], now: float
    ) -> list[int] | None:
        """The candidates of the best rank by their predicted prefill stall, or None to hold the request."""
        model = self.prefill
        itl_s = req.budget.itl_s
        assert model is not None and itl_s is not None
        ttft_left = None if req.budget.ttft_s is None else req.budget.ttft_s - (now - req.arrival)
        stalls = []
        for engine, hit in zip(eligible, cached, strict=True):
            budgeted = engine.load - engine.inflight_by_class.get(BATCH, 0)
            stalls.append(
                model.predict(req.prompt_tokens - hit, hit, engine.load, budgeted, engine.queued_prefill, itl_s)
            )
        ranks = [model.rank(stall, ttft_left) for stall in stalls]
        best = min(range(len(ranks)), key=ranks.__getitem__)
        if ranks[best][0] and model.hold(stalls[best], now - req.arrival, ttft_left):
            return None
        if ranks[best][0] == 0:
            return [i for i, r in enumerate(ranks) if r[0] == 0]
        return [i for i, r in enumerate(ranks) if r[:2] == ranks[best][:2]]

    def holds(self, req: RouteRequest) -> bool:
        """The last ``choose`` held ``req`` for its prefill (candidates had room; none kept its ITL budget)."""
        return self._held == req.id

    # -- learning -------------------------------------------------------------------

    def routed(self, req: RouteRequest, choice: Choice) -> None:
        engine = choice.engine
        if engine.id not in self._honesty:
            self._honesty[engine.id] = _Honesty()
            self._sync_capacity(engine)
        if req.prefix and self.precise is None:
            self._apply_capacity(engine)
            self.index.record(engine.id, req.prefix, req.prompt_tokens, req.block_tokens)
            outbox = self._outbox
            if outbox is not None:
                if len(outbox) == outbox.maxlen:
                    self.learned_dropped += 1
                outbox.append(RoutedBlocks(engine.id, tuple(req.prefix), req.prompt_tokens, req.block_tokens))
        if req.session is not None:
            self.sessions[req.session] = engine.id
            self.sessions.move_to_end(req.session)
            if len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        self.predicted_tokens += choice.predicted_cached_tokens
        self.prompt_tokens += req.prompt_tokens

    # -- sharing with other replicas ---------------------------------------------------------

    def share(self, max_pending: int = 10_000) -> None:
        """Keep what routing records as facts for other replicas (approximate mode only)."""
        if self.precise is None and self._outbox is None:
            self._outbox = deque(maxlen=max(1, max_pending))

    def take_learned(self) -> list[RoutedBlocks]:
        outbox = self._outbox
        if not outbox:
            return []
        facts = list(outbox)
        outbox.clear()
        return facts

    def learn(self, fact: RoutedBlocks, engine: EngineState) -> None:
        """Apply another replica's fact: ``engine`` now holds these blocks."""
        if self.precise is None and fact.blocks:
            self._apply_capacity(engine)
            self.index.record(engine.id, fact.blocks, fact.prompt_tokens, fact.block_tokens)

    def started(self, engine_id: str, predicted_cached_tokens: int, prompt_tokens: int) -> None:
        """The engine has scheduled a request routed with this prediction (its first token came)."""
        honesty = self._honesty.get(engine_id)
        if honesty is not None:
            honesty.predicted_tokens += predicted_cached_tokens
            honesty.prompt_tokens += prompt_tokens

    def hit_ratio_estimate(self) -> float:
        return self.predicted_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def modelled_capacity(self, engine_id: str) -> int:
        """Prompt tokens the index takes the engine's cache to keep (its size, less what honesty found)."""
        return self._modelled.get(engine_id, self.default_capacity_tokens)

    def _capacity_tokens(self, engine: EngineState) -> int:
        return engine.num_blocks * engine.block_size if engine.num_blocks else self.default_capacity_tokens

    def _sync_capacity(self, engine: EngineState) -> None:
        self._modelled[engine.id] = self._capacity_tokens(engine)
        self._apply_capacity(engine)

    def _apply_capacity(self, engine: EngineState) -> None:
        """The index's capacity: the engine's modelled cache, plus the prompts routed there that it has
        not computed yet (recorded already, they take no cache space until they are)."""
        if self.precise is None:
            self.index.set_capacity(engine.id, self.modelled_capacity(engine.id) + engine.queued_prefill)

    def kv_events(self, engine_id: str, events: Sequence[KVEvent], restarted: bool = False) -> None:
        """Apply an engine's KV cache events (precise mode; ignored otherwise)."""
        precise = self.precise
        if precise is None:
            return
        if restarted:
            precise.cleared(engine_id)
        for event in events:
            match event:
                case BlockStored():
                    precise.stored(
                        engine_id,
                        event.block_hashes,
                        event.parent_block_hash,
                        event.token_ids,
                        event.block_size,
                        event.lora_name,
                        event.medium,
                    )
                case BlockRemoved():
                    precise.removed(engine_id, event.block_hashes, event.medium)
                case AllBlocksCleared():
                    precise.cleared(engine_id)

    def scraped(self, engine: EngineState) -> None:
        """Compare the engine's real prefix-cache counters with what the index predicted."""
        honesty = self._honesty.setdefault(engine.id, _Honesty())
        queries, hits = engine.prefix_queries, engine.prefix_hits
        seen, honesty.seen_queries = honesty.seen_queries, queries
        if honesty.last_queries < 0:
            honesty.last_queries, honesty.last_hits = queries, hits
            self._sync_capacity(engine)
            return
        if queries < seen:
            # Counters went back: the engine restarted and its cache is empty.
            if self.precise is not None:
                self.precise.cleared(engine.id)
            else:
                self.index.clear(engine.id)
            self._sync_capacity(engine)
        else:
            if honesty.prompt_tokens < self.honesty_share * self._capacity_tokens(engine):
                return  # too few started requests to judge yet: keep accumulating
            d_queries = queries - honesty.last_queries
            d_hits = hits - honesty.last_hits
            if d_queries > 0 and self.precise is None:
                real = d_hits / d_queries
                predicted = honesty.predicted_tokens / honesty.prompt_tokens
                capacity = self.modelled_capacity(engine.id)
                full = self._capacity_tokens(engine)
                if predicted > 0.1 and real < 0.5 * predicted:
                    # The engine keeps less than we model (other tenants, smaller cache): shrink.
                    self._modelled[engine.id] = max(1024, int(capacity * 0.75))
                elif capacity < full and real >= 0.8 * predicted:
                    self._modelled[engine.id] = min(full, int(capacity * 1.25) + 1)
                self._apply_capacity(engine)
        honesty.last_queries, honesty.last_hits = queries, hits
        honesty.predicted_tokens = honesty.prompt_tokens = 0.0

    def forget(self, engine_id: str) -> None:
        self.index.forget(engine_id)
        self._honesty.pop(engine_id, None)
        self._modelled.pop(engine_id, None)
        for session in [s for s, e in self.sessions.items() if e == engine_id]:
            del self.sessions[session]


def _with_slot(adapter: str, eligible: list[EngineState], candidates: Sequence[EngineState]) -> list[EngineState]:
    """The engines that can take ``adapter`` without exceeding their slots: eligible ones first,
    then any candidate (a slot rule outranks the load bound); all eligible when none has room."""
    room = [e for e in eligible if e.adapters.has_room(adapter)]
    if room:
        return room
    room = [e for e in candidates if e.adapters.has_room(adapter)]
    return room or eligible
