"""Medians over repeated runs of ``benchmarks/fairness_realtime.py``: real time on a shared host is
noisy, so the report quotes each number's median over the repeats, beside every repeat's own.

Reads each run's ``summary.json`` and ``runs.json`` (its ``--out``), and writes ``summary.json``
(the shape of one run's, less the per-scenario rows, each number the median of the repeats') with
``repeats``: per repeat its directory, its headline numbers and the host's load in each scenario
(the machine's busy share over the run; the benchmark's own processes' share of the cores), and
the plot of the medians (``benchmarks/fairness.py``'s ``plot``). All repeats must have the same
replicas, engines and modes.

    python benchmarks/fairness_repeats.py DIR DIR [DIR ...] --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from fairness import TENANTS, plot

from priority_gateway.bench import envelope

TENANT_FIELDS = ("slo_attainment", "slo_attainment_without_noisy", "kept", "share", "refused_share_noisy_run")
MODE_FIELDS = ("jain_index", "well_behaved_kept_min", "noisy_alone_share_of_capacity")
SAME = ("mode", "profile", "max_num_batched_tokens", "engines", "replicas", "budget_ms", "request_tokens", "seconds")


def median(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 4) if known else None


def load(run: Path) -> dict[str, Any]:
    return {
        "summary": json.loads((run / "summary.json").read_text()),
        "runs": json.loads((run / "runs.json").read_text()),
    }


def host_load(runs: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Per scenario: the machine's busy share while it ran, and the benchmark's own share of the cores."""
    return {
        name: {"machine_busy": run["cpu"]["machine_busy_share"], "ours": run["cpu"]["ours_share_of_cores"]}
        for name, run in runs.items()
    }


def medians(repeats: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The repeats' summaries (``fairness_realtime.py``'s, by directory) folded into one: every number their
    median."""
    summaries = [r["summary"] for _, r in repeats]
    first = summaries[0]
    for field in SAME:
        if any(s.get(field) != first.get(field) for s in summaries):
            raise SystemExit(f"the repeats differ in {field!r}: not repeats of one run")
    modes = [m for m in ("fair", "unfair") if all(m in s for s in summaries)]
    out: dict[str, Any] = {field: first.get(field) for field in SAME}
    out["capacity_rps"] = median([s["capacity_rps"] for s in summaries])
    for mode in modes:
        tenants = {
            t: {
                "weight": first[mode]["tenants"][t]["weight"],
                **{f: median([s[mode]["tenants"][t].get(f) for s in summaries]) for f in TENANT_FIELDS},
            }
            for t in TENANTS
        }
        out[mode] = {"tenants": tenants, **{f: median([s[mode][f] for s in summaries]) for f in MODE_FIELDS}}
    out["repeats"] = [
        {
            "out": name,
            "commit": r["summary"].get("commit"),
            "capacity_rps": r["summary"]["capacity_rps"],
            **{
                mode: {
                    **{f: r["summary"][mode][f] for f in MODE_FIELDS},
                    "slo_attainment": {t: r["summary"][mode]["tenants"][t]["slo_attainment"] for t in TENANTS},
                }
                for mode in modes
            },
            "host_load": host_load(r["runs"]),
        }
        for name, r in repeats
    ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="fairness_realtime.py --out directories")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    provenance = envelope.start()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = medians([(run, load(Path(run))) for run in args.runs])
    summary["mode"] = f"{summary['mode']}, median of {len(args.runs)} runs"
    (out / "summary.json").write_text(json.dumps(provenance.wrap(summary), indent=2) + "\n")
    if "fair" in summary and "unfair" in summary:
        plot(summary, out / "fairness_realtime.png")
    headline = {m: {f: summary[m][f] for f in MODE_FIELDS} for m in ("fair", "unfair") if m in summary}
    print(json.dumps(headline, indent=2))


if __name__ == "__main__":
    main()
