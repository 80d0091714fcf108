"""The gateway's metrics helpers: many observations at once read as many one by one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from priority_gateway.metrics import ITL_BUCKETS, observe_times


def test_observing_a_value_many_times_at_once_is_observing_it_one_by_one():
    rendered = []
    for together in (True, False):
        registry = CollectorRegistry()
        histogram = Histogram("gaps", "gaps", ("class",), buckets=ITL_BUCKETS, registry=registry)
        child = histogram.labels("interactive")
        for value, times in ((0.004, 3), (0.02, 1), (0.3, 12), (9.0, 2)):
            if together:
                observe_times(child, value, times)
            else:
                for _ in range(times):
                    child.observe(value)
        rendered.append(generate_latest(registry))
    lines = [[line for line in page.splitlines() if b"_created" not in line] for page in rendered]
    assert lines[0] == lines[1]
    assert b'gaps_count{class="interactive"} 18.0' in rendered[0]
