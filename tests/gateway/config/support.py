"""Every section of the configuration, walked from the code, so tests cover sections added later."""

from __future__ import annotations

from typing import Any, get_args, get_origin

from priority_gateway.config import Config
from priority_gateway.config.reference import sections
from priority_gateway.config.schema import open_field, type_hints

POOLS = {"interactive": {"engines": ["http://127.0.0.1:8001"]}, "batch": {"engines": ["http://127.0.0.1:8003"]}}


def section_paths() -> list[tuple[str, ...]]:
    """Every section's path (``()`` is the top level; ``("pools", "<name>")`` is any pool)."""
    return [section.path for section in sections(Config, Config(), ())]


def section_class(path: tuple[str, ...]) -> type:
    cls: Any = Config
    for part in path:
        if part == "<name>":
            if (extra := open_field(cls)) is not None:
                cls = get_args(type_hints(cls)[extra])[1]
            continue
        tp = type_hints(cls)[part]
        cls = get_args(tp)[1] if get_origin(tp) is dict else tp
    return cls


def with_value(path: tuple[str, ...], key: str, value: object) -> dict[str, Any]:
    """A valid configuration with ``key: value`` in the section at ``path``."""
    data: dict[str, Any] = {"pools": {name: dict(spec) for name, spec in POOLS.items()}}
    node = data
    for part in path:
        part = "batch" if part == "<name>" else part
        node = node.setdefault(part, {})
    node[key] = value
    return data


def typo(key: str) -> str:
    """A plausible misspelling of ``key``: one letter dropped from its end."""
    return key[:-1]
