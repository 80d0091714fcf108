"""Certificates for HTTPS on loopback, made by ``openssl``: a private CA and a server certificate
it signed for 127.0.0.1, as an operator's own CA would issue them."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path
from typing import Any

from priority_gateway.loopback import Proc
from tests.support.procs import start_gateway


def _openssl(tmp: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=tmp, check=True, capture_output=True)


def make_certs(tmp: Path) -> dict[str, Path]:
    """``ca`` (the CA's certificate), ``cert`` and ``key`` (the server's), all PEM, in ``tmp``."""
    _openssl(
        tmp,
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=gateway-test-ca"),
        *("-keyout", "ca.key", "-out", "ca.pem"),
        *("-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"),
    )
    _openssl(
        tmp,
        *("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1"),
        *("-keyout", "key.pem", "-out", "req.csr"),
    )
    (tmp / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    _openssl(
        tmp,
        *("x509", "-req", "-in", "req.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial"),
        *("-days", "2", "-extfile", "ext.cnf", "-out", "cert.pem"),
    )
    return {"ca": tmp / "ca.pem", "key": tmp / "key.pem", "cert": tmp / "cert.pem"}


def start_https_gateway(tmp: Path, config: dict[str, Any], certs: dict[str, Path]) -> Proc:
    """``gateway serve`` with ``config``, serving HTTPS with ``certs`` (``listen.ssl_*``); ready."""
    listen = {"ssl_certfile": str(certs["cert"]), "ssl_keyfile": str(certs["key"])}
    gateway = start_gateway(tmp, {**config, "listen": listen})
    gateway.url = gateway.url.replace("http://", "https://", 1)
    return gateway.wait_ready("/health", verify=ssl.create_default_context(cafile=str(certs["ca"])))
