"""The ``prefix`` policy: send a request where its prompt prefix is cached, within a load bound.

Rules:
- Load bound (consistent hashing with bounded loads): an engine is eligible only while
  ``load + 1 <= ceil(load_factor * (total_load + 1) / n)``. The least loaded engine is
  always eligible, and no engine is ever chosen above the bound for a cache hit.
- A pinned session (``X-Session-ID``) stays on its engine while that engine is eligible;
  otherwise the pin moves to wherever the request goes.
- Among eligible engines, cache affinity counts only where engines differ: blocks that
  every candidate holds (a system prompt all engines cached) say nothing about where to go.
- With no difference in cached blocks, the engine is chosen by rendezvous hashing of the
  prompt's first distinctive blocks, so replicas that share no state agree, and a
  conversation's later turns follow its first.
- Otherwise the score is the extra cached share of the prompt minus a load penalty and
  a KV-pressure penalty; the best score wins, rendezvous order breaks ties.
- The engines' real prefix-cache counters keep the index honest: an engine whose real
  hit ratio falls well below what the index predicted gets its modelled capacity shrunk;
  a counter that goes backwards means the engine restarted with an empty cache.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from xxhash import xxh3_64_intdigest

from gateway.core.affinity import AffinityIndex
from gateway.core.engines import EngineState
from gateway.core.request import RouteRequest
from gateway.core.routing import Choice


@dataclass(slots=True)
class _Honesty:
    """Predicted versus real prefix-cache hits of one engine since the last scrape."""

    predicted_tokens: float = 0.0
    prompt_tokens: float = 0.0
    last_queries: float = -1.0
    last_hits: float = 0.0


def rendezvous_weight(key: int, engine_id: str) -> int:
    return xxh3_64_intdigest(engine_id.encode(), key)


class PrefixAffinity:
    name = "prefix"

    def __init__(
        self,
        load_factor: float = 1.25,
        load_weight: float = 0.5,
        kv_weight: float = 0.25,
        rendezvous_blocks: int = 8,
        default_capacity_tokens: int = 131072,
        max_sessions: int = 100_000,
    ) -> None:
        if load_factor < 1.0:
            raise ValueError("load_factor must be at least 1")
        self.load_factor = load_factor
        self.load_weight = load_weight
        self.kv_weight = kv_weight
        self.rendezvous_blocks = rendezvous_blocks
        self.default_capacity_tokens = default_capacity_tokens
        self.index = AffinityIndex()
        self.sessions: OrderedDict[str, str] = OrderedDict()
        self.max_sessions = max_sessions
        self._honesty: dict[str, _Honesty] = {}
        self._block_tokens = 16
        self.predicted_tokens = 0.0
        self.prompt_tokens = 0.0

    # -- choice --------------------------------------------------------------------

    def eligible(self, candidates: Sequence[EngineState]) -> list[EngineState]:
        total = 0.0
        for engine in candidates:
            total += engine.load
        bound = math.ceil(self.load_factor * (total + 1) / len(candidates) - 1e-9)
        return [e for e in candidates if e.load + 1 <= bound + 1e-9]

    def choose(self, req: RouteRequest, candidates: Sequence[EngineState], now: float) -> Choice | None:
        if not candidates:
            return None
        eligible = self.eligible(candidates)
        if req.session is not None:
            pinned = self.sessions.get(req.session)
            if pinned is not None:
                for engine in eligible:
                    if engine.id == pinned:
                        matched = self.index.match(req.prefix, [engine.id])[0]
                        return Choice(engine, matched * req.block_tokens, "session")
        prefix = req.prefix
        if not prefix:
            return self._least_loaded(eligible)
        depths = self.index.match(prefix, [e.id for e in eligible])
        floor = min(depths)
        best = max(depths)
        if best == floor:
            key_at = min(len(prefix), floor + self.rendezvous_blocks) - 1
            engine = max(eligible, key=lambda e: rendezvous_weight(prefix[key_at], e.id))
            return Choice(engine, floor * req.block_tokens, "rendezvous" if floor == 0 else "shared_prefix")
        prompt_tokens = max(req.prompt_tokens, len(prefix) * req.block_tokens, 1)
        load_scale = 1.0 + sum(e.load for e in eligible) / len(eligible)
        key = prefix[min(len(prefix), best + self.rendezvous_blocks) - 1]
        best_engine, best_score, best_depth, best_tie = eligible[0], -math.inf, 0, -1
        for engine, depth in zip(eligible, depths, strict=True):
            score = (
                (depth - floor) * req.block_tokens / prompt_tokens
                - self.load_weight * engine.load / load_scale
                - self.kv_weight * engine.kv_usage
            )
            tie = rendezvous_weight(key, engine.id)
            if score > best_score + 1e-12 or (abs(score - best_score) <= 1e-12 and tie > best_tie):
                best_engine, best_score, best_depth, best_tie = engine, score, depth, tie
        return Choice(best_engine, best_depth * req.block_tokens, "affinity" if best_depth > floor else "load")

    def _least_loaded(self, eligible: Sequence[EngineState]) -> Choice:
        engine = min(eligible, key=lambda e: (e.load, e.id))
        return Choice(engine, 0, "least_loaded")

    # -- learning -------------------------------------------------------------------

    def routed(self, req: RouteRequest, choice: Choice, now: float) -> None:
        engine = choice.engine
        predicted_tokens = choice.predicted_cached_tokens
        self._block_tokens = req.block_tokens
        if engine.id not in self._honesty:
            self._honesty[engine.id] = _Honesty()
            self._sync_capacity(engine)
        if req.prefix:
            self.index.record(engine.id, req.prefix)
        if req.session is not None:
            self.sessions[req.session] = engine.id
            self.sessions.move_to_end(req.session)
            if len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        honesty = self._honesty[engine.id]
        honesty.predicted_tokens += predicted_tokens
        honesty.prompt_tokens += req.prompt_tokens
        self.predicted_tokens += predicted_tokens
        self.prompt_tokens += req.prompt_tokens

    def hit_ratio_estimate(self) -> float:
        return self.predicted_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def _capacity_blocks(self, engine: EngineState) -> int:
        tokens = engine.num_blocks * engine.block_size if engine.num_blocks else self.default_capacity_tokens
        return max(1, tokens // max(1, self._block_tokens))

    def _sync_capacity(self, engine: EngineState) -> None:
        self.index.set_capacity(engine.id, self._capacity_blocks(engine))

    def scraped(self, engine: EngineState) -> None:
        """Compare the engine's real prefix-cache counters with what the index predicted."""
        honesty = self._honesty.setdefault(engine.id, _Honesty())
        queries, hits = engine.prefix_queries, engine.prefix_hits
        if honesty.last_queries < 0:
            honesty.last_queries, honesty.last_hits = queries, hits
            self._sync_capacity(engine)
            return
        if queries < honesty.last_queries:
            # Counters went back: the engine restarted and its cache is empty.
            self.index.clear(engine.id)
            self._sync_capacity(engine)
        else:
            d_queries = queries - honesty.last_queries
            d_hits = hits - honesty.last_hits
            if d_queries > 0 and honesty.prompt_tokens > 0:
                real = d_hits / d_queries
                predicted = honesty.predicted_tokens / honesty.prompt_tokens
                capacity = self.index.capacity(engine.id)
                full = self._capacity_blocks(engine)
                if predicted > 0.1 and real < 0.5 * predicted:
                    # The engine keeps less than we model (other tenants, smaller cache): shrink.
                    self.index.set_capacity(engine.id, max(64, int(capacity * 0.75)))
                elif capacity < full and real >= 0.8 * predicted:
                    self.index.set_capacity(engine.id, min(full, int(capacity * 1.25) + 1))
        honesty.last_queries, honesty.last_hits = queries, hits
        honesty.predicted_tokens = honesty.prompt_tokens = 0.0

    def forget(self, engine_id: str) -> None:
        self.index.forget(engine_id)
        self._honesty.pop(engine_id, None)
        for session in [s for s, e in self.sessions.items() if e == engine_id]:
            del self.sessions[session]
