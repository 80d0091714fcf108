"""The engine client over TLS: https:// engines, as ``vllm serve --ssl-certfile`` runs them."""

from __future__ import annotations

import ssl

import httpx
import openai
import pytest

from tests.support.observe import wait_for
from tests.support.procs import start_engine, start_gateway


@pytest.fixture(scope="module")
def tls_engine(procs, certs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tls-engine")
    engine = start_engine(
        tmp, "--token-delay-ms", "2", "--ssl-keyfile", str(certs["key"]), "--ssl-certfile", str(certs["cert"])
    )
    engine.url = engine.url.replace("http://", "https://")
    procs.append(engine)
    engine.wait_ready(verify=ssl.create_default_context(cafile=str(certs["ca"])))
    return engine


def test_gateway_serves_through_an_https_engine_signed_by_its_ca_file(procs, certs, tls_engine, tmp_path_factory):
    config = {
        "pools": {"interactive": {"engines": [tls_engine.url], "ca_file": str(certs["ca"])}},
        "health": {"interval_s": 0.2, "timeout_s": 0.5, "unhealthy_after": 1},
    }
    gateway = start_gateway(tmp_path_factory.mktemp("tls-gw"), config)
    procs.append(gateway)
    gateway.wait_ready("/ready")
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    chat = client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hello over tls"}], max_tokens=5
    )
    assert chat.usage.completion_tokens == 5
    stream = client.completions.create(model="sim-model", prompt="stream over tls", max_tokens=6, stream=True)
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert text
    # The monitor reads the engine's /metrics over the same TLS connection pool.
    metrics = httpx.get(gateway.url + "/metrics").text
    assert f'gateway_engine_healthy{{engine="{tls_engine.url}",pool="interactive"}} 1.0' in metrics


def test_an_engine_certificate_nobody_trusts_keeps_the_engine_out(procs, tls_engine, tmp_path_factory):
    config = {
        "pools": {"interactive": {"engines": [tls_engine.url]}},  # system trust store only
        "health": {"interval_s": 0.1, "timeout_s": 0.5, "unhealthy_after": 1},
    }
    gateway = start_gateway(tmp_path_factory.mktemp("tls-untrusted"), config)
    procs.append(gateway)
    gateway.wait_ready("/health")
    assert wait_for(lambda: httpx.get(gateway.url + "/ready").status_code == 503)
    r = httpx.post(gateway.url + "/v1/completions", json={"model": "sim-model", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "no_healthy_engine"
