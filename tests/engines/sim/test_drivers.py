"""The same scenario in real time and in virtual time gives the same result."""

from __future__ import annotations

import asyncio
import time

from priority_gateway.engines.sim import virtual
from priority_gateway.engines.sim.core import EngineCore, EngineRequest
from priority_gateway.engines.sim.profile import Profile, Timing
from priority_gateway.engines.sim.realtime import RealtimeDriver

from .helpers import unique_hashes

PROFILE = Profile(
    "drivers",
    block_size=16,
    num_blocks=512,
    max_num_seqs=2,
    max_num_batched_tokens=256,
    max_model_len=2048,
    timing=Timing(overhead_ms=8.0, prefill_ms_per_token=0.05, decode_ms_per_token=0.5),
)
# (arrival s, id, prompt tokens, max tokens): two run, two queue; finishes are steps apart.
SCENARIO = [(0.0, "a", 400, 12), (0.004, "b", 100, 30), (0.03, "c", 300, 8), (0.06, "d", 50, 20)]


def new_request(rid: str, prompt: int, max_tokens: int) -> EngineRequest:
    return EngineRequest(rid, prompt, unique_hashes(rid, prompt, 16), max_tokens, ignore_eos=True)


def in_virtual_time() -> dict[str, tuple[int, float, float]]:
    core = EngineCore(PROFILE)
    trace = virtual.run(core, [(t, new_request(rid, p, m)) for t, rid, p, m in SCENARIO])
    arrival = {rid: t for t, rid, _, _ in SCENARIO}
    out: dict[str, list] = {}
    for t, o in trace.deliveries:
        rec = out.setdefault(o.request_id, [0, None, None])
        rec[0] += o.new_tokens
        if o.first_token:
            rec[1] = t - arrival[o.request_id]
        if o.finished:
            rec[2] = t
    return {rid: (n, ttft, done) for rid, (n, ttft, done) in out.items()}


async def in_real_time() -> dict[str, tuple[int, float, float]]:
    driver = RealtimeDriver(EngineCore(PROFILE))
    driver.start()
    start = time.monotonic()
    results: dict[str, tuple[int, float, float]] = {}

    async def client(at: float, rid: str, prompt: int, max_tokens: int) -> None:
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        sent = time.monotonic()
        stream = driver.submit(new_request(rid, prompt, max_tokens))
        total, ttft = 0, None
        while True:
            n, finished, _ = await stream.next()
            total += n
            if ttft is None:
                ttft = time.monotonic() - sent
            if finished:
                break
        results[rid] = (total, ttft, time.monotonic() - start)

    await asyncio.gather(*(client(*row) for row in SCENARIO))
    await driver.stop()
    return results


def order(results: dict[str, tuple[int, float, float]]) -> list[str]:
    return sorted(results, key=lambda rid: results[rid][2])


def test_real_and_virtual_time_agree():
    simulated = in_virtual_time()
    real = asyncio.run(in_real_time())
    assert {rid: n for rid, (n, _, _) in real.items()} == {rid: n for rid, (n, _, _) in simulated.items()}
    assert {rid: n for rid, (n, _, _) in simulated.items()} == {rid: m for _, rid, _, m in SCENARIO}
    assert order(real) == order(simulated)
    for rid, (_, ttft, _) in simulated.items():
        # Loose: the wall clock adds scheduling jitter on a shared machine.
        assert abs(real[rid][1] - ttft) < 0.05 + 0.5 * ttft, (rid, real[rid][1], ttft)
