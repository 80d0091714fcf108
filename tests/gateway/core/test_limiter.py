"""The adaptive limit against engines whose ITL depends on how many requests they run."""

import random

from gateway.core.limiter import ConcurrencyLimit, LimitSettings


def run(itl_of, seconds=600.0, budget=0.05, tokens_per_s=30.0, seed=0, start=None):
    """Keep the engine exactly at its limit (a saturating load) and feed it ITL samples."""
    rng = random.Random(seed)
    settings = LimitSettings()
    limit = ConcurrencyLimit(budget, settings, 0.0)
    if start is not None:
        limit.limit = start
    t, history = 0.0, []
    while t < seconds:
        load = int(limit.limit)
        for _ in range(load):
            limit.observe_itl(itl_of(load, rng), load, t)
        limit.note_load(load)
        t += 1.0 / tokens_per_s
        limit.update(t, load)
        history.append(limit.limit)
    return history


def cliff_at_4(load, rng):
    # Like the article's NVFP4 engine: ~40 ms up to 4 sequences, then prefill stalls push p99 over.
    stall = 0.002 * max(0, load - 4)
    return 0.18 if rng.random() < stall * 10 else 0.035 + 0.002 * load


def test_limit_converges_to_the_largest_concurrency_within_budget():
    history = run(cliff_at_4)
    settled = history[len(history) // 2 :]
    assert max(settled) <= 5
    assert sum(1 for v in settled if v == 4) / len(settled) > 0.8


def test_limit_backs_off_when_the_engine_gets_slower():
    history = run(lambda load, rng: 0.02 * load, start=10.0)
    assert history[-1] <= 2.5


def test_limit_grows_on_a_fast_engine():
    history = run(lambda load, rng: 0.005 + 0.0005 * load)
    assert history[-1] >= 20


def test_an_unused_limit_does_not_grow():
    limit = ConcurrencyLimit(0.05, LimitSettings(), 0.0)
    for t in range(1, 300):
        limit.observe_itl(0.01, 1, float(t))
        limit.update(float(t), 1.0)
    assert limit.limit == LimitSettings().initial


def test_engines_without_a_budget_keep_a_fixed_limit():
    limit = ConcurrencyLimit(None, LimitSettings(unbudgeted=48), 0.0)
    for t in range(1, 100):
        limit.observe_itl(5.0, 48, float(t))
        limit.update(float(t), 48.0)
    assert limit.limit == 48
