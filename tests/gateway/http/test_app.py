"""The ASGI app's own rules: what needs a key, no redirects, no bare 500s."""

from __future__ import annotations

import httpx
import orjson
import pytest

from priority_gateway.config import parse_config
from priority_gateway.http.app import GatewayApp
from priority_gateway.runtime import Gateway
from tests.support.asgi import call
from tests.support.procs import free_port, start_gateway


def keyed_gateway(procs, tmp, limits: dict):
    """Keys required, no engine behind it: only the gateway's own routes answer."""
    config = {
        "pools": {"interactive": {"engines": [f"http://127.0.0.1:{free_port()}"]}},
        "keys": {"required": True},
        "limits": limits,
    }
    gw = start_gateway(tmp, config)
    procs.append(gw)
    return gw.wait_ready("/health")


@pytest.fixture(scope="module")
def locked(procs, tmp_path_factory):
    return keyed_gateway(procs, tmp_path_factory.mktemp("locked"), {"metrics_public": False})


@pytest.fixture(scope="module")
def open_docs(procs, tmp_path_factory):
    return keyed_gateway(procs, tmp_path_factory.mktemp("open"), {"openapi_public": True})


def test_openapi_needs_a_key_when_keys_are_required(locked):
    r = httpx.get(locked.url + "/openapi.json")
    assert r.status_code == 401
    assert r.json()["error"]["code"]


def test_metrics_can_be_closed(locked):
    assert httpx.get(locked.url + "/metrics").status_code == 401


def test_openapi_and_metrics_can_be_open(open_docs):
    assert httpx.get(open_docs.url + "/openapi.json").json()["info"]["title"] == "priority gateway"
    assert httpx.get(open_docs.url + "/metrics").status_code == 200


@pytest.mark.parametrize("path", ["/v1/models/", "/health/", "/v1/batches/", "/v1/chat/completions/"])
def test_a_trailing_slash_is_never_a_redirect_to_the_clients_host(locked, path):
    r = httpx.get(locked.url + path, headers={"host": "evil.example"})
    assert r.status_code != 307 and "location" not in r.headers
    assert "evil.example" not in r.text


# -- in-process: an unexpected exception on the hot path -----------------------------------


@pytest.fixture
def app():
    config = parse_config(
        {"pools": {"interactive": {"engines": ["http://127.0.0.1:9"], "model": "m"}}, "keys": {"required": False}}
    )
    return GatewayApp(Gateway(config))


BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})


async def test_an_unexpected_exception_before_dispatch_is_a_logged_500_in_openai_shape(app, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(app.gateway.dispatcher, "submit", broken)
    answer = await call(app, "POST", "/v1/chat/completions", BODY)
    assert answer.status == 500
    error = orjson.loads(answer.body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "internal_error"
    assert any(r.getMessage() == "request_failed" for r in caplog.records)


async def test_an_unexpected_exception_after_dispatch_releases_the_engine(app, monkeypatch):
    def broken(engine_id):
        raise RuntimeError("boom")

    monkeypatch.setattr(app.gateway.monitor, "client", broken)
    engine = app.gateway.dispatcher.engines()[0]
    answer = await call(app, "POST", "/v1/chat/completions", BODY)
    assert answer.status == 500
    assert orjson.loads(answer.body)["error"]["type"] == "server_error"
    assert engine.inflight == 0


async def test_an_unexpected_exception_in_a_framework_route_is_a_500_in_openai_shape(app, monkeypatch):
    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(app.gateway.monitor, "models", broken)
    answer = await call(app, "GET", "/v1/models")
    assert answer.status == 500
    assert orjson.loads(answer.body)["error"]["code"] == "internal_error"
