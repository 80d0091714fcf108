"""The budgets plan's single-GPU scenes in ``gateway sim``, and the simulator against the device.

    python benchmarks/gpu/budgets_sim.py --res RES [--res RES2 ...] --out benchmarks/results/gpu/budgets
    python benchmarks/gpu/budgets_sim.py --predict 17 --out benchmarks/results/gpu/budgets   # before a sitting

Rules:
- For every front a sitting ran (``budgets-<arrivals>-<front>``): the same requests
  (``budgets.scene_requests``, each level's rate, seconds, lengths and seed as ``sweep.json`` says),
  each level starting when it started on the device (``started_s``), replayed in virtual time through
  the gateway's core in front of one simulated engine (``simulate.cluster``): with the front's admission
  as the server reads its configuration (``runtime.admission_settings``: learned, pinned, off);
  ``vllm-router`` as the gateway with admission off (before one engine neither chooses anything:
  both pass every request on at once).
- The engine: the ``h200-7b-bf16`` profile (fitted to the device) with the device engine's limits
  (``--max-num-seqs``, ``--max-num-batched-tokens``) and the KV cache vLLM reported, as the sitting's
  ``engines.json`` records them.
- Figures per level as ``budgets.level_figures`` computes them on the device (one code path): each
  simulated request becomes what the client would have recorded (sent at its arrival, an event per
  step that gave it a token, its end or its refusal).
- The fleet scenes (``fleet-itl-shipped/*``, ``shared-gpu-throttle-*``: ``fleet_itl.py`` runs): the
  interactive pool's 2 engines and the batch pool's 2 with their profiles' limits, all 4 on one
  device (``engines_per_device``), the run's replicas, Poisson interactive at its rate with the prompt
  length the engines counted (the scene sends text: its tokens are the served tokenizer's), the batch
  flood kept at its size with the same lengths, its budgets; the interactive figures of the requests
  that arrived after its warm-up, against the run's own.
- ``--predict X``: no sitting yet; the plan's single-engine scenes as it would run them on an engine
  whose capacity is X requests/s (the plan's rates, its fronts, each level 15 s with the pause the
  device takes after it), written as ``predicted.json``.
- Compared: goodput, TTFT p50 and p99, ITL p99; ``within_15pct`` when ``|sim - device| <= 0.15 *
  device``. Written: ``sim.json`` and ``sim_vs_gpu.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import budgets
import engine_args

from priority_gateway.bench import envelope
from priority_gateway.bench.loadgen import Sample
from priority_gateway.config.load import parse_config
from priority_gateway.core.classes import BATCH, INTERACTIVE, Budget
from priority_gateway.core.dispatcher import AdmissionSettings
from priority_gateway.engines.sim.profile import load_profile
from priority_gateway.runtime import admission_settings
from priority_gateway.simulate.cluster import Cluster, ClusterSetup, PoolSetup, Record
from priority_gateway.simulate.report import meets_budget
from priority_gateway.simulate.traces import TraceRequest, load_trace

METRICS = ("goodput_rps", "ttft_p50_ms", "ttft_p99_ms", "itl_p99_ms")
TOLERANCE = 0.15
PROFILE = "h200-7b-bf16"
TAIL_SCALE = 1.0
"""``--tail-scale``: the profile's step tail times this (``Profile.with_tail_scaled``)."""


def _admission(run: dict[str, Any]) -> AdmissionSettings:
    config = run.get("gateway_config")
    if config is None:  # vllm-router: every request on at once
        return AdmissionSettings(enabled=False)
    return admission_settings(parse_config(config))


def _seats(run: dict[str, Any]) -> int | None:
    """The engines' seats as the front's interactive pool declares them (None: undeclared, or no gateway)."""
    config = run.get("gateway_config")
    if config is None:
        return None
    pool = parse_config(config).pools.get(INTERACTIVE)
    return pool.max_num_seqs if pool is not None else None


