"""LoRA-aware routing against adapter-blind prefix routing and round robin, in virtual time.

The gateway's core in front of simulated engines (``priority_gateway.simulate.cluster``, what ``gateway sim``
runs): 8 engines of the ``h200-7b-bf16`` profile with ``--max-loras 4`` and 32 adapters in their CPU
cache. Requests arrive as a Poisson process; each names one adapter drawn from a Zipf popularity
(rank r with weight 1/r^s) and carries that adapter's system prompt (shared by its requests) and a
user part of its own. The same arrivals go through each router:

- ``adapter-aware``: the ``prefix`` policy with ``lora_aware`` (slots from ``vllm:lora_requests_info``
  and in-flight adapters; an engine holding the adapter preferred);
- ``adapter-blind``: the same policy with ``lora_aware: false`` (prefix hashing still per adapter);
- ``round-robin``.

Reported per router: adapter swaps into GPU slots per minute (all engines), TTFT p50/p99, output
tokens per second, and the engines' prefix-cache hit ratio.

    python benchmarks/lora.py [--rates 30,45] [--seconds 300] [--zipf 1.0] [--out benchmarks/results/lora]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from priority_gateway.bench import envelope
from priority_gateway.core.dispatcher import AdmissionSettings
from priority_gateway.engines.sim.profile import load_profile
from priority_gateway.simulate.cluster import Cluster, ClusterSetup, PoolSetup
from priority_gateway.simulate.traces import TraceRequest

ROOT = Path(__file__).resolve().parents[1]

ROUTERS = {
    "adapter-aware": ("prefix", {"lora_aware": True}),
    "adapter-blind": ("prefix", {"lora_aware": False}),
    "round-robin": ("round_robin", {}),
}
BLOCK_TOKENS = 64


def progress(message: str) -> None:
    print(f"lora: {message}", file=sys.stderr, flush=True)


def trace(args: argparse.Namespace, rate: float) -> list[TraceRequest]:
    rng = random.Random(args.seed)
    names = [f"adapter-{i:02d}" for i in range(args.adapters)]
    weights = [1.0 / (rank + 1) ** args.zipf for rank in range(args.adapters)]
    system_blocks = args.system_tokens // BLOCK_TOKENS
    user_blocks = args.user_tokens // BLOCK_TOKENS
    out = []
    t = 0.0
    n = 0
    while True:
        t += rng.expovariate(rate)
        if t >= args.seconds:
            return out
        i = rng.choices(range(args.adapters), weights)[0]
        system = tuple(1_000_000 * (i + 1) + b for b in range(system_blocks))
        user = tuple(10**9 + n * 1000 + b for b in range(user_blocks))
        n += 1
        tokens = (system_blocks + user_blocks) * BLOCK_TOKENS
        output = rng.randint(args.output_tokens // 2, args.output_tokens * 3 // 2)
        out.append(TraceRequest(t, tokens, output, system + user, block_tokens=BLOCK_TOKENS, adapter=names[i]))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_one(router: str, requests: list[TraceRequest], args: argparse.Namespace) -> dict:
    policy, options = ROUTERS[router]
    names = tuple(sorted({tr.adapter for tr in requests if tr.adapter}))
    setup = ClusterSetup(
        pools=[
            PoolSetup("interactive", args.engines, load_profile(args.profile), lora_adapters=names, max_loras=4),
        ],
        policy=policy,
        policy_options=options,
        admission=AdmissionSettings(enabled=False),
        seed=args.seed,
    )
    started = time.monotonic()
    result = Cluster(setup).run(requests)
    records = result["records"].values()
    done = [r for r in records if r.done is not None and r.first is not None]
    ttft = [r.first - r.req.arrival for r in done]
    duration = result["duration_s"]
    engines = result["engines"].values()
    swaps = sum(e.core.lora_swaps for e in engines)
    hits = sum(e.core.stats.prefix_cache_hits for e in engines)
    queries = sum(e.core.stats.prefix_cache_queries for e in engines)
    per_engine = {e.id: e.core.lora_swaps for e in engines}
    row = {
        "completed": len(done),
        "requests": len(records),
        "adapter_swaps": swaps,
        "swaps_per_minute": round(swaps / (duration / 60), 1),
        "ttft_p50_ms": round(1000 * statistics.median(ttft), 1),
        "ttft_p99_ms": round(1000 * percentile(ttft, 0.99), 1),
        "throughput_tokens_s": round(sum(r.output_tokens for r in done) / duration, 1),
        "throughput_requests_s": round(len(done) / duration, 2),
        "prefix_hit_ratio": round(hits / queries, 4) if queries else 0.0,
        "virtual_s": round(duration, 1),
        "swaps_by_engine": per_engine,
        "wall_s": round(time.monotonic() - started, 1),
    }
    progress(
        f"{router}: {row['swaps_per_minute']} swaps/min, TTFT p50 {row['ttft_p50_ms']} ms p99 {row['ttft_p99_ms']} ms, "
        f"{row['throughput_tokens_s']} tok/s ({row['wall_s']} s wall)"
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="30,45", help="arrivals per second, one run of every router at each")
    parser.add_argument("--seconds", type=float, default=300.0, help="virtual seconds of arrivals")
    parser.add_argument("--adapters", type=int, default=32)
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of adapter popularity")
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--profile", default="h200-7b-bf16")
    parser.add_argument("--system-tokens", type=int, default=1024)
    parser.add_argument("--user-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/lora"))
    args = parser.parse_args()
    provenance = envelope.start()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    by_rate = {}
    for rate in (float(r) for r in args.rates.split(",")):
        requests = trace(args, rate)
        progress(f"rate {rate:g}/s: {len(requests)} requests over {args.seconds:g} virtual s, {args.adapters} adapters")
        by_rate[f"{rate:g}"] = {name: run_one(name, requests, args) for name in ROUTERS}
    report = {
        "setup": {k: v for k, v in vars(args).items() if k != "out"} | {"max_loras": 4},
        "results": by_rate,
        "ratios_vs_adapter_aware": {rate: _ratios(results) for rate, results in by_rate.items()},
    }
    (out / "results.json").write_text(json.dumps(provenance.wrap(report), indent=2) + "\n")
    print(json.dumps(report["ratios_vs_adapter_aware"]))
    plot(by_rate, out / "lora.png", provenance.command)


def _ratios(results: dict) -> dict:
    aware = results["adapter-aware"]
    return {
        name: {
            "swaps": _ratio(r["adapter_swaps"], aware["adapter_swaps"]),
            "ttft_p50": _ratio(r["ttft_p50_ms"], aware["ttft_p50_ms"]),
            "ttft_p99": _ratio(r["ttft_p99_ms"], aware["ttft_p99_ms"]),
            "throughput": _ratio(r["throughput_tokens_s"], aware["throughput_tokens_s"]),
        }
        for name, r in results.items()
    }


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def plot(by_rate: dict, path: Path, command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = list(by_rate)
    names = list(ROUTERS)
    colors = ["tab:blue", "tab:orange", "tab:grey"]
    panels = [
        ("swaps_per_minute", "adapter swaps / min (8 engines)"),
        ("ttft_p50_ms", "TTFT p50 (ms, log)"),
        ("ttft_p99_ms", "TTFT p99 (ms, log)"),
        ("throughput_tokens_s", "output tokens / s"),
    ]
    width = 0.8 / len(names)
    fig, axes = plt.subplots(1, len(panels), figsize=(17, 4.2))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for j, name in enumerate(names):
            xs = [i + (j - 1) * width for i in range(len(rates))]
            values = [by_rate[r][name][key] for r in rates]
            ax.bar(xs, values, width, color=colors[j], label=name)
            for x, v in zip(xs, values, strict=True):
                ax.annotate(f"{v:g}", (x, v), ha="center", va="bottom", fontsize=7)
        if "ttft" in key:
            ax.set_yscale("log")
        ax.set_xticks(range(len(rates)), [f"{r} req/s" for r in rates])
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"32 Zipf adapters on 8 engines, max_loras=4 (virtual time)\n{command}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
