"""A Redis that is up but refuses writes (out of memory, demoted to a read-only replica, a failed
snapshot): the store's endpoints answer 503 ``store_unavailable`` with ``Retry-After``,
inference goes on, and everything works again once Redis is fixed."""

from __future__ import annotations

import io
import shutil
from collections.abc import Callable

import httpx
import openai
import pytest

from tests.gateway.batch.support import MODEL, chat_line, client_for, jsonl, start_stack, upload
from tests.support.observe import wait_for
from tests.support.procs import free_port
from tests.support.redis import RedisServer

pytestmark = pytest.mark.redis

ADMIN = "admin-secret-for-tests"


@pytest.fixture(scope="module")
def env(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    server = RedisServer(tmp).start()
    stack = start_stack(tmp, procs, store=server.url, keys={"admin": ADMIN, "cache_s": 0.2, "refresh_s": 0.2})
    url = stack.gateways[0].url
    created = httpx.post(
        url + "/admin/keys",
        json={"name": "limited", "rpm": 1000, "tpm": 1_000_000},
        headers={"authorization": f"Bearer {ADMIN}"},
    )
    assert created.status_code == 201, created.text
    client = client_for(stack.gateways[0], created.json()["secret"])
    yield {"server": server, "url": url, "client": client, "file_id": upload(client, jsonl([chat_line(0)]))}
    server.stop()


def out_of_memory(server: RedisServer) -> Callable[[], None]:
    redis = server.client()
    redis.config_set("maxmemory-policy", "noeviction")
    redis.config_set("maxmemory", "1")
    return lambda: redis.config_set("maxmemory", "0")


def read_only(server: RedisServer) -> Callable[[], None]:
    # Demoted to a replica of a primary that is gone: it keeps its data and refuses writes.
    redis = server.client()
    redis.replicaof("127.0.0.1", free_port())
    return lambda: redis.replicaof("NO", "ONE")


def failed_snapshot(server: RedisServer) -> Callable[[], None]:
    redis = server.client()
    redis.config_set("save", "3600 1")
    redis.config_set("stop-writes-on-bgsave-error", "yes")
    shutil.rmtree(server.dir)  # its working directory: the snapshot cannot be written
    redis.bgsave()
    assert wait_for(lambda: redis.info("persistence")["rdb_last_bgsave_status"] == "err", timeout=10)
    return lambda: redis.config_set("save", "")


def assert_store_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "store_unavailable"
    assert int(response.headers["retry-after"]) >= 1


@pytest.mark.parametrize("fault", [out_of_memory, read_only, failed_snapshot], ids=["oom", "readonly", "misconf"])
def test_a_redis_refusing_writes_gives_503_and_inference_goes_on(env, fault):
    client, url = env["client"], env["url"]
    auth = {"authorization": f"Bearer {client.api_key}"}
    fix = fault(env["server"])
    try:
        with pytest.raises(openai.InternalServerError) as refused:
            client.files.create(file=("in.jsonl", io.BytesIO(jsonl([chat_line(1)]))), purpose="batch")
        assert refused.value.status_code == 503
        batch = {"input_file_id": env["file_id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        assert_store_unavailable(httpx.post(url + "/v1/batches", json=batch, headers=auth))
        admin = {"authorization": f"Bearer {ADMIN}"}
        assert_store_unavailable(httpx.post(url + "/admin/keys", json={"name": "x"}, headers=admin))
        # Inference needs the store only for the key's rate limits, which fail open.
        for _ in range(3):
            reply = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert reply.choices[0].message.content
    finally:
        fix()
    created = client.batches.create(
        input_file_id=env["file_id"], endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert created.status == "validating"
    assert client.files.create(file=("in.jsonl", io.BytesIO(jsonl([chat_line(2)]))), purpose="batch").id
