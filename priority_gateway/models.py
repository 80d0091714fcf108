"""The gateway's model catalog: what clients may name, what that resolves to, what ``/v1/models`` lists.

Rules:
- Served names come from the engines' ``/v1/models`` (as vLLM reports them: ``root`` is the base
  model's path, an adapter's ``parent`` its base model's name), the pools' ``model``/``models``
  and the public names of ``models.aliases``.
- The engines' part is rebuilt only when the monitor says some engine's list changed
  (``models_version``), never per request.
- An unknown name's error lists what is served, cut to ``LISTED_IN_ERROR`` names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from priority_gateway.config.sections import Config
from priority_gateway.core.models import Aliases, cache_key

LISTED_IN_ERROR = 20


@dataclass(slots=True, frozen=True)
class Resolved:
    public: str
    served: str
    adapter: str | None
    seed: str
    """What the prefix chain is seeded with (``priority_gateway.core.models.cache_key``)."""


class Listings(Protocol):
    """The engines' ``/v1/models`` entries (``priority_gateway.upstream.monitor.EngineMonitor``)."""

    models_version: int

    def models(self) -> list[dict[str, Any]]: ...


class Catalog:
    def __init__(self, config: Config, monitor: Listings) -> None:
        self.monitor = monitor
        self.aliases = Aliases(
            {
                public: target if isinstance(target, str) else [(t.model, t.weight) for t in target]
                for public, target in config.models.aliases.items()
            }
        )
        configured: set[str] = set()
        loadable: set[str] = set()
        for pool in config.pools.values():
            if pool.model:
                configured.add(pool.model)
            configured.update(pool.models)
            loadable.update(pool.lora_adapters)
        self._configured = frozenset(configured | loadable)
        self._loadable = frozenset(loadable)
        self._version = -1
        self._entries: dict[str, dict[str, Any]] = {}
        self._known: frozenset[str] = self._configured
        self._resolved: dict[str, Resolved] = {}
        """Known names that are no alias, as resolved since the engines' lists last changed: the same
        answer every time, asked on every request."""

    def _refresh(self) -> None:
        version = self.monitor.models_version
        if version == self._version:
            return
        self._version = version
        self._resolved = {}
        self._entries = {str(m["id"]): m for m in self.monitor.models()}
        self._known = frozenset(self._entries) | self._configured | frozenset(self.aliases.public_names())

    def known(self) -> frozenset[str]:
        """Every name a request may give."""
        self._refresh()
        return self._known

    def served(self) -> frozenset[str]:
        """Names the engines and pools serve (aliases left out)."""
        self._refresh()
        return frozenset(self._entries) | self._configured

    def resolve(self, public: str) -> Resolved:
        self._refresh()
        known = self._resolved.get(public)
        if known is not None:
            return known
        served = self.aliases.resolve(public) if self.aliases else None
        name = served or public
        entry = self._entries.get(name)
        adapter = None
        root = name
        if entry is not None:
            parent = entry.get("parent")
            if isinstance(parent, str) and parent != name:
                adapter = name
                base = self._entries.get(parent)
                root = str(base.get("root") or parent) if base is not None else parent
            else:
                root = str(entry.get("root") or name)
        elif name in self._loadable:
            adapter = name
        resolved = Resolved(public, name, adapter, cache_key(root, adapter))
        if served is None and public in self._known:  # a split alias changes its answer; unknown names are unbounded
            self._resolved[public] = resolved
        return resolved

    def unknown_message(self, shown: str) -> str:
        names = sorted(self.known())
        listed = ", ".join(names[:LISTED_IN_ERROR])
        more = f" and {len(names) - LISTED_IN_ERROR} more (GET /v1/models)" if len(names) > LISTED_IN_ERROR else ""
        return f"The model '{shown}' does not exist; served: {listed}{more}"

    def listing(self) -> list[dict[str, Any]]:
        """``/v1/models``: every engine's models and adapters as vLLM lists them, then the pools'
        declared names and the aliases."""
        self._refresh()
        data = list(self._entries.values())
        listed = set(self._entries)
        for model in sorted(self._configured - listed):
            data.append({"id": model, "object": "model", "owned_by": "gateway"})
            listed.add(model)
        for public in self.aliases.public_names():
            if public not in listed:
                root = self.aliases.targets(public)[0]
                data.append({"id": public, "object": "model", "owned_by": "gateway", "root": root, "parent": None})
        return data

    def entry(self, model: str) -> dict[str, Any] | None:
        return next((m for m in self.listing() if m["id"] == model), None)
