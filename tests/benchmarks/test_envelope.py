"""Every benchmark writes its results in one envelope (``priority_gateway/bench/envelope.py``: the commit and
whether the code had changed, the command line, the host's load): each script takes it when it starts, and
none records those facts its own way."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import ROOT

BENCHMARKS = ROOT / "benchmarks"
# What measures nothing and writes no results of its own, and why.
NOT_BENCHMARKS = {
    "live_stack.py": "the real-time benchmarks' engines, gateways and instruments, a library",
    "gpu/engine_args.py": "a pool's engine arguments on the device, a library",
    "gpu/fit_mixed.py": "the step model's fit, a library of analyze.py",
    "gpu/fronts.py": "the budgets plan's fronts by name, a library of budgets.py and harness.py",
    "gpu/harness.py": "runs the device's plan; each result is written by the script it runs (its commit: envelope)",
    "gpu/vllm_flags.py": "reads a vLLM wheel's flags, measures nothing",
    "relay_floor.py": "the bare relays relay_overhead.py measures (its results: envelope), a server",
    "report_summary.py": "writes docs/report.md's summary from the committed results, measures nothing",
}
# The commit and the load, found in a script's own code: it records them a second way.
OWN_WAYS = ("rev-parse", "git describe", "/proc/loadavg", "getloadavg")


def scripts() -> list[Path]:
    return sorted(p for p in BENCHMARKS.rglob("*.py") if "results" not in p.relative_to(BENCHMARKS).parts)


def name(path: Path) -> str:
    return str(path.relative_to(BENCHMARKS))


def starts_the_envelope(path: Path) -> bool:
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "start"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "envelope"
        for node in ast.walk(ast.parse(path.read_text()))
    )


def test_the_exemptions_name_scripts_that_exist():
    assert sorted(set(NOT_BENCHMARKS) - {name(p) for p in scripts()}) == []


@pytest.mark.parametrize("path", [p for p in scripts() if name(p) not in NOT_BENCHMARKS], ids=name)
def test_each_benchmark_takes_the_envelope(path):
    assert starts_the_envelope(path), f"benchmarks/{name(path)} writes results without envelope.start()"


@pytest.mark.parametrize("path", scripts(), ids=name)
def test_no_benchmark_records_the_commit_or_the_load_its_own_way(path):
    text = path.read_text()
    assert [way for way in OWN_WAYS if way in text] == []


def test_the_walk_tells_a_script_that_takes_the_envelope_from_one_that_does_not(tmp_path):
    taking, lacking = tmp_path / "taking.py", tmp_path / "lacking.py"
    taking.write_text("from priority_gateway.bench import envelope\nprovenance = envelope.start()\n")
    lacking.write_text("import json\nresults = {'command': 'x'}\n")
    assert starts_the_envelope(taking) and not starts_the_envelope(lacking)


def test_a_quick_benchmark_writes_the_envelope_around_its_figures(tmp_path):
    # limiter_evidence.py is the quickest end to end: virtual time, no processes.
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "benchmarks/gpu/limiter_evidence.py", "--trials", "2", "--seconds", "60", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "limiter_evidence.json").read_text())
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert result["commit"] == head.strip() and isinstance(result["dirty"], bool)
    assert result["command"].startswith("python benchmarks/gpu/limiter_evidence.py --trials 2 ")
    assert result["host"]["cpus"] >= 1 and len(result["host"]["load_avg_at_end"]) == 3
    assert result["by_replicas"]  # the figures, beside the envelope
