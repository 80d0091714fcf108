"""Models behind the gateway: which pool serves a name, public aliases and weighted splits.

Rules:
- A pool serves a model it declares (``pools.<name>.models``) or one any of its engines lists in
  ``/v1/models`` (base model names and LoRA adapters alike). A pool that declares nothing while
  some engine has not answered yet may serve anything: routing does not refuse before it knows.
- An alias maps a public name to one served name, or splits it over several by weight. A split
  is smooth weighted round robin (nginx's): over any run of requests each target's share is within
  one request of its weight, with no random draw, and one replica's sequence interleaves targets.
- A public name resolves once per request; what the engine receives and what the client gets
  back carry the served and the public name respectively (``priority_gateway.http.model_names``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from xxhash import xxh3_64_hexdigest


def serves(declared: frozenset[str], engine_models: Iterable[frozenset[str] | None], model: str) -> bool:
    if model in declared:
        return True
    unknown = False
    for models in engine_models:
        if models is None:
            unknown = True
        elif model in models:
            return True
    return unknown and not declared


@dataclass(slots=True)
class Split:
    """One public name spread over served names by weight."""

    targets: tuple[str, ...]
    weights: tuple[int, ...]
    current: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.targets) != len(self.weights) or not self.targets:
            raise ValueError("a split needs one weight per target and at least one target")
        if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
            raise ValueError("split weights must not be negative and must not all be 0")
        self.current = [0] * len(self.targets)

    def next(self) -> str:
        total = 0
        best = 0
        current = self.current
        for i, weight in enumerate(self.weights):
            current[i] += weight
            total += weight
            if current[i] > current[best]:
                best = i
        current[best] -= total
        return self.targets[best]


class Aliases:
    def __init__(self, aliases: Mapping[str, str | Sequence[tuple[str, int]]] | None = None) -> None:
        self._fixed: dict[str, str] = {}
        self._splits: dict[str, Split] = {}
        for public, target in (aliases or {}).items():
            if isinstance(target, str):
                self._fixed[public] = target
            elif len(target) == 1:
                self._fixed[public] = target[0][0]
            else:
                self._splits[public] = Split(tuple(t for t, _ in target), tuple(w for _, w in target))

    def __bool__(self) -> bool:
        return bool(self._fixed or self._splits)

    def public_names(self) -> list[str]:
        return [*self._fixed, *self._splits]

    def targets(self, public: str) -> tuple[str, ...]:
        if public in self._fixed:
            return (self._fixed[public],)
        split = self._splits.get(public)
        return split.targets if split is not None else ()

    def resolve(self, public: str) -> str | None:
        """The served name for this request, or None when ``public`` is no alias."""
        fixed = self._fixed.get(public)
        if fixed is not None:
            return fixed
        split = self._splits.get(public)
        return split.next() if split is not None else None


def cache_key(root: str, adapter: str | None) -> str:
    """What the prefix chain is seeded with: engines share KV blocks only within one base model
    (whatever name serves it) and one adapter, as vLLM keys its block hashes by adapter."""
    return root if adapter is None else f"{root}\0lora:{adapter}"


def engine_tag(engine_id: str) -> str:
    """An opaque, stable name for an engine (its URL hashed), for the ``x-gateway-engine`` header."""
    return xxh3_64_hexdigest(engine_id.encode())[:12]
