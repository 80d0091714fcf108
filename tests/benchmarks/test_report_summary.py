"""docs/report.md opens with the results summary that ``benchmarks/report_summary.py`` makes from the committed
results, and it cannot drift from them: a changed figure fails the check until the summary is rewritten."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from tests.support.procs import ROOT

SCRIPT = ROOT / "benchmarks" / "report_summary.py"
REPORT = ROOT / "docs" / "report.md"


def summary(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_committed_report_holds_the_summary_the_committed_results_give():
    done = summary("--check")
    assert done.returncode == 0, done.stderr


def test_the_report_opens_with_the_summary_before_the_lab_notes():
    text = REPORT.read_text()
    assert text.startswith("# Results at a glance\n")
    block = text.index("<!-- begin:results-summary -->")
    assert block < text.index("<!-- end:results-summary -->") < text.index("\n# The article's experiments")
    rows = text[block : text.index("<!-- end:results-summary -->")].splitlines()[3:]
    assert len(rows) >= 10 and all(row.startswith("| ") and row.count(" | ") == 4 for row in rows)


def test_a_changed_figure_fails_the_check_until_the_summary_is_rewritten(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results, ignore=shutil.ignore_patterns("*.png", "*.gz", "*.svg"))
    report = tmp_path / "report.md"
    shutil.copy(REPORT, report)
    routing = results / "routing" / "summary.json"
    changed = json.loads(routing.read_text())
    changed["mooncake_1x"]["prefix"]["prefix_hit_ratio"] = 0.4321
    routing.write_text(json.dumps(changed))
    where = ("--results", str(results), "--report", str(report))

    assert summary("--check", *where).returncode == 1
    assert summary(*where).returncode == 0
    assert "43.2 % of prompt tokens from cache" in report.read_text()
    assert "23.0 % of prompt tokens from cache" not in report.read_text()
    assert summary("--check", *where).returncode == 0
    assert (
        report.read_text().split("<!-- end:results-summary -->")[1]
        == REPORT.read_text().split("<!-- end:results-summary -->")[1]
    )  # the lab notes below are left as they were


def test_a_report_without_the_markers_is_an_error(tmp_path):
    report = tmp_path / "report.md"
    report.write_text("# No summary here\n")
    done = summary("--report", str(report))
    assert done.returncode != 0 and "results-summary" in done.stderr
    assert report.read_text() == "# No summary here\n"
