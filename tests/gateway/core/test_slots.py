"""When a queued request gets a slot, from the requests running on full engines."""

import pytest

from priority_gateway.core.slots import FullEngine, Running, SlotTimes


def paced(gap: float = 0.035) -> SlotTimes:
    slots = SlotTimes()
    for _ in range(50):
        slots.observe_gap(gap)
    return slots


def test_a_slot_time_is_first_token_then_max_tokens_at_the_pace():
    slots = paced()
    assert slots.predict(Running(0.0, 0.1, 101)) == pytest.approx(0.1 + 100 * 0.035)
    assert slots.predict(Running(0.0, 0.1, None)) is None  # nothing to go by yet


def test_answers_that_stop_early_scale_the_prediction_down():
    slots = paced()
    for _ in range(200):
        run = Running(0.0, 0.1, 1001)
        slots.observe_done(run, 0.3 * (0.1 + 1000 * 0.035))  # they stop at 30 % of max_tokens
    assert slots.predict(Running(0.0, 0.1, 1001)) == pytest.approx(0.3 * (0.1 + 1000 * 0.035), rel=0.05)
    assert slots.mean_s == pytest.approx(0.3 * 35.1, rel=0.01)  # for requests without max_tokens


def test_the_next_slot_frees_when_the_first_running_request_ends():
    slots = paced()
    engines = [
        FullEngine(2, 2, [Running(0.0, 0.0, 101), Running(2.0, 0.0, 11)]),  # ends at 3.5 and 2.35
        FullEngine(1, 1, [Running(1.0, 0.0, 51)]),  # ends at 2.75
    ]
    assert slots.wait(0, engines, now=2.0) == pytest.approx(0.35)
    assert slots.wait(1, engines, now=2.0) == pytest.approx(0.75)
    assert slots.wait(2, engines, now=2.0) == pytest.approx(1.5)


def test_an_engine_over_its_limit_frees_a_slot_only_once_it_is_back_under():
    slots = paced()
    # Load 3 against a limit of 2 (the limit just shrank): two requests must end first.
    over = FullEngine(3, 2, [Running(0.0, 0.0, 11), Running(0.0, 0.0, 21), Running(0.0, 0.0, 31)])
    assert slots.wait(0, [over], now=0.0) == pytest.approx(0.7)
    assert slots.wait(0, [FullEngine(1, 2, [Running(0.0, 0.0, 31)])], now=0.0) == 0.0  # room already


def test_a_request_past_its_prediction_is_taken_to_end_now():
    slots = paced()
    assert slots.wait(0, [FullEngine(1, 1, [Running(0.0, 0.0, 11)])], now=5.0) == 0.0


def test_without_timed_requests_the_average_slot_time_is_shared_over_the_slots():
    slots = SlotTimes()
    assert slots.wait(0, [FullEngine(2, 2, [])], now=0.0) is None
    slots.observe_done(Running(0.0, 0.0, None), 4.0)
    assert slots.wait(1, [FullEngine(2, 2, [])], now=0.0) == pytest.approx(2 * 4.0 / 2)


def test_many_gaps_at_once_move_the_average_as_many_one_by_one():
    together, one_by_one = SlotTimes(), SlotTimes()
    for gap, times in ((0.02, 1), (0.05, 7), (0.01, 30)):
        together.observe_gap(gap, times)
        for _ in range(times):
            one_by_one.observe_gap(gap)
    assert together.gap_s == pytest.approx(one_by_one.gap_s, rel=1e-9)
