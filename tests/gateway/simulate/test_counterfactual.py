"""Judging refusals by replaying them admitted, in virtual time."""

from pathlib import Path

from priority_gateway.core.classes import BATCH, INTERACTIVE, Budget
from priority_gateway.core.dispatcher import AdmissionSettings
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.engines.sim.profile import load_profile
from priority_gateway.simulate.cluster import Cluster, ClusterSetup, PoolSetup
from priority_gateway.simulate.counterfactual import false_refusals, spread
from priority_gateway.simulate.traces import TraceRequest, load_trace


def setup(limit: float, ttft_s: float = 0.5) -> ClusterSetup:
    """Two interactive engines whose limit is pinned at ``limit``."""
    admission = AdmissionSettings(limits=LimitSettings(initial=limit, maximum=limit))
    pools = [PoolSetup(INTERACTIVE, 2, load_profile("gemma4-nvfp4"))]
    return ClusterSetup(pools, "least_loaded", admission, {INTERACTIVE: Budget(ttft_s, 0.05), BATCH: Budget()})


def arrivals(rate: float) -> list[TraceRequest]:
    return load_trace(Path(f"poisson:rate={rate},input=1024,output=128,minutes=2"), INTERACTIVE)


def judge(s: ClusterSetup, trace: list[TraceRequest], samples: int = 10) -> dict:
    first = Cluster(s).run(trace, [])
    return false_refusals(s, trace, [], first, samples)[INTERACTIVE]


def test_a_limit_far_below_what_the_engines_hold_refuses_falsely():
    # One request per engine at a light load: every refusal would have met its budgets.
    verdict = judge(setup(limit=1), arrivals(0.5))
    assert verdict["refused"] > 10
    assert verdict["judged"] == 10 and verdict["replay_diverged"] == 0
    assert verdict["would_have_met_budget"] == 10
    assert verdict["false_refusals"] == verdict["refused"]


def test_refusals_that_could_not_have_met_the_budget_are_not_false():
    # A TTFT budget below what a 1024-token prefill takes: admitted, they would have missed it too.
    verdict = judge(setup(limit=1, ttft_s=0.05), arrivals(0.5))
    assert verdict["refused"] > 0
    assert verdict["would_have_met_budget"] == 0 and verdict["false_refusals"] == 0


def test_judging_leaves_the_run_itself_untouched():
    s = setup(limit=1)
    trace = arrivals(0.5)
    plain = Cluster(s).run(trace, [])
    judged = Cluster(s)
    refused = [rid for rid, r in plain["records"].items() if r.rejected is not None]
    judged.what_if = set(refused[:5])
    replay = judged.run(trace, [])
    assert set(judged.what_if_records) == set(refused[:5])
    outcome = {rid: (r.first, r.done, r.rejected, r.gaps) for rid, r in plain["records"].items()}
    assert {rid: (r.first, r.done, r.rejected, r.gaps) for rid, r in replay["records"].items()} == outcome
    for rid in refused[:5]:
        assert judged.what_if_records[rid].record.done is not None  # admitted in the copy, and it ran


def test_spread_keeps_the_ends_and_spaces_the_rest_evenly():
    items = list(range(101))
    assert spread(items, 5) == [0, 25, 50, 75, 100]  # type: ignore[arg-type]
    assert spread(items[:3], 5) == [0, 1, 2]  # type: ignore[arg-type]
    assert spread(items, 0) == []  # type: ignore[arg-type]
