"""Prefix-affinity routing against round robin and least loaded, in virtual time.

Two workloads through the gateway's own core (``gateway sim``), 8 simulated engines of the
``h200-32b-fp8`` profile, admission off so that only routing differs:
- the Mooncake conversation trace at its own rate and at twice its rate: hit ratio against
  the pooled-cache ceiling (``oracle_hit_ratio``), TTFT p50/p99, load imbalance;
- many users sharing a few hot system prompts (Zipf popularity), the case where naive
  affinity piles up: hit ratio, and the highest engine load relative to the load bound.

Each workload also runs the prefix policy in precise mode (``prefix_precise``: the engines' KV
cache events instead of the gateway's guess) to show what the guess leaves on the table; and
Mooncake runs once more through two gateway replicas that share no state (``--replicas 2
--share off``), where each replica's guess sees only half the traffic but the engines' events
reach both (``benchmarks/replicas.py`` measures replicas that share their routing).

    python benchmarks/routing.py [--minutes M] [--out benchmarks/results/routing]

Writes ``results.json`` (every run's full ``gateway sim`` output), ``summary.json`` (the checks)
and ``routing.png``.
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

MOONCAKE = str(ROOT / "benchmarks/traces/mooncake/conversation_trace.jsonl")
HOT = "hot:rate=8,prompts=64,prompt_len=8192,user_len=512,output=128,zipf=1.1,minutes=10"
POLICIES = "round_robin,least_loaded,prefix"
PLOTTED = [*POLICIES.split(","), "prefix_precise"]


def sim(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return run_sim(parser.parse_args(argv))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=None, help="replay only the first M minutes of Mooncake")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/routing"))
    args = parser.parse_args()
    provenance = envelope.start()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = ["--engines", "8", "--profile", "h200-32b-fp8", "--admission", "off"]
    minutes = ["--minutes", str(args.minutes)] if args.minutes else []
    started = time.monotonic()
    results = {}
    workloads = {
        "mooncake_1x": ["--trace", MOONCAKE, "--rate-scale", "1", *minutes],
        "mooncake_2x": ["--trace", MOONCAKE, "--rate-scale", "2", *minutes],
        "hot_prompts": ["--trace", HOT],
        "mooncake_1x_2_replicas": [
            "--trace",
            MOONCAKE,
            "--rate-scale",
            "1",
            "--replicas",
            "2",
            "--share",
            "off",
            *minutes,
        ],
    }
    for name, workload in workloads.items():
        print(f"routing: {name} ...", file=sys.stderr, flush=True)
        results[name] = sim([*workload, *common, "--policy", POLICIES])
        precise = ["--policy", "prefix", "--policy-option", "precise=true", "--no-oracle"]
        results[name]["prefix_precise"] = sim([*workload, *common, *precise])["prefix"]
    (out / "results.json").write_text(json.dumps(provenance.wrap(results), indent=2))
    summary = summarize(results)
    summary["wall_s"] = round(time.monotonic() - started, 1)
    (out / "summary.json").write_text(json.dumps(provenance.wrap(summary), indent=2))
    print(json.dumps(summary, indent=2))
    plot(results, out / "routing.png")


def summarize(results: dict) -> dict:
    summary: dict = {}
    for name, runs in results.items():
        prefix, rr = runs["prefix"], runs["round_robin"]
        row = {
            policy: {
                k: r[k] for k in ("prefix_hit_ratio", "ttft_p50_ms", "ttft_p99_ms", "itl_p99_ms", "load_imbalance")
            }
            for policy, r in runs.items()
        }
        row["oracle_hit_ratio"] = prefix["oracle_hit_ratio"]
        row["infinite_hit_ratio"] = prefix["infinite_hit_ratio"]
        row["prefix_share_of_oracle"] = round(prefix["prefix_hit_ratio"] / prefix["oracle_hit_ratio"], 4)
        row["prefix_ttft_p99_over_round_robin"] = round(prefix["ttft_p99_ms"] / rr["ttft_p99_ms"], 4)
        if "prefix_precise" in runs:
            precise = runs["prefix_precise"]["prefix_hit_ratio"]
            row["prefix_precise_share_of_oracle"] = round(precise / prefix["oracle_hit_ratio"], 4)
        pool = next(iter(prefix["by_pool"].values()))
        row["prefix_max_load_over_bound"] = pool.get("max_load_over_bound")
        summary[name] = row
    return summary


def plot(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(results)
    policies = [p for p in PLOTTED if all(p in results[n] for n in names)]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    width = 0.8 / len(policies)
    for i, policy in enumerate(policies):
        xs = [n + (i - (len(policies) - 1) / 2) * width for n in range(len(names))]
        axes[0].bar(xs, [results[n][policy]["prefix_hit_ratio"] for n in names], width, label=policy)
        axes[1].bar(xs, [results[n][policy]["ttft_p99_ms"] / 1000 for n in names], width, label=policy)
        axes[2].bar(xs, [results[n][policy]["load_imbalance"] for n in names], width, label=policy)
    axes[0].scatter(
        range(len(names)),
        [results[n]["prefix"]["oracle_hit_ratio"] for n in names],
        color="black",
        marker="_",
        s=600,
        zorder=3,
        label="pooled-cache ceiling (oracle)",
    )
    axes[0].set_title("prefix hit ratio (tokens from cache / prompt tokens)")
    axes[1].set_title("TTFT p99 (s, log scale)")
    axes[1].set_yscale("log")
    axes[2].set_title("load imbalance (max / mean busy time)")
    axes[2].axhline(1.25, color="red", linestyle="--", linewidth=1)
    for ax in axes:
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([n.replace("_", " ") for n in names], fontsize=7, rotation=12)
    axes[0].legend(fontsize=7)
    fig.suptitle("8 engines (h200-32b-fp8), gateway core in virtual time, admission off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
