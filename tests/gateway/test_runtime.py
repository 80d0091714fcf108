"""The running gateway's own loops: the dispatcher's poll measures how late the event loop ran it."""

from __future__ import annotations

import asyncio
import time

from priority_gateway.config import parse_config
from priority_gateway.runtime import Gateway


def lag_samples(gateway: Gateway) -> dict[str, float]:
    """Observations of ``gateway_event_loop_lag_seconds`` by bucket, and their count."""
    out = {}
    for family in gateway.metrics.registry.collect():
        if family.name == "gateway_event_loop_lag_seconds":
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    out[sample.labels["le"]] = sample.value
                elif sample.name.endswith("_count"):
                    out["count"] = sample.value
    return out


async def test_a_loop_held_by_other_work_shows_as_event_loop_lag():
    gateway = Gateway(parse_config({"pools": {"interactive": {"engines": ["http://127.0.0.1:9"]}}}))
    poller = asyncio.create_task(gateway._poll_loop())
    try:
        deadline = time.monotonic() + 10
        while lag_samples(gateway).get("count", 0) < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        held_until = time.monotonic() + 0.5
        while time.monotonic() < held_until:
            pass  # work that holds the loop: what the histogram is for
        seen = lag_samples(gateway)["count"]
        while lag_samples(gateway)["count"] == seen:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        samples = lag_samples(gateway)
        assert samples["count"] - samples["0.25"] >= 1, "the held loop's lag was not seen"
    finally:
        poller.cancel()
        await gateway.store.close()
