"""``benchmarks/fairness_realtime.py`` end to end, small and quick: keys made through the admin API
carry each tenant's requests, and the summary has what the issue asks for, from the run; and
``benchmarks/fairness_repeats.py`` folds repeats of it into medians."""

from __future__ import annotations

import json
import shutil

from tests.benchmarks import run_script

TENANTS = ("noisy", "team-a", "team-b", "team-c")


def test_a_small_run_writes_the_summary_from_the_tenants_requests_and_repeats_fold_into_medians(tmp_path):
    out = tmp_path / "out"
    args = "--capacity 16 --seconds 2 --warmup-s 0.5 --interactive-engines 1 --profile default"
    # Eight fresh gateways in turn: untraced, as the product code they run is covered by tests of its own.
    run_script("fairness_realtime.py", args, out, traced=False)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["max_num_batched_tokens"] == 384
    assert (out / "fairness_realtime.png").stat().st_size > 0
    fair = summary["fair"]
    assert set(fair["tenants"]) == set(TENANTS)
    assert all(t["weight"] == 1.0 for t in fair["tenants"].values())
    assert abs(sum(t["share"] for t in fair["tenants"].values()) - 1.0) < 1e-3
    assert 0.25 <= fair["jain_index"] <= 1.0
    for name, rows in fair["scenarios"].items():
        for tenant, row in rows.items():
            # Served with its own key: a key the gateway did not know would have failed every request.
            assert row["errors"] == 0 and row["tokens"] > 0, (name, tenant, row)
            # Every miss has its reason: refused, over the TTFT budget, or over the ITL budget.
            assert row["met"] + row["refused"] + row["missed_ttft"] + row["missed_itl"] == row["requests"], row
            if tenant != "noisy":
                assert len(row["misses"]) == min(100, row["requests"] - row["met"]), row
    noisy = fair["scenarios"]["noisy"]
    assert noisy["noisy"]["requests"] > 2 * max(noisy[t]["requests"] for t in TENANTS[1:]), noisy

    again = tmp_path / "again"
    shutil.copytree(out, again)
    summary_again = json.loads((again / "summary.json").read_text())
    summary_again["fair"]["jain_index"] = 0.5
    (again / "summary.json").write_text(json.dumps(summary_again))
    medians = tmp_path / "medians"
    run_script("fairness_repeats.py", f"{out} {again} {out}", medians, timeout=60)
    folded = json.loads((medians / "summary.json").read_text())
    assert folded["fair"]["jain_index"] == fair["jain_index"]
    assert [r["fair"]["jain_index"] for r in folded["repeats"]] == [fair["jain_index"], 0.5, fair["jain_index"]]
    assert folded["unfair"]["tenants"]["team-a"]["kept"] == summary["unfair"]["tenants"]["team-a"]["kept"]
    scenarios = ("quiet", "noisy", "backlogged", "alone")
    assert set(folded["repeats"][0]["host_load"]) == {f"{m}/{s}" for m in ("fair", "unfair") for s in scenarios}
    assert (medians / "fairness_realtime.png").stat().st_size > 0
