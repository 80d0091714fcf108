"""``benchmarks/gpu/limiter_evidence.py``, small and quick: replicas sharing their evidence as the
gateway does decide, with fresh evidence, exactly when one replica seeing every gap does, and the
shared mode writes its results and plot."""

from __future__ import annotations

import json

from tests.benchmarks import run_script


def test_four_replicas_sharing_fresh_evidence_shrink_when_one_seeing_every_gap_does(tmp_path):
    args = "--trials 6 --seconds 60 --replicas 1 4 --shared 4 --full-s 0.01 1"
    # A CPU-bound virtual-time loop of the product's limiter: 12 s untraced on a busy host, 5x that traced.
    run_script("gpu/limiter_evidence.py", args, tmp_path, timeout=600, traced=False)

    result = json.loads((tmp_path / "limiter_evidence_shared.json").read_text())
    one, alone = result["by_replicas"]["1"], result["by_replicas"]["4"]
    fresh, every_second = result["shared"]
    assert (fresh["replicas"], fresh["full_s"], every_second["full_s"]) == (4, 0.01, 1.0)
    assert one["shrunk_within_run"] > alone["shrunk_within_run"]  # a quarter of the gaps is thinner evidence
    # The leader judges the sum of everyone's counts: with nothing stale it sees what one replica sees.
    assert {k: fresh[k] for k in one} == one
    assert fresh["all_follow"]["shrunk_within_run"] == fresh["shrunk_within_run"]
    assert (tmp_path / "limiter_evidence_shared.png").stat().st_size > 0
    assert not (tmp_path / "limiter_evidence.json").exists()  # the old mode's file is left alone
