"""Noisy neighbour: four tenants of equal weight share an interactive pool; one sends 5x its share.

Virtual time, through the gateway's own core (``gateway sim``'s cluster): 8 engines
(``gemma4-nvfp4``) with a chunked-prefill budget of ``CHUNK_TOKENS`` tokens per step (vLLM's
``--max-num-batched-tokens``, as the interactive pool's engines run), admission on, TTFT p99
500 ms / ITL p99 50 ms, Poisson arrivals per tenant (1024-token prompts, 128-token answers).
``C`` is what the pool serves within its budgets, measured first with one tenant far over it
(``PROBE_RPS``); a tenant's share is C / 4 (four tenants). Every run, the noisy tenant's or not,
has the same engines.

Runs, each with fair queueing (``fair``) and without (``unfair``: one line by deadline):

1. quiet: the three well-behaved tenants alone at 60 % of their share each: the SLO attainment
   they have without the noisy one.
2. noisy: the same, plus the noisy tenant at 5x its share. The well-behaved must keep at least
   99 % of their quiet attainment.
3. backlogged: every tenant over its share (well-behaved 2x, noisy 5x): the token shares they
   get, and Jain's index over shares per weight (at least 0.95).
4. alone: the noisy tenant at 5x its share with the others idle: it gets the pool (work-conserving).

A tenant over its weighted share of the pool's slots (while others are active) starts only
where an engine keeps ``admission.backfill_reserve`` of its limit free, so the others find room
at once; alone, it takes every slot. Chunked prefill keeps its prompts from stalling the others'
decoding past their ITL budget (``--also-max-num-batched-tokens 8192``: the same runs with a
whole prompt in one step, for contrast).

Several replicas (``--replicas 2,4``): the same scenarios with fair queueing through N gateway
replicas, each tenant's requests spread over them as a Service spreads connections (``spread``),
the noisy tenant's all through one replica (``skewed``), or each tenant's through one replica, the
noisy one alone on its own (``apart``), the replicas telling each other
their tenants' requests (``core/tenant_share.py``) or not (``alone``, for contrast; they share
routing and load either way, as on a Redis store), with every engine's limit pinned at what one
replica learned, and as learned (see ``fleet``).

    python benchmarks/fairness.py [--minutes 4] [--replicas 2,4] [--max-num-batched-tokens 384]
                                  [--also-max-num-batched-tokens 8192] [--out benchmarks/results/fairness]
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

from priority_gateway.bench import envelope
from priority_gateway.core.classes import BATCH, INTERACTIVE, Budget
from priority_gateway.core.dispatcher import AdmissionSettings
from priority_gateway.core.limiter import LimitSettings
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
CHUNK_TOKENS = 384
"""Prefill tokens per engine step (``--max-num-batched-tokens``): a step with a full chunk beside the
decoding requests stays within the 50 ms ITL budget on this profile (0.093 ms a prefill token plus
the step's fixed 4 ms), and a 1024-token prompt still prefills in three steps, well within TTFT."""
PROBE_RPS = 30.0
"""The capacity probe's rate on ``ENGINES`` engines, far over what they serve within budget."""
LAYOUTS = ("spread", "skewed", "apart")
"""How tenants reach the replicas (``layout``)."""


def layout(name: str, replicas: int) -> dict[str, int]:
    """Tenants whose requests all go through one replica: none (``spread``: round robin, as a Service
    spreads connections), the noisy one's through replica 0 (``skewed``), or every tenant's through a
    replica of its own, the noisy one alone on replica 0 (``apart``: one client, one connection each)."""
    if name == "spread":
        return {}
    if name == "skewed":
        return {"noisy": 0}
    return {"noisy": 0, **{t: 1 + i % max(1, replicas - 1) for i, t in enumerate(WELL_BEHAVED)}}


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


def simulate(rates: dict[str, float], seconds: float, fair: bool, seed: int = 0, **options: Any) -> dict[str, Record]:
    """The scenario's records (``options``: ``cluster``'s)."""
    return cluster(fair, seed, **options).run(trace_of(rates, seconds, seed))["records"]


def trace_of(rates: dict[str, float], seconds: float, seed: int = 0) -> list[TraceRequest]:
    return sorted(
        (r for tenant, rate in rates.items() if rate > 0 for r in arrivals(tenant, rate, seconds, seed)),
        key=lambda r: r.arrival,
    )


def cluster(
    fair: bool,
    seed: int = 0,
    *,
    chunk: int = CHUNK_TOKENS,
    replicas: int = 1,
    share: bool = True,
    pinned: dict[str, int] | None = None,
    limit: float | None = None,
) -> Cluster:
    """The pool through ``replicas`` gateway replicas, the tenants in ``pinned`` each through one of them;
    ``limit``: every engine's concurrency limit fixed there, not learned."""
    limits = LimitSettings() if limit is None else LimitSettings(initial=limit, minimum=limit, maximum=limit)
    setup = ClusterSetup(
        [PoolSetup(INTERACTIVE, ENGINES, load_profile(PROFILE).with_overrides(max_num_batched_tokens=chunk))],
        policy="least_loaded",
        admission=AdmissionSettings(enabled=True, fair=fair, limits=limits),
        budgets={INTERACTIVE: BUDGET, BATCH: Budget()},
        home={INTERACTIVE: INTERACTIVE, BATCH: INTERACTIVE},
        seed=seed,
        replicas=replicas,
        share_tenants=share,
        tenant_replica=dict(pinned or {}),
    )
    return Cluster(setup)


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


def probe_rates(engines: int = ENGINES) -> dict[str, float]:
    """The capacity probe's one tenant and its rate: ``PROBE_RPS`` per ``ENGINES`` engines."""
    return {"probe": PROBE_RPS * engines / ENGINES}


def capacity(seconds: float, chunk: int = CHUNK_TOKENS) -> tuple[float, float]:
    """Requests/s the pool completes within its budgets when one tenant asks for far more, and the
    concurrency limit admission learned for its engines then (their mean)."""
    probe = cluster(True, chunk=chunk)
    records = probe.run(trace_of(probe_rates(), seconds))["records"]
    met = sum(meets_budget(r, BUDGET) for r in records.values() if r.req.arrival >= WARMUP_S)
    limits = [limit.limit for limit in probe.dispatchers[0].limits.values()]
    return met / (seconds - WARMUP_S), sum(limits) / len(limits)


def virtual(minutes: float, chunk: int = CHUNK_TOKENS, replicas: tuple[int, ...] = ()) -> dict[str, Any]:
    seconds = 60.0 * minutes
    started = time.monotonic()
    progress(f"capacity probe ({minutes:g} virtual minutes, {chunk} prefill tokens a step) ...")
    c, learned = capacity(seconds, chunk)
    share = c / len(TENANTS)
    progress(f"C = {c:.3f} req/s within budget (limit learned: {learned:.2f}); a tenant's share {share:.3f} req/s")
    runs: dict[str, dict[str, Any]] = {}
    for mode in ("fair", "unfair"):
        for name, rates in scenarios(share).items():
            progress(f"{mode} / {name}: {', '.join(f'{t} {r:.3f}/s' for t, r in rates.items())} ...")
            records = simulate(rates, seconds, fair=mode == "fair", chunk=chunk)
            runs.setdefault(mode, {})[name] = per_tenant(records, seconds)
    summary: dict[str, Any] = {
        "mode": "virtual",
        "profile": PROFILE,
        "max_num_batched_tokens": chunk,
        "engines": ENGINES,
        "budget_ms": {"ttft_p99": BUDGET.ttft_s * 1000, "itl_p99": BUDGET.itl_s * 1000},
        "request_tokens": {"input": INPUT, "output": OUTPUT},
        "minutes": minutes,
        "capacity_rps": round(c, 4),
        "learned_limit": round(learned, 2),
        "share_rps": round(share, 4),
        "rates_rps": {name: {t: round(r, 4) for t, r in rates.items()} for name, rates in scenarios(share).items()},
        "wall_s": None,
        **compare(runs, c * (INPUT + OUTPUT)),
    }
    if replicas:
        summary["replicas"] = fleet(summary, share, seconds, chunk, replicas)
    summary["wall_s"] = round(time.monotonic() - started, 1)
    return summary


def fleet(
    one: dict[str, Any], share: float, seconds: float, chunk: int, counts: tuple[int, ...]
) -> list[dict[str, Any]]:
    """The fair runs through N replicas, per layout, the replicas sharing their tenants or not.

    The replicas learn each engine's limit together, from everyone's gaps (``learned``: the product as
    it is, against one replica learning). To measure the shares alone, the same runs with every limit
    pinned at what one replica learned in the probe, against one replica pinned alike (``pinned``)."""
    capacity_tokens = one["capacity_rps"] * (INPUT + OUTPUT)
    pinned_limit = float(round(one["learned_limit"]))
    reference = {"learned": one["fair"]["tenants"]}
    out = []
    setups = [("pinned", 1, "spread", True)]
    setups += [("pinned", n, clients, sharing) for n in counts for clients in LAYOUTS for sharing in (True, False)]
    setups += [("learned", n, clients, True) for n in counts for clients in LAYOUTS[:2]]
    for limits, n, clients, sharing in setups:
        label = f"{n} replicas, {clients}, {'sharing' if sharing else 'alone'}, limits {limits}"
        limit = pinned_limit if limits == "pinned" else None
        by = {}
        for name, rates in scenarios(share).items():
            progress(f"{label} / {name} ...")
            records = simulate(
                rates, seconds, True, chunk=chunk, replicas=n, share=sharing, pinned=layout(clients, n), limit=limit
            )
            by[name] = per_tenant(records, seconds)
        row = compare({"fair": by}, capacity_tokens)["fair"]
        tenants = row["tenants"]
        if n == 1:
            reference["pinned"] = tenants
        for t in WELL_BEHAVED:
            one_replica = reference[limits][t]["slo_attainment"]
            vs = tenants[t]["slo_attainment"] / one_replica if one_replica else None
            tenants[t]["vs_one_replica"] = round(vs, 4) if vs is not None else None
        least = min(tenants[t]["vs_one_replica"] or 0.0 for t in WELL_BEHAVED)
        out.append(
            {
                "replicas": n,
                "layout": clients,
                "sharing": sharing,
                "limits": limits,
                "limit": limit,
                **row,
                "well_behaved_vs_one_replica_min": least,
            }
        )
        progress(
            f"{label}: Jain {row['jain_index']:.3f}, well-behaved keep >= {row['well_behaved_kept_min']:.3f}, "
            f">= {least:.3f} of one replica's attainment"
        )
    return out


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

    fleet = summary.get("replicas")
    if isinstance(fleet, list) and fleet:  # the virtual runs' replica setups; in real time, a count
        fig = plt.figure(figsize=(13, 8.5))
        grid = fig.add_gridspec(2, 2)
        left, right = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
        replicas_panel(fig.add_subplot(grid[1, :]), fleet)
    else:
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
    chunk = summary.get("max_num_batched_tokens")
    budget = f", {chunk} prefill tokens a step" if chunk else ""
    fig.suptitle(
        f"Noisy neighbour ({summary['mode']}): {summary['engines']} x {summary['profile']}{budget}, admission on"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def replicas_panel(ax: Any, fleet: list[dict[str, Any]]) -> None:
    """Per replica setup: Jain's index while all are backlogged, and the well-behaved tenants' least
    attainment with the noisy one present, as a share of one replica's."""
    labels = [
        f"{row['replicas']} {row['layout'] if row['replicas'] > 1 else ''}\n"
        f"{'shared' if row['sharing'] else 'not shared'}\n{row['limits']}"
        for row in fleet
    ]
    xs = range(len(fleet))
    width = 0.38
    ax.bar([x - width / 2 for x in xs], [row["jain_index"] for row in fleet], width, label="Jain's index, backlogged")
    ax.bar(
        [x + width / 2 for x in xs],
        [row["well_behaved_vs_one_replica_min"] for row in fleet],
        width,
        label="well-behaved attainment / one replica's (least)",
    )
    ax.axhline(0.95, color="gray", linestyle="--", linewidth=1, label="0.95")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_xlabel("replicas, how clients reach them; tenants shared or not; engine limits")
    ax.set_ylim(0, 1.1)
    ax.set_title("Several replicas: tenants shared or not; limits pinned or learned")
    ax.legend(fontsize=7, loc="lower left")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=4.0, help="virtual minutes per run")
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=CHUNK_TOKENS,
        help="the engines' prefill tokens per step (8192, the profile's: no budget worth the name)",
    )
    parser.add_argument(
        "--also-max-num-batched-tokens",
        default="",
        help="the one-replica runs again with these budgets, for contrast (e.g. 8192: one step per prompt)",
    )
    parser.add_argument("--replicas", default="", help="also through these numbers of replicas, e.g. 2,4")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/fairness"))
    args = parser.parse_args()
    provenance = envelope.start()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    replicas = tuple(int(n) for n in args.replicas.split(",") if n)
    summary: dict[str, Any] = virtual(args.minutes, args.max_num_batched_tokens, replicas)
    others = [int(n) for n in args.also_max_num_batched_tokens.split(",") if n]
    if others:
        summary["other_budgets"] = {str(chunk): virtual(args.minutes, chunk) for chunk in others}
    (out / "summary.json").write_text(json.dumps(provenance.wrap(summary), indent=2) + "\n")
    plot(summary, out / "fairness.png")
    for mode in ("fair", "unfair"):
        v = summary[mode]
        progress(
            f"{mode}: well-behaved keep >= {v['well_behaved_kept_min']:.3f} of their attainment, "
            f"Jain {v['jain_index']:.3f}, noisy alone gets {v['noisy_alone_share_of_capacity']} of C"
        )


if __name__ == "__main__":
    main()
