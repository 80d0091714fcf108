"""What a configuration comes to: the effective settings a person checks, and what is worth a warning.

``gateway config check`` prints both; ``gateway serve`` logs the same warnings as it starts, so the
check says everything the start would.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from priority_gateway.config.env import PREFIX, unread
from priority_gateway.config.sections import Config
from priority_gateway.store import describe_store, is_shared


@dataclass(frozen=True, slots=True)
class Warning_:
    """One warning: the log event ``gateway serve`` writes, its fields, and the line the check prints."""

    event: str
    fields: dict[str, object]
    text: str


def warnings(config: Config, env: Mapping[str, str] | None = None) -> list[Warning_]:
    env = os.environ if env is None else env
    found = []
    ignored = unread(Config, env)
    if ignored:
        why = f"overrides are {PREFIX}<SECTION>__<KEY>"
        text = f"{', '.join(ignored)}: not read ({why}, two underscores)"
        found.append(Warning_("environment_not_read", {"variables": ",".join(ignored), "why": why}, text))
    if config.store == "memory":
        why = "batch jobs, files and keys are lost when the gateway stops; the default store, sqlite, keeps them"
        found.append(Warning_("store_not_durable", {"store": "memory", "why": why}, f"store: memory: {why}"))
    if config.keys.file and is_shared(config.store):
        why = "keys live in the Redis store; keys.file is read only with store: sqlite or memory"
        found.append(Warning_("keys_file_ignored", {"file": config.keys.file, "why": why}, f"keys.file: {why}"))
    return found


def summary(config: Config) -> list[str]:
    """The effective configuration, a line each: where it listens, its store, pools and classes, keys."""
    listen = config.listen
    lines = [
        f"listen: {listen.scheme}://{listen.host}:{listen.port}",
        f"store: {describe_store(config.store, config.data_dir)}",
        "pools:",
    ]
    for name, pool in config.pools.items():
        engines = ", ".join(pool.engines) if pool.engines else f"discovered from {pool.discovery}"
        lines.append(f"  {name}: {engines}; policy {pool.policy}, scheduling {pool.scheduling_policy}")
    lines.append("classes:")
    table = config.classes.table().specs
    for name, spec in config.classes.by_name().items():
        budget = []
        if spec.ttft_p99_ms is not None:
            budget.append(f"TTFT p99 {spec.ttft_p99_ms:g} ms")
        if spec.itl_p99_ms is not None:
            budget.append(f"ITL p99 {spec.itl_p99_ms:g} ms")
        if spec.deadline_s is not None:
            budget.append(f"deadline {spec.deadline_s:g} s")
        lines.append(
            f"  {name}: pool {spec.pool}, priority {table[name].priority}, kind {table[name].kind}"
            + (f"; {', '.join(budget)}" if budget else "")
        )
    admin = "on" if config.keys.admin or config.keys.admin_file else "off"
    lines.append(f"keys: required {str(config.keys.required).lower()}; admin API {admin}")
    lines.append(f"admission: {'on' if config.admission.enabled else 'off'}; log_level {config.log_level}")
    return lines
