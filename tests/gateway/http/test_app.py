"""The ASGI app's own rules: what needs a key, no redirects, no bare 500s."""

from __future__ import annotations

import httpx
import openai
import orjson
import pytest

from priority_gateway.config import parse_config
from priority_gateway.http.app import GatewayApp
from priority_gateway.runtime import Gateway
from tests.support.asgi import call
from tests.support.procs import free_port, start_gateway, start_stack


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
    def broken(*_args, **_kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(app.gateway.dispatcher, "submit", broken)
    answer = await call(app, "POST", "/v1/chat/completions", BODY)
    assert answer.status == 500
    error = orjson.loads(answer.body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "internal_error"
    assert any(r.getMessage() == "request_failed" for r in caplog.records)


async def test_an_unexpected_exception_after_dispatch_releases_the_engine(app, monkeypatch):
    def broken(_engine_id):
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


# -- methods, the Responses API's ids, /metrics exposure: a real gateway before a simulated engine ---

ADMIN = "admin-secret-for-app"


@pytest.fixture(scope="module")
def served(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("served")
    config = {
        "keys": {"admin": ADMIN},
        "limits": {"metrics_public": False},
        "tenants": {"metrics_limit": 0},
    }
    gateway = start_stack(procs, tmp, config, "--token-delay-ms", "1")
    made = httpx.post(
        gateway.url + "/admin/keys",
        json={"name": "app", "tenant": "team-secret-name"},
        headers={"authorization": f"Bearer {ADMIN}"},
    )
    assert made.status_code == 201, made.text
    return gateway, made.json()["secret"], made.json()["id"]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/v1/completions", "POST"),
        ("DELETE", "/v1/embeddings", "POST"),
        ("GET", "/v1/batches/batch_x/cancel", "POST"),
        ("DELETE", "/v1/files", "GET, POST"),
        ("POST", "/health", "GET"),
    ],
)
def test_an_unsupported_method_on_a_known_path_is_405_with_allow(served, method, path, allow):
    gateway, secret, _ = served
    r = httpx.request(method, gateway.url + path, headers={"authorization": f"Bearer {secret}"})
    assert r.status_code == 405, r.text
    assert {m.strip() for m in r.headers["allow"].split(",")} - {"HEAD"} == set(allow.split(", "))
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/responses/resp_abc"),
        ("DELETE", "/v1/responses/resp_abc"),
        ("POST", "/v1/responses/resp_abc/cancel"),
    ],
)
def test_a_response_id_is_the_engine_s_to_answer(served, method, path):
    gateway, secret, _ = served
    r = httpx.request(method, gateway.url + path, headers={"authorization": f"Bearer {secret}"})
    assert r.status_code == 404 and r.headers["x-gateway-engine"]
    error = r.json()["error"]  # the engine's own message; for a route it lacks, in OpenAI's shape too
    assert set(error) == {"message", "type", "param", "code"} and "resp_abc" in error["message"]
    assert httpx.request(method, gateway.url + path).status_code == 401


def test_the_official_client_retrieves_a_response_and_gets_the_engine_s_not_found(served):
    gateway, secret, _ = served
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=secret, max_retries=0, timeout=10)
    with pytest.raises(openai.NotFoundError, match="resp_missing"):
        client.responses.retrieve("resp_missing")


def test_metrics_can_be_protected_by_the_admin_key_and_carry_no_tenant_names(served):
    gateway, secret, key_id = served
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(gateway.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {secret}"})
    assert httpx.get(gateway.url + "/metrics").status_code == 401
    text = httpx.get(gateway.url + "/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
    assert "gateway_tenant_requests_total" in text
    assert "team-secret-name" not in text and key_id not in text
