"""``benchmarks/gpu/budgets.py`` (one front at rising open-loop rates) and ``budgets_sim.py`` (the same
scene in ``gateway sim``, compared): the device and the simulator replay the same requests, each level's
figures judge every request on both budgets, and a small sweep through a real gateway in front of a
simulated engine comes out side by side with its virtual-time twin."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from priority_gateway.bench.loadgen import Sample
from tests.support.procs import ROOT, start_engine, start_gateway

GPU = ROOT / "benchmarks" / "gpu"
TRACES = ROOT / "benchmarks" / "traces"


@pytest.fixture
def budgets(monkeypatch):
    monkeypatch.syspath_prepend(str(GPU))
    import budgets

    return budgets


def test_the_device_and_the_simulator_replay_the_same_requests(budgets):
    poisson = budgets.scene_requests("poisson", 12.0, 60.0, seed=3)
    again = budgets.scene_requests("poisson", 12.0, 60.0, seed=3)
    assert [(r.arrival, r.input_len, r.output_len) for r in poisson] == [
        (r.arrival, r.input_len, r.output_len) for r in again
    ]
    assert 600 < len(poisson) < 840  # 12/s for a minute, give or take Poisson's spread
    assert all(768 <= r.input_len <= 1280 and 96 <= r.output_len <= 160 for r in poisson)
    assert len({r.hash_ids[0] for r in poisson}) == len(poisson)  # every prompt its own
    bursty = budgets.scene_requests("bursty", 12.0, 20.0, traces=TRACES)
    assert len(bursty) == 240 and bursty[0].arrival == 0.0
    assert all(0.0 <= a.arrival <= b.arrival < 20.0 for a, b in itertools.pairwise(bursty))
    # Squeezed from the Azure trace, its bursts stay: some second holds far more than the mean.
    per_second = [sum(1 for r in bursty if s <= r.arrival < s + 1) for s in range(20)]
    assert max(per_second) >= 2 * 12


def sample(ttft: float, gaps: list[float], refused: str | None = None, error: str | None = None) -> Sample:
    s = Sample("r", 0.0)
    if refused is not None:
        s.refused, s.done = refused, 0.001
        return s
    t = ttft
    s.chunks = [t]
    for g in gaps:
        t += g
        s.chunks.append(t)
    s.done, s.error = t, error
    return s


def test_figures_count_refusals_apart_and_judge_each_request_on_both_budgets(budgets):
    fast = [0.02] * 99
    samples = [
        sample(0.1, fast),  # meets both
        sample(0.6, fast),  # first token late
        sample(0.1, [*[0.02] * 90, *[0.2] * 9]),  # its own gaps' p99 over 50 ms
        sample(0.1, fast, error="500 internal_error"),
        sample(0.0, [], refused="429 slo_budget_exceeded"),
    ]
    figures = budgets.level_figures(samples, arrival_window_s=2.0)
    assert (figures["offered"], figures["admitted"], figures["refused"]) == (5, 4, 1)
    assert figures["refused_share"] == 0.2
    assert figures["meeting_budgets"] == 1 and figures["goodput_rps"] == 0.5
    assert figures["attainment_of_admitted"] == 0.25
    assert figures["ttft_p99_ms"] > 500 and not figures["admitted_meet_p99_budgets"]


def test_a_small_sweep_through_a_gateway_and_its_virtual_time_twin(tmp_path):
    """A gateway with its limit pinned at 8 in front of one simulated H200 engine, two levels and a
    warm-up; the analysis and the simulator's replay of the same requests, side by side."""
    engine_flags = ["--profile", "h200-7b-bf16", "--max-num-seqs", "64", "--max-num-batched-tokens", "384"]
    engine = start_engine(tmp_path, *engine_flags, "--enable-prompt-tokens-details", model="llama7b")
    procs = [engine]
    try:
        engine.wait_ready()
        config = {
            "pools": {"interactive": {"engines": [engine.url]}},
            "admission": {"initial_limit": 8, "min_limit": 8, "max_limit": 8},
            "access_log": False,
        }
        gateway = start_gateway(tmp_path, config)
        procs.append(gateway)
        gateway.wait_ready("/ready")
        folder = tmp_path / "res" / "budgets-poisson-cap-8"
        cmd = [sys.executable, str(GPU / "budgets.py"), "sweep", "--url", gateway.url, "--engine", engine.url]
        cmd += ["--front", "cap-8", "--rates", "3,6", "--level-s", "4", "--warmup-rate", "3", "--warmup-s", "2"]
        cmd += ["--input", "256", "--output", "32", "--out", str(folder)]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        for proc in reversed(procs):
            proc.stop()
    # What the harness writes beside each sweep: the front's configuration and the engine's flags.
    (folder / "run.json").write_text(json.dumps({"gateway_config": config}))
    device_args = ["--max-num-seqs=64", "--max-num-batched-tokens=384"]
    (folder / "engines.json").write_text(json.dumps({"engines": [{"device_args": device_args}]}))
    sweep = json.loads((folder / "sweep.json").read_text())
    assert [lv["label"] for lv in sweep["levels"]] == ["warmup", "r=3", "r=6"]
    assert all(lv["started_s"] < lv["ended_s"] for lv in sweep["levels"])
    assert (folder / "timelines-02-6.json.gz").exists() and (folder / "metrics-02-6-after.txt").exists()
    assert sweep["levels"][-1]["limit_last"] == 8  # the gateway's own /metrics, sampled while it ran

    out = tmp_path / "out"
    for script, extra in (("budgets.py", ["analyze"]), ("budgets_sim.py", [])):
        cmd = [sys.executable, str(GPU / script), *extra, "--res", str(tmp_path / "res"), "--out", str(out)]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
    analysis = json.loads((out / "budgets.json").read_text())["by_arrivals"]["poisson"]
    assert analysis["fronts"] == ["cap-8"] and [r["best_static_cap"] for r in analysis["rates"]] == ["cap-8"] * 2
    assert (out / "budgets.png").stat().st_size > 0
    compared = json.loads((out / "sim_vs_gpu.json").read_text())
    assert [r["level"] for r in compared["rows"]] == ["r=3", "r=6"]
    simulated = json.loads((out / "sim.json").read_text())["sweeps"][0]["levels"]
    for device, sim in zip(sweep["levels"], simulated, strict=True):
        assert sim["offered"] == device["offered"]  # the same requests, replayed
    for row in compared["rows"]:
        goodput = row["goodput_rps"]
        assert goodput["gpu"] > 0 and goodput["sim"] > 0
        assert goodput["within_15pct"] == (abs(goodput["sim"] - goodput["gpu"]) <= 0.15 * goodput["gpu"])


