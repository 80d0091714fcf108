"""docs/architecture.md stays true to the tree: every module and folder it names exists, and the
README's layout section points to it."""

from __future__ import annotations

import re

from tests.architecture.imports import ROOT

GUIDE = ROOT / "docs" / "architecture.md"
NAMED = re.compile(r"\b((?:priority_gateway|engines|benchmarks|tests|docs)/[\w/.-]*[\w/])")


def named_paths(text: str) -> set[str]:
    return {match.rstrip("/") for match in NAMED.findall(text)}


def test_every_module_the_guide_names_exists():
    named = named_paths(GUIDE.read_text())
    assert len(named) > 40  # the walk found the guide's modules, not nothing
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert missing == [], "docs/architecture.md names what is not there: " + ", ".join(missing)


def test_the_walk_would_see_a_module_that_is_gone():
    assert named_paths("see `priority_gateway/core/nowhere.py` and priority_gateway/http/") == {
        "priority_gateway/core/nowhere.py",
        "priority_gateway/http",
    }
    assert not (ROOT / "priority_gateway/core/nowhere.py").exists()


def test_the_readme_layout_points_to_the_guide():
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    assert "docs/architecture.md" in layout


def test_the_guide_names_every_module_of_the_core():
    named = named_paths(GUIDE.read_text())
    core = ROOT / "priority_gateway" / "core"
    modules = {str(path.relative_to(ROOT)) for path in core.rglob("*.py") if path.name != "__init__.py"}
    assert len(modules) > 25
    unnamed = sorted(modules - named)
    assert unnamed == [], "docs/architecture.md does not name: " + ", ".join(unnamed)