def _profile(engines: list[dict[str, Any]]):
    profile = load_profile(PROFILE).with_tail_scaled(TAIL_SCALE)
    if not engines:
        return profile
    values = engine_args.flag_values(engines[0].get("device_args") or [])
    tokens = engines[0].get("kv_cache_tokens")
    if "--kv-cache-memory-bytes" in values and not tokens:
        tokens = profile.num_blocks * profile.block_size  # the profile's cache is those 12 GiB
    return profile.with_overrides(
        max_num_seqs=int(values["--max-num-seqs"]) if "--max-num-seqs" in values else None,
        max_num_batched_tokens=int(values["--max-num-batched-tokens"])
        if "--max-num-batched-tokens" in values
        else None,
        max_model_len=int(values["--max-model-len"]) if "--max-model-len" in values else None,
        num_blocks=int(tokens) // profile.block_size if tokens else None,
    )


def _samples(records: list[Record]) -> list[Sample]:
    """What the client would have recorded of each simulated request."""
    out = []
    for rec in records:
        sample = Sample(INTERACTIVE, rec.req.arrival)
        if rec.rejected is not None:
            sample.refused, sample.done = f"429 {rec.rejected}", rec.req.arrival
        elif rec.first is not None:
            t = rec.first
            sample.chunks = [t]
            for gap in rec.gaps:
                t += gap
                sample.chunks.append(t)
            sample.done = rec.done
            sample.output_tokens = rec.output_tokens
            if rec.done is None:
                sample.cancelled = True
        else:
            sample.cancelled = True
        out.append(sample)
    return out


def simulate_sweep(sweep: dict[str, Any], run: dict[str, Any], engines: list[dict[str, Any]], traces: Path | None):
    """One front's sweep in virtual time: its levels' figures, as the device's are."""
    trace: list[TraceRequest] = []
    spans = []
    for level in sweep["levels"]:
        reqs = budgets.scene_requests(
            sweep["arrivals"], level["rate"], level["seconds"], input_len=sweep["input"],
            output_len=sweep["output"], seed=level["seed"], traces=traces,
        )  # fmt: skip
        for r in reqs:
            r.arrival += level["started_s"]
        spans.append((len(trace), len(trace) + len(reqs)))
        trace += reqs
    budget_ms = (sweep["budget_ms"]["ttft_p99"], sweep["budget_ms"]["itl_p99"])
    setup = ClusterSetup(
        [PoolSetup(INTERACTIVE, 1, _profile(engines), seats=_seats(run))],
        "prefix",
        _admission(run),
        {INTERACTIVE: Budget(budget_ms[0] / 1000.0, budget_ms[1] / 1000.0)},
    )
    records = Cluster(setup).run(trace)["records"]
    rows = []
    for level, (lo, hi) in zip(sweep["levels"], spans, strict=True):
        mine = [records[f"t{i}"] for i in range(lo, hi)]
        figures = budgets.level_figures(_samples(mine), level["seconds"], budget_ms)
        rows.append({"label": level["label"], "rate": level["rate"], "warmup": level.get("warmup", False), **figures})
    return rows


