"""``benchmarks/gpu/fleet_itl.py`` end to end on simulated engines, small and quick: every request's
timeline names the replica and the engine that served it, and the engines' own ITL histograms,
scraped around the window, count the gaps the client measured there."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import run_script
from tests.support.procs import ROOT
from tests.support.redis import REDIS_SERVER

pytestmark = pytest.mark.redis


def test_a_small_run_places_every_request_and_the_engines_count_the_clients_gaps(tmp_path):
    out = tmp_path / "out"
    args = "--setups fleet --replicas 2 --repeats 1 --seconds 6 --warmup-s 1 --rate 3 --input 64 --output 16"
    args += " --flood 4 --ramp-s 0.5 --sample-ms 50 --scrape-s 0.5 --interactive-profile default"
    # A 2-core host running the suite under coverage relays a token later than the GPU machine does.
    args += " --batch-profile default --relay-lag-s 2"
    # Untraced: the run is timed against its own scraper, which the tracer would make the slowest part.
    run_script("gpu/fleet_itl.py", args, out, "--redis-server", REDIS_SERVER, traced=False)

    run = json.loads((out / "summary.json").read_text())["runs"][0]
    assert run["replicas"] == 2 and run["interactive_completed"] > 5
    assert set(run["interactive_gaps_by_replica"]) == {"0", "1"}  # round robin: both replicas carried some
    engines = run["engines"]
    assert {e["pool"] for e in engines.values()} == {"interactive", "batch"}
    # Every pool's engines emitted tokens around the scrapes. (A busy host may take the scraper's ticks so
    # late that no read falls between two of them: the bounds below hold all the same.)
    for pool in ("interactive", "batch"):
        assert sum(e["client_gaps_maybe_in"] for e in engines.values() if e["pool"] == pool) > 0, engines
    for url, engine in engines.items():
        if engine["engine_itl_count"] is None:
            # No two scrapes of the engine fell inside the window (a host too busy for the scraper's
            # ticks): there is no count to bound, and none of the clients' gaps counts as surely in.
            assert engine["client_gaps_surely_in"] == 0, (url, engine)
            continue
        # Each engine's own count over the window is what the clients saw of it: no fewer than the
        # gaps read surely inside the window, no more than those that may have been.
        assert engine["client_gaps_surely_in"] <= engine["engine_itl_count"], (url, engine)
        assert engine["engine_itl_count"] <= engine["client_gaps_maybe_in"], (url, engine)
    assert run["host_busy_cores_p50"] is not None and run["host_cores_by_role_mean"]["gateways"] > 0


def test_a_late_first_token_is_told_apart_by_whether_its_engine_held_requests_waiting(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "gpu"))
    import fleet_itl

    def tick(t: float, waiting: float) -> dict:
        return {"t": t, "engines": {"e": {"vllm:num_requests_waiting": waiting}}}

    def request(sent: float, first: float, cls: str = "interactive") -> dict:
        return {"class": cls, "sent": sent, "chunks": [first, first + 0.02], "engine": "e"}

    ticks = [tick(0.5, 0), tick(1.0, 0), tick(1.5, 2), tick(2.0, 2), tick(2.5, 0), tick(3.0, 0)]
    timelines = [
        request(0.1, 0.3),  # in the warm-up: not counted
        request(1.2, 2.6),  # late, while the engine held two waiting
        request(2.6, 2.9),  # on time, nothing waiting
        request(1.4, 1.6),  # on time, though the scrape between saw requests waiting
        request(2.5, 3.6, cls="batch"),
    ]
    run = {"warmup_s": 1.0, "budget_ms": [1000, 100]}
    got = fleet_itl.late_first_tokens(run, timelines, ticks)
    assert got == {
        "ttft_budget_ms": 1000.0,
        "over": 1,
        "over_at_waiting_engine": 1,
        "within": 2,
        "within_at_waiting_engine": 1,
    }
