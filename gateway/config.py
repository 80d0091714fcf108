"""Configuration: one YAML file, then environment overrides, then command-line flags.

Environment overrides are ``GATEWAY_<PATH>`` with ``__`` between levels; values are
parsed as YAML scalars, so ``GATEWAY_POOLS__BATCH__ENGINES='["http://a:8000"]'`` is a list.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.batch.settings import BatchSettings
from gateway.core.classes import BATCH, CLASSES, INTERACTIVE, Budget
from gateway.limits import ClientLimits, Deadlines, settings_from

ENV_PREFIX = "GATEWAY_"
POLICY_NAMES = ("prefix", "least_loaded", "round_robin")


class ConfigError(ValueError):
    pass


@dataclass(slots=True)
class ClassConfig:
    name: str
    pool: str
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    deadline_s: float | None = None

    @property
    def budget(self) -> Budget:
        return Budget(
            None if self.ttft_p99_ms is None else self.ttft_p99_ms / 1000.0,
            None if self.itl_p99_ms is None else self.itl_p99_ms / 1000.0,
            self.deadline_s,
        )


@dataclass(slots=True)
class PoolConfig:
    name: str
    engines: list[str] = field(default_factory=list)
    discovery: str | None = None
    discovery_interval_s: float = 10.0
    policy: str = "prefix"
    scheduling_policy: str = "fcfs"
    backfill: bool = True
    accept_overflow: bool = False
    kv_events: str | None = None
    """Precise prefix mode: ``tcp://HOST:PORT`` to bind one socket engines publish to (each with its
    URL as topic), or ``engine-port:PORT`` to subscribe to every engine's own publisher."""
    tokenizer: str | None = None
    """How engines tokenize prompts, for precise mode: a model directory, or ``sim``."""
    kv_events_topics: dict[str, str] = field(default_factory=dict)
    """Topics engines publish under that are neither their URL nor ``host:port``: topic -> engine URL."""
    model: str | None = None
    api_key: str | None = None
    ca_file: str | None = None
    """CA bundle that signs the engines' certificates (``https://`` engines); default: the system's."""

    @property
    def takes_priority(self) -> bool:
        return self.scheduling_policy == "priority"


