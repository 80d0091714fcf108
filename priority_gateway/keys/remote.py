"""API keys of a running gateway, through its admin API (``/admin/keys``), with httpx.

Rules:
- Only the admin key (``Authorization: Bearer``) goes with each call; TLS is checked against the
  system's trust store (``SSL_CERT_FILE`` honoured) or the given CA bundle, and ``HTTPS_PROXY`` /
  ``NO_PROXY`` from the environment apply, as for any client of a remote service.
- A refusal is an ``AdminError`` with the gateway's own message and status; a gateway that cannot
  be reached, or whose certificate does not verify, is one too (status 0).
"""

from __future__ import annotations

import ssl
from typing import Any

import httpx

from priority_gateway.store.records import ApiKey


class AdminError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class RemoteKeys:
    def __init__(self, url: str, admin_key: str, ca_file: str | None = None, timeout_s: float = 30.0) -> None:
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
        self.url = url.rstrip("/")
        self._client = httpx.Client(
            base_url=self.url,
            headers={"authorization": f"Bearer {admin_key}"},
            verify=verify,
            timeout=timeout_s,
            trust_env=True,
        )

    def __enter__(self) -> RemoteKeys:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    def create(
        self,
        name: str,
        classes: list[str],
        default_class: str | None,
        rpm: int | None,
        tpm: int | None,
        tenant: str | None = None,
        weight: float | None = None,
        max_concurrency: int | None = None,
    ) -> tuple[ApiKey, str]:
        body = {
            "name": name,
            "classes": classes,
            "default_class": default_class,
            "rpm": rpm,
            "tpm": tpm,
            "tenant": tenant,
            "weight": weight,
            "max_concurrency": max_concurrency,
        }
        data = self._call("POST", "/admin/keys", json={k: v for k, v in body.items() if v is not None})
        return _key(data), str(data["secret"])

    def list(self) -> list[ApiKey]:
        return [_key(item) for item in self._call("GET", "/admin/keys")["data"]]

    def revoke(self, key_id: str) -> ApiKey | None:
        """The key as revoked (now or before), or None when the gateway knows no such key."""
        try:
            return _key(self._call("DELETE", f"/admin/keys/{key_id}"))
        except AdminError as exc:
            if exc.status == 404:
                return None
            raise

    def _call(self, method: str, path: str, json: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            response = self._client.request(method, path, json=json)
        except httpx.HTTPError as exc:
            raise AdminError(0, f"{self.url}: {exc or type(exc).__name__}") from None
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.is_success and isinstance(data, dict):
            return data
        error = data.get("error") if isinstance(data, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        raise AdminError(response.status_code, message or f"{method} {path} answered {response.status_code}")


def _key(data: dict[str, Any]) -> ApiKey:
    fields = {name: data.get(name) for name in ("rpm", "tpm", "revoked_at", "tenant", "max_concurrency")}
    return ApiKey(
        str(data["id"]),
        str(data["name"]),
        "",
        list(data["classes"]),
        str(data["default_class"]),
        int(data["created_at"]),
        weight=float(data.get("weight") or 1.0),
        **fields,
    )
