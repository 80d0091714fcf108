from priority_gateway.core.ttft_model import TTFTModel


def test_learns_fixed_cost_plus_per_token_prefill():
    model = TTFTModel()
    for i in range(200):
        tokens = 500 + (i * 37) % 4000
        model.observe(tokens, 0.05 + tokens * 0.0001)
    assert abs(model.predict(1000) - 0.15) < 0.005
    assert abs(model.predict(4000) - 0.45) < 0.01


def test_follows_a_change_and_knows_nothing_before_data():
    model = TTFTModel()
    assert model.predict(100) is None
    for _ in range(100):
        model.observe(1000, 0.1)
    for _ in range(300):
        model.observe(1000, 0.3)
    assert abs(model.predict(1000) - 0.3) < 0.01


def test_the_margin_is_the_measured_p99_over_the_typical_first_token():
    """Half the first tokens twice as slow as the other half: a p99 needs what covers the slow half, not
    the fixed 1.2 that holds before enough were seen; a steady engine gets the floor."""
    spread = TTFTModel()
    steady = TTFTModel()
    assert spread.margin == 1.2
    for i in range(400):
        spread.observe(1000, 0.1 if i % 2 else 0.2)
        steady.observe(1000, 0.1)
    typical = spread.predict(1000)
    assert typical is not None and 0.13 < typical < 0.17
    assert 1.25 < spread.margin < 1.5  # the slow half over the line's typical one
    assert spread.margin * typical >= 0.19  # so the margin covers it
    assert steady.margin == 1.1  # at least the floor, whatever the spread
