import pytest

from priority_gateway.core.classes import BATCH, INTERACTIVE, Budget, ClassificationError, classify
from priority_gateway.core.reasons import Refusal


def test_header_is_case_insensitive_and_absent_means_default():
    assert classify("Batch") == BATCH
    assert classify(" INTERACTIVE ") == INTERACTIVE
    assert classify(None) == INTERACTIVE
    assert classify(None, default=BATCH) == BATCH


def test_unknown_class_is_refused_as_an_invalid_priority():
    with pytest.raises(ClassificationError) as err:
        classify("urgent")
    assert err.value.reason == Refusal.INVALID_PRIORITY
    assert err.value.param == "X-Priority"


def test_key_without_interactive_is_refused_not_silently_downgraded():
    with pytest.raises(ClassificationError) as err:
        classify("interactive", default=BATCH, allowed=frozenset({BATCH}))
    assert err.value.reason == Refusal.CLASS_NOT_ALLOWED
    assert classify(None, default=BATCH, allowed=frozenset({BATCH})) == BATCH


def test_budget_headers_tighten_but_never_loosen():
    budget = Budget(ttft_s=0.5, itl_s=0.05)
    tighter = budget.tightened("200", "20")
    assert (tighter.ttft_s, tighter.itl_s) == (0.2, 0.02)
    looser = budget.tightened("5000", "500")
    assert (looser.ttft_s, looser.itl_s) == (0.5, 0.05)
    assert Budget().tightened("300", None).ttft_s == 0.3


@pytest.mark.parametrize("value", ["abc", "-5", "0", "nan", "inf"])
def test_bad_budget_header_is_refused(value):
    with pytest.raises(ClassificationError) as err:
        Budget(0.5, 0.05).tightened(value, None)
    assert err.value.reason == Refusal.INVALID_HEADER
