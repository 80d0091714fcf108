"""``benchmarks/fairness_realtime.py`` end to end, small and quick: keys made through the admin API
carry each tenant's requests, and the summary has what the issue asks for, from the run."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.procs import ROOT

TENANTS = ("noisy", "team-a", "team-b", "team-c")


def test_a_small_fair_run_writes_the_summary_from_the_tenants_requests(tmp_path):
    out = tmp_path / "out"
    args = "--modes fair --capacity 16 --seconds 2.5 --warmup-s 0.5 --interactive-engines 1 --profile default"
    cmd = [sys.executable, "benchmarks/fairness_realtime.py", *args.split(), "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]

    summary = json.loads((out / "summary.json").read_text())
    fair = summary["fair"]
    assert set(fair["tenants"]) == set(TENANTS)
    assert all(t["weight"] == 1.0 for t in fair["tenants"].values())
    assert abs(sum(t["share"] for t in fair["tenants"].values()) - 1.0) < 1e-3
    assert 0.25 <= fair["jain_index"] <= 1.0
    for name, rows in fair["scenarios"].items():
        for tenant, row in rows.items():
            # Served with its own key: a key the gateway did not know would have failed every request.
            assert row["errors"] == 0 and row["tokens"] > 0, (name, tenant, row)
    noisy = fair["scenarios"]["noisy"]
    assert noisy["noisy"]["requests"] > 2 * max(noisy[t]["requests"] for t in TENANTS[1:]), noisy