def test_bursty_is_burstier_than_poisson(budgets):
    """The point of the second arrival process: at one mean rate, its busiest seconds are busier."""
    seconds = 60.0
    poisson = budgets.scene_requests("poisson", 8.0, seconds)
    bursty = budgets.scene_requests("bursty", 8.0, seconds, traces=TRACES)

    def spread(reqs) -> float:
        counts = [sum(1 for r in reqs if s <= r.arrival < s + 1) for s in range(int(seconds))]
        mean = sum(counts) / len(counts)
        return (sum((c - mean) ** 2 for c in counts) / len(counts)) ** 0.5 / mean**0.5

    assert spread(bursty) > 1.1 * spread(poisson)


def test_a_warm_up_does_not_shift_the_requests_of_the_measured_levels(budgets):
    """Every front meets the same requests at a rate: the gateway's warm-up comes before its levels, and
    the fronts without one must not be offered another draw of arrivals at the same rate."""
    level = budgets.Level
    warm = [level("warmup", 8.0, 20.0, warmup=True), level("r=4", 4.0, 15.0), level("r=8", 8.0, 15.0)]
    cold = warm[1:]
    seeds_warm = [budgets.level_seed(0, i, warm) for i in range(len(warm))]
    seeds_cold = [budgets.level_seed(0, i, cold) for i in range(len(cold))]
    assert seeds_warm[1:] == seeds_cold == [0, 1]
    assert seeds_warm[0] not in seeds_cold
    with_warmup = budgets.scene_requests("poisson", 4.0, 15.0, seed=seeds_warm[1])
    without = budgets.scene_requests("poisson", 4.0, 15.0, seed=seeds_cold[0])
    assert [(r.arrival, r.input_len) for r in with_warmup] == [(r.arrival, r.input_len) for r in without]


