"""Noisy neighbour: four tenants of equal weight share an interactive pool; one sends 5x its share.

Virtual time, through the gateway's own core (``gateway sim``'s cluster): 8 engines
(``gemma4-nvfp4``), admission on, TTFT p99 500 ms / ITL p99 50 ms, Poisson arrivals per
tenant (1024-token prompts, 128-token answers). ``C`` is what the pool serves within its
budgets, measured first with one tenant far over it; a tenant's share is C / 4 (four tenants).

Runs, each with fair queueing (``fair``) and without (``unfair``: one line by deadline):

1. quiet: the three well-behaved tenants alone at 60 % of their share each: the SLO attainment
   they have without the noisy one.
2. noisy: the same, plus the noisy tenant at 5x its share. The well-behaved must keep at least
   99 % of their quiet attainment.
3. backlogged: every tenant over its share (well-behaved 2x, noisy 5x): the token shares they
   get, and Jain's index over shares per weight (at least 0.95).
4. alone: the noisy tenant at 5x its share with the others idle: it gets the pool (work-conserving).

A tenant over its weighted share of the pool's slots (while others are active) starts only
where an engine keeps ``admission.backfill_reserve`` of its limit free and serves no tenant under
its share, so the others find room at once; alone, it takes every slot.

    python benchmarks/fairness.py [--minutes 4] [--out benchmarks/results/fairness]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from priority_gateway.core.classes import BATCH, INTERACTIVE, Budget
from priority_gateway.core.dispatcher import AdmissionSettings
from priority_gateway.engines.sim.profile import load_profile
from priority_gateway.simulate.cluster import Cluster, ClusterSetup, PoolSetup, Record
from priority_gateway.simulate.report import meets_budget
from priority_gateway.simulate.traces import TRACE_BLOCK_TOKENS, TraceRequest

ROOT = Path(__file__).resolve().parents[1]
PROFILE = "gemma4-nvfp4"
ENGINES = 8
INPUT, OUTPUT = 1024, 128
BUDGET = Budget(0.5, 0.05)
TENANTS = ("noisy", "team-a", "team-b", "team-c")
WELL_BEHAVED = TENANTS[1:]
WEIGHTS = dict.fromkeys(TENANTS, 1.0)
WARMUP_S = 30.0


def progress(message: str) -> None:
    print(f"fairness: {message}", file=sys.stderr, flush=True)


def arrivals(tenant: str, rate: float, seconds: float, seed: int) -> list[TraceRequest]:
    """Poisson arrivals of one tenant, every prompt distinct (no prefix sharing to blur shares)."""
    rng = random.Random(f"{tenant}/{rate}/{seed}")
    out, t = [], 0.0
    base = (zlib.crc32(tenant.encode()) & 0xFFFF) << 32
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        blocks = -(-INPUT // TRACE_BLOCK_TOKENS)
        ids = tuple(base + len(out) * blocks + j for j in range(blocks))
        out.append(TraceRequest(t, INPUT, OUTPUT, ids, INTERACTIVE, tenant, tenant=tenant))


def simulate(rates: dict[str, float], seconds: float, fair: bool, seed: int = 0) -> dict[str, Record]:
    trace = sorted(
        (r for tenant, rate in rates.items() if rate > 0 for r in arrivals(tenant, rate, seconds, seed)),
        key=lambda r: r.arrival,
    )
    setup = ClusterSetup(
        [PoolSetup(INTERACTIVE, ENGINES, load_profile(PROFILE))],
        policy="least_loaded",
        admission=AdmissionSettings(enabled=True, fair=fair),
        budgets={INTERACTIVE: BUDGET, BATCH: Budget()},
        home={INTERACTIVE: INTERACTIVE, BATCH: INTERACTIVE},
        seed=seed,
    )
    return Cluster(setup).run(trace)["records"]


def per_tenant(records: dict[str, Record], seconds: float) -> dict[str, dict[str, Any]]:
    """Attainment over requests that arrived after warm-up; tokens served by those that did."""
    out: dict[str, dict[str, Any]] = {}
    for rec in records.values():
        if rec.req.arrival < WARMUP_S or rec.req.arrival > seconds:
            continue
        row = out.setdefault(rec.req.tenant, {"requests": 0, "met": 0, "refused": 0, "tokens": 0})
        row["requests"] += 1
        row["met"] += meets_budget(rec, BUDGET)
        row["refused"] += rec.rejected is not None
        if rec.done is not None:
            row["tokens"] += rec.req.prompt_tokens + rec.output_tokens
    return rates_of(out, seconds - WARMUP_S)


def rates_of(rows: dict[str, dict[str, Any]], span: float) -> dict[str, dict[str, Any]]:
    """Each tenant's counts (``requests``, ``met``, ``refused``, ``tokens``) with its attainment and tokens/s."""
    for row in rows.values():
        row["slo_attainment"] = round(row["met"] / row["requests"], 4) if row["requests"] else None
        row["tokens_per_s"] = round(row["tokens"] / span, 1)
    return rows


def jain(values: list[float]) -> float:
    return round(sum(values) ** 2 / (len(values) * sum(v * v for v in values)), 4) if any(values) else 0.0


def capacity(seconds: float) -> float:
    """Requests/s the pool completes within its budgets when one tenant asks for far more."""
    records = simulate({"probe": 10.0}, seconds, fair=True)
    met = sum(meets_budget(r, BUDGET) for r in records.values() if r.req.arrival >= WARMUP_S)
    return met / (seconds - WARMUP_S)


