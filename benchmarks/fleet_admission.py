"""Fleet-wide admission in virtual time: four gateway replicas against one, under a batch flood.

Through the gateway's own core (``gateway sim --replicas``), the flood scenario of
``benchmarks/admission.py``: 8 interactive engines (``gemma4-nvfp4``) and 4 batch engines
(``gemma4-nvfp4-mtp4``), interactive Poisson arrivals at 60 % of what the interactive pool serves
within its SLO (TTFT p99 500 ms, ITL p99 50 ms), and a batch flood far beyond what the batch pool
takes. Arrivals are spread round robin over the replicas, as a Service spreads connections.

Runs, side by side:
- ``one``: one replica (the reference);
- ``four``: four replicas sharing load and learned limits over the simulated channel;
- ``four_share_down``: the same with the channel broken for the middle third of the run (each
  replica admits its safe share of every limit, then shares again);
- ``four_no_share``: four replicas that share nothing (each fills every limit alone), for contrast.

Targets: with four replicas, interactive TTFT p99 and ITL p99 within 5 % of one replica's and batch
goodput (output tokens/s) within 10 %; with the channel down mid-run, the budgets still hold. Each
run also counts the dispatches that left an engine with more requests than one replica would
start there (``overfilled``: none with one replica).

    python benchmarks/fleet_admission.py [--minutes 10] [--out benchmarks/results/fleet_admission]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# The same scenario as benchmarks/admission.py's flood (run as a script, this directory is on the path).
from admission import PROFILES, SLO_RATE, sim

from priority_gateway.bench import envelope

TTFT_BUDGET_MS, ITL_BUDGET_MS = 500.0, 50.0


def progress(message: str) -> None:
    print(f"fleet_admission: {message}", file=sys.stderr, flush=True)


def figures(result: dict) -> dict:
    i = result["by_class"]["interactive"]
    return {
        "interactive_ttft_p99_ms": i["ttft_p99_ms"],
        "interactive_itl_p99_ms": i["itl_p99_ms"],
        "interactive_slo_attainment": i["slo_attainment"],
        "interactive_rejected_share": round(i["rejected"] / max(1, i["requests"]), 4),
        "batch_goodput_tokens_per_s": result["by_class"]["batch"]["output_tokens_per_s"],
        "safe_share_spans": (result.get("share") or {}).get("safe_share_spans"),
        "overfilled_dispatches": result["overfilled"]["dispatches"],
        "overfilled_max_excess": result["overfilled"]["max_excess"],
    }


def runs(minutes: float) -> dict:
    rate = round(0.6 * SLO_RATE, 3)
    down = f"{minutes * 20:g}:{minutes * 40:g}"  # the middle third, in seconds
    base = [
        "--trace",
        f"poisson:rate={rate},input=2048,output=512,minutes={minutes}@interactive",
        *f"--engines interactive=8,batch=4 --policy prefix --batch-flood 1024 --flood-lengths 2048,512 "
        f"--minutes {minutes} --no-oracle --counterfactual 0 --profile {PROFILES}".split(),
    ]
    setups = {
        "one": [],
        "four": ["--replicas", "4"],
        "four_share_down": ["--replicas", "4", "--share-down", down],
        "four_no_share": ["--replicas", "4", "--share", "off"],
    }
    out = {}
    for name, extra in setups.items():
        progress(f"{name}: {' '.join(extra) or 'one replica'} ...")
        out[name] = sim([*base, *extra])
    return {"interactive_rate_rps": rate, "share_down_s": down, "runs": out}


def checks(results: dict) -> dict:
    f = {name: figures(r) for name, r in results["runs"].items()}
    one, down = f["one"], f["four_share_down"]

    def ratio(a: dict, key: str) -> float:
        return round(a[key] / one[key], 4) if one[key] else float("nan")

    table = {
        name: {
            **row,
            "ttft_p99_vs_one": ratio(row, "interactive_ttft_p99_ms"),
            "itl_p99_vs_one": ratio(row, "interactive_itl_p99_ms"),
            "batch_goodput_vs_one": ratio(row, "batch_goodput_tokens_per_s"),
        }
        for name, row in f.items()
    }
    return {
        "table": table,
        "four_within_targets": bool(
            table["four"]["ttft_p99_vs_one"] <= 1.05
            and table["four"]["itl_p99_vs_one"] <= 1.05
            and table["four"]["batch_goodput_vs_one"] >= 0.9
        ),
        "share_down_budgets_hold": bool(
            down["interactive_ttft_p99_ms"] <= TTFT_BUDGET_MS and down["interactive_itl_p99_ms"] <= ITL_BUDGET_MS
        ),
        "one_budgets_hold": bool(
            one["interactive_ttft_p99_ms"] <= TTFT_BUDGET_MS and one["interactive_itl_p99_ms"] <= ITL_BUDGET_MS
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="scenario length (virtual minutes)")
    parser.add_argument("--out", default="benchmarks/results/fleet_admission")
    args = parser.parse_args()
    provenance = envelope.start()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = runs(args.minutes)
    summary = {
        "interactive_rate_rps": results["interactive_rate_rps"],
        "share_down_s": results["share_down_s"],
        **checks(results),
        "wall_s": round(time.monotonic() - started, 1),
    }
    (out / "summary.json").write_text(json.dumps(provenance.wrap(summary), indent=2))
    (out / "runs.json").write_text(json.dumps(results, indent=1, default=str))
    print(json.dumps(summary, indent=2))
    plot(summary, out / "fleet_admission.png")


def plot(summary: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    table = summary["table"]
    names = list(table)
    colors = ["tab:grey", "tab:blue", "tab:orange", "tab:red"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, budget, title in (
        (axes[0], "interactive_ttft_p99_ms", TTFT_BUDGET_MS, "interactive TTFT p99 (ms)"),
        (axes[1], "interactive_itl_p99_ms", ITL_BUDGET_MS, "interactive ITL p99 (ms)"),
        (axes[2], "batch_goodput_tokens_per_s", None, "batch output tokens/s"),
    ):
        ax.bar(names, [table[n][key] for n in names], color=colors)
        if budget is not None:
            ax.axhline(budget, color="black", linestyle="--", linewidth=1, label="budget")
            ax.legend()
        ax.set_title(title)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle("gateway sim: 1 vs 4 replicas under a batch flood (share_down: channel broken mid-run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
