"""Agent sessions as the core sees them: which turn continues a paused session, how long its pause
is expected to last, and how much KV cache the paused sessions hold on each engine.

An agent loop is a model call, a tool call that takes seconds, then the next call with the tool's
output appended. Between two turns the session's KV blocks sit unreferenced in its engine's prefix
cache, where LRU eviction takes them when cold prompts need room; the next turn then computes its
whole context again. This book is what the gateway knows of that, so that admission can start a
continuing turn first (``queue``) and routing can send cold prompts where they evict no paused
session (``prefix_policy``).

Rules:
- A session is the opaque key the shell recognised (``RouteRequest.session``); nothing here reads
  what it means. At most ``max_sessions`` are remembered; the least recently active is forgotten
  first, and its hold with it.
- A turn arrives (``arrived``): it continues its session when the session's previous turn ended
  within the session's hold (below); that pause (previous end to this arrival) teaches the session
  its gap. From arrival to end the session holds nothing: its blocks are referenced by the running
  turn, or about to be, and nothing evicts them.
- A turn ends (``ended``): the session pauses on that engine holding ``tokens`` (its prompt and what
  it generated: what the next turn finds cached there), unless another of its turns is in flight.
  One that never ran (``abandoned``: refused, or its client left the queue) holds nothing.
- A hold lasts ``hold_s`` from the end: ``gap_factor`` times the session's learned gap (an EWMA of
  its pauses, the newest weighing ``gap_weight``), within ``[min_hold_s, max_hold_s]``; a session
  with no pause learned yet holds ``default_hold_s``. Past it the session has gone quiet: it holds
  nothing and its next turn counts as a new session's.
- ``held(engine)``: the tokens this replica's paused sessions hold there, unbounded here; what
  routing may count is bounded by the engine's KV cache (``retained``): never more than its free
  blocks (``num_blocks x block_size`` from ``vllm:cache_config_info``, less the share in use,
  ``vllm:kv_cache_usage_perc``), so the gateway never reserves more than an engine can keep.
- Time is an argument; expiry is lazy (``expire(now)``), in order of the holds' ends, and says which
  engines' totals changed, so the caller can tell the other replicas (``EngineReport.kv_held``).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from dataclasses import dataclass

from priority_gateway.core.engines import EngineState


@dataclass(frozen=True, slots=True)
class SessionSettings:
    enabled: bool = True
    """Sessions are tracked: continuing turns start first and paused sessions' blocks count as held."""
    max_sessions: int = 100_000
    default_hold_s: float = 30.0
    """How long a session that has not paused yet is taken to hold its blocks after a turn."""
    min_hold_s: float = 2.0
    max_hold_s: float = 120.0
    gap_factor: float = 2.0
    """A hold lasts this many times the session's learned gap: pauses vary, a hold that ends at
    the mean gap would end before half of the next turns."""
    gap_weight: float = 0.3
    """Weight of the newest pause in the learned gap (EWMA)."""
    first_burst: int = 1
    """Continuing turns that may start in a row, within a tenant's line of a class, while a new
    session's turn waits there; then the oldest new one starts (``fair_queue``: the bound). One: with
    the engines' seats declared the queue is real, and longer runs of continuing turns re-prefilled no
    less while new sessions' TTFT p99 grew 1.7x in the simulator (benchmarks/agent_sessions.py) and
    1.5-1.9x on the H200 (benchmarks/results/gpu/sessions/seats/)."""
    wait_for_engine: bool = True
    """A continuing turn whose session's engine is full waits for a seat there while it has waited
    less than ``wait_factor`` times its first token would take elsewhere (``Dispatcher``): moving
    computes its context again."""
    wait_factor: float = 3.0
    """How long a continuing turn waits for its session's engine, in its predicted first token
    elsewhere. Over 1: moving costs more than the mover's own first token, since its context computed
    again is prefill that every request on the other engine waits behind, and KV it evicts there. In
    the simulator (benchmarks/results/agent_sessions/wait_factor/: 40 sessions, KV demand 1.2x, a CPU
    tier, ten seeds), 3 against 1: 1.5x fewer re-prefilled tokens, turn TTFT p99 and new-session TTFT
    p99 lower, throughput the same; 5 and 10 re-prefill 2.2x and 2.4x fewer than plain prefix routing
    (3: 1.6x) at a turn TTFT p99 1.3x that of 3."""


@dataclass(slots=True)
class Session:
    key: str
    engine: str | None = None
    tokens: int = 0
    ended_at: float | None = None
    expires_at: float = 0.0
    gap: float | None = None
    """The session's learned inter-turn pause, seconds (None: none seen yet)."""
    inflight: int = 0
    turns: int = 0
    holding: bool = False
    version: int = 0
    """Bumped whenever the hold changes, so a stale expiry entry is ignored."""


