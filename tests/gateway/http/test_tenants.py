"""Tenants over real HTTP: a key's concurrency cap holds its tenant's requests in the gateway's queue
while another tenant's go ahead (work-conserving), and the tenant comes from the key, never from the
request. Real gateway and simulated engine processes; the order of events is asserted through the
access log and the gateway's gauges, never a duration."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import openai
import pytest

from tests.gateway.batch.support import chat_line, submit, wait_batch
from tests.support.observe import async_metric, log_lines, metric, peak_of, until, wait_for
from tests.support.procs import start_engine, start_gateway

MODEL = "sim-model"
ADMIN = "admin-secret"


def start(procs, tmp, token_delay_ms: str, limit: int, keys: dict[str, dict]):
    """A simulated engine and a gateway running at most ``limit`` requests on it; ``keys`` made by the admin API."""
    engine = start_engine(tmp, "--token-delay-ms", token_delay_ms)
    procs.append(engine)
    engine.wait_ready()
    config = {
        "pools": {"interactive": {"engines": [engine.url]}},
        # No latency budget: nothing here is refused for time, only queued.
        "classes": {"interactive": {"ttft_p99_ms": None, "itl_p99_ms": None}},
        "admission": {"unbudgeted_limit": limit},
        "health": {"interval_s": 0.2},
    }
    proc = start_gateway(tmp, config, env={"GATEWAY__KEYS__ADMIN": ADMIN})
    procs.append(proc)
    proc.wait_ready("/ready")
    admin = {"authorization": f"Bearer {ADMIN}"}
    made = {
        name: httpx.post(proc.url + "/admin/keys", json=key, headers=admin).json()["secret"]
        for name, key in keys.items()
    }
    return proc, made


@pytest.fixture(scope="module")
def gateway(procs, tmp_path_factory):
    capped = {"name": "capped", "tenant": "team-capped", "max_concurrency": 1}
    return start(procs, tmp_path_factory.mktemp("tenants"), "20", 8, {"capped": capped, "free": {"name": "free"}})


async def stream(client: httpx.AsyncClient, url: str, key: str, request_id: str) -> None:
    body = {"model": MODEL, "prompt": "tell me", "max_tokens": 15, "stream": True}
    headers = {"authorization": f"Bearer {key}", "x-request-id": request_id, "x-tenant": "team-free"}
    async with client.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        async for _ in r.aiter_bytes():
            pass


async def burst(url: str, keys: dict[str, str]) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        capped = [asyncio.create_task(stream(client, url, keys["capped"], f"capped-{n}")) for n in range(3)]

        async def two_held_back() -> bool:
            return await async_metric(url, "gateway_tenant_queued", tenant="team-capped") == 2

        assert await until(two_held_back), "the capped tenant's requests never queued"
        await stream(client, url, keys["free"], "free-0")
        await asyncio.gather(*capped)


def test_a_capped_tenant_queues_while_another_goes_ahead(gateway):
    proc, keys = gateway
    asyncio.run(burst(proc.url, keys))

    def access() -> dict[str, dict[str, str]]:
        return {x["request_id"]: x for x in log_lines(proc.log_path.read_text(), "access")}

    assert wait_for(lambda: {"capped-0", "capped-1", "capped-2", "free-0"} <= set(access()), timeout=5)
    lines = access()
    capped = [lines[f"capped-{n}"] for n in range(3)]
    # One of the capped tenant's requests starts at once; the cap holds the other two in the queue ...
    assert sorted(line["admission"] for line in capped) == ["admitted", "queued", "queued"]
    # ... while the other tenant, arriving after them, starts at once: the cap holds back only its own.
    assert lines["free-0"]["admission"] == "admitted"
    text = httpx.get(proc.url + "/metrics").text
    assert 'gateway_tenant_requests_total{class="interactive",status="200",tenant="team-capped"} 3.0' in text
    assert "team-free" not in text, "a header cannot choose the tenant"


@pytest.fixture(scope="module")
def one_at_a_time(procs, tmp_path_factory):
    """A gateway that runs one request at a time on its engine, and a key for each of two tenants."""
    keys = {tenant: {"name": tenant, "tenant": tenant} for tenant in ("team-a", "team-b")}
    return start(procs, tmp_path_factory.mktemp("settle"), "2", 1, keys)


def test_a_tenant_is_charged_the_tokens_its_answer_used_not_its_max_tokens(one_at_a_time):
    proc, keys = one_at_a_time

    async def complete(client: httpx.AsyncClient, tenant: str, request_id: str, max_tokens: int, **extra) -> None:
        body = {"model": MODEL, "prompt": "tell me", "max_tokens": max_tokens, **extra}
        headers = {"authorization": f"Bearer {keys[tenant]}", "x-request-id": request_id}
        r = await client.post(proc.url + "/v1/completions", json=body, headers=headers)
        assert r.status_code == 200, r.text

    async def holding(name: str, n: int) -> bool:
        return await async_metric(proc.url, name) == n

    async def run() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            # b0 holds the engine (up to 6 s) while the others queue, in this order: a1 asks for 4000
            # tokens but the model stops long before (at most 256), then three of team-b's 300 each, then
            # a2. Then b0's client leaves: whatever b0 is charged (at most its 3000), team-b's b1 brings
            # it past a1's real length, while a1 charged its 4000 would put a2 behind all three of team-b's.
            b0 = asyncio.create_task(complete(client, "team-b", "b0", 3000, ignore_eos=True))
            assert await until(lambda: holding("gateway_inflight", 1)), "b0 never reached the engine"
            plan = [("team-a", "a1", 4000, {}), *(("team-b", f"b{n}", 300, {"ignore_eos": True}) for n in (1, 2, 3))]
            calls = []
            for queued, (tenant, request_id, max_tokens, extra) in enumerate(
                [*plan, ("team-a", "a2", 300, {"ignore_eos": True})], start=1
            ):
                calls.append(asyncio.create_task(complete(client, tenant, request_id, max_tokens, **extra)))
                assert await until(lambda n=queued: holding("gateway_queue_depth", n)), f"{request_id} never queued"
            b0.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await b0
            await asyncio.gather(*calls)

    asyncio.run(run())
    ids = {"b0", "a1", "b1", "b2", "b3", "a2"}
    assert wait_for(lambda: ids <= {x["request_id"] for x in log_lines(proc.log_path.read_text(), "access")})
    ended = [x["request_id"] for x in log_lines(proc.log_path.read_text(), "access") if x["request_id"] in ids]
    assert ended[:2] == ["b0", "a1"], ended
    assert ended.index("a2") < ended.index("b2"), ended


# -- a tenant's cap binds every way in: its keys, and its batch jobs ------------------------------


def inflight(proc, tenant: str):
    """The gateway's count of ``tenant``'s requests at an engine, sampled while a block runs."""
    return peak_of(lambda: metric(proc.url, "gateway_tenant_inflight", tenant=tenant))


@pytest.fixture(scope="module")
def team(procs, tmp_path_factory):
    """A tenant capped at 2 through one key, a sibling key without a cap, an engine that runs 16."""
    keys = {
        "capped": {"name": "capped", "tenant": "team-c", "max_concurrency": 2, "classes": ["interactive", "batch"]},
        "sibling": {"name": "sibling", "tenant": "team-c", "classes": ["interactive", "batch"]},
        "batcher": {"name": "batcher", "tenant": "team-j", "max_concurrency": 2, "classes": ["batch"]},
    }
    proc, made = start(procs, tmp_path_factory.mktemp("team"), "20", 16, keys)
    listed = httpx.get(proc.url + "/admin/keys", headers={"authorization": f"Bearer {ADMIN}"}).json()["data"]
    ids = {k["name"]: k["id"] for k in listed}
    return proc, made, ids


def test_a_key_without_a_cap_does_not_lift_its_tenant_s_cap(team):
    proc, keys, ids = team

    async def run() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            calls = [stream(client, proc.url, keys["sibling" if n % 2 else "capped"], f"team-c-{n}") for n in range(16)]
            await asyncio.gather(*calls)

    with inflight(proc, "team-c") as running:
        asyncio.run(run())
    wanted = {f"team-c-{n}" for n in range(16)}
    assert wait_for(lambda: wanted <= {x["request_id"] for x in log_lines(proc.log_path.read_text(), "access")})
    lines = [x for x in log_lines(proc.log_path.read_text(), "access") if x["request_id"] in wanted]
    assert {x["key_id"] for x in lines} == {ids["capped"], ids["sibling"]}
    assert running.peak == 2  # the cap, reached: sixteen requests wanted more


def test_batch_lines_run_as_their_owner_s_tenant_under_its_cap(team):
    proc, keys, ids = team
    client = openai.OpenAI(base_url=proc.url + "/v1", api_key=keys["batcher"], max_retries=0, timeout=30)
    lines = [chat_line(i, max_tokens=15) for i in range(24)]
    with inflight(proc, "team-j") as running:
        batch = wait_batch(client, submit(client, lines).id, timeout=60)
    assert batch.status == "completed" and batch.request_counts.completed == 24
    ran = [x for x in log_lines(proc.log_path.read_text(), "access") if x.get("batch_id") == batch.id]
    assert len(ran) == 24 and {x["key_id"] for x in ran} == {ids["batcher"]}
    assert running.peak == 2
    text = httpx.get(proc.url + "/metrics").text
    assert 'gateway_tenant_requests_total{class="batch",status="200",tenant="team-j"} 24.0' in text
