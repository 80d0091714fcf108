"""API keys end to end: the CLI against a real redis-server, two gateway replicas sharing keys
and rate limits, 401/403/404/429, ownership of files and batches, the admin endpoints."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import httpx
import openai
import pytest
import yaml

from priority_gateway.keys import CACHE_ENTRIES
from tests.gateway.batch.support import MODEL, chat_line, client_for, file_lines, start_stack, submit, wait_batch
from tests.support.observe import metric, wait_for
from tests.support.partial_body import post_unfinished
from tests.support.procs import ROOT
from tests.support.redis import RedisServer

pytestmark = pytest.mark.redis

ADMIN = "admin-secret-for-tests"
KEYS = {"admin": ADMIN, "refresh_s": 0.2, "cache_s": 0.3}


def keys_cli(config, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "priority_gateway", "keys", *args, "--config", str(config)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=30)


def create_key(config, name: str, *args: str) -> tuple[str, str]:
    done = keys_cli(config, "create", "--name", name, *args)
    assert done.returncode == 0, done.stderr
    fields = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    return fields["key_id"], fields["secret"]


def chat(url: str, key: str | None, **headers: str) -> httpx.Response:
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=10)


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code


@pytest.fixture(scope="module")
def env(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keys")
    server = RedisServer(tmp).start()
    config = tmp / "keys.yaml"
    config.write_text(yaml.safe_dump({"store": server.url, "keys": KEYS}))
    keys = {
        "web": create_key(config, "web", "--classes", "interactive,batch"),
        "other": create_key(config, "other", "--classes", "interactive,batch"),
        "offline": create_key(config, "offline", "--classes", "batch"),
        "rpm": create_key(config, "rpm", "--rpm", "4"),
        "tpm": create_key(config, "tpm", "--tpm", "300"),
        "team-a-1": create_key(config, "team-a-1", "--tenant", "team-a", "--weight", "2", "--max-concurrency", "4"),
        "team-a-2": create_key(config, "team-a-2", "--tenant", "team-a"),
    }
    stack = start_stack(tmp, procs, store=server.url, keys=KEYS, gateways=2)
    yield {"config": config, "keys": keys, "stack": stack, "urls": [g.url for g in stack.gateways], "server": server}
    server.stop()


def secret(env, name: str) -> str:
    return env["keys"][name][1]


def tokens_counted(env, name: str) -> int:
    """The tokens the store counts against key ``name`` in the current and the previous minute."""
    redis = env["server"].client()
    return sum(int(redis.get(k) or 0) for k in redis.scan_iter(f"gw:rl:{env['keys'][name][0]}:tpm:*"))


def test_v1_needs_a_valid_key_and_probes_do_not(env):
    url = env["urls"][0]
    assert_error(chat(url, None), 401, "missing_api_key")
    assert_error(chat(url, "sk-key-000000000000.forged"), 401, "invalid_api_key")
    assert_error(chat(url, secret(env, "web") + "x"), 401, "invalid_api_key")
    assert_error(httpx.get(url + "/v1/files", timeout=5), 401, "missing_api_key")
    assert chat(url, secret(env, "web")).status_code == 200
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/metrics").status_code == 200
    assert_error(httpx.get(url + "/v1/models", timeout=5), 401, "missing_api_key")
    with pytest.raises(openai.AuthenticationError):
        client_for(env["stack"].gateways[1], "wrong").models.list()
    assert [m.id for m in client_for(env["stack"].gateways[1], secret(env, "web")).models.list()] == [MODEL]


def test_a_batch_only_key_gets_403_for_interactive_and_batch_by_default(env):
    url = env["urls"][1]
    assert_error(chat(url, secret(env, "offline"), **{"x-priority": "interactive"}), 403, "class_not_allowed")
    reply = chat(url, secret(env, "offline"))
    assert reply.status_code == 200 and reply.headers["x-gateway-class"] == "batch"
    assert chat(url, secret(env, "web")).headers["x-gateway-class"] == "interactive"


def test_files_and_batches_belong_to_their_key(env):
    a, b = env["stack"].gateways
    owner, stranger = client_for(a, secret(env, "web")), client_for(b, secret(env, "other"))
    batch = wait_batch(owner, submit(owner, [chat_line(i) for i in range(5)]).id)
    assert batch.status == "completed"
    assert len(file_lines(owner, batch.output_file_id)) == 5
    for call in (
        lambda: stranger.files.retrieve(batch.input_file_id),
        lambda: stranger.files.content(batch.output_file_id),
        lambda: stranger.files.delete(batch.input_file_id),
        lambda: stranger.batches.retrieve(batch.id),
        lambda: stranger.batches.cancel(batch.id),
        lambda: stranger.batches.create(
            input_file_id=batch.input_file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch.id not in [x.id for x in stranger.batches.list()]
    assert batch.input_file_id not in [f.id for f in stranger.files.list()]
    assert owner.files.retrieve(batch.input_file_id).id == batch.input_file_id


def test_a_key_without_the_batch_class_cannot_create_batches(env):
    config = env["config"]
    _, interactive_only = create_key(config, "chat-only", "--classes", "interactive")
    client = client_for(env["stack"].gateways[0], interactive_only)
    file_id = client.files.create(file=("x.jsonl", b'{"a": 1}\n'), purpose="batch").id
    with pytest.raises(openai.PermissionDeniedError):
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")


def test_requests_per_minute_hold_across_both_replicas(env):
    key = secret(env, "rpm")
    answers = [chat(env["urls"][i % 2], key) for i in range(6)]
    assert [r.status_code for r in answers[:4]] == [200] * 4
    for refused in answers[4:]:
        assert_error(refused, 429, "rate_limit_exceeded")
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert 1 <= int(refused.headers["retry-after"]) <= 120
    with pytest.raises(openai.RateLimitError):
        client_for(env["stack"].gateways[1], key).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=1
        )


def test_tokens_per_minute_count_prompts_and_completions(env):
    a, b = env["stack"].gateways
    key = secret(env, "tpm")
    messages = [{"role": "user", "content": "hi"}]
    client_for(a, key).chat.completions.create(model=MODEL, messages=messages, max_tokens=100)
    stream = client_for(b, key).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=100, stream=True, stream_options={"include_usage": True}
    )
    assert list(stream)[-1].usage.completion_tokens == 100
    # Both completions counted in the store (each settled to its usage once its response ended) ...
    assert wait_for(lambda: tokens_counted(env, "tpm") >= 200)
    # ... about 210 of 300 used: a third request's reservation of 100 output tokens does not fit, 4 do.
    with pytest.raises(openai.RateLimitError) as refused:
        client_for(a, key).chat.completions.create(model=MODEL, messages=messages, max_tokens=100, stream=True)
    assert refused.value.code == "rate_limit_exceeded" and "tokens per minute" in refused.value.message
    assert chat(b.url, key).status_code == 200


def test_batch_lines_run_as_their_owner_when_keys_are_required(env):
    client = client_for(env["stack"].gateways[1], secret(env, "offline"))
    batch = wait_batch(client, submit(client, [chat_line(i) for i in range(20)]).id)
    assert batch.status == "completed" and batch.request_counts.completed == 20


def test_cli_lists_and_revokes_and_the_gateways_follow(env):
    config = env["config"]
    key_id, key = create_key(
        config, "short-lived", "--classes", "interactive", "--rpm", "1000", "--tpm", "99999",
        "--tenant", "team-cli", "--weight", "2.5", "--max-concurrency", "7",
    )  # fmt: skip
    listed = keys_cli(config, "list")
    assert listed.returncode == 0
    header = listed.stdout.splitlines()[0].split()
    assert header[6:9] == ["TENANT", "WEIGHT", "MAX_CONC"]
    row = next(line for line in listed.stdout.splitlines() if line.startswith(key_id))
    assert "short-lived" in row and "active" in row and "1000" in row and "99999" in row
    assert row.split()[6:9] == ["team-cli", "2.5", "7"]
    assert key not in listed.stdout
    assert chat(env["urls"][0], key).status_code == 200
    assert keys_cli(config, "revoke", key_id).returncode == 0
    assert "revoked" in next(line for line in keys_cli(config, "list").stdout.splitlines() if line.startswith(key_id))
    assert keys_cli(config, "revoke", key_id).returncode == 1
    for url in env["urls"]:  # once each replica's cache of the key has run out
        assert wait_for(lambda u=url: chat(u, key).status_code == 401)
        assert_error(chat(url, key), 401, "invalid_api_key")


def test_cli_refuses_bad_keys_and_a_store_that_forgets(env, tmp_path):
    bad = keys_cli(env["config"], "create", "--name", "x", "--classes", "batch", "--default-class", "interactive")
    assert bad.returncode == 2 and "default class" in bad.stderr
    memory = tmp_path / "memory.yaml"
    memory.write_text("store: memory\n")
    forgetful = keys_cli(memory, "list")
    assert forgetful.returncode == 2 and "keys.file" in forgetful.stderr


def test_admin_endpoints_manage_keys_with_the_admin_key(env):
    a, b = env["urls"]
    admin = {"authorization": f"Bearer {ADMIN}"}
    assert_error(httpx.get(a + "/admin/keys"), 401, "invalid_api_key")
    assert_error(httpx.get(a + "/admin/keys", headers={"authorization": "Bearer nope"}), 401, "invalid_api_key")
    created = httpx.post(a + "/admin/keys", json={"name": "via-admin", "classes": ["batch"], "rpm": 50}, headers=admin)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["secret"].startswith(f"sk-{body['id']}.") and body["default_class"] == "batch"
    assert "secret_hash" not in body
    assert chat(b, body["secret"]).status_code == 200
    listed = httpx.get(b + "/admin/keys", headers=admin).json()["data"]
    assert body["id"] in [k["id"] for k in listed] and all("secret" not in k for k in listed)
    bad = httpx.post(a + "/admin/keys", json={"name": "x", "classes": ["gold"]}, headers=admin)
    assert_error(bad, 400, "invalid_value")
    team = {"name": "team-key", "tenant": "team-a", "weight": 3, "max_concurrency": 8}
    shared = httpx.post(a + "/admin/keys", json=team, headers=admin).json()
    assert (shared["tenant"], shared["weight"], shared["max_concurrency"]) == ("team-a", 3.0, 8)
    assert httpx.delete(f"{b}/admin/keys/{body['id']}", headers=admin).json()["revoked_at"] is not None
    assert_error(httpx.delete(f"{b}/admin/keys/key-nope", headers=admin), 404, "not_found")
    assert wait_for(lambda: chat(a, body["secret"]).status_code == 401)  # once a's cache of the key ran out
    assert_error(chat(a, body["secret"]), 401, "invalid_api_key")


def test_admin_input_is_bounded_and_never_echoed(env):
    url = env["urls"][0]
    admin = {"authorization": f"Bearer {ADMIN}"}
    cases = [
        ({"name": "n" * 10_000}, "invalid_value"),
        ({"name": "x", "classes": ["g" * 10_000]}, "invalid_value"),
        ({"name": "x", "default_class": "d" * 10_000}, "invalid_value"),
        ({"name": "x", "default_class": 5}, "invalid_value"),
        ({"name": {"a": 1}}, "invalid_value"),
        ({"name": "x", "tenant": "t" * 10_000}, "invalid_value"),
        ({"name": "x", "tenant": "bad tenant"}, "invalid_value"),
        ({"name": "x", "weight": 0}, "invalid_value"),
        ({"name": "x", "weight": "heavy"}, "invalid_value"),
        ({"name": "x", "max_concurrency": 0}, "invalid_value"),
    ]
    for body, code in cases:
        refused = httpx.post(url + "/admin/keys", json=body, headers=admin)
        assert_error(refused, 400, code)
        assert len(refused.text) < 400
    assert_error(httpx.delete(f"{url}/admin/keys/key-{'x' * 10_000}", headers=admin), 404, "not_found")
    assert len(httpx.delete(f"{url}/admin/keys/key-{'x' * 10_000}", headers=admin).text) < 400
    huge = httpx.post(url + "/admin/keys", content=b"{" + b" " * 10_000_000 + b"}", headers=admin)
    assert_error(huge, 413, "body_too_large")
    # Sent without a length and never finished: the gateway stops reading at its limit and answers.
    status, _, answer = post_unfinished(url, "/admin/keys", b'{"name": "', 1_000_000, admin)
    assert (status, answer["error"]["code"]) == (413, "body_too_large")


def test_a_revoked_keys_batches_are_cancelled_and_say_why(env):
    url = env["urls"][0]
    admin = {"authorization": f"Bearer {ADMIN}"}
    created = httpx.post(url + "/admin/keys", json={"name": "leaving"}, headers=admin).json()
    client = client_for(env["stack"].gateways[0], created["secret"])
    batch = submit(client, [chat_line(i, max_tokens=200) for i in range(600)])
    assert wait_for(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 8, timeout=30)
    assert httpx.delete(f"{url}/admin/keys/{created['id']}", headers=admin).status_code == 200
    redis = env["server"].client()

    def field(name: str):
        return json.loads(redis.hget(f"gw:batch:{batch.id}", name))

    assert wait_for(lambda: field("status") == "cancelled", timeout=30), field("status")
    assert [e["code"] for e in field("errors")] == ["api_key_revoked"]
    assert 8 <= field("completed") < 600 and field("output_file_id")
    # Nothing more runs: the engines go idle with lines left.
    engines = env["stack"].interactive + env["stack"].batch
    assert wait_for(lambda: all(metric(e.url, "vllm:num_requests_running") == 0 for e in engines))
    assert field("completed") + field("failed") < 600


async def flood(url: str, n: int, connections: int = 8) -> list[int]:
    """``n`` chat requests, each with a made-up key of its own, pipelined on a few connections
    (an HTTP client's own work would take ten times as long as the gateway's)."""
    host, port = url.removeprefix("http://").split(":")
    body = b'{"model":"%s","messages":[{"role":"user","content":"hi"}]}' % MODEL.encode()

    async def connection(c: int) -> list[int]:
        reader, writer = await asyncio.open_connection(host, int(port))
        count = n // connections + (c < n % connections)
        writer.write(
            b"".join(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s\r\ncontent-length: %d\r\n"
                b"authorization: Bearer sk-key-%02d%08d.made-up\r\n\r\n%s" % (host.encode(), len(body), c, i, body)
                for i in range(count)
            )
        )
        statuses = []
        for _ in range(count):
            head = await reader.readuntil(b"\r\n\r\n")
            statuses.append(int(head.split(b" ", 2)[1]))
            length = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
            if length:
                await reader.readexactly(int(length[0].split(b":")[1]))
            else:
                await reader.readuntil(b"\r\n0\r\n\r\n")
        writer.close()
        return statuses

    return [status for part in await asyncio.gather(*map(connection, range(connections))) for status in part]


def test_a_flood_of_made_up_keys_does_not_push_out_real_ones(env, tmp_path):
    server = RedisServer(tmp_path).start()
    try:
        gateway = env["stack"].add_gateway(env={"GATEWAY_STORE": server.url})
        admin = {"authorization": f"Bearer {ADMIN}"}
        key = httpx.post(gateway.url + "/admin/keys", json={"name": "regular"}, headers=admin).json()["secret"]
        assert chat(gateway.url, key).status_code == 200

        statuses = asyncio.run(flood(gateway.url, CACHE_ENTRIES + 100))
        assert set(statuses) == {401} and len(statuses) == CACHE_ENTRIES + 100
        server.kill()
        # The store is gone: a caller the gateway knows keeps working, as before the flood.
        reply = chat(gateway.url, key)
        assert reply.status_code == 200, reply.text
    finally:
        server.stop()


def test_one_replica_keeps_keys_in_a_file_and_requires_them_once_one_exists(procs, tmp_path):
    keys_file = tmp_path / "keys.json"
    stack = start_stack(tmp_path, procs, keys={"file": str(keys_file), "refresh_s": 0.2})
    url = stack.gateways[0].url
    assert chat(url, None).status_code == 200
    config = tmp_path / "file.yaml"
    config.write_text(yaml.safe_dump({"keys": {"file": str(keys_file)}}))
    _, key = create_key(config, "first")
    assert wait_for(lambda: chat(url, None).status_code == 401)  # the file read again
    assert_error(chat(url, None), 401, "missing_api_key")
    assert chat(url, key).status_code == 200


def test_a_key_names_its_tenant_weight_and_cap_and_old_records_still_load():
    from priority_gateway.keys import KeySpecError, new_key, principal_of
    from priority_gateway.store.records import ApiKey

    key, _ = new_key("k", ["interactive"], tenant="team-a", weight=2.5, max_concurrency=4)
    principal = principal_of(key)
    assert (principal.tenant, principal.weight, principal.max_concurrency) == ("team-a", 2.5, 4)
    own, _ = new_key("k", ["interactive"])
    assert principal_of(own).tenant == own.id, "without a tenant a key is its own"
    stored_before = {
        k: v for k, v in own.to_api().items() if k not in ("tenant", "weight", "max_concurrency", "object")
    }
    old = ApiKey(**{**stored_before, "secret_hash": own.secret_hash})
    assert (old.tenant, old.weight, old.max_concurrency) == (None, 1.0, None)
    with pytest.raises(KeySpecError, match="classes must be some of interactive, batch"):
        new_key("k", ["realtime"])
    assert new_key("k", ["realtime"], known=("realtime", "interactive", "batch"))[0].classes == ["realtime"]


def test_tenant_metrics_name_the_key_stores_tenant_never_request_input(env):
    url = env["urls"][0]
    for name in ("team-a-1", "team-a-2"):
        assert chat(url, secret(env, name), **{"x-tenant": "forged", "x-priority": "interactive"}).status_code == 200
    text = httpx.get(url + "/metrics").text
    team = [line for line in text.splitlines() if line.startswith("gateway_tenant_requests_total{")]
    assert any('tenant="team-a"' in line and 'status="200"' in line and line.endswith(" 2.0") for line in team), team
    assert "forged" not in text
    assert 'gateway_tenant_tokens_total{class="interactive",kind="completion",tenant="team-a"} 8.0' in text


@pytest.mark.redis
def test_a_store_that_never_answered_is_503_for_keyless_callers_and_not_ready_until_it_does(procs, tmp_path):
    from tests.support.procs import start_engine, start_gateway

    redis_server = RedisServer(tmp_path)  # not started: the store is unreachable
    engine = start_engine(tmp_path)
    procs.append(engine)
    engine.wait_ready()
    gateway = start_gateway(tmp_path, {"pools": {"interactive": {"engines": [engine.url]}}, "store": redis_server.url})
    procs.append(gateway)
    gateway.wait_ready("/health")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert wait_for(lambda: httpx.get(gateway.url + "/ready").json()["pools"]["interactive"], timeout=20)
    ready = httpx.get(gateway.url + "/ready")
    assert ready.status_code == 503
    assert ready.json()["store"]["ok"] is False and "store_unavailable" in ready.json()["store"]["reason"]
    answer = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=10)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "store_unavailable" and answer.headers["retry-after"] == "1"
    redis_server.start()
    try:
        assert wait_for(lambda: httpx.get(gateway.url + "/ready").status_code == 200, timeout=20)
        assert wait_for(
            lambda: httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=10).status_code == 200,
            timeout=20,
        ), "no key exists: keyless callers are served once the store says so"
    finally:
        redis_server.stop()


def test_keys_made_without_a_config_land_in_the_default_store_file(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")} | {"XDG_STATE_HOME": str(tmp_path)}
    run = [sys.executable, "-m", "priority_gateway", "keys"]
    made = subprocess.run([*run, "create", "--name", "laptop"], capture_output=True, text=True, env=env, timeout=60)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "priority-gateway" / "gateway.db").is_file(), "the file make run's gateway reads"
    listed = subprocess.run([*run, "list"], capture_output=True, text=True, env=env, timeout=60)
    assert listed.returncode == 0 and any(" laptop " in line for line in listed.stdout.splitlines()), listed.stdout


async def test_every_key_of_a_tenant_and_its_batch_lines_run_under_the_tenant_s_tightest_terms():
    from priority_gateway.keys import KeyAuthenticator, new_key
    from priority_gateway.store import MemoryStore

    store = MemoryStore()
    capped, capped_secret = new_key("a", ["interactive", "batch"], tenant="team", weight=3.0, max_concurrency=2)
    free, free_secret = new_key("b", ["interactive"], tenant="team", weight=5.0, rpm=100)
    for key in (capped, free):
        await store.put_key(key)
    auth = KeyAuthenticator(store)
    await auth.start()
    try:
        sibling = await auth.authenticate(f"Bearer {free_secret}".encode())
        assert (sibling.tenant, sibling.weight, sibling.max_concurrency, sibling.rpm) == ("team", 3.0, 2, 100)
        line = await auth.authenticate(auth.internal_authorization(free.id))
        assert (line.tenant, line.weight, line.max_concurrency) == ("team", 3.0, 2)
        assert line.allowed == frozenset({"batch"}) and line.rpm is None and line.key_id == free.id
        # A key made since the last refresh tightens its tenant's terms as soon as it is used.
        tighter, tighter_secret = new_key("c", ["interactive"], tenant="team", max_concurrency=1)
        await store.put_key(tighter)
        await auth.authenticate(f"Bearer {tighter_secret}".encode())
        assert (await auth.authenticate(f"Bearer {capped_secret}".encode())).max_concurrency == 1
    finally:
        await auth.stop()
