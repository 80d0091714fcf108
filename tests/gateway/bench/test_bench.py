"""``gateway bench`` against real simulated engines (and the gateway) on loopback."""

from __future__ import annotations

import itertools
import json

import httpx
import pytest

from priority_gateway.bench import loadgen
from priority_gateway.bench.workload import SyntheticWorkload
from priority_gateway.cli import main
from priority_gateway.upstream.h1 import EngineClient
from tests.support.procs import start_engine, start_gateway

STEP_MS = 5.0
FIELDS = (
    "requests",
    "completed",
    "errors",
    "errors_by_code",
    "refused",
    "refused_by_code",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p90_ms",
    "itl_p99_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "output_tokens_per_s",
    "request_throughput",
    "slo_attainment",
    "goodput_requests_per_s",
    "goodput_tokens_per_s",
)


@pytest.fixture(scope="module")
def engine(procs, tmp_path_factory):
    proc = start_engine(tmp_path_factory.mktemp("bench"), "--token-delay-ms", str(STEP_MS), "--max-model-len", "4096")
    procs.append(proc)
    return proc.wait_ready()


def bench(out, command: str) -> tuple[int, dict]:
    code = main(["bench", "--out", str(out), *command.split()])
    return code, json.loads((out / "results.json").read_text())


def prefix_cache_hits(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("vllm:prefix_cache_hits_total"):
            return float(line.split()[-1])
    raise AssertionError("no vllm:prefix_cache_hits_total")


def test_closed_loop_levels_report_plausible_numbers(engine, tmp_path):
    out = tmp_path / "closed"
    hits_before = prefix_cache_hits(engine.url)
    code, results = bench(out, f"--url {engine.url} --concurrency 1,4 --duration 1.5 --input-len 200 --output-len 32")
    assert code == 0
    assert results["model"] == "sim-model"
    assert "--concurrency 1,4" in results["command"]
    assert [r["concurrency"] for r in results["runs"]] == [1, 4]
    for run in results["runs"]:
        assert all(field in run for field in FIELDS)
        assert run["completed"] == run["requests"] > 0 and run["errors"] == 0
        # ignore_eos and max_tokens: every reply has its drawn length, 32 ± 25 %.
        assert 24 <= run["output_tokens"] / run["completed"] <= 40
        # In milliseconds, and each the right span, whatever else the host runs: no token comes sooner
        # than the engine's step; a first token comes before its reply ends; and half of all gaps are
        # at least the median while a reply of 24 tokens or more has 23 gaps after its first token.
        assert STEP_MS * 0.8 <= run["itl_p50_ms"] <= (run["e2e_mean_ms"] - run["ttft_mean_ms"]) / 10
        assert STEP_MS * 0.8 <= run["ttft_p50_ms"] <= run["e2e_p50_ms"]
        assert run["output_tokens_per_s"] > 0 and run["request_throughput"] > 0
        assert 0.0 <= run["slo_attainment"] <= 1.0
        assert run["goodput_tokens_per_s"] <= run["output_tokens_per_s"] * 1.05
    assert results["runs"][1]["requests"] > results["runs"][0]["requests"]
    # Every prompt is new to the engine: no level finds another's prompts in the prefix cache.
    assert prefix_cache_hits(engine.url) == hits_before
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," in page
    assert page.count("<tr>") == 3
    assert "gateway bench --url" in page


def test_shared_prefix_reaches_the_cache(engine, tmp_path):
    hits_before = prefix_cache_hits(engine.url)
    command = (
        f"--url {engine.url} --concurrency 2 --duration 0.5 --input-len 300 --shared-prefix-len 256 --output-len 4"
    )
    code, results = bench(tmp_path / "shared", command)
    assert code == 0
    runs = results["runs"][0]["requests"]
    # Every request after the first finds the 256 common tokens (16 blocks of 16) cached.
    assert prefix_cache_hits(engine.url) - hits_before >= (runs - 1) * 256 * 0.9


def test_trace_replay_sends_every_request_with_shared_prefixes_shared(engine, tmp_path):
    azure = tmp_path / "azure.csv"
    rows = [f"2023-11-16 18:15:{10 + i // 2:02d}.{i % 2 * 5}000000,{150 + 10 * i},{8 + i}" for i in range(8)]
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    mooncake = tmp_path / "mooncake.jsonl"
    lines = [
        {"timestamp": 1000 * i, "input_length": 1100, "output_length": 10, "hash_ids": [1, 2, 100 + i]}
        for i in range(4)
    ]
    mooncake.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    hits_before = prefix_cache_hits(engine.url)
    out = tmp_path / "trace"
    code, results = bench(out, f"--url {engine.url} --trace {azure}@interactive --trace {mooncake} --rate-scale 4")
    assert code == 0
    assert results["mode"] == "trace replay"
    runs = {r["label"]: r for r in results["runs"]}
    assert set(runs) == {"azure@interactive", "mooncake"}
    assert runs["azure@interactive"]["completed"] == 8
    assert runs["mooncake"]["completed"] == 4
    assert runs["azure@interactive"]["output_tokens"] == sum(8 + i for i in range(8))
    assert all(r["errors"] == 0 for r in runs.values())
    # Requests 2 to 4 of the Mooncake slice share its first two 512-token blocks with the first.
    assert prefix_cache_hits(engine.url) - hits_before >= 3 * 1024
    assert (out / "report.png").exists() and (out / "report.html").exists()


def test_token_id_replay_reports_the_engines_cached_tokens_per_request(procs, tmp_path):
    engine = start_engine(tmp_path, "--token-delay-ms", "2", "--enable-prompt-tokens-details").wait_ready()
    procs.append(engine)
    mooncake = tmp_path / "mooncake.jsonl"
    lines = [
        {"timestamp": 1000 * i, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 100 + i]} for i in range(4)
    ]
    mooncake.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    command = (
        f"--url {engine.url} --trace {mooncake} --rate-scale 4 --endpoint completions --token-ids"
        " --trace-block-tokens 128"
    )
    code, results = bench(tmp_path / "ids", command)
    assert code == 0 and results["prompts"] == "token ids"
    run = results["runs"][0]
    assert run["completed"] == 4
    # 1100 tokens at 128 a block instead of 512: 275 each, exactly, as the engine counted them.
    assert run["prompt_tokens"] == 4 * 275
    # Each later request finds the two shared blocks (256 tokens, 16 engine blocks) cached.
    assert run["cached_tokens"] == 3 * 256
    assert run["cached_token_ratio"] == round(768 / 1100, 4)
    assert run["request_cached_ratio_p50"] == round(256 / 275, 4)
    assert run["requests_with_cache_hit"] == 0.75


