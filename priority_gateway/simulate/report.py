"""What a cluster run measured, as the JSON ``gateway sim`` writes.

Per run, for all requests and again per class under ``by_class``: requests, completed,
rejected, TTFT and ITL percentiles, prefix hit ratio (tokens served from cache / prompt
tokens), the oracle and infinite-cache ceilings, load imbalance, SLO attainment and goodput;
with admission on, ``false_refusals`` of the budgeted classes (see ``counterfactual``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from priority_gateway.core.classes import CLASSES, Budget
from priority_gateway.engines.sim.sweep import percentile
from priority_gateway.simulate.cluster import ClusterSetup, Record, SimEngine, hit_ceiling


def meets_budget(rec: Record, budget: Budget) -> bool:
    """Completed, first token within the TTFT budget, the p99 of its own gaps within the ITL budget."""
    if rec.done is None or rec.first is None:
        return False
    if budget.ttft_s is not None and rec.first - rec.req.arrival > budget.ttft_s:
        return False
    if budget.itl_s is not None and rec.gaps and percentile(rec.gaps, 99) > budget.itl_s:
        return False
    return not (budget.deadline_s is not None and rec.done - rec.req.arrival > budget.deadline_s)


def _imbalance(engines: Iterable[SimEngine]) -> float:
    busy = [e.busy_s for e in engines]
    mean = sum(busy) / len(busy) if busy else 0.0
    return round(max(busy) / mean, 4) if mean > 0 else 1.0


def _block(
    records: list[Record],
    engines: list[SimEngine],
    window: tuple[float, float],
    budgets: dict[str, Budget],
    capacity: tuple[float, int] | None,
) -> dict[str, Any]:
    done = [r for r in records if r.done is not None]
    ttft = [(r.first - r.req.arrival) * 1000 for r in done if r.first is not None]
    gaps = [g * 1000 for r in done for g in r.gaps]
    prompt = sum(r.trace.input_len for r in done)
    cached = sum(r.cached_tokens for r in done)
    meeting = sum(1 for r in records if meets_budget(r, budgets[r.trace.cls]))
    start, end = window
    duration = end - start
    out = {
        "requests": len(records),
        "completed": len(done),
        "rejected": sum(1 for r in records if r.rejected is not None),
        "rejected_by_code": _count(r.rejected for r in records if r.rejected is not None),
        "preemptions": sum(r.preemptions for r in records),
        "ttft_p50_ms": _r(percentile(ttft, 50)),
        "ttft_p99_ms": _r(percentile(ttft, 99)),
        "itl_p50_ms": _r(percentile(gaps, 50)),
        "itl_p99_ms": _r(percentile(gaps, 99)),
        "prefix_hit_ratio": round(cached / prompt, 4) if prompt else 0.0,
        "load_imbalance": _imbalance(engines),
        "slo_attainment": round(meeting / len(records), 4) if records else 0.0,
        "goodput_rps": round(meeting / duration, 4) if duration > 0 else 0.0,
        "output_tokens_per_s": round(_tokens_within(done, start, end) / duration, 2) if duration > 0 else 0.0,
    }
    if capacity is not None:
        ordered = sorted((r.trace for r in records), key=lambda t: t.arrival)
        blocks, block_size = capacity
        out["oracle_hit_ratio"] = round(hit_ceiling(ordered, blocks, block_size), 4)
        out["infinite_hit_ratio"] = round(hit_ceiling(ordered, math.inf, block_size), 4)
    return out


def _tokens_within(done: list[Record], start: float, end: float) -> float:
    """Output tokens delivered inside [start, end], each request's spread evenly from first to last token."""
    total = 0.0
    for r in done:
        if r.first is None or r.done is None:
            continue
        span = r.done - r.first
        if span <= 0:
            total += r.output_tokens if start <= r.done <= end else 0
            continue
        inside = max(0.0, min(end, r.done) - max(start, r.first))
        total += r.output_tokens * inside / span
    return total


def _count(values: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return counts


def _r(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 2)


def summarize(setup: ClusterSetup, result: dict[str, Any], oracle: bool = True) -> dict[str, Any]:
    records: list[Record] = list(result["records"].values())
    engines: dict[str, SimEngine] = result["engines"]
    starts = [r.req.arrival for r in records]
    ends = [r.done for r in records if r.done is not None]
    duration = (max(ends) - min(starts)) if ends and starts else 0.0
    # Rates are over the arrival window (goodput: SLO-meeting requests that arrived in it; tokens:
    # those delivered in it), not the makespan, which a backlog's drain would stretch.
    window = (min(starts), max(starts)) if starts else (0.0, 0.0)
    home = {
        cls: setup.home.get(cls) or (cls if any(p.name == cls for p in setup.pools) else setup.pools[0].name)
        for cls in CLASSES
    }
    pool_blocks = {p.name: (p.engines * p.profile.num_blocks, p.profile.block_size) for p in setup.pools}
    all_blocks = (sum(b for b, _ in pool_blocks.values()), setup.pools[0].profile.block_size)
    summary = _block(records, list(engines.values()), window, setup.budgets, all_blocks if oracle else None)
    by_class = {}
    for cls in CLASSES:
        mine = [r for r in records if r.trace.cls == cls]
        if not mine:
            continue
        pool_engines = [e for e in engines.values() if e.pool == home[cls]]
        by_class[cls] = _block(mine, pool_engines, window, setup.budgets, pool_blocks[home[cls]] if oracle else None)
    summary["by_class"] = by_class
    summary["by_pool"] = {
        p.name: {
            "engines": p.engines,
            "profile": p.profile.name,
            "load_imbalance": _imbalance(e for e in engines.values() if e.pool == p.name),
            "busy_s": [round(e.busy_s, 2) for e in engines.values() if e.pool == p.name],
        }
        for p in setup.pools
    }
    for name, spec in result.get("policies", {}).items():
        ratio = getattr(spec, "max_bound_ratio", None)
        if ratio is not None:
            summary["by_pool"][name]["max_load_over_bound"] = round(ratio, 4)
    if result.get("share") is not None:
        summary["share"] = result["share"]
    if setup.admission.enabled and "overfilled" in result:
        summary["overfilled"] = result["overfilled"]
    summary["duration_s"] = round(duration, 2)
    summary["window_s"] = round(window[1] - window[0], 2)
    return summary