def compare(gpu: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in METRICS:
        g, s = gpu.get(key), sim.get(key)
        if g is None or s is None:
            out[key] = {"gpu": g, "sim": s, "within_15pct": None}
            continue
        ratio = None if g == 0 else round(s / g, 3)
        out[key] = {"gpu": g, "sim": s, "sim_over_gpu": ratio, "within_15pct": abs(s - g) <= TOLERANCE * abs(g)}
    return out


def _flag(command: list[str], name: str, default: str) -> str:
    """A flag's value as argparse reads it: the last one given."""
    at = [i for i, arg in enumerate(command[:-1]) if arg == name]
    return command[at[-1] + 1] if at else default


def fleet_folders(folders: list[Path]) -> list[Path]:
    out = []
    for res in folders:
        out += sorted(p.parent for p in res.glob("fleet-itl-shipped/*/runs.json"))
        out += sorted(p.parent for p in res.glob("shared-gpu-throttle-*/runs.json"))
    return out


def simulate_fleet(folder: Path) -> list[dict[str, Any]]:
    """Each run of one ``fleet_itl.py`` folder in virtual time: the interactive figures beside the run's."""
    command = (folder / "command.txt").read_text().split()
    engines = json.loads((folder / "engines.json").read_text())["engines"]
    by_pool = {e["pool"]: e for e in engines}
    rate, output = float(_flag(command, "--rate", "2")), int(_flag(command, "--output", "128"))
    seconds, warmup = float(_flag(command, "--seconds", "75")), float(_flag(command, "--warmup-s", "15"))
    flood = int(_flag(command, "--flood", "192"))
    ttft_ms, itl_ms = (float(x) for x in _flag(command, "--budget-ms", "1000,100").split(","))
    budget = Budget(ttft_ms / 1000.0, itl_ms / 1000.0)
    rows = []
    for run in json.loads((folder / "runs.json").read_text()):
        device = run["interactive"]
        prompt = round(device.get("prompt_tokens", 0) / max(1, device.get("completed", 0))) or 1024
        minutes = (warmup + seconds) / 60.0
        spec = f"poisson:rate={rate},input={prompt},output={output},minutes={minutes:g},seed={run['repeat']}"
        trace = load_trace(Path(spec), INTERACTIVE)
        flood_source = load_trace(Path(f"poisson:rate=1,input={prompt},output={output},minutes=30,seed=f"), BATCH)
        setup = ClusterSetup(
            [
                PoolSetup(INTERACTIVE, 2, _profile([by_pool["interactive"]])),
                PoolSetup(BATCH, 2, _profile([by_pool["batch"]]), "priority"),
            ],
            "prefix",
            AdmissionSettings(),
            {INTERACTIVE: budget, BATCH: Budget()},
            flood=flood,
            flood_until=warmup + seconds,
            replicas=run["replicas"],
            engines_per_device=4,
        )
        records = [r for r in Cluster(setup).run(trace, flood_source)["records"].values() if not r.flood]
        measured = [r for r in records if r.trace.cls == INTERACTIVE and r.req.arrival >= warmup]
        samples = _samples(measured)
        figures = budgets.level_figures(samples, seconds, (ttft_ms, itl_ms))
        figures["goodput_rps"] = round(sum(meets_budget(r, budget) for r in measured) / seconds, 3)
        gpu = {
            "goodput_rps": device.get("goodput_requests_per_s"),
            "ttft_p50_ms": device.get("ttft_p50_ms"),
            "ttft_p99_ms": device.get("ttft_p99_ms"),
            "itl_p99_ms": device.get("itl_p99_ms"),
        }
        scene = f"{folder.parent.name}/{folder.name}" if folder.parent.name.startswith("fleet") else folder.name
        rows.append({"scene": scene, "replicas": run["replicas"], "prompt_tokens": prompt, "gpu": gpu, "sim": figures})
    return rows


def run(folders: list[Path], out: Path, traces: Path | None, provenance: envelope.Envelope) -> dict[str, Any]:
    sweeps = budgets.load_sweeps(folders)
    fleets = fleet_folders(folders)
    if not sweeps and not fleets:
        raise SystemExit(f"no budgets-*/sweep.json nor fleet runs under {', '.join(map(str, folders))}")
    simulated, compared = [], []
    for sweep in sweeps:
        run_ = sweep["run"]
        folder = Path(sweep["folder"])
        try:
            engines = json.loads((folder / "engines.json").read_text())["engines"]
        except (OSError, ValueError, KeyError):
            engines = run_.get("engines", [])
        rows = simulate_sweep(sweep, run_, engines, traces)
        simulated.append({"arrivals": sweep["arrivals"], "front": sweep["front"], "levels": rows})
        for device, sim in zip(sweep["levels"], rows, strict=True):
            if device.get("warmup"):
                continue
            compared.append(
                {
                    "arrivals": sweep["arrivals"],
                    "front": sweep["front"],
                    "level": device["label"],
                    "rate": device["rate"],
                    **compare(device, sim),
                }
            )
    for folder in fleets:
        for row in simulate_fleet(folder):
            simulated.append({"scene": row["scene"], "replicas": row["replicas"], "levels": [row["sim"]]})
            level = f"{row['replicas']} replica(s)"
            compared.append(
                {"arrivals": "fleet", "front": row["scene"], "level": level, **compare(row["gpu"], row["sim"])}
            )
    within = {
        key: [row[key]["within_15pct"] for row in compared if row[key]["within_15pct"] is not None] for key in METRICS
    }
    summary = {
        "profile": PROFILE,
        "tail_scale": TAIL_SCALE,
        "tolerance": TOLERANCE,
        "within_15pct_share": {k: round(sum(v) / len(v), 3) if v else None for k, v in within.items()},
        "misses": [
            {"arrivals": r["arrivals"], "front": r["front"], "level": r["level"], "metric": k, **r[k]}
            for r in compared
            for k in METRICS
            if r[k]["within_15pct"] is False
        ],
        "rows": compared,
    }
    out.mkdir(parents=True, exist_ok=True)
    sim = provenance.wrap({"profile": PROFILE, "sweeps": simulated})
    (out / "sim.json").write_text(json.dumps(sim, indent=1))
    summary = provenance.wrap(summary)
    (out / "sim_vs_gpu.json").write_text(json.dumps(summary, indent=1))
    return summary


PREDICT_FRONTS = ("ours-admission", "cap-16", "cap-32", "cap-64", "ours-off")


def predict(capacity_rps: float, out: Path, traces: Path | None, provenance: envelope.Envelope) -> dict[str, Any]:
    """The budgets plan's single-engine scenes in virtual time, before any sitting (see the rules)."""
    import harness

    engines = [{"device_args": ["--max-num-seqs=256", "--max-num-batched-tokens=384", "--max-model-len=32768"]}]
    result: dict[str, Any] = {"profile": PROFILE, "capacity_rps": capacity_rps, "by_arrivals": {}}
    for arrivals, fractions in (("poisson", harness.POISSON_FRACTIONS), ("bursty", harness.BURSTY_FRACTIONS)):
        fronts = {}
        for front in PREDICT_FRONTS:
            levels: list[dict[str, Any]] = []
            t = 0.0
            if front == "ours-admission":
                levels.append({"label": "warmup", "rate": 0.75 * capacity_rps, "seconds": 20.0, "seed": 0})
                levels[-1] |= {"started_s": 0.0, "warmup": True}
                t = 25.0
            for i, f in enumerate(fractions):
                rate = round(capacity_rps * f, 2)
                levels.append({"label": f"r={rate:g}", "rate": rate, "seconds": 15.0, "seed": i + 1, "started_s": t})
                t += 15.0 + 8.0 + max(0.0, f - 1.0) * 15.0
            sweep = {"arrivals": arrivals, "input": 1024, "output": 128, "levels": levels}
            sweep["budget_ms"] = {"ttft_p99": 500, "itl_p99": 50}
            run_ = {"gateway_config": harness.budgets_front(front, "http://127.0.0.1:8101")}
            fronts[front] = [r for r in simulate_sweep(sweep, run_, engines, traces) if not r["warmup"]]
        best = [
            max((f for f in fronts if f.startswith("cap-")), key=lambda f: fronts[f][i]["goodput_rps"])
            for i in range(len(fractions))
        ]
        ratios = [
            round(fronts["ours-admission"][i]["goodput_rps"] / fronts[b][i]["goodput_rps"], 3)
            if fronts[b][i]["goodput_rps"]
            else None
            for i, b in enumerate(best)
        ]
        result["by_arrivals"][arrivals] = {"fronts": fronts, "best_static_cap": best, "gateway_over_best_cap": ratios}
    out.mkdir(parents=True, exist_ok=True)
    result = provenance.wrap(result)
    (out / "predicted.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--res", type=Path, action="append", default=[], help="a sitting's res folder")
    p.add_argument(
        "--predict", type=float, default=None, metavar="X", help="no sitting: the plan's scenes at capacity X"
    )
    p.add_argument("--traces", type=Path, default=Path(__file__).resolve().parents[1] / "traces")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tail-scale", type=float, default=1.0, help="the profile's step tail times this")
    args = p.parse_args()
    global TAIL_SCALE
    TAIL_SCALE = args.tail_scale
    provenance = envelope.start()
    if args.predict is not None:
        predicted = predict(args.predict, args.out, args.traces, provenance)
        print(json.dumps({k: v["gateway_over_best_cap"] for k, v in predicted["by_arrivals"].items()}))
        return
    if not args.res:
        raise SystemExit("budgets_sim.py: give --res RES (a sitting's results) or --predict X")
    summary = run(args.res, args.out, args.traces, provenance)
    print(json.dumps({"within_15pct_share": summary["within_15pct_share"], "misses": len(summary["misses"])}))


if __name__ == "__main__":
    main()
