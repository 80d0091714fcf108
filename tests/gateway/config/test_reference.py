"""docs/configuration.md is generated from the settings classes, and kept up to date."""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import get_args

import pytest

from priority_gateway.config import Config
from priority_gateway.config.env import section_type
from priority_gateway.config.reference import render, sections
from priority_gateway.config.schema import open_field, type_hints

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "configuration.md"


def test_the_committed_page_is_what_the_code_says():
    assert PAGE.read_text() == render(), (
        "docs/configuration.md is out of date: run `gateway config reference > docs/configuration.md`"
    )


def leaf_keys(cls: type, path: str) -> list[str]:
    keys = []
    for name, tp in type_hints(cls).items():
        inner = section_type(tp)
        args = get_args(inner)
        if is_dataclass(inner):
            keys += leaf_keys(inner, f"{path}{name}.")
        elif args and is_dataclass(args[-1]):
            # An open section's free keys sit beside its fields.
            keys += leaf_keys(args[-1], f"{path}<name>." if name == open_field(cls) else f"{path}{name}.<name>.")
        else:
            keys.append(path + name)
    return keys


def test_every_key_has_a_row_with_its_default():
    page = render()
    keys = leaf_keys(Config, "")
    assert len(keys) >= 70
    for key in keys:
        assert f"| `{key}` |" in page, key
    assert "| `listen.port` | integer >= 1, <= 65535 | `8080` |" in page
    assert "| `classes.interactive.ttft_p99_ms` | number > 0 or null | `500` |" in page
    assert "| `classes.batch.ttft_p99_ms` | number > 0 or null | `null` |" in page
    assert "| `admission.enabled` | boolean | `true` |" in page


@dataclass(frozen=True, slots=True)
class Undocumented:
    """A section with a setting nobody explained."""

    mystery: int = 3


def test_a_setting_without_a_docstring_is_refused():
    assert [f.name for f in fields(Undocumented)] == ["mystery"]
    with pytest.raises(ValueError, match=r"Undocumented\.mystery has no docstring"):
        list(sections(Undocumented, Undocumented(), ()))


def test_the_readme_points_to_the_page():
    assert "docs/configuration.md" in (ROOT / "README.md").read_text()
