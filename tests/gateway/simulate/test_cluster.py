import argparse
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from priority_gateway.core.classes import BATCH, INTERACTIVE, Budget
from priority_gateway.core.dispatcher import AdmissionSettings
from priority_gateway.engines.sim.profile import load_profile
from priority_gateway.simulate.cli import _flood_source, add_arguments, build_setup
from priority_gateway.simulate.cluster import Cluster, ClusterSetup, PoolSetup, hit_ceiling
from priority_gateway.simulate.report import meets_budget
from priority_gateway.simulate.traces import TraceRequest, load_trace
from tests.support.coverage import untraced_env

ROOT = Path(__file__).parents[3]
MOONCAKE = ROOT / "benchmarks" / "traces" / "mooncake" / "conversation_trace.jsonl"


def sim(*args: str, traced: bool = True) -> dict:
    """``gateway sim`` with ``args``: its JSON. ``traced=False``: outside coverage (a long replay)."""
    env = None if traced else untraced_env()
    cmd = [sys.executable, "-m", "priority_gateway", "sim", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    return json.loads(out.stdout)


def test_hit_ceiling_follows_vllm_rules_on_a_toy_trace():
    a = TraceRequest(0.0, 1024, 1, (1, 2))
    b = TraceRequest(1.0, 1024, 1, (1, 2))  # the same prompt again: all but its last block
    c = TraceRequest(2.0, 600, 1, (1, 9))  # shares only the first 512 tokens
    ratio = hit_ceiling([a, b, c], math.inf, 16)
    assert ratio == (1008 + 512) / (1024 + 1024 + 600)
    assert hit_ceiling([a, b, c], 10, 16) == 0.0  # a cache too small to hold a prompt


def test_policies_replay_the_same_arrivals_deterministically():
    args = [
        "--trace",
        str(MOONCAKE),
        "--minutes",
        "1",
        "--engines",
        "4",
        "--profile",
        "h200-32b-fp8",
        "--policy",
        "round_robin,prefix",
        "--admission",
        "off",
    ]
    first, second = sim(*args, traced=False), sim(*args, traced=False)
    assert first == {**second, **{p: {**second[p], "wall_s": first[p]["wall_s"]} for p in second}}
    for policy in ("round_robin", "prefix"):
        r = first[policy]
        assert r["requests"] == r["completed"] > 100
        assert 0 <= r["prefix_hit_ratio"] <= r["oracle_hit_ratio"] + 0.02 <= r["infinite_hit_ratio"] + 0.02
        for key in (
            "ttft_p50_ms",
            "ttft_p99_ms",
            "itl_p50_ms",
            "itl_p99_ms",
            "load_imbalance",
            "slo_attainment",
            "goodput_rps",
            "by_class",
        ):
            assert key in r
    assert first["prefix"]["prefix_hit_ratio"] > first["round_robin"]["prefix_hit_ratio"]


def test_flood_and_admission_keep_interactive_within_budget():
    r = sim(
        "--trace",
        "poisson:rate=0.3,input=1024,output=128,minutes=2@interactive",
        "--engines",
        "interactive=2,batch=1",
        "--profile",
        "interactive=gemma4-nvfp4,batch=gemma4-nvfp4-mtp4",
        "--batch-flood",
        "64",
        "--flood-lengths",
        "1024,128",
        "--minutes",
        "2",
        "--no-oracle",
    )["prefix"]
    interactive, batch = r["by_class"]["interactive"], r["by_class"]["batch"]
    assert interactive["ttft_p99_ms"] <= 500 and interactive["itl_p99_ms"] <= 50
    assert batch["completed"] > 50
    verdict = interactive["false_refusals"]
    assert verdict["refused"] == interactive["rejected"] and verdict["replay_diverged"] == 0
    assert "false_refusals" not in batch


def test_single_engine_sweep_is_keyed_by_level():
    r = sim("--profile", "gemma4-nvfp4", "--concurrency", "1,4", "--input-len", "512", "--output-len", "32")
    assert set(r) == {"1", "4"}
    assert r["4"]["output_tokens_per_s"] > r["1"]["output_tokens_per_s"]
    for key in (
        "requests",
        "completed",
        "rejected",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "itl_p50_ms",
        "itl_p99_ms",
        "prefix_hit_ratio",
        "oracle_hit_ratio",
        "infinite_hit_ratio",
        "load_imbalance",
        "slo_attainment",
        "goodput_rps",
    ):
        assert key in r["1"]
    assert r["4"]["infinite_hit_ratio"] == 0.0  # every prompt is distinct


@pytest.mark.untraced
@pytest.mark.parametrize("replicas", [1, 2])
def test_precise_mode_predicts_what_the_engines_really_serve_from_cache(replicas):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    precise = ["--policy-option", "precise=true", "--replicas", str(replicas)]
    args = parser.parse_args(["--engines", "4", "--profile", "h200-32b-fp8", "--admission", "off", *precise])
    trace = load_trace(MOONCAKE, "interactive", minutes=2)
    cluster = Cluster(build_setup(args, "prefix", {"interactive"}))
    out = cluster.run(trace)
    indexes = [d.pools["interactive"].policy.precise for d in cluster.dispatchers]
    for index in indexes:
        # A stored block whose parent the engine already evicted cannot be placed: rare (after
        # a preemption), never a share that matters.
        blocks = sum(index.blocks(engine) for engine in cluster.engines)
        assert blocks > 10_000 and index.unplaced <= 0.001 * blocks
    # Every replica hears every engine, so all hold the same picture.
    assert all(index._ours == indexes[0]._ours for index in indexes)
    assert {r.replica for r in out["records"].values()} == set(range(replicas))
    records = [r for r in out["records"].values() if r.dispatch is not None]
    assert len(records) > 300
    predicted = sum(r.dispatch.predicted_cached_tokens for r in records)
    real = sum(r.cached_tokens for r in records)
    assert real > 100_000
    # Short of the truth only where an earlier turn was still being prefilled when we routed.
    assert abs(predicted - real) <= 0.15 * real
    exact = sum(r.dispatch.predicted_cached_tokens == r.cached_tokens for r in records)
    assert exact >= 0.9 * len(records)


def test_bad_policy_options_are_refused_clearly():
    for option, message in (("bogus=1", "unknown key"), ("cache_weight=lots", "expected a number")):
        out = subprocess.run(
            [sys.executable, "-m", "priority_gateway", "sim", "--trace", str(MOONCAKE), "--policy-option", option],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr


def _ttfts(timing: dict, engines_per_device: int = 1) -> list[float]:
    from priority_gateway.core.classes import INTERACTIVE, Budget
    from priority_gateway.engines.sim.profile import profile_from_dict
    from priority_gateway.simulate.cluster import ClusterSetup, PoolSetup

    engine = {"block_size": 16, "num_blocks": 4096, "max_num_batched_tokens": 2048, "max_model_len": 8192}
    profile = profile_from_dict({"engine": engine, "timing": timing})
    setup = ClusterSetup(
        [PoolSetup(INTERACTIVE, 2, profile)],
        policy="round_robin",
        budgets={INTERACTIVE: Budget()},
        engines_per_device=engines_per_device,
    )
    setup.admission.enabled = False
    trace = [TraceRequest(0.01 * i, 1024, 4, (10 * i, 10 * i + 1)) for i in range(2)]
    records = Cluster(setup).run(trace)["records"].values()
    return [r.first - r.req.arrival for r in records]


def test_the_api_servers_share_of_a_request_adds_to_its_ttft():
    timing = {"overhead_ms": 2.0, "prefill_ms_per_token": 0.01}
    plain = _ttfts(timing)
    slowed = _ttfts({**timing, "request_overhead_ms": 30.0, "request_ms_per_prompt_token": 0.01})
    assert all(s == pytest.approx(p + 0.030 + 1024 * 0.01e-3) for s, p in zip(slowed, plain, strict=True))


def test_engines_on_one_device_wait_for_each_other():
    timing = {"overhead_ms": 1.0, "prefill_ms_per_token": 0.05}
    apart, together = _ttfts(timing), _ttfts(timing, engines_per_device=2)
    assert apart[0] == pytest.approx(together[0])
    # The second prefill (51 ms of device work) waits for the first one's, which began 10 ms earlier.
    assert together[1] == pytest.approx(apart[1] + 0.0512 - 0.010, abs=1e-3)


def _replicas(share: str, *options: str) -> tuple[Cluster, dict]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--engines", "4", "--profile", "h200-32b-fp8", "--admission", "off", "--replicas", "2", "--share", share]
    cluster = Cluster(build_setup(parser.parse_args([*argv, *options]), "prefix", {"interactive"}))
    return cluster, cluster.run(load_trace(MOONCAKE, "interactive", minutes=2))


@pytest.mark.untraced
def test_replicas_that_share_at_once_hold_the_same_index_and_one_view_of_load():
    cluster, out = _replicas("on", "--share-delay-ms", "0", "--share-interval-ms", "0")
    a, b = (d.pools["interactive"].policy.index for d in cluster.dispatchers)
    assert len(a._holders) > 10_000 and a._holders == b._holders
    routed = sum(1 for r in out["records"].values() if r.dispatch is not None)
    assert out["share"]["facts"] == out["share"]["applied"] == routed
    assert out["share"]["bytes"] > routed * 8
    # Nothing in flight at the end, as every replica heard it.
    for dispatcher in cluster.dispatchers:
        assert all(e.peer_inflight == 0 and e.peer_prefill == 0 for e in dispatcher.engines())


@pytest.mark.untraced
def test_replicas_that_share_nothing_each_know_only_their_own_routing():
    cluster, out = _replicas("off")
    a, b = (d.pools["interactive"].policy.index for d in cluster.dispatchers)
    assert out["share"] is None
    assert a._holders != b._holders


def _lora_cluster(lora_aware: bool):
    from priority_gateway.core.dispatcher import AdmissionSettings
    from priority_gateway.engines.sim.profile import load_profile
    from priority_gateway.simulate.cluster import ClusterSetup, PoolSetup

    adapters = tuple(f"a{i}" for i in range(4))
    setup = ClusterSetup(
        pools=[PoolSetup("interactive", 2, load_profile("h200-7b-bf16"), lora_adapters=adapters, max_loras=2)],
        admission=AdmissionSettings(enabled=False),
        policy_options={"lora_aware": lora_aware},
        scrape_s=0.5,
    )
    trace = [
        TraceRequest(i * 0.05, 256, 32, (i % 4, 10_000 + i), block_tokens=128, adapter=adapters[i % 4])
        for i in range(200)
    ]
    cluster = Cluster(setup)
    return cluster, cluster.run(trace)


def test_lora_adapters_run_in_slots_and_are_scraped_back():
    cluster, result = _lora_cluster(True)
    assert all(r.done is not None for r in result["records"].values())
    assert sum(e.core.lora_swaps for e in result["engines"].values()) > 0
    for engine in cluster.dispatchers[0].engines():
        assert engine.adapters.max_lora == 2


def test_the_slot_rule_keeps_engines_within_their_adapter_slots():
    """Four adapters round the clock on two engines of two slots: a blind router leaves requests
    waiting for a slot (vLLM defers them), an adapter-aware one waits for none while any engine has room."""
    p99, swaps = {}, {}
    for aware in (True, False):
        _, result = _lora_cluster(aware)
        ttft = sorted(r.first - r.req.arrival for r in result["records"].values())
        p99[aware] = ttft[int(0.99 * len(ttft))]
        swaps[aware] = sum(e.core.lora_swaps for e in result["engines"].values())
    assert p99[True] < 0.5 * p99[False]
    assert swaps[True] < swaps[False]


@pytest.mark.untraced
def test_replicas_fill_no_more_than_one_would_and_their_safe_share_while_the_channel_is_down():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--engines", "interactive=2,batch=1", "--profile", "gemma4-nvfp4", "--replicas", "2"]
    argv += ["--batch-flood", "128", "--flood-lengths", "2048,256", "--minutes", "1", "--share-down", "20:40"]
    args = parser.parse_args(argv)
    cluster = Cluster(build_setup(args, "prefix", {"interactive", "batch"}))
    held: list[tuple[float, float, float]] = []  # (when, this replica's in-flight, its share), in the outage
    for dispatcher in cluster.dispatchers:

        def start(*args, d=dispatcher, original=dispatcher._start, **kwargs):
            out = original(*args, **kwargs)
            if d.fleet.channel.safe:
                # The two replicas heard split the limit this replica learned (it hears no other now);
                # what ran before the outage runs on, so it is what each starts that is bounded.
                share = max(1, math.floor(d.limits[out.engine.id].limit / 2))
                held.append((cluster.now, out.engine.inflight, share))
            return out

        dispatcher._start = start
    trace = load_trace(Path("poisson:rate=3,input=2048,output=256,minutes=1"), "interactive")
    out = cluster.run(trace, _flood_source(args, trace))
    spans = out["share"]["safe_share_spans"]
    assert len(spans) == 2 and all(s["from_s"] == 20 and 41 <= s["until_s"] <= 41.1 for s in spans), spans
    assert {s["replicas"] for s in spans} == {2}
    assert held and all(20 <= when <= 41.1 and inflight <= share for when, inflight, share in held), held
    assert all(r.done is not None or r.rejected for r in out["records"].values())
    # Never more on an engine than one replica would start, the flood's first instant included.
    assert out["overfilled"] == {"dispatches": 0, "max_excess": 0}


def _learning(replicas: int, through_one: bool) -> tuple[float, int]:
    """Two engines under a tenant asking twice what they serve, through ``replicas`` replicas sharing
    (``through_one``: all of it through replica 0, the others idle): the mean of the limits the replicas
    apply at the end, and the requests that met their budgets."""
    budget = Budget(0.5, 0.05)
    profile = load_profile("gemma4-nvfp4").with_overrides(max_num_batched_tokens=384)
    setup = ClusterSetup(
        [PoolSetup(INTERACTIVE, 2, profile)],
        policy="least_loaded",
        admission=AdmissionSettings(enabled=True),
        budgets={INTERACTIVE: budget, BATCH: Budget()},
        home={INTERACTIVE: INTERACTIVE, BATCH: INTERACTIVE},
        replicas=replicas,
        tenant_replica={"t": 0} if through_one else {},
    )
    rng = random.Random(7)
    trace, t = [], 0.0
    while (t := t + rng.expovariate(6.0)) < 120.0:
        blocks = tuple(1000 * len(trace) + j for j in range(64))
        trace.append(TraceRequest(t, 1024, 128, blocks, INTERACTIVE, "t", tenant="t"))
    cluster = Cluster(setup)
    records = cluster.run(trace)["records"]
    limits = [limit for d in cluster.dispatchers for limit in d.readings.concurrency_limits().values()]
    met = sum(meets_budget(r, budget) for r in records.values() if r.req.arrival >= 30.0)
    return sum(limits) / len(limits), met


@pytest.mark.untraced
@pytest.mark.parametrize("through_one", [False, True])
def test_replicas_learn_together_the_limit_one_replica_learns(through_one):
    # Each replica saw only its own requests' gaps, judged growth at its own limit and counted its starting
    # limit while it served nothing: four replicas settled at 2.5 to 2.9 where one learns 9.
    one, served = _learning(1, False)
    fleet, fleet_served = _learning(4, through_one)
    assert one >= 6
    assert abs(fleet - one) <= 0.5
    assert fleet_served >= 0.95 * served
