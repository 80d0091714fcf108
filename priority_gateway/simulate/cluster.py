"""A discrete-event cluster: the gateway's core in front of simulated engines, in virtual time.

Rules:
- Arrivals go through the same ``Dispatcher`` the HTTP server uses (classification is the
  trace's, routing and admission are the core's), with the same prefix hashing of text.
- An engine runs steps back to back while it has work; a step's tokens are delivered at
  its end, where they become the gateway's TTFT and inter-token observations, exactly as
  the relay would time streamed chunks. A finished request reports the tokens it generated, as
  the relay reads them from the answer's usage (its tenant's charge is settled with them).
- Engines are scraped every ``scrape_s`` like the monitor scrapes vLLM's ``/metrics``, and
  the dispatcher is polled every ``poll_s`` like the server's poll loop.
- A batch flood keeps ``flood`` batch requests outstanding at all times, their lengths drawn
  from the traces; they stop arriving when the trace ends.
- Precise prefix mode (policy option ``precise``): engines publish their KV cache events, which
  reach the dispatcher at the end of the step that made them, and requests are hashed by
  token blocks as the server hashes a tokenized prompt (the token ids are those the
  simulated engine reports in its events).
- A request reaches its engine's scheduler ``request_s`` after the gateway sends it (the API
  server's part, from the profile); its TTFT counts from its arrival at the gateway.
- ``engines_per_device`` engines in a row share one GPU (``SharedDevice``): their steps take turns
  on it for their device parts, as engines sharing a real GPU do.
- LoRA (a pool's ``lora_adapters``): its engines run with ``enable_lora`` and those adapters in
  their CPU cache; a trace request's ``adapter`` is its model, and it is scraped back as vLLM's
  ``vllm:lora_requests_info`` (the newest series).
- Agent sessions (a trace request's ``session`` and ``next_turn``): closed loop, as an agent runs. A
  turn names its session to the core (``RouteRequest.session``); when it ends, its next turn arrives
  its ``pause_s`` (the tool call) later; a turn refused ends its session (``sessions_failed``). The
  reply's blocks are hashed as the next turn's prompt carries them (``output_hash_ids``), so a
  paused session's whole context is a hit while its engine keeps it.
- ``replicas`` gateway replicas each get every Nth arrival, as a Service spreads connections;
  each scrapes every engine and sees only its own requests in flight. A tenant in
  ``tenant_replica`` sends everything through that one replica (one client on one connection).
- With ``share`` on (the server's default on a Redis store), the replicas act as one fleet through
  the product's own ``Fleet`` (``priority_gateway/core/fleet``), as the server's channel drives it over
  Redis: each replica's ``outgoing`` runs at every multiple of ``share_interval_s`` (0: after every
  event), its batch's bytes reach every replica, itself included, ``share_delay_s`` later, in the order
  sent (as Redis delivers a channel's messages), where ``receive`` applies them (slots granted start
  queued requests at once); every ``share_full_s`` each replica's next batch is full. The bytes are
  counted as the server sends them. The replicas start settled, having heard each other, as the
  server's have by the time they serve: each holds its even share of every engine's slots. Sharing
  does not depend on the routing policy; ``share_tenants`` off keeps tenants' shares each replica's own.
- ``overfilled`` (admission on): dispatches that left an engine with more gateway requests than the
  highest limit any replica learned for it lets one replica start (none with one replica), and the
  largest excess.
- ``share_down`` ``(from, until)``: the channel breaks then, as when Redis dies: batches in transit
  and sent meanwhile are lost, every replica's fleet is told (``channel_lost``) and admits its safe
  share; from ``until`` batches flow again (``channel_up``) and each returns to shared admission once
  settled (``share_full_s`` later, as the server does).
- What if: for each request id in ``what_if``, at its arrival the whole cluster is copied and,
  in the copy, that request is admitted whatever admission says; the copy runs until it and
  every request with a latency budget that was alive while it ran have ended, and their records
  there are kept in ``what_if_records``. The run itself goes on untouched.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from priority_gateway.core.classes import BATCH, INTERACTIVE, Budget
from priority_gateway.core.dispatcher import (
    AdmissionSettings,
    Dispatch,
    Dispatcher,
    Outcome,
    PoolSpec,
    Preempted,
    Queued,
    Rejection,
)
from priority_gateway.core.engines import EngineMetrics
from priority_gateway.core.fleet import FleetDecisions, FleetSettings
from priority_gateway.core.fleet.replica import Heard, SafeShareBegan, SafeShareEnded, Sent
from priority_gateway.core.fleet.wire import Batch, Report, encode
from priority_gateway.core.lora import LoraInfo
from priority_gateway.core.models import cache_key
from priority_gateway.core.precise import DEFAULT_MAX_BLOCKS as PRECISE_MAX_BLOCKS
from priority_gateway.core.precise import token_block_hashes
from priority_gateway.core.prefix import chain_seed, hash_blocks
from priority_gateway.core.request import RouteRequest
from priority_gateway.engines.sim.core import EngineCore, EngineRequest, SharedDevice, StepResult
from priority_gateway.engines.sim.kv_cache import lru_hit_ratio
from priority_gateway.engines.sim.lora import LoraAdapter
from priority_gateway.engines.sim.profile import Profile
from priority_gateway.engines.sim.tokens import block_hashes_for_trace, synthetic_token_ids
from priority_gateway.simulate.traces import TraceRequest

MODEL = "sim-model"
(
    _ARRIVAL,
    _STEP_END,
    _POLL,
    _SCRAPE,
    _ENGINE_ADD,
    _SHARE_TICK,
    _SHARE_ARRIVE,
    _SHARE_FULL,
    _SHARE_DOWN,
    _SHARE_UP,
) = range(10)


@dataclass(slots=True)
class PoolSetup:
    name: str
    engines: int
    profile: Profile
    scheduling_policy: str = "fcfs"
    backfill: bool = True
    accept_overflow: bool = False
    shares_hardware_with: str | None = None
    """Learn this pool's limits from that pool's gaps (their engines share devices)."""
    lora_adapters: tuple[str, ...] = ()
    """Adapters every engine of the pool serves (LoRA on when any)."""
    max_loras: int = 1
    seats: int | None = None
    """The engines' ``--max-num-seqs`` as the gateway's pool declares it (``PoolSpec.seats``)."""


@dataclass(slots=True)
class ClusterSetup:
    pools: list[PoolSetup]
    policy: str = "prefix"
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    budgets: dict[str, Budget] = field(
        default_factory=lambda: {INTERACTIVE: Budget(0.5, 0.05), BATCH: Budget(None, None, None)}
    )
    home: dict[str, str] = field(default_factory=dict)
    flood: int = 0
    flood_until: float | None = None
    """Keep the flood going until this time (default: the last trace arrival)."""
    scrape_s: float = 2.0
    poll_s: float = 0.05
    seed: int = 0
    policy_options: dict[str, Any] = field(default_factory=dict)
    replicas: int = 1
    engines_per_device: int = 1
    share: bool = True
    share_interval_s: float = 0.005
    share_delay_s: float = 0.002
    share_full_s: float = 1.0
    share_silent_s: float = 3.0
    share_down: tuple[float, float] | None = None
    """The channel is broken from the first time to the second (seconds of the run)."""
    share_window_s: float = 30.0
    """Replicas heard within this long before the channel broke split each limit (the safe share)."""
    share_tenants: bool = True
    """With ``share``: replicas tell each other their tenants too (off: fair shares are each replica's own)."""
    tenant_replica: dict[str, int] = field(default_factory=dict)
    """Tenants whose every request goes through this replica (the others' are spread round robin)."""


@dataclass(slots=True, eq=False)
class Record:
    trace: TraceRequest
    req: RouteRequest
    dispatch: Dispatch | None = None
    first: float | None = None
    last: float | None = None
    done: float | None = None
    rejected: str | None = None
    cached_tokens: int = 0
    output_tokens: int = 0
    gaps: list[float] = field(default_factory=list)
    flood: bool = False
    preemptions: int = 0
    replica: int = 0


@dataclass(slots=True, eq=False)
class SimEngine:
    id: str
    pool: str
    core: EngineCore
    busy_s: float = 0.0
    stepping: bool = False


@dataclass(slots=True, eq=False)
class WhatIf:
    """A request admitted in a copy of the cluster, and the budgeted requests alive while it ran there."""

    record: Record
    others: dict[str, Record]


def _ended(rec: Record) -> bool:
    return rec.done is not None or rec.rejected is not None


def budgeted(budget: Budget) -> bool:
    """The class has a latency budget (TTFT or ITL), as interactive has."""
    return budget.ttft_s is not None or budget.itl_s is not None


def _engine_id(rec: Record) -> str:
    """The engine-side id of a request's current attempt (a preempted request starts afresh)."""
    return f"{rec.req.id}#{rec.preemptions}"


class Cluster:
    def __init__(self, setup: ClusterSetup) -> None:
        self.setup = setup
        self.precise = setup.policy == "prefix" and bool(setup.policy_options.get("precise"))
        specs = []
        self.engines: dict[str, SimEngine] = {}
        self.adapters: dict[str, LoraAdapter] = {}
        devices: list[SharedDevice] = []
        for pool in setup.pools:
            ids = [f"{pool.name}-{i}" for i in range(pool.engines)]
            specs.append(self._pool_spec(pool, ids))
            for i, engine_id in enumerate(ids):
                self.engines[engine_id] = SimEngine(engine_id, pool.name, self._engine_core(pool, i, devices))
        replicas = max(1, setup.replicas)
        self.sharing = setup.share and replicas > 1
        self.dispatchers = [
            Dispatcher(
                specs,
                home=setup.home or None,
                budgets={cls: b.itl_s for cls, b in setup.budgets.items()},
                admission=setup.admission,
                fleet=self._fleet_settings(replica) if self.sharing else None,
            )
            for replica in range(replicas)
        ]
        self._next_replica = itertools.count()
        self.share_up = True
        self.safe_share_spans: list[dict[str, float | None]] = []
        self._full_due = False
        self.share_stats = {"batches": 0, "facts": 0, "bytes": 0, "applied": 0}
        self.overfilled = {"dispatches": 0, "max_excess": 0}
        self.records: dict[str, Record] = {}
        self._events: list[tuple[float, int, int, Any]] = []
        self._order = itertools.count()
        self._seed = chain_seed(MODEL)
        self._flood_rng = random.Random(setup.seed)
        self._flood_pool: list[TraceRequest] = []
        self._flood_ids = itertools.count()
        self.now = 0.0
        self.end_of_arrivals = 0.0
        self._pending_arrivals = 0
        self.what_if: set[str] = set()
        self.what_if_records: dict[str, WhatIf] = {}

    def _pool_spec(self, pool: PoolSetup, ids: list[str]) -> PoolSpec:
        setup = self.setup
        return PoolSpec(
            pool.name,
            ids,
            policy=setup.policy,
            takes_priority=pool.scheduling_policy == "priority",
            backfill=pool.backfill,
            accept_overflow=pool.accept_overflow,
            policy_options=dict(setup.policy_options) if setup.policy == "prefix" else {},
            shares_hardware_with=pool.shares_hardware_with,
            seats=pool.seats,
        )

    def _engine_core(self, pool: PoolSetup, i: int, devices: list[SharedDevice]) -> EngineCore:
        """The ``i``-th engine of ``pool``: on a device of its own, or taking turns on the last of
        ``devices`` (a new one each ``engines_per_device`` engines); its adapters loaded on the CPU."""
        setup = self.setup
        device = None
        if setup.engines_per_device > 1:
            if len(self.engines) % setup.engines_per_device == 0:
                devices.append(SharedDevice())
            device = devices[-1]
        core = EngineCore(
            pool.profile,
            model=MODEL,
            scheduling_policy=pool.scheduling_policy,
            seed=setup.seed * 1000 + i,
            kv_events=self.precise,
            device=device,
            enable_lora=bool(pool.lora_adapters),
            max_loras=pool.max_loras,
            max_cpu_loras=max(pool.max_loras, len(pool.lora_adapters)),
        )
        for n, name in enumerate(pool.lora_adapters):
            adapter = self.adapters.setdefault(name, LoraAdapter(name, n + 1, f"/adapters/{name}"))
            assert core.lora_slots is not None
            core.lora_slots.preload(adapter, False)
        return core

    # -- events ----------------------------------------------------------------------

    def _at(self, t: float, kind: int, data: Any) -> None:
        if kind == _ARRIVAL:
            self._pending_arrivals += 1
        heapq.heappush(self._events, (t, next(self._order), kind, data))

    def run(self, trace: list[TraceRequest], flood_source: list[TraceRequest] | None = None) -> dict[str, Any]:
        for i, tr in enumerate(trace):
            self._at(tr.arrival, _ARRIVAL, (f"t{i}", tr, False))
        self.end_of_arrivals = max((tr.arrival for tr in trace), default=0.0)
        if self.setup.flood_until is not None:
            self.end_of_arrivals = max(self.end_of_arrivals, self.setup.flood_until)
        self._flood_pool = list(flood_source or [])
        if self.setup.flood and self._flood_pool:
            for _ in range(self.setup.flood):
                self._flood_one(0.0)
        self._at(0.0, _POLL, None)
        self._at(0.0, _SCRAPE, None)
        if self.sharing:
            self._hear_each_other()
            self._at(self.setup.share_full_s, _SHARE_FULL, None)
            if self.setup.share_interval_s > 0:
                self._at(self.setup.share_interval_s, _SHARE_TICK, None)
            if self.setup.share_down is not None:
                self._at(self.setup.share_down[0], _SHARE_DOWN, None)
                self._at(self.setup.share_down[1], _SHARE_UP, None)
        self._advance(lambda: False)
        return {
            "records": self.records,
            "engines": self.engines,
            "duration_s": self.now,
            "share": self._share_summary(),
            "overfilled": dict(self.overfilled),
            # Replica 0's policies: the report reads their load-bound record.
            "policies": {name: pool.policy for name, pool in self.dispatchers[0].pools.items()},
        }

    def _advance(self, done: Callable[[], bool]) -> None:
        """Handle events in time order until none is left or ``done()``."""
        while self._events and not done():
            t, _, kind, data = heapq.heappop(self._events)
            self.now = t
            if kind == _ARRIVAL:
                self._pending_arrivals -= 1
                self._arrive(*data)
            elif kind == _STEP_END:
                self._step_end(data)
            elif kind == _ENGINE_ADD:
                self._engine_add(*data)
            elif kind == _POLL:
                for dispatcher in self.dispatchers:
                    self._handle(dispatcher.poll(t))
                if self._busy():
                    self._at(t + self.setup.poll_s, _POLL, None)
            elif kind == _SCRAPE:
                self._scrape()
                if self._busy():
                    self._at(t + self.setup.scrape_s, _SCRAPE, None)
            elif kind == _SHARE_TICK:
                self._collect_learned()
                if self._busy():
                    self._at(t + self.setup.share_interval_s, _SHARE_TICK, None)
            elif kind == _SHARE_ARRIVE:
                self._share_arrive(data)
            elif kind == _SHARE_DOWN:
                self._share_down()
            elif kind == _SHARE_UP:
                self.share_up = True
                for dispatcher in self.dispatchers:
                    dispatcher.fleet.channel_up(t)
            elif kind == _SHARE_FULL:
                self._share_full()
                if self._busy():
                    self._at(t + self.setup.share_full_s, _SHARE_FULL, None)
            if self.sharing and self.setup.share_interval_s <= 0:
                self._collect_learned()

    def _busy(self) -> bool:
        # Queued requests alone do not keep the clock going: with no arrival to come and every
        # engine idle, nothing could ever free the room they wait for.
        return self._pending_arrivals > 0 or any(e.stepping or e.core.has_work for e in self.engines.values())

    # -- arrivals ----------------------------------------------------------------------

    def _flood_one(self, t: float) -> None:
        if t > self.end_of_arrivals:
            return
        tr = self._flood_rng.choice(self._flood_pool)
        flood = TraceRequest(
            t,
            tr.input_len,
            tr.output_len,
            tuple((1 << 50) + next(self._flood_ids) * 1000 + j for j in range(len(tr.hash_ids))),
            BATCH,
            "flood",
            tr.block_tokens,
        )
        self._at(t, _ARRIVAL, (f"f{next(self._flood_ids)}", flood, True))

    def _arrive(self, rid: str, tr: TraceRequest, flood: bool) -> None:
        if rid in self.what_if:
            self.what_if_records[rid] = self._fork()._admitted_anyway(rid, tr, flood)
        rec = self._record(rid, tr, flood)
        dispatcher = self.dispatchers[rec.replica]
        self._handle(dispatcher.submit(rec.req, self.now))

    def _fork(self) -> Cluster:
        """A copy of the cluster as it is now, sharing only what no run changes (setup, trace requests)."""
        memo: dict[int, Any] = {id(self.setup): self.setup}
        for tr in self._flood_pool:
            memo[id(tr)] = tr
        for _, _, kind, data in self._events:
            if kind == _ARRIVAL:
                memo[id(data[1])] = data[1]
        records = self.records
        # Finished requests play no part in what happens next: leave them out of the copy.
        self.records = {rid: r for rid, r in records.items() if r.done is None and r.rejected is None}
        for r in self.records.values():
            memo[id(r.trace)] = r.trace
            memo[id(r.req.prefix)] = r.req.prefix  # hashed once, never changed
        try:
            fork = copy.deepcopy(self, memo)
        finally:
            self.records = records
        fork.what_if = set()
        fork.what_if_records = {}
        return fork

    def _admitted_anyway(self, rid: str, tr: TraceRequest, flood: bool) -> WhatIf:
        """Admit this arrival whatever admission says; run until it and every budgeted request
        alive while it ran have ended."""
        rec = self._record(rid, tr, flood)
        dispatch = self.dispatchers[rec.replica].admit_anyway(rec.req, self.now)
        if dispatch is None:
            rec.rejected = "no_healthy_engine"
            return WhatIf(rec, {})
        self._handle([dispatch])
        self._advance(lambda: _ended(rec))
        end = self.now
        budgets = self.setup.budgets
        others = {
            r.req.id: r
            for r in self.records.values()
            if r is not rec and r.req.arrival <= end and budgeted(budgets.get(r.trace.cls, Budget()))
        }
        self._advance(lambda: all(_ended(r) for r in others.values()))
        return WhatIf(rec, others)

    def _record(self, rid: str, tr: TraceRequest, flood: bool) -> Record:
        budget = self.setup.budgets.get(tr.cls, Budget())
        seed = self._seed if tr.adapter is None else chain_seed(cache_key(MODEL, tr.adapter))
        req = RouteRequest(
            rid,
            tr.cls,
            tr.adapter or MODEL,
            self.now,
            prompt_tokens=tr.input_len,
            max_tokens=tr.output_len,
            prefix=[] if self.precise else hash_blocks(tr.text(), seed),
            session=tr.session,
            budget=budget,
            restartable=tr.cls == BATCH,
            adapter=tr.adapter,
            tenant=tr.tenant,
        )
        if self.precise:
            req.block_tokens = self._block_size(tr.cls)
            req.prefix = self._token_prefix(tr, req.block_tokens)
        pinned = self.setup.tenant_replica.get(tr.tenant)
        replica = (pinned if pinned is not None else next(self._next_replica)) % len(self.dispatchers)
        rec = self.records[rid] = Record(tr, req, flood=flood, replica=replica)
        return rec

    def _block_size(self, cls: str) -> int:
        home = self.dispatchers[0].home[cls]
        return next(p.profile.block_size for p in self.setup.pools if p.name == home)

    @staticmethod
    def _token_prefix(tr: TraceRequest, block_size: int) -> list[int]:
        """The token-block hashes the server would compute from this prompt's token ids."""
        hashes = block_hashes_for_trace(tr.hash_ids, tr.input_len, tr.block_tokens, block_size)
        ids: list[int] = []
        for h in hashes[: min(tr.input_len // block_size, PRECISE_MAX_BLOCKS)]:
            ids.extend(synthetic_token_ids(h, block_size))
        return token_block_hashes(ids, block_size)

    def _handle(self, outcomes: Iterable[Outcome]) -> None:
        """Carry out what the dispatcher decided (a ``Decisions``: the answer, then the others)."""
        for outcome in outcomes:
            if isinstance(outcome, Dispatch):
                self._start(outcome)
            elif isinstance(outcome, Rejection):
                rec = self.records[outcome.request.id]
                rec.rejected = outcome.reason
                self._closed(rec)
            elif isinstance(outcome, Preempted):
                rec = self.records[outcome.request.id]
                assert rec.dispatch is outcome.dispatch, "a preemption notice arrived after a newer dispatch"
                self.engines[outcome.dispatch.engine.id].core.abort(_engine_id(rec), self.now)
                rec.dispatch = None
                rec.first = rec.last = None
                rec.gaps.clear()
                rec.output_tokens = 0
                rec.preemptions += 1
            elif isinstance(outcome, Queued):
                pass

    def _start(self, dispatch: Dispatch) -> None:
        self._check_fill(dispatch.engine.id)
        rec = self.records[dispatch.request.id]
        rec.dispatch = dispatch
        tr = rec.trace
        engine = self.engines[dispatch.engine.id]
        block_size = engine.core.block_size
        hashes = block_hashes_for_trace(
            tr.hash_ids + tr.output_hash_ids,
            tr.input_len + len(tr.output_hash_ids) * tr.block_tokens,
            tr.block_tokens,
            block_size,
        )
        limit = engine.core.max_model_len
        prompt = min(tr.input_len, limit - 1)
        max_tokens = max(1, min(tr.output_len, limit - prompt))
        req = EngineRequest(
            _engine_id(rec),
            prompt,
            hashes[: prompt // block_size],
            max_tokens,
            priority=dispatch.priority or 0,
            arrival=self.now,
            ignore_eos=True,
            lora=self.adapters[tr.adapter] if tr.adapter is not None else None,
            output_block_hashes=hashes[prompt // block_size :] if tr.output_hash_ids else (),
        )
        delay = engine.core.profile.timing.request_s(prompt)
        if delay > 0:
            self._at(self.now + delay, _ENGINE_ADD, (engine, rec, dispatch, req))
        else:
            self._engine_add(engine, rec, dispatch, req)

    def _engine_add(self, engine: SimEngine, rec: Record, dispatch: Dispatch, req: EngineRequest) -> None:
        if rec.dispatch is not dispatch:
            return  # preempted (or moved) while the API server was still on it
        engine.core.add_request(req, self.now)
        if not engine.stepping:
            self._step(engine)

    def _step(self, engine: SimEngine) -> None:
        result = engine.core.step(self.now)
        engine.stepping = True
        engine.busy_s += result.duration_s
        self._at(self.now + result.duration_s, _STEP_END, (engine, result))

    def _step_end(self, data: tuple[SimEngine, StepResult]) -> None:
        engine, result = data
        now = self.now
        if result.kv_events:
            for dispatcher in self.dispatchers:
                dispatcher.apply_kv_events(engine.id, result.kv_events)
        finished: list[Record] = []
        for out in result.outputs:
            rid, _, incarnation = out.request_id.rpartition("#")
            rec = self.records.get(rid)
            if rec is None or rec.dispatch is None or int(incarnation) != rec.preemptions:
                continue
            rec.output_tokens += out.new_tokens
            if out.first_token:
                rec.first = now
                rec.cached_tokens = out.cached_tokens
                self.dispatchers[rec.replica].observe_ttft(rec.dispatch, now - rec.req.arrival)
            elif rec.last is not None:
                gap = now - rec.last
                rec.gaps.append(gap)
                self.dispatchers[rec.replica].observe_itl(rec.dispatch, gap, now)
            rec.last = now
            if out.finished:
                rec.done = now
                finished.append(rec)
        engine.stepping = False
        for rec in finished:
            if rec.dispatch is None:
                continue
            self._handle(self.dispatchers[rec.replica].finish(rec.dispatch, now, generated=rec.output_tokens))
            self._closed(rec)
        if engine.core.has_work and not engine.stepping:
            self._step(engine)

    def _closed(self, rec: Record) -> None:
        if rec.flood:
            self._flood_one(self.now)
        following = rec.trace.next_turn
        if following is not None and rec.done is not None:
            arrival = self.now + following.pause_s
            self._at(
                arrival,
                _ARRIVAL,
                (f"{rec.req.id.split('.')[0]}.{following.turn}", replace(following, arrival=arrival), False),
            )

    # -- replicas sharing what they learn ---------------------------------------------------

    def _fleet_settings(self, replica: int) -> FleetSettings:
        setup = self.setup
        return FleetSettings(
            replica.to_bytes(16, "big"),
            silent_s=setup.share_silent_s,
            window_s=setup.share_window_s,
            settle_s=setup.share_full_s,
            tenants=setup.share_tenants,
            settled=True,
        )

    def _collect_learned(self) -> None:
        """Every replica's publisher: what it has to tell since its previous batch goes out now."""
        full, self._full_due = self._full_due, False
        for replica, dispatcher in enumerate(self.dispatchers):
            decided = dispatcher.fleet.outgoing(self.now, full)
            self._fleet_decided(decided)
            if decided.send is not None and self.share_up:  # the server drops what it cannot publish
                stats = self.share_stats
                stats["batches"] += 1
                stats["bytes"] += len(decided.send)
                self._at(self.now + self.setup.share_delay_s, _SHARE_ARRIVE, (replica, decided.send))

    def _fleet_decided(self, decided: FleetDecisions) -> None:
        self._handle(decided)
        for event in decided.events:
            if isinstance(event, Heard):
                self.share_stats["applied"] += event.facts
            elif isinstance(event, Sent) and self.share_up:
                self.share_stats["facts"] += event.facts
            elif isinstance(event, SafeShareBegan):
                self.safe_share_spans.append(
                    {"from_s": round(self.now, 3), "until_s": None, "replicas": event.replicas}
                )
            elif isinstance(event, SafeShareEnded):
                self._safe_share_ended(self.now)

    def _check_fill(self, engine_id: str) -> None:
        if not self.setup.admission.enabled:
            return
        running = sum(state.inflight for d in self.dispatchers if (state := d.engine(engine_id)) is not None)
        excess = running - math.ceil(max(d.limits[engine_id].limit for d in self.dispatchers))
        if excess > 0:
            self.overfilled["dispatches"] += 1
            self.overfilled["max_excess"] = max(self.overfilled["max_excess"], excess)

    def _hear_each_other(self) -> None:
        """Every replica hears of the others, then a round of full batches: each holds its even share."""
        for dispatcher in self.dispatchers:
            for other in self.dispatchers:
                if other is not dispatcher:
                    empty = Batch(other.fleet.own, 0, 0.0, other.fleet.block_chars, Report(full=True))
                    dispatcher.fleet.receive(encode(empty), 0.0)
        self._full_due = True
        for replica, dispatcher in enumerate(self.dispatchers):
            decided = dispatcher.fleet.outgoing(self.now, full=True)
            if decided.send is not None:
                self._share_arrive((replica, decided.send))
        self._full_due = False

    def _share_full(self) -> None:
        """Every replica's heartbeat: its next batch lists everything (and it lets the silent go)."""
        self._full_due = True
        if self.setup.share_interval_s <= 0:
            self._collect_learned()

    def _share_down(self) -> None:
        self.share_up = False
        for dispatcher in self.dispatchers:
            self._fleet_decided(dispatcher.fleet.channel_lost(self.now))

    def _safe_share_ended(self, now: float) -> None:
        open_span = next((span for span in self.safe_share_spans if span["until_s"] is None), None)
        if open_span is not None:
            open_span["until_s"] = round(now, 3)

    def _share_arrive(self, data: tuple[int, bytes]) -> None:
        _, batch = data
        if not self.share_up:
            return  # lost in transit with the channel
        for dispatcher in self.dispatchers:
            self._fleet_decided(dispatcher.fleet.receive(batch, self.now))

    def _share_summary(self) -> dict[str, Any] | None:
        if not self.sharing:
            return None
        span = max(self.end_of_arrivals, 1e-9)
        stats = self.share_stats
        return {
            **stats,
            "interval_ms": self.setup.share_interval_s * 1000,
            "delay_ms": self.setup.share_delay_s * 1000,
            "full_every_s": self.setup.share_full_s,
            "safe_share_spans": [dict(span) for span in self.safe_share_spans],
            "published_bytes_per_s": round(stats["bytes"] / span, 1),
            "received_bytes_per_s_per_replica": round(stats["bytes"] * (1 - 1 / len(self.dispatchers)) / span, 1),
        }

    def _scrape(self) -> None:
        for engine in self.engines.values():
            core = engine.core
            metrics = EngineMetrics(
                running=core.num_running,
                waiting=core.num_waiting,
                kv_usage=core.kv_cache_usage,
                prefix_queries=core.stats.prefix_cache_queries,
                prefix_hits=core.stats.prefix_cache_hits,
                block_size=core.block_size,
                num_blocks=core.profile.num_blocks,
                itl_buckets=tuple(zip((*core.stats.itl.bounds, math.inf), core.stats.itl.cumulative(), strict=True)),
                lora=_lora_info(core),
            )
            for dispatcher in self.dispatchers:
                dispatcher.scrape_sent(engine.id)
                dispatcher.apply_scrape(engine.id, metrics, self.now)


def _lora_info(core: EngineCore) -> LoraInfo | None:
    """The newest ``vllm:lora_requests_info`` series, as the monitor's scrape reads it."""
    if core.lora_slots is None:
        return None
    if not core.lora_info:
        return LoraInfo((), (), core.max_loras)
    running, waiting = max(core.lora_info, key=core.lora_info.__getitem__)
    return LoraInfo(tuple(filter(None, running.split(","))), tuple(filter(None, waiting.split(","))), core.max_loras)


def capacity_blocks(setup: ClusterSetup, pool: str) -> tuple[int, int]:
    for p in setup.pools:
        if p.name == pool:
            return p.engines * p.profile.num_blocks, p.profile.block_size
    raise KeyError(pool)


def hit_ceiling(trace: list[TraceRequest], capacity_blocks: float, block_size: int) -> float:
    """Prefix hit ratio of one LRU cache of ``capacity_blocks`` fed every request of ``trace`` in order."""
    prompts = (
        (tr.input_len, block_hashes_for_trace(tr.hash_ids, tr.input_len, tr.block_tokens, block_size)) for tr in trace
    )
    return lru_hit_ratio(prompts, capacity_blocks, block_size)