def test_every_run_of_the_gateway_is_judged_against_the_best_cap(budgets, tmp_path):
    """A repeat (``ours-admission@2``) is a second run, not a second chance: the ratio is the worse one."""

    def level(rate: float, goodput: float, meets: bool) -> dict:
        return {"label": f"r={rate:g}", "rate": rate, "goodput_rps": goodput, "attainment_of_admitted": 1.0,
                "admitted_meet_p99_budgets": meets}  # fmt: skip

    runs = (("cap-32", 10.0, True), ("ours-admission", 9.8, True), ("ours-admission@2", 9.0, False))
    for front, goodput, meets in runs:
        folder = tmp_path / f"budgets-poisson-{front}"
        folder.mkdir()
        sweep = {"front": front, "arrivals": "poisson", "commit": "x", "levels": [level(8.0, goodput, meets)]}
        (folder / "sweep.json").write_text(json.dumps(sweep))
    summary = budgets.analyze([tmp_path], tmp_path / "out", budgets.envelope.start())
    row = summary["by_arrivals"]["poisson"]["rates"][0]
    assert row["gateway_goodput_over_best_cap_runs"] == {"ours-admission": 0.98, "ours-admission@2": 0.9}
    assert row["gateway_goodput_over_best_cap"] == 0.9 and row["gateway_meets_p99_budgets"] is False


def test_repeats_are_also_compared_median_to_median(budgets, tmp_path):
    """With several runs of each front, the ratio of medians sits beside the strict one (worst run of the
    gateway against the best run of any cap): the best cap is the one whose median run is best."""

    def level(goodput: float) -> dict:
        return {"label": "r=8", "rate": 8.0, "goodput_rps": goodput, "attainment_of_admitted": 1.0,
                "admitted_meet_p99_budgets": True}  # fmt: skip

    runs = {"cap-32": 9.0, "cap-64": 12.0, "cap-64@2": 9.5, "cap-64@3": 10.0, "ours-admission": 9.9,
            "ours-admission@2": 8.0, "ours-admission@3": 10.4}  # fmt: skip
    for front, goodput in runs.items():
        folder = tmp_path / f"budgets-poisson-{front}"
        folder.mkdir()
        sweep = {"front": front, "arrivals": "poisson", "commit": "x", "levels": [level(goodput)]}
        (folder / "sweep.json").write_text(json.dumps(sweep))
    summary = budgets.analyze([tmp_path], tmp_path / "out", budgets.envelope.start())
    row = summary["by_arrivals"]["poisson"]["rates"][0]
    assert row["gateway_goodput_over_best_cap"] == round(8.0 / 12.0, 3)
    assert row["gateway_median_over_best_cap_median"] == 0.99  # 9.9 over cap-64's median 10.0
    assert row["runs"] == {"cap-32": 1, "cap-64": 3, "ours-admission": 3}
    assert summary["by_arrivals"]["poisson"]["gateway_median_over_best_cap_median_min"] == 0.99


def test_a_capacity_measured_before_replaces_the_probe(monkeypatch):
    monkeypatch.syspath_prepend(str(GPU))
    import harness

    probed = harness.dry_setup(1, 0.15, "h200-7b-bf16")
    given = harness.dry_setup(1, 0.15, "h200-7b-bf16")
    given.state.update(capacity_rps=23.0, capacity_source="an H100, before")
    probed_steps = [s.name for s in harness.budgets_again_steps(probed, harness.PAIRS_ORDER)]
    given_steps = [s.name for s in harness.budgets_again_steps(given, harness.PAIRS_ORDER)]
    assert probed_steps[0] == "budgets capacity"
    assert given_steps == probed_steps[1:]
    assert harness.capacity(given) == (23.0, "an H100, before")


def test_every_front_with_admission_warms_up_before_its_measured_levels(monkeypatch):
    """A static cap is the gateway with its limit pinned: it learns the first-token line and margin as the
    learning gateway does, so both get the same warm-up level; a front without admission learns nothing."""
    monkeypatch.syspath_prepend(str(GPU))
    import harness

    setup = harness.dry_setup(1, 1.0, "h200-7b-bf16")
    warm = {front: harness.warmup_s(setup, front) for front in ("ours-admission@2", "cap-64@3", "cap-16", "ours-off")}
    assert warm == {"ours-admission@2": 20.0, "cap-64@3": 20.0, "cap-16": 20.0, "ours-off": 0.0}
    assert harness.budgets_estimate(setup, "poisson", "cap-64") == harness.budgets_estimate(
        setup, "poisson", "ours-admission"
    )
