"""``core/capacity``: a pool that declares its engines' seats keeps every limit within them, however
the limits are set: an engine there starts within them and may not grow past them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from priority_gateway.core.capacity import pool_limit_settings
from priority_gateway.core.dispatcher import AdmissionSettings, Dispatcher
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.core.pools import PoolSpec

limits = st.floats(1.0, 512.0)


@given(limits, limits, limits, limits, st.integers(1, 300) | st.none(), st.booleans())
def test_declared_seats_bound_every_limit_and_keep_them_ordered(low, a, b, unbudgeted, seats, beside):
    minimum, initial, maximum = sorted((low, a, b))
    base = LimitSettings(initial=initial, minimum=minimum, maximum=maximum, unbudgeted=unbudgeted)
    got = pool_limit_settings(base, seats, beside)
    if seats is None:
        assert (got.minimum, got.maximum, got.unbudgeted) == (minimum, maximum, unbudgeted)
    else:
        assert max(got.maximum, got.initial, got.minimum, got.unbudgeted) <= seats
    assert got.initial == min(unbudgeted if beside else initial, seats if seats is not None else float("inf"))


def test_an_engine_of_a_pool_with_seats_starts_within_them_and_may_not_grow_past_them():
    admission = AdmissionSettings(limits=LimitSettings(initial=8.0, maximum=64.0))
    budgets = {"interactive": 0.05}
    seated = Dispatcher([PoolSpec("interactive", ["a"], seats=4)], budgets=budgets, admission=admission)
    free = Dispatcher([PoolSpec("interactive", ["a"])], budgets=budgets, admission=admission)
    assert seated.limits["a"].limit == 4.0 and seated.limits["a"].settings.maximum == 4.0
    assert free.limits["a"].limit == 8.0 and free.limits["a"].settings.maximum == 64.0
