"""``gateway bench`` over HTTPS (httpx), against a gateway serving a certificate of a private CA."""

from __future__ import annotations

import json

import pytest

from priority_gateway.bench.clients import HttpxClient, open_client
from priority_gateway.cli import main
from priority_gateway.upstream.h1 import EngineClient
from tests.support.procs import start_engine
from tests.support.tls import start_https_gateway


@pytest.fixture(scope="module")
def https_gateway(procs, certs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench-https")
    engine = start_engine(tmp, "--token-delay-ms", "2")
    procs.append(engine)
    engine.wait_ready()
    gateway = start_https_gateway(tmp, {"pools": {"interactive": {"engines": [engine.url]}}}, certs)
    procs.append(gateway)
    return gateway


def test_https_is_httpx_and_http_the_lean_client():
    assert isinstance(open_client("https://h/v1", read_timeout=1, connections=1, api_key=None), HttpxClient)
    assert isinstance(open_client("http://h:8080", read_timeout=1, connections=1, api_key=None), EngineClient)
    with pytest.raises(ValueError, match="http:// or https://"):
        open_client("ftp://h", read_timeout=1, connections=1, api_key=None)
    with pytest.raises(ValueError, match="--ca-file is for https"):
        open_client("http://h", read_timeout=1, connections=1, api_key=None, ca_file="ca.pem")


def test_bench_measures_an_https_endpoint_signed_by_its_ca_file(https_gateway, certs, tmp_path):
    url = https_gateway.url + "/v1"
    command = ["--url", url, "--ca-file", str(certs["ca"]), "--concurrency", "2", "--duration", "0.6"]
    code = main(["bench", "--out", str(tmp_path), *command, "--output-len", "8", "--x-priority", "interactive"])
    results = json.loads((tmp_path / "results.json").read_text())
    assert code == 0
    assert results["url"].startswith("https://") and results["model"] == "sim-model"
    assert f"--ca-file {certs['ca']}" in results["command"]
    run = results["runs"][0]
    assert run["errors"] == 0 and run["completed"] > 0
    assert 6 <= run["output_tokens"] / run["completed"] <= 10  # 8 ± 25 %, streamed over TLS


def test_a_certificate_nobody_vouches_for_is_refused(https_gateway, tmp_path, monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with pytest.raises(SystemExit, match="CERTIFICATE_VERIFY_FAILED"):
        main(["bench", "--out", str(tmp_path), "--url", https_gateway.url, "--concurrency", "1", "--duration", "0.2"])
