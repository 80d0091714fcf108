"""What the device runs measured, side by side, and what the simulator predicts for the same work.

Reads the folders the harness's archives unpack to (``res/``, one per sitting on the device, in the
order given) and writes, under ``--out``:

- ``routing.json`` / ``routing.png``: per workload and front, each request's cached tokens as the
  engine reported them (token-weighted and per-request), the engines' own counters beside them,
  TTFT p50/p99, ITL p99, output tokens/s, and how evenly prompt tokens spread over the engines;
  every run, the median over a front's runs, and the gateway's prefix policy over each other front
  (of the medians, and within each sitting, where the runs were measured side by side).
- ``admission.json`` / ``admission.png``: interactive traffic beside a batch flood, two pools with
  admission against one shared FCFS pool.
- ``relay.json``: TTFT p50 through each front at concurrency 1 and 64, and what it adds to direct,
  before one engine and (``engines_4``) before four.
- ``calibration.json`` / ``calibration.png``: the single-engine phases and the step-time fit
  (``vllm_calibration.fit_report``) that ``engines/sim/profiles/h200-7b-bf16.yaml`` holds.
- ``mixed_steps.json`` / ``mixed_steps.png`` (with ``--mixed``, the sitting of ``--plan mixed``):
  steps that mix a prefill with decodes and the decode tail, and the fit of the profile's step
  terms to them (``fit_mixed.py``) that ``h200-7b-bf16`` holds.
- ``sim_vs_real.json`` / ``sim_vs_real.png``: the predictions for the same workloads (single-engine
  closed loops; the routing runs through ``gateway sim``'s cluster with the device's four engines on
  one GPU, and with a GPU each) of the profile fitted to isolated parts only
  (``h200-7b-bf16-isolated.yaml``) and of ``h200-7b-bf16``, side by side, against the measurements,
  with the bounds of the check.
- ``raw/``: every run's ``gateway bench`` results and the commands that made them.

    .venv/bin/python benchmarks/gpu/analyze.py --res /tmp/gpures/s1/res --res /tmp/gpures/s2/res \
        --mixed /tmp/gpures/s3/res --out benchmarks/results/gpu
    .venv/bin/python benchmarks/gpu/analyze.py --sim-only   # the simulator check again, from the committed summaries
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import fit_mixed  # noqa: E402
import numpy as np  # noqa: E402
import vllm_calibration as vc  # noqa: E402

from priority_gateway.bench import envelope  # noqa: E402
from priority_gateway.core.classes import INTERACTIVE, Budget  # noqa: E402
from priority_gateway.engines.sim.profile import Profile, load_profile  # noqa: E402
from priority_gateway.engines.sim.sweep import run_level  # noqa: E402
from priority_gateway.simulate.cluster import Cluster, ClusterSetup, PoolSetup  # noqa: E402
from priority_gateway.simulate.traces import load_trace, scale_blocks  # noqa: E402

PROFILE = "h200-7b-bf16"
# The profile as fitted to isolated prefills and decodes only, before the mixed-step fit: the baseline.
ISOLATED = ROOT / "benchmarks/results/gpu/h200-7b-bf16-isolated.yaml"
ENGINES = 4
BOUNDS = {"ttft_p50_ms": 0.15, "output_tokens_per_s": 0.15, "itl_p99_ms": 0.25}
FRONTS = {
    "ours-prefix": "gateway, prefix",
    "ours-rr": "gateway, round_robin",
    "vllmr-ca": "vllm-router cache_aware (defaults)",
    "vllmr-ca-tuned": "vllm-router cache_aware (tuned)",
    "vllmr-rr": "vllm-router round_robin",
}
SHORT = {
    "ours-prefix": "gateway\nprefix",
    "ours-rr": "gateway\nround robin",
    "vllmr-ca": "router\ncache_aware",
    "vllmr-ca-tuned": "router\nc_a tuned",
    "vllmr-rr": "router\nround robin",
}
KEYS = (
    "requests",
    "completed",
    "errors",
    "cached_token_ratio",
    "request_cached_ratio_mean",
    "request_cached_ratio_p50",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "output_tokens_per_s",
    "output_tokens",
    "window_s",
    "slo_attainment",
)


def counters(path: Path) -> dict[str, float]:
    """Sums of each metric's samples in a Prometheus text page."""
    out: dict[str, float] = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? ([0-9.e+-]+)$", line.strip())
        if match:
            out[match.group(1)] = out.get(match.group(1), 0.0) + float(match.group(3))
    return out


