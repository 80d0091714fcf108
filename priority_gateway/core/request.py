"""A request as the core sees it: class, budget, prefix and nothing of HTTP."""

from __future__ import annotations

from dataclasses import dataclass, field

from priority_gateway.core.classes import Budget


@dataclass(slots=True, eq=False)
class RouteRequest:
    id: str
    cls: str
    model: str
    arrival: float
    prompt_tokens: int = 0
    max_tokens: int | None = None
    prefix: list[int] = field(default_factory=list)
    block_tokens: int = 16
    session: str | None = None
    """The agent session or conversation it belongs to, as the shell recognised it: an opaque,
    bounded key, never a metric label."""
    continuing: bool = False
    """Set by the dispatcher: a turn of a session that paused within its learned gap (``sessions``)."""
    budget: Budget = field(default_factory=Budget)
    tenant: str = ""
    """Who is charged for it in its class's fair queue: the API key's tenant (or the key), never
    anything the request itself says."""
    weight: float = 1.0
    """The tenant's weight in the fair queue."""
    max_concurrency: int | None = None
    """The most requests of the tenant in flight at once; None: no cap."""
    restartable: bool = False
    """Nothing of the answer reaches the client before it is complete (not streamed), so the
    request may be stopped and started again elsewhere."""
    adapter: str | None = None
    """The LoRA adapter ``model`` names, when it names one (its slots are what LoRA routing weighs)."""
    alias: str | None = None
    """The public name the client gave, when it is an alias of ``model`` (answers carry it back)."""
