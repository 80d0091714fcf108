"""The adaptive limit against engines whose ITL depends on how many requests they run."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from priority_gateway.core.limiter import ConcurrencyLimit, LimitSettings
from tests.support.examples import examples


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
    # It probes past the cliff now and then (a step there is found over budget and taken back), never far.
    assert max(settled) <= 6
    assert sum(1 for v in settled if v > 5) / len(settled) < 0.03
    assert sum(1 for v in settled if v == 4) / len(settled) > 0.8


def test_limit_backs_off_when_the_engine_gets_slower():
    history = run(lambda load, _rng: 0.02 * load, start=10.0)
    assert history[-1] <= 2.5


@pytest.mark.untraced
def test_limit_grows_on_a_fast_engine():
    history = run(lambda load, _rng: 0.005 + 0.0005 * load)
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


def test_a_few_prefill_stalls_do_not_drag_the_limit_down():
    # Every new prompt stalls the decoding beside it for one slow step: ~0.7 % of gaps at any load,
    # under the 1 % a p99 budget allows. Above 4 requests the stalls become a cliff.
    def stalls(load, rng):
        share = 0.007 if load <= 4 else 0.05
        return 0.1 if rng.random() < share else 0.036

    history = run(stalls, seconds=900.0, seed=3)
    settled = history[len(history) // 3 :]
    assert sum(1 for v in settled if v <= 2) / len(settled) < 0.02
    assert sum(1 for v in settled if v == 4) / len(settled) > 0.6


def overload_then_idle(limit: ConcurrencyLimit, until: float) -> float:
    """Drive ``limit`` down with an engine over budget at 2 requests, then leave it idle until ``until``."""
    t = 0.0
    while t < 60.0:
        load = int(limit.limit)
        for _ in range(load):
            limit.observe_itl(0.09 if load >= 2 else 0.03, load, t)
        limit.note_load(load)
        t += 1.0 / 30
        limit.update(t, load)
    assert limit.limit == 1
    while t < until:
        t += 1.0
        limit.update(t, 0.0)
    return t


def test_a_limit_learned_under_overload_climbs_back_when_the_engine_idles():
    limit = ConcurrencyLimit(0.05, LimitSettings(), 0.0)
    overload_then_idle(limit, until=60.0 + 300.0)
    assert limit.limit == LimitSettings().initial


def test_missing_evidence_is_not_bad_evidence():
    # After the overload the engine serves one request at a time and nothing is measured at two:
    # the limit still climbs back to the probe level, where the engine is measured afresh.
    limit = ConcurrencyLimit(0.05, LimitSettings(), 0.0)
    t = overload_then_idle(limit, until=60.0)
    while t < 110.0:
        limit.observe_itl(0.03, 1, t)
        limit.note_load(1)
        t += 1.0 / 30
        limit.update(t, 1.0)
    assert limit.limit == LimitSettings().initial


def engine_histogram(fast: int, slow: int) -> list[tuple[float, float]]:
    """A vLLM ``inter_token_latency_seconds`` histogram (cumulative) with gaps of ~36 and ~90 ms."""
    bounds = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, math.inf)
    return [(b, float(fast * (b >= 0.05) + slow * (b >= 0.1))) for b in bounds]


@settings(max_examples=examples(25), deadline=None)
@given(slowdown=st.floats(min_value=1.5, max_value=6.0), start=st.integers(min_value=2, max_value=6))
def test_slowness_the_engine_does_not_confirm_cannot_talk_the_limit_down(slowdown, start):
    # A client hammering the gateway with requests it refuses burns the gateway's (or the host's)
    # CPU: the relay times the engine's gaps late, while the engine's own histogram says it
    # produced them on time.
    limit = ConcurrencyLimit(0.05, LimitSettings(), 0.0)
    limit.limit = float(start)
    fast = 0
    t = 0.0
    limit.observe_engine_itl(engine_histogram(0, 0), t)  # the first scrape, at start
    while t < 120.0:
        load = int(limit.limit)
        for _ in range(load):
            limit.observe_itl(0.036 * slowdown, load, t)
        fast += load
        limit.note_load(load)
        t += 1.0 / 30
        if int(t * 30) % 60 == 0:  # a scrape every 2 s
            limit.observe_engine_itl(engine_histogram(fast, 0), t)
        limit.update(t, load)
        assert limit.limit >= start, t


def test_slowness_the_engine_confirms_still_shrinks_the_limit():
    limit = ConcurrencyLimit(0.05, LimitSettings(), 0.0)
    limit.limit = 4.0
    fast = slow = 0
    t = 0.0
    limit.observe_engine_itl(engine_histogram(0, 0), t)
    while t < 60.0:
        load = int(limit.limit)
        for i in range(load):
            stalled = (int(t * 30) + i) % 20 == 0  # 5 % of gaps stall, in the engine itself
            limit.observe_itl(0.09 if stalled else 0.036, load, t)
            slow += stalled
            fast += not stalled
        limit.note_load(load)
        t += 1.0 / 30
        if int(t * 30) % 60 == 0:
            limit.observe_engine_itl(engine_histogram(fast, slow), t)
        limit.update(t, load)
    assert limit.limit < 4


def stalls_over_4(load, rng):
    share = 0.007 if load <= 4 else 0.05
    return 0.1 if rng.random() < share else 0.036


@pytest.mark.untraced
@settings(max_examples=examples(6), deadline=None)
@given(
    itl_of=st.sampled_from([cliff_at_4, stalls_over_4, lambda load, rng: 0.005 + 0.002 * load * rng.random()]),
    replicas=st.integers(min_value=2, max_value=5),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_replicas_that_add_up_their_counts_learn_what_one_replica_fed_every_gap_learns(itl_of, replicas, seed):
    # The same engine, the same gaps: one replica relays them all, or each of ``replicas`` relays some; the
    # first of them leads on everyone's counts, the others follow it.
    rng, split = random.Random(seed), random.Random(seed + 1)
    one = ConcurrencyLimit(0.05, LimitSettings(), 0.0)
    fleet = [ConcurrencyLimit(0.05, LimitSettings(), 0.0) for _ in range(replicas)]
    leader, followers = fleet[0], fleet[1:]
    t = 0.0
    while t < 200.0:
        load = int(one.limit)
        assert leader.limit == one.limit, t
        for _ in range(3 * load):  # a step of 10 ms gives each request a token; 3 steps a tick
            gap = itl_of(load, rng)
            one.observe_itl(gap, load, t)
            split.choice(fleet).observe_itl(gap, load, t)
        one.note_load(load)
        leader.note_load(load)
        t += 0.1
        one.update(t, load)
        heard = [r.evidence(t) for r in fleet]
        for i, follower in enumerate(followers, 1):
            follower.update(t, load, heard[:i] + heard[i + 1 :], lead=False)
        leader.update(t, load, heard[1:])
        for follower in followers:
            follower.follow(leader.limit, t)
    assert one.learned and leader.limit == one.limit


def test_a_replica_that_follows_never_moves_the_limit_itself():
    limit = ConcurrencyLimit(0.05, LimitSettings(), 0.0)
    t = 0.0
    while t < 60.0:
        limit.observe_itl(0.01, 2, t)
        limit.note_load(2)
        t += 1.0 / 30
        limit.update(t, 2.0, lead=False)
    assert limit.limit == LimitSettings().initial and not limit.learned
    assert limit.follow(7.0, t) and limit.limit == 7.0 and limit.learned


def test_far_within_budget_the_limit_grows_by_half_a_step_not_one():
    history = run(lambda _load, _rng: 0.01, seconds=30.0)
    steps = sorted(set(history))
    assert steps[:6] == [2.0, 3.0, 4.0, 6.0, 9.0, 13.0]


def test_near_the_budget_the_limit_grows_one_request_at_a_time():
    # 42 ms gaps under a 50 ms budget: within it, but where a cliff of prefill stalls may be one step away.
    history = run(lambda _load, _rng: 0.042, seconds=30.0)
    steps = sorted(set(history))
    assert steps[:6] == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]


def seated(seats: int, seconds: float = 600.0, itl: float = 0.01) -> tuple[list[float], set[str]]:
    """An engine that runs at most ``seats`` requests (vLLM's ``--max-num-seqs``) and queues the rest, fast
    whatever it runs, kept at its limit by a saturating load and scraped every second."""
    limit = ConcurrencyLimit(0.05, LimitSettings(), 0.0)
    t, history, reasons = 0.0, [], set()
    step = 1.0 / 30
    while t < seconds:
        load = int(limit.limit)
        for _ in range(min(load, seats)):
            limit.observe_itl(itl, min(load, seats), t)
        limit.note_load(load)
        scraped = math.floor(t)
        limit.note_engine_queue(min(load, seats), max(0, load - seats), float(scraped))
        t += step
        limit.update(t, load)
        history.append(limit.limit)
        reasons.add(limit.reason)
    return history, reasons


def test_a_limit_does_not_grow_past_the_requests_the_engine_runs():
    # Its gaps stay fast, so ITL alone would take the limit to the maximum; past four the engine queues
    # what it is sent, which then waits where no TTFT budget is counted.
    history, reasons = seated(4)
    settled = history[len(history) // 4 :]
    assert "engine_queueing" in reasons
    assert max(settled) <= 6
    assert sum(1 for v in settled if v == 4) / len(settled) > 0.9


@pytest.mark.untraced
def test_an_engine_that_seats_everything_lets_the_limit_grow():
    history, reasons = seated(1000, seconds=120.0)
    assert "engine_queueing" not in reasons
    assert history[-1] >= 20


@pytest.mark.untraced
def test_requests_waiting_for_a_prefill_budget_count_as_carried():
    # A chunked-prefill engine (vLLM's --max-num-batched-tokens) holds the newest one or two requests
    # waiting for the next steps' prefill budget while the number it runs moves: it carries them all, and
    # the limit grows. (Counting only what it runs kept a real H100's limit at 42 while the gateway queued.)
    limit = ConcurrencyLimit(0.05, LimitSettings(), 0.0)
    t, step = 0.0, 1.0 / 30
    while t < 120.0:
        load = int(limit.limit)
        for _ in range(load):
            limit.observe_itl(0.01, load, t)
        limit.note_load(load)
        scraped = math.floor(t)
        waiting = 1 + scraped % 2 if load >= 4 else 0
        limit.note_engine_queue(load - waiting, waiting, float(scraped))
        t += step
        limit.update(t, load)
    assert limit.reason != "engine_queueing"
    assert limit.limit >= 20


def prefill_bound(settings: LimitSettings, seconds: float = 120.0) -> tuple[ConcurrencyLimit, set[str]]:
    """A chunked-prefill engine short of its prefill budget, with seats to spare: it holds the two newest
    requests waiting for the next steps' prefill, so each scrape shows the same number running."""
    limit = ConcurrencyLimit(0.05, settings, 0.0)
    t, step, reasons = 0.0, 1.0 / 30, set()
    while t < seconds:
        load = int(limit.limit)
        for _ in range(load):
            limit.observe_itl(0.01, load, t)
        limit.note_load(load)
        waiting = 2 if load >= 4 else 0
        limit.note_engine_queue(load - waiting, waiting, float(math.floor(t)))
        t += step
        limit.update(t, load)
        reasons.add(limit.reason)
    return limit, reasons


@pytest.mark.untraced
def test_declared_seats_keep_a_steady_prefill_queue_from_passing_for_them():
    # Undeclared, the same number running beside requests waiting, scrape after scrape, is all the engine
    # seats: the limit stops there. (A real H100 with 256 seats once showed 34 running twice and held its
    # limit at 34.) The pool that declares the engine's --max-num-seqs knows better.
    learned, reasons = prefill_bound(LimitSettings())
    assert "engine_queueing" in reasons and learned.limit < 8
    declared, reasons = prefill_bound(LimitSettings(seats=256.0, maximum=256.0))
    assert "engine_queueing" not in reasons
    assert declared.limit >= 20


def test_a_moment_of_waiting_in_one_scrape_is_no_queue():
    limit = ConcurrencyLimit(0.05, LimitSettings(), 0.0)
    limit.limit = 8.0
    for t in range(1, 60):
        waiting = 1 if t % 2 else 0  # a request seen waiting for the next step, every other scrape
        limit.note_engine_queue(7, waiting, float(t))
        limit.note_load(8)
        limit.update(float(t), 8.0)
    assert limit.reason != "engine_queueing" and limit.limit >= 8


@pytest.mark.parametrize("waiting", [float("nan"), -5.0, 1e12, float("inf")])
def test_a_broken_engine_queue_reading_moves_no_limit_by_itself(waiting):
    # What a scrape says the engine carries only lets a limit count as reached; growth still needs ITL
    # evidence, and an engine reporting nonsense gives none.
    limit = ConcurrencyLimit(0.05, LimitSettings(), 0.0)
    for t in range(1, 60):
        limit.note_engine_queue(2, waiting, float(t))
        limit.note_load(2)
        limit.update(float(t), 2.0)
    assert limit.limit <= LimitSettings().initial