def test_token_ids_need_the_completions_endpoint(engine, tmp_path):
    with pytest.raises(SystemExit, match="completions"):
        bench(tmp_path / "x", f"--url {engine.url} --concurrency 1 --duration 0.2 --token-ids")


def test_errors_are_counted_by_status_and_code(engine, tmp_path):
    command = f"--url {engine.url}/v1 --model no-such-model --concurrency 2 --duration 0.3 --stop-after-errors 0"
    code, results = bench(tmp_path / "err", command)
    assert code == 1
    run = results["runs"][0]
    assert run["completed"] == 0 and run["errors"] == run["requests"] > 0
    assert list(run["errors_by_code"]) == ["404 NotFoundError"]
    assert run["slo_attainment"] == 0.0 and run["goodput_tokens_per_s"] == 0.0
    assert (tmp_path / "err" / "report.html").exists()


def test_through_the_gateway_class_header_is_sent(engine, procs, tmp_path):
    gateway = start_gateway(tmp_path, {"pools": {"interactive": {"engines": [engine.url]}}})
    procs.append(gateway)
    gateway.wait_ready("/ready")
    command = f"--url {gateway.url} --concurrency 2 --duration 0.5 --output-len 8"
    code, results = bench(tmp_path / "ok", command + " --x-priority interactive")
    assert code == 0 and results["runs"][0]["errors"] == 0
    code, results = bench(tmp_path / "bad", command + " --x-priority urgent --stop-after-errors 0")
    assert code == 1
    assert list(results["runs"][0]["errors_by_code"]) == ["400 invalid_priority"]


def test_refusals_are_waited_out_and_reported_apart_from_errors(engine, procs, tmp_path):
    # One slot for four clients: the gateway refuses the rest with 429 and Retry-After.
    config = {
        "pools": {"interactive": {"engines": [engine.url]}},
        "admission": {"initial_limit": 1, "max_limit": 1},
    }
    gateway = start_gateway(tmp_path, config)
    procs.append(gateway)
    gateway.wait_ready("/ready")
    command = f"--url {gateway.url} --concurrency 4 --duration 3 --output-len 150 --x-priority interactive"
    code, results = bench(tmp_path / "refused", command)
    assert code == 0
    run = results["runs"][0]
    assert run["errors"] == 0 and run["errors_by_code"] == {}
    assert run["completed"] >= 2
    assert set(run["refused_by_code"]) == {"429 slo_budget_exceeded"}
    # Each refused client waits at least the second Retry-After asks before it sends again.
    assert 0 < run["refused"] == run["refused_by_code"]["429 slo_budget_exceeded"] <= 3 * 4
    assert run["requests"] == run["completed"] + run["refused"]
    page = (tmp_path / "refused" / "report.html").read_text()
    assert "Refused" in page and "slo_budget_exceeded" in page


async def test_ramp_up_spreads_client_starts(engine):
    client = EngineClient(engine.url)
    try:
        target = loadgen.Target(client, "sim-model")
        samples = await loadgen.closed_loop(target, SyntheticWorkload(100, 4, tag="ramp"), 3, 0.3, ramp_up=0.6)
    finally:
        client.close()
    starts = sorted(s.sent for s in samples if s.warmup)
    assert len(starts) == 3
    assert all(later - earlier >= 0.15 for earlier, later in itertools.pairwise(starts))
    measured = [s for s in samples if s.measured]
    assert measured and all(not s.warmup and s.error is None for s in measured)


@pytest.mark.parametrize(
    "mode",
    [
        "--concurrency 4 --duration 60",
        "--trace benchmarks/traces/mooncake/conversation_trace.jsonl --duration 600 --rate-scale 20",
    ],
)
def test_a_run_of_identical_client_errors_stops_the_bench_and_says_why(engine, tmp_path, mode):
    with pytest.raises(SystemExit) as stopped:
        main(["bench", "--out", str(tmp_path), "--url", engine.url, "--model", "no-such-model", *mode.split()])
    message = str(stopped.value)
    assert message.startswith("gateway bench: stopped: 50 requests in a row answered 404"), message
    assert "does not exist" in message and "check --model" in message
    assert len(message.splitlines()) == 1
