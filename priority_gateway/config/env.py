"""Environment overrides: ``GATEWAY__<SECTION>__<KEY>``, a namespace nothing else writes into.

Rules:
- A variable overrides a key when its name starts with ``GATEWAY__`` (two underscores): the rest
  is the key's path with ``__`` between levels, case-insensitive: ``GATEWAY__STORE``,
  ``GATEWAY__LISTEN__PORT``, ``GATEWAY__POOLS__BATCH__ENGINES``.
- Two underscores, because one is what others write: Docker Compose files and shells use
  ``GATEWAY_PORT`` or ``GATEWAY_ADMIN_KEY`` for their own purposes, and Kubernetes gives every
  pod ``GATEWAY_SERVICE_HOST``, ``GATEWAY_PORT=tcp://...`` and more for a Service named
  ``gateway``. No such name starts with ``GATEWAY__``, so none of them is ever read.
- An override must name a known key (pool names are free): otherwise it is an error naming the
  variable and the nearest known key.
- A value is taken as written for a string key, read as YAML otherwise
  (``GATEWAY__POOLS__BATCH__ENGINES='["http://a:8000"]'`` is a list); empty means the default.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from priority_gateway.config.schema import ConfigError, Raw, misspelt, open_field, type_hints, unknown_key

PREFIX = "GATEWAY__"
SEPARATOR = "__"


def overrides(
    schema: type, env: Mapping[str, str], moved: Mapping[str, str] | None = None
) -> list[tuple[list[str], Raw]]:
    """Each ``GATEWAY__*`` variable as (key path, value), its path checked against ``schema``; a path
    under a key that ``moved`` (old dotted key -> new) is checked at the new place."""
    found = []
    for name, value in sorted(env.items()):
        if not name.startswith(PREFIX):
            continue
        path = name[len(PREFIX) :].lower().split(SEPARATOR)
        if not all(path):
            raise ConfigError("expected GATEWAY__<SECTION>__<KEY>, with __ between levels", source=name)
        checked = path
        for old, new in (moved or {}).items():
            parts = old.split(".")
            if path[: len(parts)] == parts:
                checked = [*new.split("."), *path[len(parts) :]]
        check_path(schema, checked, name)
        found.append((path, Raw(value, name)))
    return found


def check_path(schema: type, path: Sequence[str], source: str) -> None:
    tp: Any = schema
    for depth, part in enumerate(path):
        tp = section_type(tp)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            hints = type_hints(tp)
            extra = open_field(tp)
            if part in hints:
                tp = hints[part]
            elif extra is not None and not misspelt(part, hints):
                tp = get_args(section_type(hints[extra]))[1]
            else:
                raise unknown_key(part, list(hints), path[:depth]).from_source(source)
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        else:
            raise ConfigError("is a value, not a section", path[:depth], source)


def section_type(tp: Any) -> Any:
    """``tp`` without ``Annotated`` and ``| None``."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType) and len(arms := [a for a in get_args(tp) if a is not type(None)]) == 1:
            tp = arms[0]
        else:
            return tp


def apply(data: dict[str, Any], found: list[tuple[list[str], Raw]]) -> None:
    """Write the overrides into ``data`` (sections created as needed; names matched case-insensitively)."""
    for path, value in found:
        node = data
        for part in path[:-1]:
            key = _existing(node, part)
            child = node.get(key)
            if not isinstance(child, dict):
                child = node[key] = {}
            node = child
        node[_existing(node, path[-1])] = value


def _existing(node: dict[str, Any], part: str) -> str:
    """The key of ``node`` spelled like ``part`` in any case (``pools.Interactive``), else ``part``."""
    for key in node:
        if isinstance(key, str) and key.lower() == part:
            return key
    return part


def unread(schema: type, env: Mapping[str, str]) -> list[str]:
    """Variables spelled like overrides of the old single-underscore namespace, which are no longer
    read (``GATEWAY_STORE``): worth a warning, since they once meant something."""
    sections = set(type_hints(schema))
    return sorted(
        name
        for name in env
        if name.startswith("GATEWAY_")
        and not name.startswith(PREFIX)
        and name[len("GATEWAY_") :].lower().split(SEPARATOR)[0] in sections
    )
