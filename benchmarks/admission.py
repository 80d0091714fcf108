"""SLO admission in virtual time: a batch flood against interactive budgets, and a load sweep.

Through the gateway's own core (``gateway sim``), Gemma 4 engine profiles:

1. Flood: 8 interactive engines (``gemma4-nvfp4``) and 4 batch engines (``gemma4-nvfp4-mtp4``,
   priority scheduling). Interactive Poisson arrivals at 60 % of what the interactive pool
   serves within its SLO (8 engines x 4 requests each within TTFT p99 500 ms / ITL p99 50 ms,
   2048-token prompts, 512-token answers: 0.84 requests/s), plus a batch flood far beyond what
   the batch pool takes. (With 23-second requests, a slot rarely frees within the TTFT budget:
   at 60 % load, 16 slots turn away ~3 % of Poisson arrivals, 32 slots ~0.5 %.) The same with
   admission off and one shared FCFS pool, for contrast.
   The capacity interactive leaves free is measured with the flood alone on the same cluster
   (every engine within the interactive pool's SLO limits, as admission keeps them), minus the
   output tokens/s interactive traffic takes.
2. Load sweep: the Azure LLM conversation trace (first ``--sweep-minutes`` minutes) as
   interactive traffic at 1x to 4x its rate, with a batch flood, on 24 engines: 20 interactive
   + 4 batch with admission (ours; 1x is about 60 % of the interactive pool's SLO capacity),
   against one shared FCFS pool of 24 without admission, and separate pools without admission.
   SLO attainment and SLO-compliant goodput per setup.

With admission on, refused interactive requests are judged by replaying them admitted
(``gateway sim --counterfactual``): false refusals are those that would have met their budgets.

    python benchmarks/admission.py [--minutes 30] [--sweep-minutes 5] [--out benchmarks/results/admission]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from priority_gateway.bench import envelope
from priority_gateway.simulate.cli import add_arguments
from priority_gateway.simulate.cli import run as run_sim

ROOT = Path(__file__).resolve().parents[1]

AZURE = str(ROOT / "benchmarks/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv")
PROFILES = "interactive=gemma4-nvfp4,batch=gemma4-nvfp4-mtp4"
SLO_RATE = 8 * 0.175  # requests/s the interactive pool serves within SLO (sweep: 89.7 tok/s at c=4, 512 out)


def sim(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    result = run_sim(parser.parse_args(argv))
    return next(iter(result.values()))


def progress(message: str) -> None:
    print(f"admission: {message}", file=sys.stderr, flush=True)


def flood(minutes: float) -> dict:
    rate = round(0.6 * SLO_RATE, 3)
    interactive = f"poisson:rate={rate},input=2048,output=512,minutes={minutes}@interactive"
    base = (
        "--engines interactive=8,batch=4 --policy prefix --batch-flood 1024 --flood-lengths 2048,512 "
        f"--minutes {minutes} --no-oracle --profile {PROFILES}"
    ).split()
    progress(f"flood: interactive at {rate} req/s + batch flood, admission on ...")
    ours = sim(["--trace", interactive, *base])
    progress("flood: batch flood alone (capacity) ...")
    alone = sim(base)
    progress("flood: one shared FCFS pool, admission off ...")
    shared = sim(["--trace", interactive, *base, "--shared-pool", "--admission", "off"])
    interactive_tokens = ours["by_class"]["interactive"]["output_tokens_per_s"]
    capacity = alone["by_class"]["batch"]["output_tokens_per_s"]
    free = capacity - interactive_tokens
    batch_tokens = ours["by_class"]["batch"]["output_tokens_per_s"]
    i = ours["by_class"]["interactive"]
    checks = {
        "interactive_rate_rps": rate,
        "interactive_ttft_p99_ms": i["ttft_p99_ms"],
        "interactive_itl_p99_ms": i["itl_p99_ms"],
        "interactive_admitted_share": round(1 - i["rejected"] / i["requests"], 4),
        "interactive_false_refusals": i.get("false_refusals"),
        "interactive_slo_attainment": i["slo_attainment"],
        "batch_capacity_alone_tokens_per_s": capacity,
        "interactive_tokens_per_s": interactive_tokens,
        "capacity_left_free_tokens_per_s": round(free, 1),
        "batch_goodput_tokens_per_s": batch_tokens,
        "batch_goodput_share_of_free_capacity": round(batch_tokens / free, 4) if free > 0 else None,
        "shared_fcfs_interactive_ttft_p99_ms": shared["by_class"]["interactive"]["ttft_p99_ms"],
        "shared_fcfs_interactive_itl_p99_ms": shared["by_class"]["interactive"]["itl_p99_ms"],
        "shared_fcfs_interactive_slo_attainment": shared["by_class"]["interactive"]["slo_attainment"],
        "shared_fcfs_batch_tokens_per_s": shared["by_class"]["batch"]["output_tokens_per_s"],
        "passes": bool(
            i["ttft_p99_ms"] <= 500
            and i["itl_p99_ms"] <= 50
            and i["rejected"] / i["requests"] <= 0.01
            and free > 0
            and batch_tokens >= 0.7 * free
        ),
    }
    return {"runs": {"admission": ours, "batch_alone": alone, "shared_fcfs": shared}, "checks": checks}


def _row(result: dict) -> dict:
    i = result["by_class"]["interactive"]
    judged = i.get("false_refusals", {})
    return {
        "slo_attainment": i["slo_attainment"],
        "goodput_rps": i["goodput_rps"],
        "rejected": i["rejected"],
        "false_refusals": judged.get("false_refusals"),
        "false_refusals_harming_no_one": judged.get("false_refusals_harming_no_one"),
        "ttft_p99_ms": i["ttft_p99_ms"],
        "itl_p99_ms": i["itl_p99_ms"],
        "batch_tokens_per_s": result["by_class"].get("batch", {}).get("output_tokens_per_s"),
    }


def sweep(minutes: float) -> dict:
    setups = {
        "pools+admission": ["--engines", "interactive=20,batch=4", "--policy", "prefix"],
        "pools, admission off": ["--engines", "interactive=20,batch=4", "--policy", "prefix", "--admission", "off"],
        "shared FCFS": [
            "--engines",
            "interactive=20,batch=4",
            "--policy",
            "least_loaded",
            "--shared-pool",
            "--admission",
            "off",
        ],
    }
    out: dict = {}
    for rate in (1, 2, 3, 4):
        for name, extra in setups.items():
            progress(f"sweep: Azure at {rate}x, {name} ...")
            argv = (
                f"--trace {AZURE}@interactive --rate-scale {rate} --minutes {minutes} --profile {PROFILES} "
                "--batch-flood 64 --flood-lengths 1024,256 --no-oracle"
            ).split()
            result = sim([*argv, *extra])
            out.setdefault(str(rate), {})[name] = result
    table = {rate: {name: _row(r) for name, r in runs.items()} for rate, runs in out.items()}
    top = table["4"]
    ratio = top["pools+admission"]["goodput_rps"] / max(1e-9, top["shared FCFS"]["goodput_rps"])
    return {"runs": out, "table": table, "goodput_vs_shared_fcfs_at_4x": round(ratio, 3), "passes": ratio >= 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="flood scenario length (virtual minutes)")
    parser.add_argument("--sweep-minutes", type=float, default=5.0, help="Azure trace minutes for the sweep")
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/admission"))
    args = parser.parse_args()
    provenance = envelope.start()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = {"flood": flood(args.minutes)}
    if not args.skip_sweep:
        results["sweep"] = sweep(args.sweep_minutes)
    (out / "results.json").write_text(json.dumps(provenance.wrap(results), indent=2))
    summary = {"flood": results["flood"]["checks"], "wall_s": round(time.monotonic() - started, 1)}
    if "sweep" in results:
        summary["sweep"] = {k: results["sweep"][k] for k in ("table", "goodput_vs_shared_fcfs_at_4x", "passes")}
    (out / "summary.json").write_text(json.dumps(provenance.wrap(summary), indent=2))
    print(json.dumps(summary, indent=2))
    plot(results, out / "admission.png")


def plot(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    runs = results["flood"]["runs"]
    fig, axes = plt.subplots(1, 4 if "sweep" in results else 3, figsize=(18, 4.2))
    names = ["admission", "shared_fcfs"]
    labels = ["separate pools + admission", "one shared FCFS pool"]
    colors = ["tab:blue", "tab:red"]
    for ax, key, budget, title in (
        (axes[0], "ttft_p99_ms", 500, "interactive TTFT p99 (ms)"),
        (axes[1], "itl_p99_ms", 50, "interactive ITL p99 (ms)"),
    ):
        ax.bar(labels, [runs[n]["by_class"]["interactive"][key] for n in names], color=colors)
        ax.axhline(budget, color="black", linestyle="--", linewidth=1, label="budget")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.legend()
    checks = results["flood"]["checks"]
    axes[2].bar(
        ["free capacity", "batch goodput (ours)", "batch (shared FCFS)"],
        [
            checks["capacity_left_free_tokens_per_s"],
            checks["batch_goodput_tokens_per_s"],
            checks["shared_fcfs_batch_tokens_per_s"],
        ],
        color=["grey", "tab:blue", "tab:red"],
    )
    axes[2].axhline(
        0.7 * checks["capacity_left_free_tokens_per_s"],
        color="black",
        linestyle="--",
        linewidth=1,
        label="70 % of free capacity",
    )
    axes[2].set_title("batch output tokens/s")
    axes[2].legend()
    if "sweep" in results:
        table = results["sweep"]["table"]
        rates = sorted(table, key=float)
        for name in table[rates[0]]:
            axes[3].plot(
                [float(r) for r in rates], [table[r][name]["goodput_rps"] for r in rates], marker="o", label=name
            )
        axes[3].set_xlabel("Azure trace rate (x)")
        axes[3].set_title("interactive SLO-compliant goodput (req/s)")
        axes[3].legend(fontsize=8)
    for ax in axes[:3]:
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
