"""``benchmarks/fleet_admission_realtime.py`` end to end, small and quick: two replicas on a real
``redis-server`` that is killed and restarted mid-run, fast simulated engines. What it reports must
come from the run: requests served through the replicas, the engines' own counts sampled, and
each replica's log saying it lost the channel and took its safe share."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import run_script
from tests.support.redis import REDIS_SERVER

pytestmark = pytest.mark.redis


def test_a_small_run_with_redis_killed_measures_what_happened(tmp_path):
    out = tmp_path / "out"
    args = "--setups fleet_redis_killed --replicas 2 --repeats 1 --minutes 0.15 --warmup-s 1 --rate 3"
    args += " --input 64 --output 16 --flood 6 --ramp-s 0.5 --sample-ms 20 --interactive-engines 1"
    args += " --batch-engines 1 --interactive-profile default --batch-profile default"
    # Untraced, as the product code the replicas run is covered by tests of its own.
    run_script("fleet_admission_realtime.py", args, out, "--redis-server", REDIS_SERVER, traced=False)

    run = json.loads((out / "runs.json").read_text())[0]
    assert run["replicas"] == 2 and run["redis_down_s"] == [3.0, 6.0]
    interactive = run["interactive"]
    assert interactive["completed"] > 5 and interactive["errors"] == 0, interactive
    assert run["batch_goodput_tokens_per_s"] > 0
    assert run["batch_statuses"].get("200", 0) > 0, run["batch_statuses"]
    assert {e["pool"] for e in run["engines"].values()} == {"interactive", "batch"}
    for engine in run["engines"].values():
        assert engine["samples"] > 50 and engine["max_held"] >= 1, engine
        assert engine["down_samples"] > 0, engine
    for events in run["gateway_logs"].values():
        assert events["routing_share_lost"] >= 1 and events["admission_safe_share"] >= 1, events
    assert run["cpu"]["cpu_s_by_role"]["engines"] > 0

    summary = json.loads((out / "summary.json").read_text())
    assert summary["medians"]["fleet_redis_killed"]["interactive_requests"] == interactive["requests"]
    assert (out / "fleet_admission_realtime.png").stat().st_size > 10_000