class SessionBook:
    def __init__(self, settings: SessionSettings | None = None) -> None:
        self.settings = settings or SessionSettings()
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._held: dict[str, int] = {}
        self._expiry: list[tuple[float, int, str, int]] = []
        self._order = itertools.count()
        self.turns: dict[str, str] = {}
        """The session of each request that is a turn under way (begun, not yet ended or abandoned)."""

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, key: str) -> Session | None:
        return self._sessions.get(key)

    def held(self, engine: str) -> int:
        """Tokens this replica's paused sessions hold on ``engine`` (before any capacity bound)."""
        return self._held.get(engine, 0)

    def hold_s(self, session: Session) -> float:
        s = self.settings
        if session.gap is None:
            return s.default_hold_s
        return min(s.max_hold_s, max(s.min_hold_s, s.gap_factor * session.gap))

    # -- turns ---------------------------------------------------------------------------

    def arrived(self, key: str, now: float) -> tuple[bool, set[str]]:
        """A turn of ``key`` arrives: whether it continues a paused session, and the engines whose
        held totals changed (its hold ends: its blocks are the turn's now)."""
        changed = self.expire(now)
        session = self._sessions.get(key)
        continuing = False
        if session is None:
            session = self._remember(key, changed)
        else:
            self._sessions.move_to_end(key)
            ended = session.ended_at
            if ended is not None and session.inflight == 0:
                pause = max(0.0, now - ended)
                continuing = pause <= self.hold_s(session) or session.holding
                if continuing:
                    weight = self.settings.gap_weight
                    session.gap = pause if session.gap is None else (1 - weight) * session.gap + weight * pause
            elif session.inflight:
                continuing = True  # a parallel call of a session already running
        self._release(session, changed)
        session.inflight += 1
        session.turns += 1
        return continuing, changed

    def begin(self, request_id: str, key: str, now: float) -> tuple[bool, set[str]] | None:
        """Request ``request_id``, a turn of ``key``, arrives (``arrived``); None when the book is off or
        the request is a turn under way already (submitted again)."""
        if not self.settings.enabled or request_id in self.turns:
            return None
        self.turns[request_id] = key
        return self.arrived(key, now)

    def end(self, request_id: str, engine: str, tokens: int, now: float) -> set[str]:
        """The turn ``request_id`` ended on ``engine`` (``ended``); nothing when it is no turn under way."""
        key = self.turns.pop(request_id, None)
        return set() if key is None else self.ended(key, engine, tokens, now)

    def abandon(self, request_id: str) -> None:
        """The turn ``request_id`` ended before it ran (``abandoned``), if it is one under way."""
        key = self.turns.pop(request_id, None)
        if key is not None:
            self.abandoned(key)

    def ended(self, key: str, engine: str, tokens: int, now: float) -> set[str]:
        """A turn of ``key`` ended on ``engine``, its context ``tokens`` long; engines whose totals changed."""
        changed = self.expire(now)
        session = self._sessions.get(key)
        if session is None:
            return changed  # forgotten while it ran
        session.inflight = max(0, session.inflight - 1)
        session.ended_at = now
        if session.inflight:
            return changed
        self._release(session, changed)
        session.engine, session.tokens = engine, max(0, tokens)
        session.holding = True
        session.version += 1
        session.expires_at = now + self.hold_s(session)
        self._held[engine] = self._held.get(engine, 0) + session.tokens
        heapq.heappush(self._expiry, (session.expires_at, next(self._order), key, session.version))
        changed.add(engine)
        return changed

    def abandoned(self, key: str) -> None:
        """A turn of ``key`` ended before it ran (refused, or its client left the queue): no hold."""
        session = self._sessions.get(key)
        if session is not None:
            session.inflight = max(0, session.inflight - 1)

    def expire(self, now: float) -> set[str]:
        """Holds whose time is over end; the engines whose totals changed."""
        changed: set[str] = set()
        expiry = self._expiry
        while expiry and expiry[0][0] < now:
            _, _, key, version = heapq.heappop(expiry)
            session = self._sessions.get(key)
            if session is not None and session.version == version and session.holding:
                self._release(session, changed)
        return changed

    # -- internals -------------------------------------------------------------------------

    def _remember(self, key: str, changed: set[str]) -> Session:
        session = self._sessions[key] = Session(key)
        while len(self._sessions) > self.settings.max_sessions:
            _, gone = self._sessions.popitem(last=False)
            self._release(gone, changed)
        return session

    def _release(self, session: Session, changed: set[str]) -> None:
        if not session.holding or session.engine is None:
            return
        session.holding = False
        session.version += 1
        total = self._held.get(session.engine, 0) - session.tokens
        if total > 0:
            self._held[session.engine] = total
        else:
            self._held.pop(session.engine, None)
        changed.add(session.engine)


def kv_capacity_tokens(engine: EngineState) -> int:
    """Tokens the engine's KV cache holds, from ``vllm:cache_config_info`` (0: not scraped yet)."""
    return engine.num_blocks * engine.block_size


def retained(engine: EngineState) -> int:
    """Tokens of paused sessions held on ``engine`` (this replica's and the others'), at most its free
    KV blocks: what routing counts as taken."""
    held = engine.held_kv + engine.peer_held_kv
    if not held:
        return 0
    capacity = kv_capacity_tokens(engine)
    if not capacity:
        return 0  # its cache size is unknown: nothing can be said about what it keeps
    free = int(capacity * (1.0 - min(1.0, max(0.0, engine.kv_usage))))
    return min(held, free)
