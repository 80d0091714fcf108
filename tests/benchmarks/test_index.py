"""benchmarks/README.md indexes every script under benchmarks/ and benchmarks/gpu/, names none that is gone,
and every results folder it points to exists."""

from __future__ import annotations

import re

from tests.support.procs import ROOT

BENCHMARKS = ROOT / "benchmarks"
INDEX = BENCHMARKS / "README.md"
HEADING = re.compile(r"^### (.+)$", re.M)
SCRIPT = re.compile(r"`([\w/.-]+\.(?:py|sh))`")
RESULTS = re.compile(r"`(results/[\w/.*-]+)`")
FIELDS = ("**Asks**", "**Run**", "**Results**", "**Takes**")


def indexed(text: str) -> set[str]:
    """The scripts the index's headings name (one heading may name several)."""
    return {name for heading in HEADING.findall(text) for name in SCRIPT.findall(heading)}


def sections(text: str) -> dict[str, str]:
    parts = HEADING.split(text)[1:]
    return dict(zip(parts[::2], parts[1::2], strict=True))


def scripts() -> set[str]:
    found = set()
    for folder in (BENCHMARKS, BENCHMARKS / "gpu"):
        found |= {str(p.relative_to(BENCHMARKS)) for p in folder.iterdir() if p.suffix in (".py", ".sh")}
    return found


def test_every_script_is_in_the_index():
    assert sorted(scripts() - indexed(INDEX.read_text())) == []


def test_the_index_names_no_script_that_is_gone():
    assert sorted(indexed(INDEX.read_text()) - scripts()) == []


def test_the_walk_would_see_a_missing_and_an_extra_script():
    text = "### `routing.py`\n- **Asks**: x\n### `gpu/fit_mixed.py`, `gpu/nowhere.py`\nnot a benchmark\n"
    assert indexed(text) == {"routing.py", "gpu/fit_mixed.py", "gpu/nowhere.py"}
    assert "gpu/nowhere.py" in indexed(text) - scripts()
    assert "soak.py" in scripts() - indexed(text)


def test_each_benchmark_says_what_it_asks_how_to_run_it_where_it_writes_and_how_long():
    for heading, body in sections(INDEX.read_text()).items():
        if "**Asks**" in body:  # the libraries and tools say what they are instead
            missing = [field for field in FIELDS if field not in body]
            assert missing == [], f"{heading}: no {', '.join(missing)}"


def test_every_results_folder_the_index_names_exists():
    named = set(RESULTS.findall(INDEX.read_text()))
    assert len(named) > 20
    missing = sorted(p for p in named if not list(BENCHMARKS.glob(p.rstrip("/"))))
    assert missing == [], "benchmarks/README.md names results that are not there: " + ", ".join(missing)


def test_the_readme_and_the_report_point_to_the_index():
    assert "benchmarks/README.md" in (ROOT / "README.md").read_text()
    assert "benchmarks/README.md" in (ROOT / "docs" / "report.md").read_text()
