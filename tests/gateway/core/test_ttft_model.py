import random
import statistics

from priority_gateway.core.ttft_model import DEFAULT_MARGIN, MAX_MARGIN, MIN_MARGIN, TARGET_LATE_SHARE, TTFTModel


def test_learns_fixed_cost_plus_per_token_prefill():
    model = TTFTModel()
    for i in range(200):
        tokens = 500 + (i * 37) % 4000
        model.observe(tokens, 0.05 + tokens * 0.0001)
    assert abs(model.predict(1000) - 0.15) < 0.005
    assert abs(model.predict(4000) - 0.45) < 0.01
    fixed, per_token = model.line()  # what /metrics shows of it
    assert abs(fixed - 0.05) < 0.005 and abs(per_token - 0.0001) < 0.000005
    assert abs(fixed + per_token * 1000 - model.predict(1000)) < 1e-12


def test_follows_a_change_and_knows_nothing_before_data():
    model = TTFTModel()
    assert model.predict(100) is None and model.line() is None
    for _ in range(100):
        model.observe(1000, 0.1)
    for _ in range(300):
        model.observe(1000, 0.3)
    assert abs(model.predict(1000) - 0.3) < 0.01


def test_the_margin_settles_where_few_first_tokens_are_late():
    """Requests admitted at the edge (their whole budget is margin x the typical first token) on an
    engine whose first tokens scatter around the typical one: the margin settles near the quantile
    of that scatter that leaves TARGET_LATE_SHARE of them late, however it started."""
    rng = random.Random(7)
    scatter = sorted(rng.lognormvariate(0.0, 0.25) for _ in range(200_000))
    quantile = scatter[int((1 - TARGET_LATE_SHARE) * len(scatter))]  # ~1.9
    for start in (MIN_MARGIN, MAX_MARGIN):
        model = TTFTModel()
        model.margin = start
        late, margins = 0, []
        for i in range(60_000):
            typical = 0.1
            budget = model.margin * typical
            observed = typical * rng.lognormvariate(0.0, 0.25)
            model.observe(1000, observed, late=observed > budget)
            if i >= 30_000:
                late += observed > budget
                margins.append(model.margin)
        assert abs(statistics.median(margins) - quantile) < 0.1, (start, statistics.median(margins), quantile)
        assert 0.003 < late / 30_000 < 0.008


def test_the_margin_stays_within_its_bounds_and_ignores_requests_without_a_budget():
    always_late, never_late, no_budget = TTFTModel(), TTFTModel(), TTFTModel()
    assert always_late.margin == DEFAULT_MARGIN
    for _ in range(5000):
        always_late.observe(1000, 1.0, late=True)
        never_late.observe(1000, 0.1, late=False)
        no_budget.observe(1000, 5.0)
    assert always_late.margin == MAX_MARGIN
    assert never_late.margin == MIN_MARGIN
    assert no_budget.margin == DEFAULT_MARGIN
    assert abs(no_budget.predict(1000) - 5.0) < 1e-6