def engine_deltas(folder: Path) -> dict[str, Any]:
    hits = queries = 0.0
    prompt_tokens = []
    for i in range(1, ENGINES + 1):
        before, after = folder / f"metrics-before-engine{i}.txt", folder / f"metrics-after-engine{i}.txt"
        if not (before.exists() and after.exists()):
            return {}
        b, a = counters(before), counters(after)
        hits += a.get("vllm:prefix_cache_hits_total", 0) - b.get("vllm:prefix_cache_hits_total", 0)
        queries += a.get("vllm:prefix_cache_queries_total", 0) - b.get("vllm:prefix_cache_queries_total", 0)
        prompt_tokens.append(a.get("vllm:prompt_tokens_total", 0) - b.get("vllm:prompt_tokens_total", 0))
    mean = statistics.fmean(prompt_tokens)
    return {
        "engine_hit_ratio": round(hits / queries, 4) if queries else None,
        "engine_prefix_queries": int(queries),
        "prompt_tokens_by_engine": [int(x) for x in prompt_tokens],
        "prompt_token_imbalance": round(max(prompt_tokens) / mean, 3) if mean else None,
    }


def bench_row(results: dict) -> dict[str, Any]:
    run = (results.get("runs") or [{}])[0]
    return {key: run.get(key) for key in KEYS}


# -- routing ----------------------------------------------------------------------------------------


RUN_NUMBER = {"": 1, "-repeat": 2, "-third": 3}
MEDIAN_KEYS = ("cached_token_ratio", "ttft_p50_ms", "ttft_p99_ms", "itl_p99_ms", "output_tokens_per_s")


