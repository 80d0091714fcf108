from priority_gateway.metrics import GatewayMetrics
from priority_gateway.tenant_metrics import ANONYMOUS, OTHER, TenantLabels, TenantMetrics


def test_labels_are_bounded_and_the_first_tenants_keep_theirs():
    label = TenantLabels(limit=3)
    assert [label(t) for t in ("a", "b", "c", "d", "e", "a")] == ["a", "b", "c", OTHER, OTHER, "a"]
    assert label("") == ANONYMOUS


class State:
    def tenant_inflight(self):
        return {f"t{n}": 1 for n in range(10)}

    def tenant_queued(self):
        return {(f"t{n}", "interactive"): 2 for n in range(10)}


def test_many_tenants_are_summed_under_other_at_scrape_time():
    metrics = GatewayMetrics()
    tenants = TenantMetrics(metrics, limit=2)
    tenants.watch(State())
    for n in range(10):
        tenants.answered(f"t{n}", "interactive", 200, 0.1, 0.5, (10, 5), stream=True)
    text = metrics.render().decode()
    assert 'gateway_tenant_inflight{tenant="other"} 8.0' in text
    assert 'gateway_tenant_queued{class="interactive",tenant="other"} 16.0' in text
    assert 'gateway_tenant_slo_total{class="interactive",result="met",tenant="other"} 8.0' in text
    assert len([line for line in text.splitlines() if line.startswith("gateway_tenant_requests_total{")]) == 3


def test_a_refusal_or_a_late_first_token_misses_the_slo():
    metrics = GatewayMetrics()
    tenants = TenantMetrics(metrics, limit=10)
    tenants.answered("a", "interactive", 429, None, 0.5, (None, None), stream=True)
    tenants.answered("a", "interactive", 200, 0.7, 0.5, (1, 1), stream=True)
    tenants.answered("a", "batch", 200, None, None, (1, 1), stream=False)
    text = metrics.render().decode()
    assert 'gateway_tenant_slo_total{class="interactive",result="missed",tenant="a"} 2.0' in text
    assert 'class="batch",result=' not in text
