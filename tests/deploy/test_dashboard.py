"""The Grafana dashboard: loads, every query is valid PromQL over documented metrics and
labels, it covers what operators watch, and its Kubernetes ConfigMap carries the same JSON."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import promql_parser
import pytest

from priority_gateway.metrics import GatewayMetrics
from priority_gateway.tenant_metrics import TenantMetrics
from tests.deploy.documented_metrics import GATEWAY, series_labels
from tests.deploy.support import DEPLOY, named, render

DASHBOARD = DEPLOY / "grafana" / "gateway-dashboard.json"
# Grafana's own variables become plain values for parsing.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in panels(board):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((\w+), *(\w+)\)", variable["definition"])
            assert match, variable["definition"]
            yield f"variable {variable['name']}", f"{match[1]}{{{match[2]}!=''}}"


# Expressions that wrap one inner expression (`.expr`).
NESTING = (promql_parser.AggregateExpr, promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)


def parse(expr: str) -> promql_parser.Expr:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return promql_parser.parse(expr)


def nodes(node: Any) -> Iterator[Any]:
    """`node` and every expression under it."""
    yield node
    if isinstance(node, promql_parser.MatrixSelector):
        yield from nodes(node.vector_selector)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            yield from nodes(arg)
    elif isinstance(node, promql_parser.BinaryExpr):
        yield from nodes(node.lhs)
        yield from nodes(node.rhs)
    elif isinstance(node, NESTING):
        yield from nodes(node.expr)


def selectors(node: Any) -> Iterator[promql_parser.VectorSelector]:
    return (n for n in nodes(node) if isinstance(n, promql_parser.VectorSelector))


def aggregations(node: Any) -> Iterator[promql_parser.AggregateExpr]:
    return (n for n in nodes(node) if isinstance(n, promql_parser.AggregateExpr))


def test_dashboard_is_valid_json_with_unique_panel_ids() -> None:
    board = dashboard()
    assert board["uid"] and board["title"]
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids))
    for panel in panels(board):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]


def test_every_query_parses_and_names_documented_metrics_and_labels() -> None:
    for title, expr in queries(dashboard()):
        ast = parse(expr)
        found = list(selectors(ast))
        assert found, f"{title}: {expr} reads no metric"
        for selector in found:
            labels = series_labels(selector.name)
            assert labels is not None, f"{title}: {selector.name} is not a documented metric"
            for matcher in selector.matchers.matchers:
                assert matcher.name in labels, f"{title}: {selector.name} has no label {matcher.name}"
        for aggregation in aggregations(ast):
            if aggregation.modifier is None:
                continue
            inner = [series_labels(s.name) for s in selectors(aggregation.expr)]
            for label in aggregation.modifier.labels:
                assert all(label in labels for labels in inner if labels), f"{title}: no label {label} in {expr}"


def test_an_undocumented_metric_is_caught() -> None:
    selector = next(selectors(parse("sum(rate(vllm:gpu_prefix_cache_hits_total[5m]))")))
    assert series_labels(selector.name) is None


def metrics_read(board: dict[str, Any]) -> set[str]:
    return {s.name for _, expr in queries(board) for s in selectors(parse(expr))}


@pytest.mark.parametrize(
    "needed",
    [
        "gateway_ttft_seconds_bucket",
        "gateway_itl_seconds_bucket",
        "gateway_slo_budget_seconds",
        "gateway_admission_total",
        "gateway_queue_depth",
        "gateway_engine_concurrency_limit",
        "gateway_prefix_hit_ratio_estimate",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "gateway_batch_requests_total",
        "gateway_batches",
        "gateway_engine_healthy",
        "gateway_requests_total",
        "gateway_tenant_slo_total",
        "gateway_tenant_tokens_total",
        "gateway_tenant_requests_total",
        "gateway_tenant_inflight",
        "gateway_tenant_queued",
    ],
)
def test_dashboard_shows(needed: str) -> None:
    assert needed in metrics_read(dashboard())


def test_latency_panels_draw_the_budget() -> None:
    board = dashboard()
    for kind, histogram in (("ttft_p99", "gateway_ttft_seconds_bucket"), ("itl_p99", "gateway_itl_seconds_bucket")):
        panel = next(p for p in panels(board) if any(histogram in t["expr"] for t in p.get("targets", [])))
        exprs = [t["expr"] for t in panel["targets"]]
        assert any(f'kind="{kind}"' in e and "gateway_slo_budget_seconds" in e for e in exprs), panel["title"]
        assert any(e.startswith("histogram_quantile(0.99,") for e in exprs), panel["title"]


def test_documented_gateway_metrics_are_the_ones_the_gateway_exports() -> None:
    metrics = GatewayMetrics()

    class NoState:
        def engines(self) -> list[Any]:
            return []

        def queue_depths(self) -> dict[tuple[str, str], int]:
            return {}

        def prefix_hit_estimates(self) -> dict[str, float]:
            return {}

        def concurrency_limits(self) -> dict[str, float]:
            return {}

        def ttft_models(self) -> dict[str, tuple[float, tuple[float, float] | None]]:
            return {}

        def held_slots(self) -> dict[str, int]:
            return {}

    class NoTenants:
        def tenant_inflight(self) -> dict[str, int]:
            return {}

        def tenant_queued(self) -> dict[tuple[str, str], int]:
            return {}

    metrics.watch_state(NoState())
    TenantMetrics(metrics, limit=10).watch(NoTenants())
    exported = {family.name: family.type for family in metrics.registry.collect()}
    for name, (kind, _labels) in GATEWAY.items():
        family = name.removesuffix("_total") if kind == "counter" else name
        assert exported.get(family) == kind, name


@pytest.mark.parametrize("directory", ["monitoring", "grafana"])
def test_configmap_carries_the_dashboard_for_the_grafana_sidecar(directory: str) -> None:
    config_map = named(render(directory), "ConfigMap", "grafana-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["gateway-dashboard.json"]) == dashboard()