@dataclass(slots=True)
class Config:
    pools: dict[str, PoolConfig]
    classes: dict[str, ClassConfig]
    host: str = "127.0.0.1"
    port: int = 8080
    store: str = "memory"
    log_level: str = "info"
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 300.0
    health_interval_s: float = 2.0
    health_timeout_s: float = 1.0
    unhealthy_after: int = 2
    scrape_interval_s: float = 2.0
    batch: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, Any] = field(default_factory=dict)
    admission: dict[str, Any] = field(default_factory=dict)
    prefix: dict[str, Any] = field(default_factory=dict)
    limits: ClientLimits = field(default_factory=ClientLimits)
    deadlines: Deadlines = field(default_factory=Deadlines)
    embedded: bool = False
    raw: dict[str, Any] = field(default_factory=dict)


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Read ``path`` (or nothing), apply ``GATEWAY_*`` overrides, and validate."""
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        loaded = yaml.safe_load(text) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        data = loaded
    apply_env_overrides(data, os.environ if env is None else env)
    return parse_config(data)


def apply_env_overrides(data: dict[str, Any], env: Mapping[str, str]) -> None:
    for name, value in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or name == ENV_PREFIX:
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX) :].split("__") if part]
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[path[-1]] = yaml.safe_load(value) if value != "" else None


def _section(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a mapping")
    return value


def parse_config(data: Mapping[str, Any]) -> Config:
    known = {
        "pools",
        "classes",
        "listen",
        "store",
        "max_body_bytes",
        "log_level",
        "upstream",
        "health",
        "scrape",
        "batch",
        "keys",
        "admission",
        "prefix",
        "limits",
    }
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"unknown top-level keys: {', '.join(sorted(unknown))}")
    pools_data = _section(data, "pools")
    if not pools_data:
        raise ConfigError("pools: at least one pool is needed")
    pools = {name: _parse_pool(name, spec) for name, spec in pools_data.items()}
    classes = _parse_classes(_section(data, "classes"), pools)
    listen = _section(data, "listen")
    upstream = _section(data, "upstream")
    health = _section(data, "health")
    scrape = _section(data, "scrape")
    return Config(
        pools=pools,
        classes=classes,
        host=str(listen.get("host", "127.0.0.1")),
        port=int(listen.get("port", 8080)),
        store=str(data.get("store") or "memory"),
        log_level=str(data.get("log_level", "info")),
        connect_timeout_s=float(upstream.get("connect_timeout_s", 2.0)),
        read_timeout_s=float(upstream.get("read_timeout_s", 300.0)),
        health_interval_s=float(health.get("interval_s", 2.0)),
        health_timeout_s=float(health.get("timeout_s", 1.0)),
        unhealthy_after=int(health.get("unhealthy_after", 2)),
        scrape_interval_s=float(scrape.get("interval_s", 2.0)),
        batch=_batch_section(data),
        keys=_keys_section(data),
        admission=_section(data, "admission"),
        prefix=_section(data, "prefix"),
        limits=_limits_section(data),
        deadlines=_settings(Deadlines, upstream, "upstream"),
        raw=dict(data),
    )


def _settings(cls: type[Any], section: Mapping[str, Any], where: str) -> Any:
    try:
        return settings_from(cls, section, where)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _limits_section(data: Mapping[str, Any]) -> ClientLimits:
    section = _section(data, "limits")
    unknown = set(section) - set(ClientLimits.__dataclass_fields__)
    if unknown:
        raise ConfigError(f"limits: unknown keys {', '.join(sorted(unknown))}")
    # The top-level max_body_bytes is the older spelling of limits.max_body_bytes.
    if "max_body_bytes" in data and "max_body_bytes" not in section:
        section = {**section, "max_body_bytes": data["max_body_bytes"]}
    return _settings(ClientLimits, section, "limits")


KEYS_OPTIONS = ("file", "admin", "required", "cache_s", "refresh_s")


def _batch_section(data: Mapping[str, Any]) -> dict[str, Any]:
    section = _section(data, "batch")
    try:
        BatchSettings.from_config(section)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return section


def _keys_section(data: Mapping[str, Any]) -> dict[str, Any]:
    section = _section(data, "keys")
    unknown = set(section) - set(KEYS_OPTIONS)
    if unknown:
        raise ConfigError(f"keys: unknown keys {', '.join(sorted(unknown))}; known: {', '.join(KEYS_OPTIONS)}")
    if section.get("required", "auto") not in ("auto", True, False, None):
        raise ConfigError("keys.required must be auto, true or false")
    return section


def _parse_pool(name: str, spec: Any) -> PoolConfig:
    if not isinstance(spec, dict):
        raise ConfigError(f"pools.{name} must be a mapping")
    fields = set(PoolConfig.__dataclass_fields__) - {"name"}
    unknown = set(spec) - fields
    if unknown:
        raise ConfigError(f"pools.{name}: unknown keys {', '.join(sorted(unknown))}")
    pool = PoolConfig(name=name, **spec)
    if isinstance(pool.engines, str):
        pool.engines = [pool.engines]
    pool.engines = [url.rstrip("/") for url in pool.engines]
    for url in pool.engines:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"pools.{name}.engines: {url!r} is not an http(s) URL")
    if not pool.engines and not pool.discovery:
        raise ConfigError(f"pools.{name}: give engines or discovery")
    if pool.discovery and not pool.discovery.startswith("dns://"):
        raise ConfigError(f"pools.{name}.discovery must look like dns://host:port")
    if pool.policy not in POLICY_NAMES:
        raise ConfigError(f"pools.{name}.policy must be one of {', '.join(POLICY_NAMES)}")
    if pool.scheduling_policy not in ("fcfs", "priority"):
        raise ConfigError(f"pools.{name}.scheduling_policy must be fcfs or priority")
    if pool.kv_events is not None:
        if not (pool.kv_events.startswith(("tcp://", "ipc://")) or pool.kv_events.startswith("engine-port:")):
            raise ConfigError(f"pools.{name}.kv_events must be tcp://HOST:PORT (bind) or engine-port:PORT")
        if not pool.tokenizer:
            raise ConfigError(f"pools.{name}.kv_events needs pools.{name}.tokenizer (a model directory, or sim)")
        if pool.policy != "prefix":
            raise ConfigError(f"pools.{name}.kv_events needs policy: prefix")
    if pool.accept_overflow and not pool.takes_priority:
        raise ConfigError(
            f"pools.{name}.accept_overflow needs scheduling_policy: priority, "
            "or interactive requests would queue behind batch work"
        )
    return pool


def _parse_classes(spec: dict[str, Any], pools: dict[str, PoolConfig]) -> dict[str, ClassConfig]:
    unknown = set(spec) - set(CLASSES)
    if unknown:
        raise ConfigError(f"classes: unknown classes {', '.join(sorted(unknown))}; known: {', '.join(CLASSES)}")
    defaults: dict[str, dict[str, Any]] = {
        INTERACTIVE: {"ttft_p99_ms": 500.0, "itl_p99_ms": 50.0},
        BATCH: {"deadline_s": 86400.0},
    }
    first_pool = next(iter(pools))
    classes: dict[str, ClassConfig] = {}
    for cls in CLASSES:
        merged = {**defaults[cls], **(spec.get(cls) or {})}
        merged.setdefault("pool", cls if cls in pools else first_pool)
        extra = set(merged) - {"pool", "ttft_p99_ms", "itl_p99_ms", "deadline_s"}
        if extra:
            raise ConfigError(f"classes.{cls}: unknown keys {', '.join(sorted(extra))}")
        if merged["pool"] not in pools:
            raise ConfigError(f"classes.{cls}.pool: no pool named {merged['pool']!r}")
        classes[cls] = ClassConfig(name=cls, **merged)
    return classes
