"""A pool of engines: its spec, its engines, its routing policy and its wait queue.

Rules:
- Only healthy engines that serve the request's model are candidates: an engine that listed its
  models (``/v1/models``) serves those, one that has not answered yet is assumed to serve the pool's;
  a LoRA adapter the pool may load on demand is served by every engine.
- A pool that declares ``models`` serves them (and its loadable adapters) whatever its engines list.
- A request with a TTFT budget must start by its arrival plus its budget less the first token the
  pool's pace predicts for its prompt, times the margin its late first tokens steer (``ttft_model``: the
  line predicts a typical first token, the budget bounds a p99); one with a deadline by its deadline;
  others whenever (``start_deadline``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from priority_gateway.core.classes import ClassTable
from priority_gateway.core.decisions import Dispatch
from priority_gateway.core.engines import EngineState
from priority_gateway.core.models import serves
from priority_gateway.core.queue import DEFAULT_DECODE_TOKENS, WaitQueue
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.routing import Policy, make_policy
from priority_gateway.core.slots import Running, SlotTimes
from priority_gateway.core.ttft_model import TTFTModel


@dataclass(slots=True)
class PoolSpec:
    name: str
    engines: list[str]
    policy: str = "prefix"
    takes_priority: bool = False
    backfill: bool = True
    accept_overflow: bool = False
    policy_options: dict[str, object] = field(default_factory=dict)
    models: tuple[str, ...] = ()
    """Models the pool is declared to serve, besides what its engines list."""
    loadable: tuple[str, ...] = ()
    """LoRA adapters any of its engines may be asked to load on demand."""
    shares_hardware_with: str | None = None
    """A pool whose engines run on the same devices: this pool's limits are learned from its gaps."""
    seats: int | None = None
    """The requests each of its engines runs at once (vLLM's ``--max-num-seqs``), where declared: no
    engine's limit goes above it."""


class Pool:
    def __init__(
        self,
        spec: PoolSpec,
        classes: ClassTable,
        fair: bool = True,
        decode_tokens: int = DEFAULT_DECODE_TOKENS,
        burst: int = 4,
    ) -> None:
        self.name = spec.name
        self.takes_priority = spec.takes_priority
        self.backfill = spec.backfill
        self.accept_overflow = spec.accept_overflow
        self.shares_hardware_with = spec.shares_hardware_with
        self.seats = spec.seats
        self.policy: Policy = make_policy(spec.policy, **spec.policy_options)
        self.engines: list[EngineState] = [EngineState(url, spec.name) for url in spec.engines]
        self.models = frozenset(spec.models) | frozenset(spec.loadable)
        self.loadable = frozenset(spec.loadable)
        self.queue = WaitQueue(classes, fair, decode_tokens, burst)
        self.ttft_model = TTFTModel()
        self.slots = SlotTimes()

    def healthy(self, exclude: Iterable[str] = (), model: str | None = None) -> list[EngineState]:
        if model is not None and self.models and model not in self.models:
            return [e for e in self.healthy(exclude) if e.models is not None and model in e.models]
        if exclude:
            excluded = set(exclude)
            engines = [e for e in self.engines if e.healthy and e.id not in excluded]
        else:
            engines = [e for e in self.engines if e.healthy]
        if model is not None and model not in self.loadable:
            return [e for e in engines if e.serves(model)]
        return engines

    def serves(self, model: str) -> bool:
        return serves(self.models, [e.models for e in self.engines], model)

    def set_engines(self, urls: Sequence[str]) -> None:
        known = {e.id: e for e in self.engines}
        self.engines = [known.get(url) or EngineState(url, self.name) for url in urls]
        for gone in set(known) - set(urls):
            self.policy.forget(gone)

    def start_deadline(self, req: RouteRequest) -> float:
        """When ``req`` must have started at the latest (the rules)."""
        if req.budget.ttft_s is not None:
            model = self.ttft_model
            expected = model.margin * (model.predict(req.prompt_tokens) or 0.0)
            return req.arrival + max(0.0, req.budget.ttft_s - expected)
        if req.budget.deadline_s is not None:
            return req.arrival + req.budget.deadline_s
        return math.inf

    def running(self, dispatch: Dispatch) -> Running:
        """What the slot times know of a started request: when it started, its first token's expected
        time, its output bound."""
        first = self.ttft_model.predict(dispatch.request.prompt_tokens) or 0.0
        return Running(dispatch.dispatched_at, first, dispatch.request.max_tokens)
