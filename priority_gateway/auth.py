"""Who is calling: the principal behind a request's API key.

Without configured keys every caller is ``ANONYMOUS``: any class, default interactive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from priority_gateway.core.classes import INTERACTIVE


@dataclass(frozen=True, slots=True)
class Principal:
    key_id: str | None
    name: str
    default_class: str = INTERACTIVE
    allowed: frozenset[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    tenant: str = ""
    """Who is charged in fair queueing: the key's tenant, else its id; the anonymous caller is ``""``."""
    weight: float = 1.0
    max_concurrency: int | None = None


ANONYMOUS = Principal(None, "anonymous")


class Authenticator(Protocol):
    @property
    def required(self) -> bool: ...

    async def authenticate(self, authorization: bytes | None) -> Principal: ...
