"""``benchmarks/agent_sessions.py``: its CPU tier option reaches the simulated engines."""

from __future__ import annotations

import argparse

import pytest

from priority_gateway.core.sessions import SessionSettings
from priority_gateway.simulate.cluster import Cluster
from tests.support.procs import ROOT


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import agent_sessions

    return agent_sessions


@pytest.mark.parametrize("cpu_blocks", [0, 4400])
def test_the_cpu_tier_option_gives_every_engine_a_tier_of_that_many_blocks(bench, cpu_blocks):
    args = argparse.Namespace(
        engines=2,
        num_blocks=1100,
        kv_offloading_blocks=cpu_blocks,
        first_burst=SessionSettings().first_burst,
        wait_factor=SessionSettings().wait_factor,
        itl_ms=250.0,
        seed=0,
    )
    cluster = Cluster(bench.setup_for("prefix", args))
    tiers = [e.core.offload for e in cluster.engines.values()]
    assert len(tiers) == 2
    if cpu_blocks:
        assert all(t is not None and t.tier.capacity == cpu_blocks for t in tiers)
    else:
        assert tiers == [None, None]


@pytest.mark.parametrize(("setup", "waits"), [("sessions_wait", True), ("sessions_retention", False)])
def test_the_wait_factor_option_reaches_the_gateways_sessions(bench, setup, waits):
    args = argparse.Namespace(
        engines=2, num_blocks=1100, kv_offloading_blocks=0, first_burst=1, wait_factor=7.5, itl_ms=250.0, seed=0
    )
    (dispatcher,) = Cluster(bench.setup_for(setup, args)).dispatchers
    settings = dispatcher.turns.book.settings
    assert (settings.wait_for_engine, settings.wait_factor) == (waits, 7.5)
