"""The metric names dashboards may query, with their labels.

Gateway metrics are the documented ones (the config reference's list: name, type, labels).
vLLM's are the families a real vLLM 0.32 engine exports (data/vllm-0.32-metric-families.txt);
each of its series carries `engine` and `model_name`, and our scrape configs add `pool` and
`instance` (deploy/monitoring/podmonitor.yaml, deploy/compose/prometheus.yml).
"""

from __future__ import annotations

from pathlib import Path

# name -> (type, labels); counters are named with their _total suffix, as Prometheus stores them.
GATEWAY: dict[str, tuple[str, frozenset[str]]] = {
    "gateway_requests_total": ("counter", frozenset({"class", "pool", "status"})),
    "gateway_ttft_seconds": ("histogram", frozenset({"class", "pool"})),
    "gateway_itl_seconds": ("histogram", frozenset({"class", "pool"})),
    "gateway_inflight": ("gauge", frozenset({"pool", "engine"})),
    "gateway_engine_healthy": ("gauge", frozenset({"pool", "engine"})),
    "gateway_routing_decisions_total": ("counter", frozenset({"pool", "engine", "reason"})),
    "gateway_predicted_cached_tokens": ("histogram", frozenset({"pool"})),
    "gateway_prefix_hit_ratio_estimate": ("gauge", frozenset({"pool"})),
    "gateway_admission_total": ("counter", frozenset({"class", "decision"})),
    "gateway_queue_depth": ("gauge", frozenset({"pool", "class"})),
    "gateway_queue_wait_seconds": ("histogram", frozenset({"class"})),
    "gateway_engine_concurrency_limit": ("gauge", frozenset({"pool", "engine"})),
    "gateway_engine_held_slots": ("gauge", frozenset({"pool", "engine"})),
    "gateway_slo_budget_seconds": ("gauge", frozenset({"class", "kind"})),
    "gateway_batch_requests_total": ("counter", frozenset({"status"})),
    "gateway_batches": ("gauge", frozenset({"status"})),
    "gateway_tenant_requests_total": ("counter", frozenset({"tenant", "class", "status"})),
    "gateway_tenant_tokens_total": ("counter", frozenset({"tenant", "class", "kind"})),
    "gateway_tenant_slo_total": ("counter", frozenset({"tenant", "class", "result"})),
    "gateway_tenant_inflight": ("gauge", frozenset({"tenant"})),
    "gateway_tenant_queued": ("gauge", frozenset({"tenant", "class"})),
}

VLLM_LABELS = frozenset({"engine", "model_name"})
SCRAPE_LABELS = frozenset({"instance", "job"})
VLLM_SCRAPE_LABELS = SCRAPE_LABELS | {"pool"}
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def _vllm_families() -> dict[str, str]:
    path = Path(__file__).parent / "data" / "vllm-0.32-metric-families.txt"
    families = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, kind = line.split()
            families[name] = kind
    return families


VLLM: dict[str, str] = _vllm_families()


def series_labels(series: str) -> frozenset[str] | None:
    """The labels a stored series has (None when no documented metric stores it)."""
    for name, (kind, labels) in GATEWAY.items():
        if series == name:
            return labels | SCRAPE_LABELS
        if kind == "histogram" and series in {name + suffix for suffix in HISTOGRAM_SERIES}:
            return labels | SCRAPE_LABELS | ({"le"} if series.endswith("_bucket") else set())
    for name, kind in VLLM.items():
        if series == name:
            return VLLM_LABELS | VLLM_SCRAPE_LABELS
        if kind == "histogram" and series in {name + suffix for suffix in HISTOGRAM_SERIES}:
            return VLLM_LABELS | VLLM_SCRAPE_LABELS | ({"le"} if series.endswith("_bucket") else set())
    return None
