"""Reading the configuration: defaults, then the YAML file, then ``GATEWAY__*``, then command-line options."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from priority_gateway import log
from priority_gateway.config import env as environment
from priority_gateway.config.schema import ConfigError, Raw, build
from priority_gateway.config.sections import Config


def load_config(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    *,
    base: Mapping[str, Any] | None = None,
    flags: Mapping[str, Raw | None] | None = None,
    pools_required: bool = True,
) -> Config:
    """The configuration from ``base`` (settings a caller starts from, e.g. embedded engines),
    the file at ``path``, the environment's ``GATEWAY__*`` variables and ``flags`` (command-line
    options by dotted key, ``{"listen.port": Raw("9000", "--port")}``; None: not given), each over
    the one before."""
    data: dict[str, Any] = copy.deepcopy(dict(base or {}))
    source = None
    if path is not None:
        source = str(path)
        _overlay(data, read_file(Path(path)))
    environment.apply(data, environment.overrides(Config, os.environ if env is None else env, MOVED))
    environment.apply(data, [(key.split("."), value) for key, value in (flags or {}).items() if value is not None])
    for old, new in MOVED.items():
        _move(data, old, new)
    try:
        return parse_config(data, pools_required=pools_required)
    except ConfigError as exc:
        raise exc.from_source(source) if source else exc from None


MOVED = {"prefix.share": "fleet"}
"""Keys that moved, from their older place to their new one: still read there, with a warning."""


def _move(data: dict[str, Any], old: str, new: str) -> None:
    *parents, leaf = old.split(".")
    section: Any = data
    for name in parents:
        section = section.get(name) if isinstance(section, dict) else None
    if not isinstance(section, dict) or leaf not in section:
        return
    value = section.pop(leaf)
    if isinstance(value, Mapping) and isinstance(data.get(new), Mapping):
        value = {**value, **data[new]}  # what is set at the new place wins
    data[new] = value
    log.warning("config_key_moved", key=old, now=new, effect=f"read as {new}; write it there")


def parse_config(data: Mapping[str, Any], *, pools_required: bool = True) -> Config:
    config = build(Config, data)
    if pools_required and not config.pools:
        raise ConfigError("at least one pool is needed (pools.<name>.engines or .discovery)", ["pools"])
    return config


def read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the file ({exc.strerror or exc})", source=str(path)) from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not YAML"
        raise ConfigError(f"not valid YAML: {problem}{where}", source=str(path)) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError("the top level must be a mapping of sections", source=str(path))
    return loaded


def _overlay(data: dict[str, Any], top: Mapping[str, Any]) -> None:
    """``top``'s keys over ``data``'s, section by section."""
    for key, value in top.items():
        below = data.get(key)
        if isinstance(below, dict) and isinstance(value, Mapping):
            _overlay(below, value)
        else:
            data[key] = copy.deepcopy(value) if isinstance(value, dict) else value