def routing(sittings: list[Path], raw: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for sitting, res in enumerate(sittings, 1):
        for folder in sorted(res.glob("route-*")):
            # route-<workload>[-repeat|-third]-<front>: a front's first, second or third run
            match = re.match(r"route-(hot|mooncake)(-repeat|-third)?-(.+)$", folder.name)
            if not match or not (folder / "results.json").exists():
                continue
            workload, nth, front = match.group(1), RUN_NUMBER[match.group(2) or ""], match.group(3)
            results = json.loads((folder / "results.json").read_text())
            shutil.copy(folder / "results.json", raw / f"{folder.name}.json")
            row = {"front": front, "label": FRONTS.get(front, front), "sitting": sitting, "run": nth}
            row |= {"started": results.get("started"), **bench_row(results), **engine_deltas(folder)}
            row["command"] = results.get("command")
            row["front_command"] = (folder / "front.cmd").read_text().strip()
            out.setdefault(workload, {"runs": []})["runs"].append(row)
    for data in out.values():
        by_front: dict[str, Any] = {}
        for front in FRONTS:
            runs = sorted((r for r in data["runs"] if r["front"] == front), key=lambda r: r["run"])
            if runs:
                by_front[front] = {key: round(statistics.median(r[key] for r in runs), 4) for key in MEDIAN_KEYS}
                by_front[front]["runs"] = len(runs)
                by_front[front]["each_run"] = {key: [r[key] for r in runs] for key in MEDIAN_KEYS}
        data["median_by_front"] = by_front
        ours = by_front.get("ours-prefix")
        if ours:
            data["ours_prefix_over"] = {
                front: {key: round(ours[key] / other[key], 3) for key in MEDIAN_KEYS}
                for front, other in by_front.items()
                if front != "ours-prefix"
            }
        if "vllmr-ca" in data.get("ours_prefix_over", {}):
            data["ours_over_cache_aware_defaults"] = data["ours_prefix_over"]["vllmr-ca"]
        data["ours_prefix_over_by_sitting"] = ratios_by_sitting(data["runs"])
    return out


def ratios_by_sitting(runs: list[dict]) -> dict[str, Any]:
    """The gateway's prefix policy over each other front, among the runs of one sitting only."""
    out: dict[str, Any] = {}
    for sitting in sorted({r["sitting"] for r in runs}):
        mine = [r for r in runs if r["sitting"] == sitting]
        ours = [r for r in mine if r["front"] == "ours-prefix"]
        if not ours:
            continue
        for front in FRONTS:
            others = [r for r in mine if r["front"] == front]
            if front == "ours-prefix" or not others:
                continue
            out.setdefault(f"sitting {sitting}", {})[front] = {
                key: round(statistics.median(r[key] for r in ours) / statistics.median(r[key] for r in others), 3)
                for key in MEDIAN_KEYS
            }
    return out


# -- admission and relay -----------------------------------------------------------------------------


def admission(res: Path, raw: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in ("pools", "shared"):
        folder = res / f"admission-{mode}"
        if not (folder / "interactive" / "results.json").exists():
            continue
        inter = json.loads((folder / "interactive" / "results.json").read_text())
        batch = json.loads((folder / "batch" / "results.json").read_text())
        shutil.copy(folder / "interactive" / "results.json", raw / f"admission-{mode}-interactive.json")
        shutil.copy(folder / "batch" / "results.json", raw / f"admission-{mode}-batch.json")
        run = inter["runs"][0]
        rejected = run["errors_by_code"].get("429 slo_budget_exceeded", 0)
        out[mode] = {
            "gateway_config": json.loads((folder / "gateway.json").read_text()),
            "interactive": {**bench_row(inter), "rejected_429": rejected, "budget": inter["budget"]},
            "interactive_command": inter["command"],
            "batch": bench_row(batch),
            "batch_command": batch["command"],
        }
        inter_row = out[mode]["interactive"]
        inter_row["within_budget"] = bool(
            (inter_row["ttft_p99_ms"] or 0) <= inter["budget"]["ttft_p99_ms"]
            and (inter_row["itl_p99_ms"] or 0) <= inter["budget"]["itl_p99_ms"]
        )
    return out


RELAY_KEYS = ("completed", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms")


def relay_levels(path: Path, copy_to: Path) -> dict[str, Any] | None:
    """One front's ``gateway bench`` closed loop: each concurrency level's figures and the command."""
    if not path.exists():
        return None
    results = json.loads(path.read_text())
    shutil.copy(path, copy_to)
    out: dict[str, Any] = {str(run["concurrency"]): {k: run[k] for k in RELAY_KEYS} for run in results["runs"]}
    out["command"] = results["command"]
    return out


def relay(res: Path, raw: Path, tag: str = "") -> dict[str, Any]:
    """Each front before one engine; ``tag`` keeps a later sitting's raw copies apart (``relay-s2-*``)."""
    out: dict[str, Any] = {}
    for front in ("direct", "ours-prefix", "vllmr-rr"):
        if levels := relay_levels(res / f"relay-{front}" / "results.json", raw / f"relay-{tag}{front}.json"):
            out[front] = levels
    if "direct" in out:
        for front in ("ours-prefix", "vllmr-rr"):
            if front in out:
                out[front]["added_ttft_p50_ms"] = {
                    c: round(out[front][c]["ttft_p50_ms"] - out["direct"][c]["ttft_p50_ms"], 2) for c in ("1", "64")
                }
    return out


def relay_engines(res: Path, raw: Path, engines: int = 4) -> dict[str, Any]:
    """Relay overhead before several engines: direct is one client per engine at 64 / engines (the
    c=64 figure is the median of their p50s) and runs first and again last."""
    out: dict[str, Any] = {}
    for front in ("direct", "ours-prefix", "vllmr-rr", "direct-again"):
        folder = res / f"relay{engines}-{front}"
        if front.startswith("direct"):
            if not (folder / "c1" / "results.json").exists():
                continue
            one = json.loads((folder / "c1" / "results.json").read_text())
            shutil.copy(folder / "c1" / "results.json", raw / f"relay{engines}-{front}-c1.json")
            parts = []
            for i in range(1, engines + 1):
                path = folder / f"c64-engine{i}" / "results.json"
                if path.exists():
                    parts.append(json.loads(path.read_text()))
                    shutil.copy(path, raw / f"relay{engines}-{front}-c64-engine{i}.json")
            out[front] = {"1": {k: one["runs"][0][k] for k in RELAY_KEYS}}
            if len(parts) == engines:
                each = [p["runs"][0] for p in parts]
                out[front]["64"] = {
                    "completed": sum(r["completed"] for r in each),
                    **{k: round(statistics.median(r[k] for r in each), 2) for k in RELAY_KEYS[1:]},
                    "ttft_p50_ms_by_engine": [r["ttft_p50_ms"] for r in each],
                }
            out[front]["command"] = [one["command"], *(p["command"] for p in parts)]
        elif levels := relay_levels(folder / "results.json", raw / f"relay{engines}-{front}.json"):
            out[front] = levels
    directs = [out[f] for f in ("direct", "direct-again") if f in out]
    for front in ("ours-prefix", "vllmr-rr"):
        if front not in out or not directs:
            continue
        added = {}
        for c in ("1", "64"):
            base = [d[c]["ttft_p50_ms"] for d in directs if c in d]
            if c in out[front] and base:
                added[c] = round(out[front][c]["ttft_p50_ms"] - statistics.fmean(base), 2)
        out[front]["added_ttft_p50_ms_vs_mean_direct"] = added
    return out


# -- calibration and the simulator -------------------------------------------------------------------


def calibration(res: Path) -> dict[str, Any]:
    raw = json.loads((res / "calibration" / "calibration.json").read_text())
    raw["engine"] = {"vllm": raw.get("vllm"), "argv": (res / "engines" / "engine1.cmd").read_text().split()[3:]}
    raw["machine"] = {"cpu": "one NVIDIA H200, 4 engines on it, 3 idle while measuring"}
    raw["fit"] = vc.fit_report(raw)
    raw["fit_overlap"] = fit_overlap(raw)
    return raw


def fit_overlap(raw: dict, weights_ms: float = 3.2) -> dict[str, Any]:
    """The profile's step model on a GPU in eager mode: ``max(host, device)``, where the device part
    is ``max(weights_ms, a*prefill_tokens + q*prefill_pairs)``, plus the API server's per-request
    costs for a TTFT. Piecewise linear: each point is host- or device-bound; least squares on
    relative error for a guess of which, then again until the guess holds."""
    points = [(True, r["median_ms"], n, n * n / 2, n) for r in raw["ttft_vs_prompt"] for n in [r["prompt_tokens"]]]
    points += [(False, r["median_ms"], 0, 0.0, 0) for r in raw["itl_vs_decode_seqs"]]
    warm = [(r["prompt_tokens"], max(r["cached_tokens"]), r["median_ms"]) for r in raw["warm_ttft_vs_cached"]]
    cold = raw["warm_vs_cold"]
    warm.append((cold["prompt_tokens"], max(cold["warm_cached_tokens"]), cold["warm_median_ms"]))
    points += [(True, ms, n - c, (n - c) * (c + (n - c) / 2), n) for n, c, ms in warm]
    terms = ("host_ms", "prefill_ms_per_token", "prefill_ms_per_pair", "request_ms", "request_ms_per_prompt_token")
    device_bound = [p[2] >= 2048 for p in points]
    coef = dict.fromkeys(terms, 0.0)
    for _ in range(20):
        x = np.array([
            [0.0 if dev else 1.0, n if dev else 0.0, pairs if dev else 0.0, float(ttft), prompt if ttft else 0.0]
            for (ttft, _, n, pairs, prompt), dev in zip(points, device_bound, strict=True)
        ])  # fmt: skip
        y = np.array([p[1] for p in points])
        coef = fit_mixed.relative_lstsq(x, y, terms, list(range(len(terms))))
        guess = [
            max(weights_ms, coef["prefill_ms_per_token"] * n + coef["prefill_ms_per_pair"] * pairs) > coef["host_ms"]
            for _, _, n, pairs, _ in points
        ]
        if guess == device_bound:
            break
        device_bound = guess
    errors = []
    for ttft, ms, n, pairs, prompt in points:
        device = max(weights_ms, coef["prefill_ms_per_token"] * n + coef["prefill_ms_per_pair"] * pairs)
        predicted = (
            max(coef["host_ms"], device) + (coef["request_ms"] + coef["request_ms_per_prompt_token"] * prompt) * ttft
        )
        errors.append(abs(predicted - ms) / ms)
    timing = {
        "overhead_ms": round(coef["host_ms"], 3),
        "weights_ms": weights_ms,
        "prefill_ms_per_token": round(coef["prefill_ms_per_token"], 6),
        "prefill_attention_ms_per_mpair": round(coef["prefill_ms_per_pair"] * 1e6, 4),
        "request_overhead_ms": round(coef["request_ms"], 3),
        "request_ms_per_prompt_token": round(coef["request_ms_per_prompt_token"], 6),
        "host_overlaps_device": True,
    }
    return {
        "model": "step = max(host, weights, a*prefill + q*pairs); ttft += request + r*prompt_tokens",
        "profile_timing": timing,
        "median_relative_error": round(statistics.median(errors), 3),
        "max_relative_error": round(max(errors), 3),
    }


def _within(real: float, sim: float, bound: float) -> bool:
    return abs(sim - real) <= bound * abs(real)


def _compare(real: dict[str, float], sim: dict[str, float]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for key, bound in BOUNDS.items():
        if real.get(key) is None or sim.get(key) is None:
            continue
        row[key] = {
            "real": real[key],
            "simulated": round(sim[key], 2),
            "sim_over_real": round(sim[key] / real[key], 3),
            "within": _within(real[key], sim[key], bound),
            "bound": bound,
        }
    return row


def simulate_trace(kind: str, policy: str, engines_per_device: int, profile: Profile) -> dict[str, float]:
    """The routing workload through the gateway's core and simulated engines, in virtual time."""
    if kind == "hot":
        spec = "hot:rate=6,prompts=128,prompt_len=1536,user_len=256,output=64,zipf=1.1,minutes=1"
        trace = load_trace(Path(spec), INTERACTIVE)
    else:
        trace = load_trace(ROOT / "benchmarks/traces/mooncake/conversation_trace.jsonl", INTERACTIVE, minutes=2.0)
        trace = scale_blocks([r for r in trace if r.arrival / 1.6 < 75.0], 128)
        for r in trace:
            r.arrival /= 1.6
    setup = ClusterSetup(
        [PoolSetup(INTERACTIVE, ENGINES, profile)],
        policy=policy,
        budgets={INTERACTIVE: Budget(None, None)},
        engines_per_device=engines_per_device,
    )
    setup.admission.enabled = False
    outcome = Cluster(setup).run(trace)
    records = list(outcome["records"].values())
    done = [r for r in records if r.done is not None and r.first is not None]
    ttft = [(r.first - r.req.arrival) * 1000 for r in done]
    gaps = [g * 1000 for r in done for g in r.gaps]
    span = max(r.done for r in done) - min(r.req.arrival for r in records)
    return {
        "ttft_p50_ms": vc.percentile(ttft, 50),
        "ttft_p99_ms": vc.percentile(ttft, 99),
        "itl_p99_ms": vc.percentile(gaps, 99),
        "output_tokens_per_s": sum(r.output_tokens for r in done) / span,
        "cached_token_ratio": sum(r.cached_tokens for r in done) / sum(r.trace.input_len for r in done),
    }


def closed_loops(calib: dict, mixed_res: Path | None) -> dict[str, list[dict]]:
    """The single-engine closed loops measured, by where: the first sitting's (three more engines idle
    on the GPU) and, with the mixed sitting, its single-engine phases' and its held-out levels (one
    engine alone)."""
    loops = {"1 engine": calib["closed_loop"]}
    if mixed_res is not None:
        alone = mixed_res / "calibration"
        if (alone / "calibration.json").exists():
            loops["1 engine alone"] = json.loads((alone / "calibration.json").read_text())["closed_loop"]
        if (alone / "mixed.json").exists():
            loops["1 engine alone, held out"] = json.loads((alone / "mixed.json").read_text())["closed_loop"]
    return loops


def committed_closed_loops(calib: dict, out: Path) -> dict[str, list[dict]]:
    """``closed_loops`` from what an earlier run committed under ``out/raw`` (the mixed sitting's single-engine
    phases and held-out levels), for ``--sim-only`` without the sitting's folder."""
    loops = {"1 engine": calib["closed_loop"]}
    for where, name in (("1 engine alone", "calibration-alone.json"), ("1 engine alone, held out", "mixed.json")):
        path = out / "raw" / name
        if path.exists():
            loops[where] = json.loads(path.read_text())["closed_loop"]
    return loops


def sim_vs_real(loops: dict[str, list[dict]], routing_data: dict, profiles: dict[str, Profile]) -> dict[str, Any]:
    """Each workload the device ran, simulated with each profile (``isolated``: fitted to isolated
    prefills and decodes; ``mixed``: to steps that mix them, with the step tail), side by side."""
    out: dict[str, Any] = {
        "profiles": {label: p.name for label, p in profiles.items()},
        "bounds": BOUNDS,
        "single_engine_closed_loop": {},
        "routing": {},
    }
    for where, rows in loops.items():
        for row in rows:
            real = {
                "ttft_p50_ms": row["ttft_p50_ms"],
                "itl_p99_ms": row["itl_p99_ms"],
                "output_tokens_per_s": row["output_tok_s"],
            }
            entry = out["single_engine_closed_loop"].setdefault(f"{where}, c={row['concurrency']}", {})
            for label, profile in profiles.items():
                entry[label] = _compare(real, run_level(profile, row["concurrency"], 1000, 64, spread=0.0))
    compared = (
        ("hot", "ours-prefix", "prefix"),
        ("hot", "ours-rr", "round_robin"),
        ("mooncake", "ours-prefix", "prefix"),
        ("mooncake", "ours-rr", "round_robin"),
    )
    for kind, front, policy in compared:
        measured = routing_data.get(kind, {}).get("median_by_front", {}).get(front)
        if not measured:
            continue
        for per_device, where in ((ENGINES, "one GPU shared by 4 engines"), (1, "a GPU per engine")):
            entry = out["routing"].setdefault(f"{kind} {front}", {}).setdefault(where, {})
            for label, profile in profiles.items():
                sim = simulate_trace(kind, policy, per_device, profile)
                entry[label] = _compare(measured, sim)
                entry[label]["cached_token_ratio"] = {
                    "real": measured["cached_token_ratio"],
                    "simulated": round(sim["cached_token_ratio"], 4),
                }
    return out


# -- plots ------------------------------------------------------------------------------------------


def plot_routing(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = (("cached_token_ratio", "cached tokens / prompt tokens"), ("ttft_p50_ms", "TTFT p50 (ms)"))
    metrics += (("ttft_p99_ms", "TTFT p99 (ms)"), ("itl_p99_ms", "ITL p99 (ms)"))
    workloads = [w for w in ("hot", "mooncake") if w in data]
    fig, axes = plt.subplots(len(workloads), len(metrics), figsize=(18, 4.2 * len(workloads)), squeeze=False)
    for i, workload in enumerate(workloads):
        fronts = [f for f in FRONTS if f in data[workload]["median_by_front"]]
        for j, (key, title) in enumerate(metrics):
            ax = axes[i][j]
            medians = [data[workload]["median_by_front"][f][key] for f in fronts]
            ax.bar(
                range(len(fronts)), medians, color=["tab:green" if f.startswith("ours") else "tab:gray" for f in fronts]
            )
            for k, front in enumerate(fronts):
                values = [r[key] for r in data[workload]["runs"] if r["front"] == front]
                ax.plot([k] * len(values), values, "k.", ms=6)
            ax.set_xticks(range(len(fronts)), [SHORT[f] for f in fronts])
            ax.tick_params(axis="x", labelsize=7)
            ax.set_title(f"{workload}: {title}", fontsize=10)
    fig.suptitle("4 real vLLM 0.26 engines (7B shape, dummy weights) on one H200: bars median, dots runs", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def plot_admission(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in ("pools", "shared") if m in data]
    labels = {"pools": "two pools + admission", "shared": "one shared FCFS pool"}
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    panels = (
        ("TTFT p99 (ms)", lambda m: data[m]["interactive"]["ttft_p99_ms"], "ttft_p99_ms"),
        ("ITL p99 (ms)", lambda m: data[m]["interactive"]["itl_p99_ms"], "itl_p99_ms"),
        (
            "interactive refused (429), %",
            lambda m: 100 * data[m]["interactive"]["rejected_429"] / data[m]["interactive"]["requests"],
            None,
        ),
        ("batch output tok/s", lambda m: data[m]["batch"]["output_tokens_per_s"], None),
    )
    for ax, (title, value, budget) in zip(axes, panels, strict=True):
        ax.bar([labels[m] for m in modes], [value(m) for m in modes], color=["tab:green", "tab:gray"][: len(modes)])
        if budget:
            ax.axhline(data[modes[0]]["interactive"]["budget"][budget], color="r", ls="--", label="budget")
            ax.legend(fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle("Interactive Poisson traffic beside a batch flood (192 streams), 4 engines on one H200", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def plot_sim(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: list[tuple[str, dict]] = list(data["single_engine_closed_loop"].items())
    rows += [(f"{name}\n({where})", v) for name, by in data["routing"].items() for where, v in by.items()]
    labels = list(data["profiles"])
    height = 0.8 / len(labels)
    fig, axes = plt.subplots(1, len(BOUNDS), figsize=(17, 0.6 * len(rows) + 2.5), sharey=True)
    for ax, (key, bound) in zip(axes, BOUNDS.items(), strict=True):
        for k, (label, hatch) in enumerate(zip(labels, ("//", ""), strict=False)):
            ratios = [v[label].get(key, {}).get("sim_over_real", float("nan")) for _, v in rows]
            colors = ["tab:green" if v[label].get(key, {}).get("within") else "tab:red" for _, v in rows]
            ys = [i + (k - (len(labels) - 1) / 2) * height for i in range(len(rows))]
            ax.barh(ys, ratios, height=height, color=colors, hatch=hatch, edgecolor="k", lw=0.3, label=label)
        ax.axvspan(1 - bound, 1 + bound, color="tab:green", alpha=0.15)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_title(f"{key}: simulated / real (band ±{bound:.0%})", fontsize=10)
        ax.set_yticks(range(len(rows)), [name for name, _ in rows], fontsize=7)
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor="white", edgecolor="k", hatch=h, label=label)
        for label, h in zip(labels, ("//", ""), strict=False)
    ]
    handles += [Patch(color="tab:green", label="within the band"), Patch(color="tab:red", label="outside")]
    axes[0].legend(handles=handles, fontsize=8, loc="lower right")
    fig.suptitle(f"Simulator against the device: {', '.join(data['profiles'].values())}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--res", type=Path, action="append", default=[], help="an unpacked res/ folder, once per sitting")
    p.add_argument("--mixed", type=Path, default=None, help="the res/ folder of the mixed sitting (--plan mixed)")
    p.add_argument(
        "--sim-only",
        action="store_true",
        help="no --res: the simulator check against the committed routing.json and calibration.json in --out",
    )
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/gpu")
    args = p.parse_args()
    provenance = envelope.start()
    if args.sim_only:
        route = json.loads((args.out / "routing.json").read_text())
        calib = json.loads((args.out / "calibration.json").read_text())
    elif args.res:
        route, calib = summarize(args.res, args.out, provenance)
    else:
        p.error("give --res (once per sitting) or --sim-only")
    if args.mixed is not None:
        mixed_steps(args.mixed, args.out, provenance)
    profiles = {"isolated": load_profile(str(ISOLATED)), "mixed": load_profile(PROFILE)}
    loops = (
        committed_closed_loops(calib, args.out)
        if args.sim_only and args.mixed is None
        else closed_loops(calib, args.mixed)
    )
    sim = sim_vs_real(loops, route, profiles)
    (args.out / "sim_vs_real.json").write_text(json.dumps(provenance.wrap(sim), indent=1) + "\n")
    plot_sim(sim, args.out / "sim_vs_real.png")
    print(f"wrote {args.out / 'sim_vs_real'}.json", file=sys.stderr)


def mixed_steps(res: Path, out: Path, provenance: envelope.Envelope) -> None:
    """The mixed sitting: its raw data, the fit of the profile's step terms to it, and a plot."""
    folder = res / "calibration"
    mixed = json.loads((folder / "mixed.json").read_text())
    single = json.loads((folder / "calibration.json").read_text()) if (folder / "calibration.json").exists() else None
    fitted = fit_mixed.fit(mixed, single)
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "mixed.json").write_text(json.dumps(slim_metrics(mixed), separators=(",", ":")) + "\n")
    if single is not None:
        shutil.copy(folder / "calibration.json", raw / "calibration-alone.json")
    record = {"engine": (res / "engines" / "engine1.cmd").read_text().strip(), "fit": fitted}
    (out / "mixed_steps.json").write_text(json.dumps(provenance.wrap(record), indent=1) + "\n")
    fit_mixed.plot(mixed, fitted, out / "mixed_steps.png")
    print(f"wrote {out / 'mixed_steps'}.json", file=sys.stderr)


def slim_metrics(mixed: dict) -> dict:
    """``mixed.json`` with only the metric samples that changed between a level's scrapes (or the
    phase's), and no ``_created`` timestamps: what a delta needs."""

    def changed(scrapes: list[dict[str, float]]) -> list[dict[str, float]]:
        keys = {k for scrape in scrapes for k in scrape if "_created" not in k}
        keep = {k for k in keys if len({scrape.get(k) for scrape in scrapes}) > 1}
        return [{k: v for k, v in scrape.items() if k in keep} for scrape in scrapes]

    out = dict(mixed)
    out["metrics_before"], out["metrics_after"] = changed([mixed["metrics_before"], mixed["metrics_after"]])
    out["levels"] = []
    for level in mixed["levels"]:
        names = list(level["metrics"])
        slim = changed([level["metrics"][n] for n in names])
        out["levels"].append({**level, "metrics": dict(zip(names, slim, strict=True))})
    return out


def summarize(sittings: list[Path], out: Path, provenance: envelope.Envelope) -> tuple[dict, dict]:
    """Routing, admission, relay and calibration of the sittings; returns routing and calibration (whose
    envelope is the device's measurement's, ``calibrate.py``'s)."""
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    route = routing(sittings, raw)
    (out / "routing.json").write_text(json.dumps(provenance.wrap(route), indent=1) + "\n")
    plot_routing(route, out / "routing.png")
    first = sittings[0]  # admission and calibration ran in the first sitting
    adm = admission(first, raw)
    (out / "admission.json").write_text(json.dumps(provenance.wrap(adm), indent=1) + "\n")
    plot_admission(adm, out / "admission.png")
    relays: dict[str, Any] = {"one_engine": {}}
    for sitting, res in enumerate(sittings, 1):
        if one := relay(res, raw, "" if sitting == 1 else f"s{sitting}-"):
            relays["one_engine"][f"sitting {sitting}"] = one
        if more := relay_engines(res, raw):
            relays["engines_4"] = {"sitting": sitting, **more}
    (out / "relay.json").write_text(json.dumps(provenance.wrap(relays), indent=1) + "\n")
    calib = calibration(first)
    (out / "calibration.json").write_text(json.dumps(calib, indent=1) + "\n")
    vc.plot(calib, calib["fit"], out / "calibration.png")
    commands = {
        "engine": (first / "engines" / "engine1.cmd").read_text().strip(),
        "plan_log": [
            (res / "plan.log").read_text().splitlines() if (res / "plan.log").exists() else [] for res in sittings
        ],
    }
    (raw / "commands.json").write_text(json.dumps(commands, indent=1) + "\n")
    for name in ("routing", "admission", "relay", "calibration"):
        print(f"wrote {out / name}.json", file=sys.stderr)
    return route, calib


if __name__ == "__main__":
    main()
