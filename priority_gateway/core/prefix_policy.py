"""The ``prefix`` policy: send a request where its prompt prefix is cached, within a load bound.

Rules:
- Load bound (consistent hashing with bounded loads): an engine is eligible only while
  ``load + 1 <= ceil(load_factor * (total_load + 1) / n)``, load being requests in flight.
  The least loaded engine is always eligible, and no engine is ever chosen above the bound
  for a cache hit.
- A pinned session (``X-Session-ID``) stays on its engine while that engine is eligible;
  otherwise the pin moves to wherever the request goes.
- Each eligible engine gets a cost in prompt tokens: the prefill already queued on it
  (``queued_prefill``: this replica's, and what other replicas reported), plus this prompt, minus
  ``cache_weight`` times what it holds of the prompt in cache, plus ``decode_cost_tokens`` per
  request in flight, plus a penalty that grows with KV cache pressure. A cached token counts
  ``cache_weight`` times: a hit kept also serves the conversation's next turns, and work not
  repeated is capacity left for everyone; but a long enough queue still sends the request
  elsewhere, as waiting behind it costs more.
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
from priority_gateway.core.engines import EngineState
from priority_gateway.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from priority_gateway.core.precise import PreciseIndex
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.routing import Choice
from priority_gateway.core.sharing import RoutedBlocks


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

    # -- choice --------------------------------------------------------------------

    def eligible(self, candidates: Sequence[EngineState]) -> list[EngineState]:
        total = 0.0
        for engine in candidates:
            total += engine.load
        bound = math.ceil(self.load_factor * (total + 1) / len(candidates) - 1e-9)
        self._bound = bound
        return [e for e in candidates if e.load + 1 <= bound + 1e-9]

    def choose(self, req: RouteRequest, candidates: Sequence[EngineState], now: float) -> Choice | None:
        if not candidates:
            return None
        eligible = self.eligible(candidates)
        adapter = req.adapter if self.lora_aware else None
        if adapter is not None:
            eligible = _with_slot(adapter, eligible, candidates)
        prefix = req.prefix
        if req.session is not None:
            pinned = self.sessions.get(req.session)
            if pinned is not None:
                for engine in eligible:
                    if engine.id == pinned:
                        depth = self.index.match(prefix, [engine.id])[0]
                        return Choice(engine, self._cached_tokens(req, depth), "session")
        depths = self.index.match(prefix, [e.id for e in eligible]) if prefix else [0] * len(eligible)
        cached = [self._cached_tokens(req, d) for d in depths]
        costs = [
            self.queue_weight * e.queued_prefill
            + req.prompt_tokens
            - self.cache_weight * c
            + self.decode_cost_tokens * e.load
            + self.kv_cost_tokens * max(0.0, e.kv_usage - 0.8) * 5
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

    # -- learning -------------------------------------------------------------------

    def routed(self, req: RouteRequest, choice: Choice, now: float) -> None:
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
                    )
                case BlockRemoved():
                    precise.removed(engine_id, event.block_hashes)
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
