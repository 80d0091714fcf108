"""Closed-loop concurrency sweep of every engine profile, in virtual time.

For each profile, concurrency 1, 2, 4, 8, 16, 32 (``priority_gateway.engines.sim.sweep``), with the profile's
workload (prompt/output token means, each drawn within +/-25 %):
- ``gemma4-*`` and any other profile: 2048-token prompts, 512 output tokens (the workload the
  gemma4 profiles are fitted on);
- ``tiny-cpu``: 1000-token prompts, 64 output tokens (the reference measurement of real vLLM);
- ``default``: 256-token prompts, 64 output tokens.
``instant`` is left out: its steps take no time, so it has no latency to sweep.

Then the prefix-caching comparison on ``gemma4-nvfp4``: 8192-token prompts sharing their first
4352 tokens, 64 output tokens, concurrency 16, caching on and off.

Writes ``benchmarks/results/engine_sweep/``: ``sweep.json`` (profile -> level -> metrics),
``prefix_caching.json``, ``findings.json`` (the article's claims next to what the sweep gives, in the
results' envelope: ``priority_gateway/bench/envelope.py``)
and ``sweep.png``. Run: ``python benchmarks/engine_sweep.py [--out DIR] [--profiles a,b]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from priority_gateway.bench import envelope
from priority_gateway.engines.sim.profile import available_profiles, load_profile
from priority_gateway.engines.sim.sweep import DEFAULT_LEVELS, run_level, run_sweep

ROOT = Path(__file__).resolve().parents[1]

TTFT_SLO_MS = 500.0
ITL_SLO_MS = 50.0
WORKLOADS = {"tiny-cpu": (1000, 64), "default": (256, 64)}
GEMMA_WORKLOAD = (2048, 512)
PREFIX = {"profile": "gemma4-nvfp4", "input_len": 8192, "shared_prefix_len": 4352, "output_len": 64, "concurrency": 16}


def workload(profile: str) -> tuple[int, int]:
    return WORKLOADS.get(profile, GEMMA_WORKLOAD)


def log(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def sweep_all(profiles: list[str]) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name in profiles:
        input_len, output_len = workload(name)
        started = time.perf_counter()
        levels = run_sweep(load_profile(name), DEFAULT_LEVELS, input_len, output_len)
        results[name] = levels
        for row in levels.values():
            log(event="level", profile=name, **row)
        log(event="profile_done", profile=name, seconds=round(time.perf_counter() - started, 2))
    return results


def prefix_caching() -> dict[str, Any]:
    profile = load_profile(PREFIX["profile"])
    out: dict[str, Any] = dict(PREFIX)
    for label, enabled in (("on", True), ("off", False)):
        out[label] = run_level(
            profile,
            PREFIX["concurrency"],
            PREFIX["input_len"],
            PREFIX["output_len"],
            shared_prefix_len=PREFIX["shared_prefix_len"],
            enable_prefix_caching=enabled,
        )
        log(event="prefix_caching", caching=label, **out[label])
    on, off = out["on"], out["off"]
    out["throughput_gain"] = round(on["output_tokens_per_s"] / off["output_tokens_per_s"] - 1.0, 3)
    out["ttft_p50_reduction_x"] = round(off["ttft_p50_ms"] / on["ttft_p50_ms"], 2)
    out["ttft_p99_reduction_x"] = round(off["ttft_p99_ms"] / on["ttft_p99_ms"], 2)
    return out


def findings(sweep: dict[str, dict[str, Any]], prefix: dict[str, Any]) -> dict[str, Any]:
    def lv(profile: str) -> dict[str, Any]:
        return sweep[profile]

    out: dict[str, Any] = {}
    if all(p in sweep for p in ("gemma4-bf16", "gemma4-fp8", "gemma4-nvfp4")):
        nv = lv("gemma4-nvfp4")
        out["bf16_meets_slo_at_1"] = lv("gemma4-bf16")["1"]["meets_slo"]
        out["fp8_meets_slo_at_1"] = lv("gemma4-fp8")["1"]["meets_slo"]
        out["nvfp4_max_concurrency_meeting_slo"] = max((int(c) for c, r in nv.items() if r["meets_slo"]), default=0)
        out["nvfp4_over_bf16_throughput_at_32"] = round(
            nv["32"]["output_tokens_per_s"] / lv("gemma4-bf16")["32"]["output_tokens_per_s"], 2
        )
        out["nvfp4_over_fp8_throughput_at_32"] = round(
            nv["32"]["output_tokens_per_s"] / lv("gemma4-fp8")["32"]["output_tokens_per_s"], 2
        )
    if all(p in sweep for p in ("gemma4-nvfp4", "gemma4-nvfp4-mtp4")):
        nv, mtp = lv("gemma4-nvfp4"), lv("gemma4-nvfp4-mtp4")
        tput = {c: round(mtp[c]["output_tokens_per_s"] / nv[c]["output_tokens_per_s"], 2) for c in nv}
        itl = {c: round(mtp[c]["itl_p99_ms"] / nv[c]["itl_p99_ms"], 2) for c in nv}
        out["mtp_over_nvfp4_throughput"] = tput
        out["mtp_over_nvfp4_throughput_max"] = max(tput.values())
        out["mtp_over_nvfp4_itl_p99"] = itl
        out["mtp_over_nvfp4_itl_p99_max"] = max(itl.values())
    out["prefix_caching_throughput_gain"] = prefix["throughput_gain"]
    out["prefix_caching_ttft_p50_reduction_x"] = prefix["ttft_p50_reduction_x"]
    out["prefix_caching_ttft_p99_reduction_x"] = prefix["ttft_p99_reduction_x"]
    out["article"] = {
        "bf16_meets_slo_at_1": False,
        "fp8_meets_slo_at_1": False,
        "nvfp4_max_concurrency_meeting_slo": 4,
        "nvfp4_over_bf16_throughput_at_32": 1.86,
        "nvfp4_over_fp8_throughput_at_32": 1.20,
        "mtp_over_nvfp4_throughput_max": 2.13,
        "mtp_over_nvfp4_itl_p99_max": "> 4",
        "prefix_caching_throughput_gain": 0.405,
        "prefix_caching_ttft_reduction_x": 2.1,
    }
    return out


def plot(sweep: dict[str, dict[str, Any]], prefix: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (ax_ttft, ax_itl), (ax_tput, ax_prefix) = axes
    for name, data in sweep.items():
        if name == "default":
            continue  # a test engine in the microseconds: it would squash the scale
        levels = [int(c) for c in data]
        rows = list(data.values())
        label = f"{name} ({rows[0]['input_len']}/{rows[0]['output_len']})"
        ax_ttft.plot(levels, [r["ttft_p99_ms"] for r in rows], marker="o", label=label)
        ax_itl.plot(levels, [r["itl_p99_ms"] for r in rows], marker="o", label=label)
        ax_tput.plot(levels, [r["output_tokens_per_s"] for r in rows], marker="o", label=label)
    ax_ttft.axhline(TTFT_SLO_MS, color="red", linestyle="--", label="SLO 500 ms")
    ax_itl.axhline(ITL_SLO_MS, color="red", linestyle="--", label="SLO 50 ms")
    for ax, title, unit in (
        (ax_ttft, "TTFT p99", "ms"),
        (ax_itl, "ITL p99", "ms"),
        (ax_tput, "Output throughput", "tokens/s"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(list(DEFAULT_LEVELS), [str(c) for c in DEFAULT_LEVELS])
        ax.set_xlabel("concurrency (closed loop)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    ax_ttft.legend(fontsize=7)
    on, off = prefix["on"], prefix["off"]
    metrics = ("output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms")
    xs = range(len(metrics))
    ax_prefix.bar([x - 0.2 for x in xs], [1.0] * len(metrics), width=0.4, label="prefix caching off")
    ax_prefix.bar([x + 0.2 for x in xs], [on[m] / off[m] for m in metrics], width=0.4, label="prefix caching on")
    ax_prefix.set_xticks(list(xs), ["throughput", "TTFT p50", "TTFT p99"])
    ax_prefix.set_ylabel("relative to caching off")
    ax_prefix.set_title(
        f"{prefix['profile']}: {prefix['input_len']}-token prompts, {prefix['shared_prefix_len']} shared, "
        f"c={prefix['concurrency']}\nthroughput {prefix['throughput_gain']:+.0%}, "
        f"TTFT p50 /{prefix['ttft_p50_reduction_x']}",
        fontsize=9,
    )
    ax_prefix.legend(fontsize=8)
    fig.suptitle("Simulated engines, closed-loop concurrency sweep (virtual time)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "engine_sweep")
    parser.add_argument("--profiles", default=None, help="comma-separated (default: every profile but instant)")
    args = parser.parse_args()
    provenance = envelope.start()
    profiles = args.profiles.split(",") if args.profiles else [p for p in available_profiles() if p != "instant"]
    args.out.mkdir(parents=True, exist_ok=True)
    sweep = sweep_all(profiles)
    prefix = prefix_caching()
    found = findings(sweep, prefix)
    (args.out / "sweep.json").write_text(json.dumps(sweep, indent=1) + "\n")
    (args.out / "prefix_caching.json").write_text(json.dumps(prefix, indent=1) + "\n")
    (args.out / "findings.json").write_text(json.dumps(provenance.wrap(found), indent=1) + "\n")
    plot(sweep, prefix, args.out / "sweep.png")
    log(event="done", out=str(args.out), **{k: v for k, v in found.items() if k != "article"})


if __name__ == "__main__":
    main()
