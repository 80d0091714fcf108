"""Per-tenant metrics (``gateway_tenant_*``), with a bounded set of label values.

Rules:
- A tenant label comes from the key store only (the key's tenant, or its id), never from
  request input. The first ``limit`` tenants seen get a label of their own; every later one
  is counted under ``other``, so a store with many keys cannot blow up the time series.
  Callers without a key are ``anonymous``.
- In-flight and queued counts are read from the dispatcher at scrape time; the request path
  pays one counter increment per answer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from priority_gateway.metrics import GatewayMetrics

OTHER = "other"
ANONYMOUS = "anonymous"


class TenantLabels:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: dict[str, str] = {}

    def __call__(self, tenant: str) -> str:
        if not tenant:
            return ANONYMOUS
        label = self._seen.get(tenant)
        if label is None:
            if len(self._seen) >= self.limit:
                return OTHER
            label = self._seen[tenant] = tenant
        return label


class TenantState(Protocol):
    def tenant_inflight(self) -> dict[str, int]: ...

    def tenant_queued(self) -> dict[tuple[str, str], int]: ...


class TenantMetrics:
    def __init__(self, metrics: GatewayMetrics, limit: int) -> None:
        self.label = TenantLabels(limit)
        r = self.registry = metrics.registry
        self.requests = Counter(
            "gateway_tenant_requests",
            "Requests answered, by tenant (from the key store), class and HTTP status.",
            ("tenant", "class", "status"),
            registry=r,
        )
        self.tokens = Counter(
            "gateway_tenant_tokens",
            "Tokens served, by tenant, class and kind (prompt, completion), from the engines' usage.",
            ("tenant", "class", "kind"),
            registry=r,
        )
        self.slo = Counter(
            "gateway_tenant_slo",
            "Streamed requests of classes with a TTFT budget, by whether the first token came within it "
            "(met) or not, or the request was refused (missed).",
            ("tenant", "class", "result"),
            registry=r,
        )
        # Label lookups are the costly part of prometheus_client: each child is looked up once.
        self._child: Callable[..., Any] = functools.cache(lambda metric, *labels: metric.labels(*labels))

    def watch(self, state: TenantState) -> None:
        self.registry.register(_TenantCollector(state, self.label))

    def answered(
        self,
        tenant: str,
        cls: str,
        status: int,
        ttft_s: float | None,
        ttft_budget_s: float | None,
        usage: tuple[int | None, int | None],
        stream: bool,
    ) -> None:
        label = self.label(tenant)
        self._child(self.requests, label, cls, str(status)).inc()
        prompt, completion = usage
        if prompt:
            self._child(self.tokens, label, cls, "prompt").inc(prompt)
        if completion:
            self._child(self.tokens, label, cls, "completion").inc(completion)
        if ttft_budget_s is not None and stream:
            met = status == 200 and ttft_s is not None and ttft_s <= ttft_budget_s
            self._child(self.slo, label, cls, "met" if met else "missed").inc()


class _TenantCollector(Collector):
    def __init__(self, state: TenantState, label: TenantLabels) -> None:
        self.state = state
        self.label = label

    def collect(self) -> Iterator[Metric]:
        inflight = GaugeMetricFamily(
            "gateway_tenant_inflight", "Requests of a tenant in flight to engines.", labels=("tenant",)
        )
        summed: dict[str, int] = {}
        for tenant, n in self.state.tenant_inflight().items():
            label = self.label(tenant)
            summed[label] = summed.get(label, 0) + n
        for label, n in summed.items():
            inflight.add_metric((label,), n)
        queued = GaugeMetricFamily(
            "gateway_tenant_queued",
            "Requests of a tenant waiting in the gateway, by class.",
            labels=("tenant", "class"),
        )
        by_class: dict[tuple[str, str], int] = {}
        for (tenant, cls), n in self.state.tenant_queued().items():
            key = (self.label(tenant), cls)
            by_class[key] = by_class.get(key, 0) + n
        for key, n in by_class.items():
            queued.add_metric(key, n)
        yield from (inflight, queued)
