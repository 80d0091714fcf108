"""False refusals: refused requests that would have met their budgets had they been admitted.

A refusal is judged by replaying the run: at the refused request's arrival the whole cluster is
copied, the request is admitted in the copy past any limit or queue, and the copy runs until that
request and every request with a latency budget alive meanwhile have ended. The refusal was false
when, in the copy, the request met its own TTFT and ITL budgets. Everything else in the copy is
what the real run had at that moment, so the verdict is about this one request at the load it
really arrived to. A refused request always pays for the others' sake too: its prefill stalls the
requests decoding beside it. So the judgement also says how many false refusals would have cost
no one anything: no request admitted in both runs that met its budgets in the real run missed
them in the copy (requests the copy refused instead are the admission's doing, not a cost).

Rules:
- Only refusals of classes with a latency budget (TTFT or ITL) are judged; batch is shed or
  deferred, never refused for its budget.
- Up to ``samples`` refusals per class are judged, spread evenly over the run in arrival order;
  the estimate scales the share found false to all refusals.
- The replay must refuse each judged request again (the simulation is deterministic); a request
  it admits instead is counted in ``replay_diverged`` and not judged.
"""

from __future__ import annotations

from typing import Any

from priority_gateway.core.classes import Budget
from priority_gateway.simulate.cluster import Cluster, ClusterSetup, Record, WhatIf, budgeted
from priority_gateway.simulate.report import meets_budget
from priority_gateway.simulate.traces import TraceRequest


def spread(items: list[Record], samples: int) -> list[Record]:
    """At most ``samples`` of ``items``, evenly spaced, the first and the last included."""
    if samples <= 0:
        return []
    if len(items) <= samples:
        return list(items)
    if samples == 1:
        return [items[0]]
    step = (len(items) - 1) / (samples - 1)
    return [items[round(i * step)] for i in range(samples)]


def harmed(what_if: WhatIf, real: dict[str, Record], budgets: dict[str, Budget]) -> list[str]:
    """Requests admitted in both runs that met their budgets in the real run and missed them in the copy."""
    out = []
    for rid, other in what_if.others.items():
        before = real.get(rid)
        if before is None or before.rejected is not None or other.rejected is not None:
            continue
        budget = budgets.get(other.trace.cls, Budget())
        if meets_budget(before, budget) and not meets_budget(other, budget):
            out.append(rid)
    return out


def false_refusals(
    setup: ClusterSetup,
    trace: list[TraceRequest],
    flood_source: list[TraceRequest],
    first: dict[str, Any],
    samples: int,
) -> dict[str, dict[str, Any]]:
    """Per budgeted class: refusals, how many were judged, and how many of those were false."""
    records: list[Record] = sorted(first["records"].values(), key=lambda r: (r.req.arrival, r.req.id))
    classes = sorted({r.trace.cls for r in records if budgeted(setup.budgets.get(r.trace.cls, Budget()))})
    refused = {cls: [r for r in records if r.trace.cls == cls and r.rejected is not None] for cls in classes}
    chosen = {cls: spread(refused[cls], samples) for cls in classes}
    replay: dict[str, Any] = {"records": {}}
    cluster = Cluster(setup)
    cluster.what_if = {r.req.id for picked in chosen.values() for r in picked}
    if cluster.what_if:
        replay = cluster.run(trace, flood_source)
    out: dict[str, dict[str, Any]] = {}
    for cls in classes:
        judged = met = harmless = diverged = 0
        for r in chosen[cls]:
            again = replay["records"].get(r.req.id)
            if again is None or again.rejected is None:
                diverged += 1
                continue
            judged += 1
            what_if = cluster.what_if_records[r.req.id]
            if meets_budget(what_if.record, setup.budgets[cls]):
                met += 1
                harmless += not harmed(what_if, replay["records"], setup.budgets)
        total = sum(1 for r in records if r.trace.cls == cls)
        scale = len(refused[cls]) / judged if judged else 0.0
        out[cls] = {
            "refused": len(refused[cls]),
            "judged": judged,
            "would_have_met_budget": met,
            "of_which_harming_no_one": harmless,
            "false_refusals": round(met * scale, 1),
            "false_refusal_share": round(met * scale / total, 5) if total else 0.0,
            "false_refusals_harming_no_one": round(harmless * scale, 1),
            "replay_diverged": diverged,
        }
    return out
