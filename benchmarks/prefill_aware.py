"""Prefill-aware placement in ``gateway sim``: long uncached prompts joining decode batches, with and without it.

    python benchmarks/prefill_aware.py --out benchmarks/results/prefill_aware

The scene: an interactive pool of 4 engines (the H200 profile, ``h200-7b-bf16``) takes chat requests
(Poisson, 1024-token prompts, 128-token answers) and, among them, long prompts nobody has cached
(8192 tokens); a batch pool of 2 engines beside it runs a flood of batch work, priority scheduling.
Budgets TTFT p99 500 ms / ITL p99 50 ms. Each engine's chunk budget (``--max-num-batched-tokens``):
8192 (vLLM 0.26's default on an H200: a long prompt's prefill in one step) and 384 (the interactive
manifest's). Admission with every limit pinned (so the placement alone differs between variants),
and with the limits learned.

Variants, on the same requests:
- ``off``: the prefix policy as it is;
- ``place``: the prefill prediction keeps each request off the engines where its prefill breaks the
  ITL budget of their decoders (``prefill_chunk_tokens``), placing it where it breaks the fewest;
- ``hold-50``, ``hold-250``: and holds it up to 50 or 250 ms while no engine can take it within
  budget (held, it waits in the pool's queue, and what arrives after it waits behind it);
- ``batch``: the batch pool accepts interactive overflow, and a prompt no interactive engine can take
  within budget goes there (held only until the next poll when the batch pool is full);
- ``off+batch``: the overflow alone, without the prediction (what ``batch`` is measured against).

Reported per variant: the interactive class's ITL p99 and TTFT p99, goodput (requests/s meeting both
budgets), refused share; the long prompts' own TTFT p99 and share meeting the budgets; the chat
requests' ITL p99 (the decoders the stalls hit); batch output tokens/s; how often the prediction
held or steered a request.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from priority_gateway.bench import envelope
from priority_gateway.core.classes import BATCH, INTERACTIVE, Budget
from priority_gateway.core.dispatcher import AdmissionSettings
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.engines.sim.profile import load_profile
from priority_gateway.engines.sim.sweep import percentile
from priority_gateway.simulate.cluster import Cluster, ClusterSetup, PoolSetup
from priority_gateway.simulate.report import meets_budget, summarize
from priority_gateway.simulate.traces import load_trace, merge

BUDGET = Budget(0.5, 0.05)
VARIANTS = ("off", "place", "hold-50", "hold-250", "batch", "off+batch")
HOLDS_S = {"hold-50": 0.05, "hold-250": 0.25, "batch": 0.02}
"""How long each variant holds; ``batch`` holds only until the next poll: long enough for the batch
pool to take the prompt at once when it accepts interactive overflow."""


def scene(args: argparse.Namespace) -> tuple[list, list]:
    minutes = args.seconds / 60.0
    chat = load_trace(Path(f"poisson:rate={args.rate},input=1024,output=128,minutes={minutes},seed=chat"), INTERACTIVE)
    long = load_trace(
        Path(f"poisson:rate={args.long_rate},input={args.long_input},output=128,minutes={minutes},seed=long"),
        INTERACTIVE,
    )
    for r in long:
        r.source = "long"
    flood = load_trace(Path("poisson:rate=1,input=2048,output=256,minutes=10,seed=flood"), BATCH)
    return merge([chat, long]), flood


def setup_for(variant: str, chunk: int, limit: str, args: argparse.Namespace) -> ClusterSetup:
    profile = load_profile("h200-7b-bf16")
    interactive = profile.with_overrides(max_num_batched_tokens=chunk, max_num_seqs=256)
    batch = profile.with_overrides(max_num_seqs=64)
    overflow = variant in ("batch", "off+batch")
    pools = [
        PoolSetup(INTERACTIVE, args.engines, interactive),
        PoolSetup(BATCH, 2, batch, "priority", accept_overflow=overflow),
    ]
    limits = LimitSettings()
    if limit != "learned":
        n = float(limit)
        limits = LimitSettings(initial=n, minimum=n, maximum=n)
    options: dict[str, Any] = {}
    if not variant.startswith("off"):
        options["prefill_chunk_tokens"] = chunk
        options["prefill_hold_s"] = HOLDS_S.get(variant, 0.0)
    return ClusterSetup(
        pools,
        "prefix",
        AdmissionSettings(enabled=True, limits=limits),
        {INTERACTIVE: BUDGET, BATCH: Budget()},
        flood=args.flood,
        flood_until=args.seconds,
        seed=args.seed,
        policy_options=options,
    )


def run_variant(variant: str, chunk: int, limit: str, args: argparse.Namespace) -> dict[str, Any]:
    trace, flood = scene(args)
    setup = setup_for(variant, chunk, limit, args)
    started = time.monotonic()
    outcome = Cluster(setup).run(trace, flood)
    summary = summarize(setup, outcome, oracle=False)
    records = list(outcome["records"].values())
    mine = [r for r in records if r.trace.cls == INTERACTIVE]
    long = [r for r in mine if r.trace.source == "long"]
    chat = [r for r in mine if r.trace.source != "long"]
    policy = outcome["policies"][INTERACTIVE]
    i = summary["by_class"][INTERACTIVE]
    b = summary["by_class"].get(BATCH, {})

    def ttft_p99(rs: list) -> float | None:
        values = [(r.first - r.req.arrival) * 1000 for r in rs if r.first is not None and r.done is not None]
        return round(percentile(values, 99), 1) if values else None

    def itl_p99(rs: list) -> float | None:
        values = [g * 1000 for r in rs if r.done is not None for g in r.gaps]
        return round(percentile(values, 99), 2) if values else None

    overflowed = sum(1 for r in long if r.dispatch is not None and r.dispatch.pool == BATCH)
    return {
        "variant": variant,
        "chunk_tokens": chunk,
        "limit": limit,
        "interactive_itl_p99_ms": i["itl_p99_ms"],
        "interactive_ttft_p99_ms": i["ttft_p99_ms"],
        "interactive_goodput_rps": i["goodput_rps"],
        "interactive_refused_share": round(i["rejected"] / i["requests"], 4) if i["requests"] else 0.0,
        "interactive_attainment": i["slo_attainment"],
        "chat_itl_p99_ms": itl_p99(chat),
        "chat_ttft_p99_ms": ttft_p99(chat),
        "long_requests": len(long),
        "long_ttft_p99_ms": ttft_p99(long),
        "long_meeting_share": round(sum(meets_budget(r, BUDGET) for r in long) / len(long), 4) if long else None,
        "long_refused": sum(1 for r in long if r.rejected is not None),
        "long_sent_to_batch": overflowed,
        "batch_output_tokens_per_s": b.get("output_tokens_per_s"),
        "held": getattr(policy, "prefill_held", 0),
        "long_dispatched_late_ms_p50": _late(long),
        "steered": getattr(policy, "prefill_steered", 0),
        "wall_s": round(time.monotonic() - started, 1),
    }


def _late(records: list) -> float | None:
    """How long after arriving the long prompts were sent to an engine (their hold), median."""
    waits = [(r.dispatch.dispatched_at - r.req.arrival) * 1000 for r in records if r.dispatch is not None]
    return round(percentile(waits, 50), 1) if waits else None


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["chunk_tokens"], r["limit"]) for r in rows}, key=lambda g: (-g[0], g[1]))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    width = 0.8 / len(VARIANTS)
    for k, variant in enumerate(VARIANTS):
        mine = {(r["chunk_tokens"], r["limit"]): r for r in rows if r["variant"] == variant}
        xs = [g + k * width for g in range(len(groups))]
        keys = ("interactive_itl_p99_ms", "interactive_ttft_p99_ms", "interactive_goodput_rps")
        for ax, key in zip(axes, keys, strict=True):
            ax.bar(xs, [mine[g][key] or 0 for g in groups], width, label=variant)
    labels = [f"chunk {c}\nlimit {lim}" for c, lim in groups]
    titles = ("interactive ITL p99 (ms)", "interactive TTFT p99 (ms)", "goodput (req/s)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], labels, fontsize=8)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].axhline(50, color="k", lw=0.8, ls=":")
    axes[1].axhline(500, color="k", lw=0.8, ls=":")
    axes[0].legend(fontsize=8)
    fig.suptitle("Long uncached prompts joining decode batches: prefill-aware placement in gateway sim")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--rate", type=float, default=24.0, help="chat requests/s")
    p.add_argument("--long-rate", type=float, default=1.5, help="long uncached prompts/s")
    p.add_argument("--long-input", type=int, default=8192)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--flood", type=int, default=64, help="batch requests kept outstanding")
    p.add_argument("--chunks", default="8192,384")
    p.add_argument("--limits", default="32,learned", help="pinned limit per engine, or learned")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/prefill_aware"))
    args = p.parse_args()
    provenance = envelope.start()
    rows = []
    for chunk in (int(c) for c in args.chunks.split(",")):
        for limit in args.limits.split(","):
            for variant in args.variants.split(","):
                row = run_variant(variant, chunk, limit, args)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "scene": {k: v for k, v in vars(args).items() if k != "out"},
        "budget_ms": {"ttft_p99": 500, "itl_p99": 50},
        "rows": rows,
    }
    (args.out / "prefill_aware.json").write_text(json.dumps(provenance.wrap(result), indent=1))
    plot(rows, args.out / "prefill_aware.png")


if __name__ == "__main__":
    main()
