"""``benchmarks/article_report.py --replot`` redraws docs/report.md from the committed raw results and
leaves it as committed: every table and command in the report is what the results say."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_replot_leaves_the_committed_report_and_results_unchanged(tmp_path):
    for part in ("benchmarks", "docs"):
        shutil.copytree(ROOT / part, tmp_path / part)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "benchmarks" / "article_report.py"), "--replot"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert '"missing_block"' not in done.stdout, done.stdout
    assert (tmp_path / "docs" / "report.md").read_text() == (ROOT / "docs" / "report.md").read_text()
    raw = ROOT / "benchmarks" / "results" / "article_report"
    for path in raw.rglob("*.json"):
        copy = tmp_path / path.relative_to(ROOT)
        assert copy.read_bytes() == path.read_bytes(), f"{path.relative_to(ROOT)} changed"
    for figure in (ROOT / "docs" / "figures").glob("*.png"):
        assert (tmp_path / figure.relative_to(ROOT)).stat().st_size > 0
