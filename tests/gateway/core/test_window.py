import random

from hypothesis import given, settings
from hypothesis import strategies as st

from priority_gateway.core.window import EDGES, LatencyWindow, within
from tests.support.examples import examples


def test_quantile_is_close_to_the_exact_one():
    rng = random.Random(1)
    window = LatencyWindow(window_s=100.0)
    values = [rng.expovariate(1 / 0.03) for _ in range(5000)]
    for i, v in enumerate(values):
        window.observe(v, i * 0.01)
    exact = sorted(values)[int(0.99 * len(values)) - 1]
    estimate = window.quantile(0.99, 50.0)
    assert estimate is not None
    assert exact <= estimate <= exact * 1.05


def test_old_slices_fall_out_of_the_window():
    window = LatencyWindow(window_s=10.0, slices=10)
    for i in range(100):
        window.observe(1.0, i * 0.05)  # the first 5 s: slow
    for i in range(100):
        window.observe(0.01, 20.0 + i * 0.05)  # 15 s later: fast
    assert window.quantile(0.99, 25.0) < 0.02
    assert window.count == 100
    assert window.quantile(0.5, 100.0) is None


def test_edges_cover_the_useful_range():
    assert EDGES[0] <= 1e-4 and EDGES[-1] >= 600


@settings(max_examples=examples(200), deadline=None)
@given(
    values=st.lists(st.floats(min_value=1e-4, max_value=1.0), min_size=1, max_size=300),
    bound=st.floats(min_value=1e-4, max_value=1.0),
    q=st.sampled_from([0.5, 0.9, 0.99]),
)
def test_counts_tell_whether_a_quantile_is_within_a_bound(values, bound, q):
    window = LatencyWindow(10.0)
    for value in values:
        window.observe(value, 1.0)
    quantile = window.quantile(q, 1.0)
    assert quantile is not None
    assert within(q, window.count, window.count_at_most(bound, 1.0)) == (quantile <= bound)


@given(st.lists(st.tuples(st.floats(1e-4, 10.0), st.integers(1, 40)), min_size=1, max_size=30))
@settings(max_examples=examples(50), deadline=None)
def test_observing_a_value_many_times_at_once_is_observing_it_one_by_one(observations):
    together, one_by_one = LatencyWindow(30.0), LatencyWindow(30.0)
    for i, (value, times) in enumerate(observations):
        together.observe(value, float(i), times)
        for _ in range(times):
            one_by_one.observe(value, float(i))
    now = float(len(observations))
    assert together.count == one_by_one.count
    for q in (0.5, 0.9, 0.99):
        assert together.quantile(q, now) == one_by_one.quantile(q, now)
