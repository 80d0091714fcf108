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
