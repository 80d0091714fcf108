"""API keys: creation, lookup and the ``Authorization: Bearer`` check of /v1/*.

Rules:
- A key's secret is ``sk-<key id>.<random>``; the key id is its public prefix. The store
  keeps only the SHA-256 of the secret, so a secret is shown once, at creation.
- Keys are required on /v1/* as soon as one active key exists (``keys.required: auto``,
  the default), or always (``true``), or never (``false``). Replicas notice keys created
  elsewhere within ``keys.refresh_s``.
- Lookups are cached for ``keys.cache_s`` (a revoked key stops working within that time on
  every replica). While the store is unreachable, cached keys keep working and unknown
  ones get 503, so interactive traffic from known callers survives a store outage. A replica
  that has never reached its store requires keys (``auto`` fails closed), and a request without
  one gets 503 ``store_unavailable``, not 401: whether it needs a key is not known yet.
- The cache keeps the ``CACHE_ENTRIES`` keys used last, and apart from them as many ids
  that matched no key: a flood of made-up keys never pushes out the keys of real callers.
- A tenant's cap and weight bind all its keys: a key of a tenant runs under the tightest
  ``max_concurrency`` and the lowest ``weight`` of the tenant's active keys (read from the store
  every ``keys.cache_s``, and from each key looked up), so a sibling key without a cap never
  lifts the tenant's.
- Batch lines run in-process as their owner with a credential that never leaves the
  process (``internal_authorization``): batch class only, no per-minute limits, as
  OpenAI's Batch API keeps its own limits apart from the interactive ones; the owner's tenant,
  weight and cap apply to them as to its own requests.
- ``keys.admin`` (usually from ``GATEWAY__KEYS__ADMIN``) guards the /admin/keys endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from priority_gateway import log
from priority_gateway.auth import ANONYMOUS, Authenticator, Principal
from priority_gateway.config.sections import KeysConfig
from priority_gateway.core.classes import BATCH, CLASSES
from priority_gateway.errors import ApiError, excerpt
from priority_gateway.store import Store, StoreUnavailable
from priority_gateway.store.records import ApiKey

SECRET_PREFIX = "sk-"
MAX_NAME = 256
MAX_TENANT = 64
MAX_WEIGHT = 1000.0
CACHE_ENTRIES = 10_000
_INTERNAL = b"Internal "


class KeySpecError(ValueError):
    """A key cannot be created as asked."""


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def key_id_of(secret: str) -> str | None:
    if not secret.startswith(SECRET_PREFIX):
        return None
    key_id, dot, rest = secret[len(SECRET_PREFIX) :].partition(".")
    return key_id if dot and key_id and rest else None


def new_key(
    name: str,
    classes: Sequence[str],
    default_class: str | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    tenant: str | None = None,
    weight: float = 1.0,
    max_concurrency: int | None = None,
    known: Sequence[str] = CLASSES,
) -> tuple[ApiKey, str]:
    """A fresh key and its secret (the only time the secret exists outside the caller); its classes
    must be among the ``known`` (the configured ones)."""
    name = name.strip()
    if not name:
        raise KeySpecError("a key needs a name")
    if len(name) > MAX_NAME:
        raise KeySpecError(f"a key's name has at most {MAX_NAME} characters")
    chosen = list(dict.fromkeys(c.strip().lower() for c in classes if c.strip()))
    unknown = [c for c in chosen if c not in known]
    if not chosen or unknown:
        got = excerpt(", ".join(classes)) if classes else "none"
        raise KeySpecError(f"classes must be some of {', '.join(known)}; got {got}")
    default = (default_class or chosen[0]).lower()
    if default not in chosen:
        raise KeySpecError(
            f"the default class {excerpt(default)} must be one of the key's classes ({', '.join(chosen)})"
        )
    for label, value in (("rpm", rpm), ("tpm", tpm), ("max_concurrency", max_concurrency)):
        if value is not None and value <= 0:
            raise KeySpecError(f"{label} must be a positive number")
    if not 0 < weight <= MAX_WEIGHT:
        raise KeySpecError(f"weight must be a number above 0 and at most {MAX_WEIGHT:g}")
    if tenant is not None:
        tenant = tenant.strip()
        if not 0 < len(tenant) <= MAX_TENANT or not tenant.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise KeySpecError(f"a tenant is 1 to {MAX_TENANT} letters, digits, '.', '-' or '_'; got {excerpt(tenant)}")
    key_id = "key-" + secrets.token_hex(6)
    secret = f"{SECRET_PREFIX}{key_id}.{secrets.token_urlsafe(32)}"
    key = ApiKey(
        key_id,
        name,
        hash_secret(secret),
        chosen,
        default,
        int(time.time()),
        rpm,
        tpm,
        tenant=tenant,
        weight=float(weight),
        max_concurrency=max_concurrency,
    )
    return key, secret


def principal_of(key: ApiKey, tenant: TenantTerms | None = None) -> Principal:
    """The key's principal; ``tenant``: its tenant's terms over all its keys (else the key's own)."""
    weight, cap = key.weight, key.max_concurrency
    if tenant is not None:
        weight, cap = min(weight, tenant.weight), _tightest(cap, tenant.max_concurrency)
    return Principal(
        key.id,
        key.name,
        key.default_class,
        frozenset(key.classes),
        key.rpm,
        key.tpm,
        tenant=key.tenant or key.id,
        weight=weight,
        max_concurrency=cap,
    )


@dataclass(frozen=True, slots=True)
class TenantTerms:
    """What binds every key of one tenant: the lowest weight and the tightest cap among them."""

    weight: float
    max_concurrency: int | None

    def joined(self, key: ApiKey) -> TenantTerms:
        return TenantTerms(min(self.weight, key.weight), _tightest(self.max_concurrency, key.max_concurrency))


def _tightest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def join_tenant(terms: dict[str, TenantTerms], key: ApiKey) -> None:
    """Count ``key`` in its tenant's terms (a key without a tenant, or revoked, counts in none)."""
    if key.tenant and key.active:
        known = terms.get(key.tenant)
        terms[key.tenant] = known.joined(key) if known else TenantTerms(key.weight, key.max_concurrency)


def tenant_terms(keys: Sequence[ApiKey]) -> dict[str, TenantTerms]:
    """Each named tenant's terms over its active keys."""
    out: dict[str, TenantTerms] = {}
    for key in keys:
        join_tenant(out, key)
    return out


def _bearer(authorization: bytes | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.decode("latin-1").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


@dataclass(slots=True)
class _Cached:
    key: ApiKey | None
    at: float


class _Lru:
    """At most ``size`` entries; the one used longest ago goes first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, _Cached] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key_id: str) -> _Cached | None:
        entry = self._items.get(key_id)
        if entry is not None:
            self._items.move_to_end(key_id)
        return entry

    def put(self, key_id: str, entry: _Cached) -> None:
        self._items[key_id] = entry
        self._items.move_to_end(key_id)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def pop(self, key_id: str) -> None:
        self._items.pop(key_id, None)


class KeyAuthenticator:
    def __init__(self, store: Store, settings: KeysConfig | None = None) -> None:
        settings = settings or KeysConfig()
        self.store = store
        self._mode: bool | None = None if settings.required == "auto" else settings.required
        # Unknown until the store first answers: closed, so a replica that starts during a
        # store outage does not serve keyless callers a deployment with keys would refuse.
        self._any_keys: bool | None = None
        self.cache_s = settings.cache_s
        self.refresh_s = settings.refresh_s
        self.admin_secret: str | None = settings.admin or None
        self._internal = secrets.token_hex(16).encode()
        self._known = _Lru(CACHE_ENTRIES)
        self._unknown = _Lru(CACHE_ENTRIES)
        self._tenants: dict[str, TenantTerms] = {}
        self._tenants_at = -math.inf
        self._refresher: asyncio.Task[None] | None = None

    @property
    def required(self) -> bool:
        if self._mode is not None:
            return self._mode
        return True if self._any_keys is None else self._any_keys

    @property
    def requirement_unknown(self) -> bool:
        """``required: auto`` and the store has not said yet whether any key exists."""
        return self._mode is None and self._any_keys is None

    async def start(self) -> None:
        await self.refresh()
        self._refresher = asyncio.create_task(self._refresh_loop(), name="key refresh")

    async def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher

    async def refresh(self) -> None:
        try:
            if self._mode is None:
                self._any_keys = await self.store.active_key_count() > 0
            if time.monotonic() - self._tenants_at >= self.cache_s:
                self._tenants = tenant_terms(await self.store.list_keys())
                self._tenants_at = time.monotonic()
        except StoreUnavailable as exc:
            log.warning("key_refresh_failed", reason=str(exc))

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()

    def noted_new_key(self) -> None:
        self._any_keys = True

    # -- checks ----------------------------------------------------------------------------

    def internal_authorization(self, owner: str) -> bytes:
        """The credential batch lines of ``owner`` run with, valid in this process only."""
        return _INTERNAL + self._internal + b" " + owner.encode()

    async def authenticate(self, authorization: bytes | None) -> Principal:
        if authorization is not None and authorization.startswith(_INTERNAL):
            token, _, owner = authorization[len(_INTERNAL) :].partition(b" ")
            if hmac.compare_digest(token, self._internal):
                return await self._batch_owner(owner.decode())
        secret = _bearer(authorization)
        if not authorization and self.requirement_unknown:
            raise ApiError(
                503,
                "the gateway's store has not answered yet, so whether this gateway needs an API key is not known; "
                "retry shortly",
                "store_unavailable",
                retry_after_s=1,
            )
        if secret is None:
            raise ApiError(
                401,
                "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
                "missing_api_key",
            )
        key_id = key_id_of(secret)
        key = await self._lookup(key_id) if key_id else None
        if key is None or not key.active or not hmac.compare_digest(key.secret_hash, hash_secret(secret)):
            raise ApiError(401, "Incorrect API key provided.", "invalid_api_key")
        return principal_of(key, self._tenants.get(key.tenant) if key.tenant else None)

    async def _batch_owner(self, owner_id: str) -> Principal:
        """A batch line's principal: batch class only, no per-minute limits, its owner's tenant terms."""
        try:
            key = await self._lookup(owner_id) if owner_id else None
        except ApiError:  # the store is down and the key not cached: the line runs all the same
            key = None
        if key is None:
            # No key (keys not required, or revoked: its batches are being cancelled).
            return Principal(owner_id or None, "batch", BATCH, frozenset({BATCH}), tenant=owner_id)
        own = principal_of(key, self._tenants.get(key.tenant) if key.tenant else None)
        return replace(own, default_class=BATCH, allowed=frozenset({BATCH}), rpm=None, tpm=None)

    async def _lookup(self, key_id: str) -> ApiKey | None:
        cached = self._known.get(key_id) or self._unknown.get(key_id)
        now = time.monotonic()
        if cached is not None and now - cached.at < self.cache_s:
            return cached.key
        try:
            key = await self.store.get_key(key_id)
        except StoreUnavailable as exc:
            if cached is not None:
                return cached.key
            raise ApiError(
                503, "the key store is unavailable; retry shortly", "store_unavailable", retry_after_s=1
            ) from exc
        if key is None:
            self._known.pop(key_id)
            self._unknown.put(key_id, _Cached(None, now))
        else:
            self._unknown.pop(key_id)
            self._known.put(key_id, _Cached(key, now))
            join_tenant(self._tenants, key)  # a key made since the last refresh tightens its tenant's at once
        return key

    def is_admin(self, authorization: bytes | None) -> bool:
        secret = _bearer(authorization)
        return bool(self.admin_secret and secret and hmac.compare_digest(secret, self.admin_secret))


async def caller_of(auth: Authenticator, authorization: bytes | None) -> Principal:
    """Who calls: the key's principal when keys are required, else the anonymous caller."""
    return await auth.authenticate(authorization) if auth.required else ANONYMOUS