def virtual(minutes: float) -> dict[str, Any]:
    seconds = 60.0 * minutes
    started = time.monotonic()
    progress(f"capacity probe ({minutes:g} virtual minutes) ...")
    c = capacity(seconds)
    share = c / len(TENANTS)
    progress(f"C = {c:.3f} req/s within budget; a tenant's share {share:.3f} req/s")
    runs: dict[str, dict[str, Any]] = {}
    for mode in ("fair", "unfair"):
        for name, rates in scenarios(share).items():
            progress(f"{mode} / {name}: {', '.join(f'{t} {r:.3f}/s' for t, r in rates.items())} ...")
            runs.setdefault(mode, {})[name] = per_tenant(simulate(rates, seconds, fair=mode == "fair"), seconds)
    summary: dict[str, Any] = {
        "mode": "virtual",
        "profile": PROFILE,
        "engines": ENGINES,
        "budget_ms": {"ttft_p99": BUDGET.ttft_s * 1000, "itl_p99": BUDGET.itl_s * 1000},
        "request_tokens": {"input": INPUT, "output": OUTPUT},
        "minutes": minutes,
        "capacity_rps": round(c, 4),
        "share_rps": round(share, 4),
        "rates_rps": {name: {t: round(r, 4) for t, r in rates.items()} for name, rates in scenarios(share).items()},
        "wall_s": None,
        **compare(runs, c * (INPUT + OUTPUT)),
    }
    summary["wall_s"] = round(time.monotonic() - started, 1)
    return summary


def scenarios(share: float) -> dict[str, dict[str, float]]:
    """Each scenario's request rate per tenant (see the module's runs), given a tenant's share."""
    usual = dict.fromkeys(WELL_BEHAVED, 0.6 * share)
    return {
        "quiet": usual,
        "noisy": {**usual, "noisy": 5 * share},
        "backlogged": {**dict.fromkeys(WELL_BEHAVED, 2 * share), "noisy": 5 * share},
        "alone": {"noisy": 5 * share},
    }


def compare(runs: dict[str, dict[str, Any]], capacity_tokens: float) -> dict[str, Any]:
    """Per mode (``fair``, ``unfair``): per tenant its attainment with and without the noisy one, its
    token share while all are backlogged, and Jain's index over shares per weight; from each mode's
    scenarios' per-tenant rows (``per_tenant``)."""
    summary: dict[str, Any] = {}
    for mode, by in runs.items():
        backlogged = by["backlogged"]
        total = sum(row["tokens"] for row in backlogged.values())
        shares = {t: backlogged[t]["tokens"] / total if total else 0.0 for t in TENANTS}
        tenants = {}
        for t in TENANTS:
            quiet = by["quiet"].get(t, {}).get("slo_attainment")
            noisy = by["noisy"][t]["slo_attainment"]
            tenants[t] = {
                "weight": WEIGHTS[t],
                "slo_attainment": noisy,
                "slo_attainment_without_noisy": quiet,
                "kept": round(noisy / quiet, 4) if quiet else None,
                "share": round(shares[t], 4),
                "refused_share_noisy_run": round(by["noisy"][t]["refused"] / by["noisy"][t]["requests"], 4),
            }
        alone = by["alone"]["noisy"]["tokens_per_s"]
        summary[mode] = {
            "tenants": tenants,
            "jain_index": jain([shares[t] / WEIGHTS[t] for t in TENANTS]),
            "well_behaved_kept_min": min(tenants[t]["kept"] or 0.0 for t in WELL_BEHAVED),
            "noisy_alone_share_of_capacity": round(alone / capacity_tokens, 4) if capacity_tokens else None,
            "scenarios": by,
        }
    return summary


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.38
    xs = range(len(TENANTS))
    for i, mode in enumerate(("fair", "unfair")):
        tenants = summary[mode]["tenants"]
        left.bar(
            [x + (i - 0.5) * width for x in xs], [tenants[t]["slo_attainment"] for t in TENANTS], width, label=mode
        )
        right.bar(
            [x + (i - 0.5) * width for x in xs],
            [tenants[t]["share"] for t in TENANTS],
            width,
            label=f"{mode} (Jain {summary[mode]['jain_index']:.3f})",
        )
    quiet = [summary["fair"]["tenants"][t]["slo_attainment_without_noisy"] for t in TENANTS]
    left.scatter(
        [x for x, q in zip(xs, quiet, strict=True) if q is not None],
        [q for q in quiet if q is not None],
        color="black",
        marker="_",
        s=400,
        label="without the noisy tenant",
        zorder=3,
    )
    left.set_title("SLO attainment, noisy tenant at 5x its share")
    right.axhline(0.25, color="gray", linestyle="--", linewidth=1, label="equal share")
    right.set_title("Token share while every tenant is backlogged")
    for ax in (left, right):
        ax.set_xticks(list(xs), TENANTS)
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=8)
    fig.suptitle(f"Noisy neighbour ({summary['mode']}): {summary['engines']} x {summary['profile']}, admission on")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=4.0, help="virtual minutes per run")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/fairness"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "command": " ".join(["python", "benchmarks/fairness.py", *sys.argv[1:]]),
        "virtual": virtual(args.minutes),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(summary["virtual"], out / "fairness.png")
    for mode in ("fair", "unfair"):
        v = summary["virtual"][mode]
        progress(
            f"{mode}: well-behaved keep >= {v['well_behaved_kept_min']:.3f} of their attainment, "
            f"Jain {v['jain_index']:.3f}, noisy alone gets {v['noisy_alone_share_of_capacity']} of C"
        )


if __name__ == "__main__":
    main()
