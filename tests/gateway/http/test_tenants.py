"""Tenants over real HTTP: a key's concurrency cap holds its tenant's requests in the gateway's queue
while another tenant's go ahead (work-conserving), and the tenant comes from the key, never from the
request. Real gateway and simulated engine processes; the order of events is asserted through the
access log, never a duration."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.support.observe import log_lines, wait_for
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
        await asyncio.sleep(0.1)
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
    return start(procs, tmp_path_factory.mktemp("settle"), "1", 1, keys)


def test_a_tenant_is_charged_the_tokens_its_answer_used_not_its_max_tokens(one_at_a_time):
    proc, keys = one_at_a_time

    async def complete(client: httpx.AsyncClient, tenant: str, request_id: str, max_tokens: int, **extra) -> None:
        body = {"model": MODEL, "prompt": "tell me", "max_tokens": max_tokens, **extra}
        headers = {"authorization": f"Bearer {keys[tenant]}", "x-request-id": request_id}
        r = await client.post(proc.url + "/v1/completions", json=body, headers=headers)
        assert r.status_code == 200, r.text

    async def run() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            # b0 holds the engine while the others queue, in this order: a1 asks for 4000 tokens but
            # the model stops long before (at most 256), then three of team-b's 300 each, then a2.
            calls = [asyncio.create_task(complete(client, "team-b", "b0", 300, ignore_eos=True))]
            plan = [("team-a", "a1", 4000, {}), *(("team-b", f"b{n}", 300, {"ignore_eos": True}) for n in (1, 2, 3))]
            for tenant, request_id, max_tokens, extra in [*plan, ("team-a", "a2", 300, {"ignore_eos": True})]:
                await asyncio.sleep(0.05)
                calls.append(asyncio.create_task(complete(client, tenant, request_id, max_tokens, **extra)))
            await asyncio.gather(*calls)

    asyncio.run(run())
    ids = {"b0", "a1", "b1", "b2", "b3", "a2"}
    assert wait_for(lambda: ids <= {x["request_id"] for x in log_lines(proc.log_path.read_text(), "access")})
    ended = [x["request_id"] for x in log_lines(proc.log_path.read_text(), "access") if x["request_id"] in ids]
    assert ended[:2] == ["b0", "a1"], ended
    # Charged a1's real length, team-a is level with team-b after b1; charged its 4000 max_tokens,
    # a2 would wait behind all three of team-b's.
    assert ended.index("a2") < ended.index("b2"), ended
