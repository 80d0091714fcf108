"""``gateway keys --url``: keys of a running gateway through its admin API, over HTTPS (httpx)."""

from __future__ import annotations

import ssl
import subprocess
import sys

import httpx
import pytest

from tests.support.procs import ROOT, free_port
from tests.support.tls import start_https_gateway

ADMIN = "remote-admin-key-for-tests"


@pytest.fixture(scope="module")
def gateway(procs, certs, tmp_path_factory):
    # The admin API needs no engine: one pool whose only engine never answers.
    config = {"pools": {"interactive": {"engines": [f"http://127.0.0.1:{free_port()}"]}}, "keys": {"admin": ADMIN}}
    proc = start_https_gateway(tmp_path_factory.mktemp("keys-remote"), config, certs)
    procs.append(proc)
    return proc


def keys(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "priority_gateway", "keys", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=30, env=env)


def test_create_list_and_revoke_through_the_admin_api(gateway, certs):
    remote = ("--url", gateway.url, "--admin-key", ADMIN, "--ca-file", str(certs["ca"]))
    done = keys("create", "--name", "far-away", "--classes", "batch", "--tpm", "5000", *remote)
    assert done.returncode == 0, done.stderr
    created = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    # The secret works at once (the gateway that made it knows it), and now a key is needed.
    with httpx.Client(base_url=gateway.url, verify=ssl.create_default_context(cafile=str(certs["ca"]))) as client:
        assert client.get("/v1/models", headers={"authorization": f"Bearer {created['secret']}"}).status_code == 200
        assert client.get("/v1/models").status_code == 401

    listed = keys("list", *remote)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith(created["key_id"]))
    assert row.split()[1:] == ["far-away", "batch", "batch", "-", "5000", "(itself)", "1", "-", "active"]

    assert keys("revoke", created["key_id"], *remote).stdout == f"revoked {created['key_id']}\n"
    assert "revoked 20" in next(line for line in keys("list", *remote).stdout.splitlines() if created["key_id"] in line)
    gone = keys("revoke", "key-000000000000", *remote)
    assert gone.returncode == 1 and gone.stderr == "gateway keys: key-000000000000 is not a key\n"


def test_the_gateways_refusals_come_back_in_one_line(gateway, certs):
    remote = ("--url", gateway.url, "--ca-file", str(certs["ca"]))
    wrong = keys("list", *remote, "--admin-key", "guess")
    assert wrong.returncode == 1
    assert wrong.stderr == "gateway keys: this endpoint needs the admin key as 'Authorization: Bearer ...'\n"
    bad = keys("create", "--name", "x", "--classes", "urgent", *remote, "--admin-key", ADMIN)
    assert bad.returncode == 2 and bad.stderr.startswith("gateway keys: ") and "urgent" in bad.stderr
    assert bad.stderr.count("\n") == 1


def test_the_admin_key_may_come_from_the_environment_and_tls_is_checked(gateway, certs):
    env = {"PATH": "/usr/bin:/bin", "GATEWAY_ADMIN_KEY": ADMIN}
    trusted = keys("list", "--url", gateway.url, "--ca-file", str(certs["ca"]), env=env)
    assert trusted.returncode == 0, trusted.stderr
    untrusted = keys("list", "--url", gateway.url, env=env)
    assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    missing = keys("list", "--url", gateway.url, env={"PATH": "/usr/bin:/bin"})
    assert missing.returncode == 2 and "--admin-key" in missing.stderr
