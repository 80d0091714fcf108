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


@pytest.fixture(scope="module")
def gateway(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tenants")
    engine = start_engine(tmp, "--token-delay-ms", "20")
    procs.append(engine)
    engine.wait_ready()
    config = {
        "pools": {"interactive": {"engines": [engine.url]}},
        # No latency budget: nothing here is refused for time, only queued for the cap.
        "classes": {"interactive": {"ttft_p99_ms": None, "itl_p99_ms": None}},
        "admission": {"unbudgeted_limit": 8},
        "health": {"interval_s": 0.2},
    }
    proc = start_gateway(tmp, config, env={"GATEWAY__KEYS__ADMIN": ADMIN})
    procs.append(proc)
    proc.wait_ready("/ready")
    admin = {"authorization": f"Bearer {ADMIN}"}
    capped = {"name": "capped", "tenant": "team-capped", "max_concurrency": 1}
    keys = {
        "capped": httpx.post(proc.url + "/admin/keys", json=capped, headers=admin).json()["secret"],
        "free": httpx.post(proc.url + "/admin/keys", json={"name": "free"}, headers=admin).json()["secret"],
    }
    return proc, keys


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
