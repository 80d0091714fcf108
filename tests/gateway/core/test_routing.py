"""The stateless routing policies and the policy registry (``priority_gateway/core/routing.py``)."""

from __future__ import annotations

from collections import Counter

import pytest

from priority_gateway.core.engines import EngineState
from priority_gateway.core.prefix_policy import PrefixAffinity
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.routing import LeastLoaded, RoundRobin, make_policy

REQ = RouteRequest("r", "interactive", "m", 0.0)


def engines(*loads: int) -> list[EngineState]:
    return [EngineState(f"e{i}", "p", inflight=load) for i, load in enumerate(loads)]


@pytest.mark.parametrize("policy", [RoundRobin(), LeastLoaded(), PrefixAffinity()], ids=lambda p: p.name)
def test_no_candidates_no_choice(policy):
    assert policy.choose(REQ, [], 0.0) is None


def test_round_robin_visits_every_engine_in_turn_whatever_their_load():
    policy, pool = RoundRobin(), engines(0, 50, 3)
    chosen = [policy.choose(REQ, pool, 0.0) for _ in range(6)]
    assert [c.engine.id for c in chosen if c] == ["e0", "e1", "e2", "e0", "e1", "e2"]
    assert {c.reason for c in chosen if c} == {"round_robin"}


def test_least_loaded_takes_the_fewest_in_flight_counting_other_replicas():
    policy, pool = LeastLoaded(), engines(4, 2, 3)
    pool[1].external_load = 5.0  # another replica's work, seen at the last scrape
    choice = policy.choose(REQ, pool, 0.0)
    assert choice is not None and choice.engine.id == "e2" and choice.reason == "least_loaded"


def test_least_loaded_spreads_ties_over_every_engine():
    policy, pool = LeastLoaded(), engines(0, 0, 0, 0)
    counts = Counter(c.engine.id for _ in range(400) if (c := policy.choose(REQ, pool, 0.0)))
    assert set(counts) == {"e0", "e1", "e2", "e3"} and max(counts.values()) - min(counts.values()) <= 1


def test_stateless_policies_learn_nothing():
    for policy in (RoundRobin(), LeastLoaded()):
        choice = policy.choose(REQ, engines(0), 0.0)
        assert choice is not None
        policy.routed(REQ, choice)
        policy.started("e0", 0, 10)
        policy.forget("e0")
        assert policy.hit_ratio_estimate() == 0.0


def test_make_policy_knows_each_policy_and_names_them_all_for_a_typo():
    assert isinstance(make_policy("round_robin"), RoundRobin)
    assert isinstance(make_policy("least_loaded"), LeastLoaded)
    prefix = make_policy("prefix", load_factor=1.5)
    assert isinstance(prefix, PrefixAffinity) and prefix.load_factor == 1.5
    with pytest.raises(ValueError, match=r"unknown routing policy 'prefx'; known: least_loaded, prefix, round_robin"):
        make_policy("prefx")
