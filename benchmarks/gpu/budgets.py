"""The seed's single-GPU experiment, live: one engine, one front, interactive traffic open loop at rising rates.

    python benchmarks/gpu/budgets.py sweep --url http://127.0.0.1:8200 --engine http://127.0.0.1:8101 \\
        --front ours-admission --arrivals poisson --rates 6,12,17,22,34 --level-s 15 --out DIR
    python benchmarks/gpu/budgets.py analyze --res RES [--res RES2 ...] --out benchmarks/results/gpu/budgets

``harness.py --plan budgets`` runs one ``sweep`` per front and arrival process (its folders
``budgets-<arrivals>-<front>``); ``analyze`` puts every front side by side.

Rules:
- The scene (``scene_requests``): ``poisson`` arrivals at the level's rate, or ``bursty`` ones (the
  Azure LLM conversation trace's arrival times from its start, scaled so that their mean rate is the
  level's); in both, prompt and output lengths drawn alike (``input``, ``output``, each ±25 %,
  seeded: the n-th measured level by the sweep's seed plus n, whether a warm-up ran before it or
  not), every prompt distinct. So one level differs from the next, and one front from another
  at the same level, only in what is measured. ``budgets_sim.py`` replays the same requests in
  ``gateway sim``.
- Levels run in rising order against one front process, after a warm-up level that is not
  analysed: a gateway keeps what it learned from one level to the next, as a running one would.
- Open loop: each request is sent at its arrival time whatever is in flight, streamed, token-id
  prompts, ``ignore_eos``, never retried (``bench.loadgen.stream_one``, as ``gateway bench`` sends).
  A level ends when every request has ended, or ``drain_s`` after its last arrival: those still
  running then are cut and count as missing their budgets.
- Per level: every request's timeline (sent, each token event, end, refusal or error, prompt and
  cached tokens; ms since the level began) in ``timelines-<level>.json.gz``, the engine's
  ``/metrics`` before and after, and the front's every second while it runs (a gateway's learned
  limit, queue and in-flight requests).
- Figures (``level_figures``): a request meets the budgets when it completed, its TTFT is within the
  TTFT budget and the p99 of its own gaps within the ITL budget (``bench.stats.meets_slo``, as
  ``gateway bench`` judges). Admitted: not refused (429). Admitted goodput: requests meeting the
  budgets per second of the arrival window; attainment: those over the admitted; refused share:
  refused over offered; TTFT p50/p99 and ITL p99 over the admitted requests that completed.
- ``analyze``: per arrival process and offered rate, every front's figures (a repeat of one,
  ``<front>@2``, side by side with it; the gateway's ratio is its worse run's); the best static cap is
  the cap front (``cap-N``: the gateway's limit pinned at N; ``engine-cap-N``: the engine's own
  ``--max-num-seqs N``) with the highest goodput at that rate; the gateway's goodput over it, and
  whether its admitted requests met both budgets at the p99.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import math
import random
import re
import secrets
import statistics
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fronts import front_kind, is_cap, is_ours

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from priority_gateway.bench import envelope, stats
from priority_gateway.bench.clients import open_client
from priority_gateway.bench.loadgen import Sample, Target, now, stream_one
from priority_gateway.bench.workload import TokenIds, TraceArrival
from priority_gateway.engines.sim.sweep import percentile
from priority_gateway.simulate.traces import TRACE_BLOCK_TOKENS, TraceRequest, load_trace

MODEL = "llama7b"
BUDGET_MS = (500.0, 50.0)
AZURE = "azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
AZURE_SPAN_S = 600.0
"""The stretch of the Azure trace whose mean rate is scaled to a level's."""
ARRIVALS = ("poisson", "bursty")
_GATEWAY_SERIES = {
    "limit": re.compile(r"^gateway_engine_concurrency_limit\{[^}]*\} (\S+)$", re.M),
    "inflight": re.compile(r"^gateway_inflight\{[^}]*\} (\S+)$", re.M),
    "queued": re.compile(r'^gateway_queue_depth\{class="interactive"[^}]*\} (\S+)$', re.M),
    # What holds requests back below the limit: the first-token check against the prefill ahead.
    "ttft_margin": re.compile(r'^gateway_pool_ttft_margin\{pool="interactive"\} (\S+)$', re.M),
    "pending_prefill": re.compile(r"^gateway_engine_pending_prefill_tokens\{[^}]*\} (\S+)$", re.M),
    "first_token_fixed_s": re.compile(
        r'^gateway_pool_first_token_line_seconds\{pool="interactive",term="fixed"\} (\S+)$', re.M
    ),
    "first_token_per_1k_s": re.compile(
        r'^gateway_pool_first_token_line_seconds\{pool="interactive",term="per_1k_tokens"\} (\S+)$', re.M
    ),
}


# --- the scene ----------------------------------------------------------------------------------


def scene_requests(
    arrivals: str,
    rate: float,
    seconds: float,
    *,
    input_len: int = 1024,
    output_len: int = 128,
    seed: int = 0,
    traces: Path | None = None,
) -> list[TraceRequest]:
    """One level's requests (see the module's rules); the simulator replays exactly these."""
    if arrivals == "poisson":
        rng = random.Random(f"budgets/poisson/{seed}/{rate}")
        times, t = [], 0.0
        while (t := t + rng.expovariate(rate)) < seconds:
            times.append(t)
    elif arrivals == "bursty":
        if traces is None:
            raise ValueError("bursty arrivals need the traces folder (the Azure conversation trace)")
        trace = [r.arrival for r in load_trace(traces / AZURE, minutes=AZURE_SPAN_S / 60.0)]
        wanted = min(len(trace) - 1, max(1, round(rate * seconds)))
        # The first ``wanted`` arrivals, squeezed or stretched onto the level: its mean rate is the
        # level's, its bursts the trace's.
        first, span = trace[0], trace[wanted] - trace[0]
        times = [(t - first) * seconds / span for t in trace[:wanted]]
    else:
        raise ValueError(f"arrivals: one of {ARRIVALS}, got {arrivals!r}")
    lengths = random.Random(f"budgets/lengths/{seed}/{arrivals}/{rate}")
    out, next_id = [], 1 << 48
    for t in times:
        n = max(1, round(input_len * lengths.uniform(0.75, 1.25)))
        o = max(1, round(output_len * lengths.uniform(0.75, 1.25)))
        blocks = -(-n // TRACE_BLOCK_TOKENS)
        out.append(TraceRequest(t, n, o, tuple(range(next_id, next_id + blocks)), source=arrivals))
        next_id += blocks
    return out


# --- one level, open loop -------------------------------------------------------------------------


async def open_level(
    target: Target, arrivals: list[TraceArrival], drain_s: float
) -> tuple[list[Sample], float, list[bool]]:
    """Send each at its time; wait for all, at most ``drain_s`` after the last. (samples, start, cut)."""
    loop = asyncio.get_running_loop()
    samples: list[Sample] = []
    tasks: list[asyncio.Task[None]] = []
    start = now()
    for arrival in arrivals:
        wait = start + arrival.arrival - now()
        if wait > 0:
            await asyncio.sleep(wait)
        sample = Sample(arrival.group, now())
        sample.lag = max(0.0, sample.sent - start - arrival.arrival)
        samples.append(sample)
        tasks.append(loop.create_task(stream_one(target, arrival.spec(), sample)))
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=drain_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    cut = [not t.done() or t.cancelled() or s.cancelled for t, s in zip(tasks, samples, strict=True)]
    for sample, was_cut in zip(samples, cut, strict=True):
        if was_cut:
            sample.cancelled = True
            sample.done = sample.done or now()
    return samples, start, cut


def level_figures(
    samples: list[Sample], arrival_window_s: float, budget_ms: tuple[float, float] = BUDGET_MS
) -> dict[str, Any]:
    ttft_ms, itl_ms = budget_ms
    offered = len(samples)
    refused = [s for s in samples if s.refused is not None]
    admitted = [s for s in samples if s.refused is None]
    done = [s for s in admitted if stats.completed(s) and s.chunks]
    meeting = [s for s in admitted if stats.meets_slo(s, ttft_ms, itl_ms)]
    ttfts = [(s.chunks[0] - s.sent) * 1000.0 for s in done]
    gaps = [g * 1000.0 for s in done for g in stats.gaps(s)]

    def q(values: list[float], p: float) -> float | None:
        return round(percentile(values, p), 2) if values else None

    window = max(arrival_window_s, 1e-9)
    return {
        "offered": offered,
        "offered_rps": round(offered / window, 3),
        "admitted": len(admitted),
        "completed": len(done),
        "refused": len(refused),
        "refused_share": round(len(refused) / offered, 4) if offered else 0.0,
        "errors": sum(1 for s in admitted if s.error is not None),
        "cut": sum(1 for s in admitted if s.cancelled),
        "meeting_budgets": len(meeting),
        "goodput_rps": round(len(meeting) / window, 3),
        "attainment_of_admitted": round(len(meeting) / len(admitted), 4) if admitted else None,
        "ttft_p50_ms": q(ttfts, 50),
        "ttft_p99_ms": q(ttfts, 99),
        "itl_p50_ms": q(gaps, 50),
        "itl_p99_ms": q(gaps, 99),
        "admitted_meet_p99_budgets": bool(done) and (q(ttfts, 99) or 0.0) <= ttft_ms and (q(gaps, 99) or 0.0) <= itl_ms,
        "output_tokens_per_s": round(sum(stats.tokens(s) for s in done) / window, 1),
        "cached_tokens": sum(s.cached_tokens or 0 for s in done),
        "send_lag_p99_ms": q([s.lag * 1000.0 for s in samples], 99),
    }


def timelines(samples: list[Sample], start: float) -> list[dict[str, Any]]:
    def ms(t: float | None) -> float | None:
        return None if t is None else round((t - start) * 1000.0, 1)

    return [
        {
            "sent": ms(s.sent),
            "events": [ms(t) for t in s.chunks],
            "done": ms(s.done),
            "refused": s.refused,
            "error": s.error,
            "cut": s.cancelled,
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "output_tokens": s.output_tokens,
        }
        for s in samples
    ]


def _get(url: str, timeout: float = 5.0) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode(errors="replace"))
    except (OSError, ValueError):
        return ""


class FrontSampler:
    """The gateway's learned limit, in-flight and queued requests, and what its first-token check reads (the
    margin, the line, the pending prefill), every ``every_s``, in a thread."""

    def __init__(self, url: str, every_s: float = 1.0) -> None:
        self.url, self.every_s = url, every_s
        self.series: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._origin = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            text = _get(self.url + "/metrics", timeout=2.0)
            if not text:
                continue
            point = {"t": round(time.monotonic() - self._origin, 2)}
            for name, pattern in _GATEWAY_SERIES.items():
                found = pattern.findall(text)
                if found:
                    point[name] = sum(float(v) for v in found)
            if len(point) > 1:
                self.series.append(point)

    def stop(self) -> list[dict[str, float]]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.series


@dataclass(frozen=True, slots=True)
class Level:
    label: str
    rate: float
    seconds: float
    warmup: bool = False


WARMUP_SEED = 10_000
"""Added to the sweep's seed for its warm-up level, which no measured level then shares."""


def level_seed(seed: int, index: int, levels: list[Level]) -> int:
    """The seed of ``levels[index]``: the n-th measured level gets ``seed + n`` whether or not a warm-up
    runs before it, so every front meets the same requests at the same rate."""
    if levels[index].warmup:
        return seed + WARMUP_SEED
    return seed + sum(1 for level in levels[:index] if not level.warmup)


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    provenance = envelope.start()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    levels = [Level(f"r={r:g}", r, args.level_s) for r in sorted(rates)]
    if args.warmup_rate and args.warmup_s > 0:
        levels.insert(0, Level("warmup", args.warmup_rate, args.warmup_s, warmup=True))
    traces = Path(args.traces) if args.traces else None
    budget = (args.ttft_ms, args.itl_ms)
    result: dict[str, Any] = {
        "front": args.front,
        "arrivals": args.arrivals,
        "budget_ms": {"ttft_p99": budget[0], "itl_p99": budget[1]},
        "input": args.input,
        "output": args.output,
        "level_s": args.level_s,
        "drain_s": args.drain_s,
        "levels": [],
    }
    is_gateway = args.front.startswith(("ours", "cap-", "engine-cap-"))
    origin = time.monotonic()
    for i, level in enumerate(levels):
        seed = level_seed(args.seed, i, levels)
        reqs = scene_requests(
            args.arrivals, level.rate, level.seconds, input_len=args.input, output_len=args.output,
            seed=seed, traces=traces,
        )  # fmt: skip
        tag = f"{secrets.token_hex(4)} {args.front} {level.label}"
        token_ids = TokenIds(args.vocab_size)
        arrivals = [TraceArrival(r.arrival, r, "interactive", level.label, tag, token_ids) for r in reqs]
        before = _get(args.engine + "/metrics") if args.engine else ""
        sampler = FrontSampler(args.url) if is_gateway else None
        print(f"{args.front} {args.arrivals} {level.label}: {len(reqs)} requests in {level.seconds:g} s", flush=True)
        began = time.monotonic() - origin
        samples, start, _ = asyncio.run(_drive(args.url, arrivals, args.drain_s, args.timeout))
        ended = time.monotonic() - origin
        series = sampler.stop() if sampler is not None else []
        after = _get(args.engine + "/metrics") if args.engine else ""
        figures = level_figures(samples, level.seconds, budget)
        row = {"label": level.label, "rate": level.rate, "warmup": level.warmup, "seconds": level.seconds}
        row |= {"seed": seed, "started_s": round(began, 3), "ended_s": round(ended, 3), **figures}
        if series:
            limits = [p["limit"] for p in series if "limit" in p]
            row["limit_last"] = limits[-1] if limits else None
            row["limit_max"] = max(limits) if limits else None
            row["queued_max"] = max((p.get("queued", 0.0) for p in series), default=0.0)
        result["levels"].append(row)
        name = "warmup" if level.warmup else f"{i:02d}-{level.rate:g}"
        with gzip.open(out / f"timelines-{name}.json.gz", "wt") as f:
            json.dump({"level": row, "requests": timelines(samples, start), "front_series": series}, f)
        for tag_, text in (("before", before), ("after", after)):
            if text:
                (out / f"metrics-{name}-{tag_}.txt").write_text(text)
        print(
            f"  goodput {row['goodput_rps']}/s attainment {row['attainment_of_admitted']} refused "
            f"{row['refused_share']} ttft p99 {row['ttft_p99_ms']} itl p99 {row['itl_p99_ms']} "
            f"limit {row.get('limit_last')}",
            flush=True,
        )
        (out / "sweep.json").write_text(json.dumps(provenance.wrap(result), indent=1))
        time.sleep(args.pause_s)
    result = provenance.wrap(result)
    (out / "sweep.json").write_text(json.dumps(result, indent=1))
    return result


async def _drive(
    url: str, arrivals: list[TraceArrival], drain_s: float, silent_s: float
) -> tuple[list[Sample], float, list[bool]]:
    client = open_client(url, read_timeout=silent_s, connections=2048, api_key=None)
    try:
        target = Target(client, MODEL, "completions", "interactive", True)
        return await open_level(target, arrivals, drain_s)
    finally:
        await client.aclose()


# --- analysis -------------------------------------------------------------------------------------


def load_sweeps(folders: list[Path]) -> list[dict[str, Any]]:
    out = []
    for res in folders:
        for path in sorted(res.glob("budgets-*/sweep.json")):
            sweep_ = json.loads(path.read_text())
            run = path.parent / "run.json"
            sweep_["run"] = json.loads(run.read_text()) if run.exists() else {}
            sweep_["folder"] = str(path.parent)
            out.append(sweep_)
    return out


def group_runs(levels: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each front's runs at one rate, by what the front is (``cap-64`` and ``cap-64@2`` together)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for front, lv in levels.items():
        out.setdefault(front_kind(front), []).append(lv)
    return out


def median_goodput(levels: dict[str, dict[str, Any]]) -> dict[str, float]:
    return {kind: statistics.median(lv["goodput_rps"] for lv in runs) for kind, runs in group_runs(levels).items()}


def analyze(folders: list[Path], out: Path, provenance: envelope.Envelope) -> dict[str, Any]:
    sweeps = load_sweeps(folders)
    if not sweeps:
        raise SystemExit(f"no budgets-*/sweep.json under {', '.join(map(str, folders))}")
    # The envelope is the analysis's; the commits the device ran are each sweep's (its run.json's).
    measured = sorted({str(s.get("commit") or s["run"].get("commit")) for s in sweeps})
    summary: dict[str, Any] = {"sources": [str(f) for f in folders], "measured_at": measured, "by_arrivals": {}}
    for arrivals in ARRIVALS:
        mine = [s for s in sweeps if s["arrivals"] == arrivals]
        if not mine:
            continue
        fronts: dict[str, list[dict[str, Any]]] = {}
        for s in mine:
            fronts[s["front"]] = [lv for lv in s["levels"] if not lv.get("warmup")]
        rates = sorted({lv["rate"] for rows in fronts.values() for lv in rows})
        table = []
        for rate in rates:
            at = {f: next((lv for lv in rows if lv["rate"] == rate), None) for f, rows in fronts.items()}
            caps = {f: lv for f, lv in at.items() if lv is not None and is_cap(f)}
            best = max(caps, key=lambda f: caps[f]["goodput_rps"]) if caps else None
            ours = {f: lv for f, lv in at.items() if lv is not None and is_ours(f)}
            row: dict[str, Any] = {"rate": rate, "fronts": {f: lv for f, lv in at.items() if lv is not None}}
            if best is not None:
                row["best_static_cap"] = best
                row["best_static_cap_goodput_rps"] = caps[best]["goodput_rps"]
            if ours:
                # Every run of the gateway is judged; a second run is a repeat, not a second chance.
                row["gateway_meets_p99_budgets"] = all(lv["admitted_meet_p99_budgets"] for lv in ours.values())
                if best is not None and caps[best]["goodput_rps"] > 0:
                    cap = caps[best]["goodput_rps"]
                    runs = {f: round(lv["goodput_rps"] / cap, 3) for f, lv in sorted(ours.items())}
                    row["gateway_goodput_over_best_cap_runs"] = runs
                    row["gateway_goodput_over_best_cap"] = min(runs.values())
                    medians = median_goodput(caps)
                    best_kind = max(medians, key=lambda k: medians[k])
                    if medians[best_kind] > 0:
                        # Where each front ran several times: its median run against the cap whose median is best.
                        row["runs"] = {k: len(v) for k, v in group_runs({**caps, **ours}).items()}
                        ours_median = median_goodput(ours)["ours-admission"]
                        row["gateway_median_over_best_cap_median"] = round(ours_median / medians[best_kind], 3)
            table.append(row)
        ratios = [r["gateway_goodput_over_best_cap"] for r in table if "gateway_goodput_over_best_cap" in r]
        of_medians = [
            r["gateway_median_over_best_cap_median"] for r in table if "gateway_median_over_best_cap_median" in r
        ]
        summary["by_arrivals"][arrivals] = {
            "fronts": sorted(fronts),
            "rates": table,
            "gateway_goodput_over_best_cap_min": min(ratios) if ratios else None,
            "gateway_median_over_best_cap_median_min": min(of_medians) if of_medians else None,
            "gateway_meets_p99_budgets_at_every_rate": all(r.get("gateway_meets_p99_budgets", False) for r in table)
            if any("gateway_meets_p99_budgets" in r for r in table)
            else None,
            "engines": sorted({json.dumps(s["run"].get("engines", []), sort_keys=True) for s in mine}),
        }
        for key in ("engines",):
            summary["by_arrivals"][arrivals][key] = [json.loads(e) for e in summary["by_arrivals"][arrivals][key]]
    out.mkdir(parents=True, exist_ok=True)
    summary = provenance.wrap(summary)
    (out / "budgets.json").write_text(json.dumps(summary, indent=1))
    try:
        plot(summary, out / "budgets.png")
    except ImportError:
        print("no matplotlib: no plot (run analyze where it is installed)", file=sys.stderr)
    return summary


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in ARRIVALS if k in summary["by_arrivals"]]
    every = sorted({f for k in kinds for f in summary["by_arrivals"][k]["fronts"]})
    colors = {front: f"C{i % 10}" for i, front in enumerate(every)}
    fig, axes = plt.subplots(len(kinds), 2, figsize=(12, 4.2 * len(kinds)), squeeze=False)
    for row, kind in enumerate(kinds):
        data = summary["by_arrivals"][kind]
        for front in data["fronts"]:
            # At the level's offered rate as planned (the measured one is in budgets.json).
            points = [(r["rate"], r["fronts"][front]) for r in data["rates"] if front in r["fronts"]]
            xs = [x for x, _ in points]
            style = {"linewidth": 2.5} if is_ours(front) else {"linestyle": "--" if is_cap(front) else "-"}
            style["color"] = colors[front]
            axes[row][0].plot(xs, [lv["goodput_rps"] for _, lv in points], marker="o", label=front, **style)
            attain = [lv["attainment_of_admitted"] for _, lv in points]
            axes[row][1].plot(
                xs, [math.nan if a is None else 100 * a for a in attain], marker="o", label=front, **style
            )
        axes[row][0].set_ylabel("admitted goodput (req/s meeting both budgets)")
        axes[row][1].set_ylabel("% of admitted requests meeting both budgets")
        axes[row][1].set_ylim(0, 105)
        for ax in axes[row]:
            ax.set_xlabel(f"offered rate (req/s), {kind} arrivals")
            ax.grid(alpha=0.3)
        axes[row][0].legend(fontsize=8)
        axes[row][0].set_title(f"{kind}: goodput against offered rate")
        axes[row][1].set_title(f"{kind}: budget attainment of admitted requests")
    fig.suptitle("One engine alone on the GPU: TTFT p99 500 ms / ITL p99 50 ms, a line per front")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("sweep", help="one front at rising rates")
    s.add_argument("--url", required=True, help="the front")
    s.add_argument("--engine", default="", help="the engine, for its /metrics around each level")
    s.add_argument("--front", required=True, help="its name: ours-admission, ours-off, cap-N, vllmr-rr, ...")
    s.add_argument("--arrivals", choices=ARRIVALS, default="poisson")
    s.add_argument("--rates", required=True, help="offered rates, requests/s: 6,12,17")
    s.add_argument("--level-s", type=float, default=15.0)
    s.add_argument("--warmup-rate", type=float, default=0.0)
    s.add_argument("--warmup-s", type=float, default=0.0)
    s.add_argument("--drain-s", type=float, default=45.0, help="after a level's last arrival, cut what still runs")
    s.add_argument("--pause-s", type=float, default=1.0)
    s.add_argument("--input", type=int, default=1024)
    s.add_argument("--output", type=int, default=128)
    s.add_argument("--ttft-ms", type=float, default=BUDGET_MS[0])
    s.add_argument("--itl-ms", type=float, default=BUDGET_MS[1])
    s.add_argument("--timeout", type=float, default=120.0, help="seconds a stream may stay silent")
    s.add_argument("--vocab-size", type=int, default=32000)
    s.add_argument("--traces", default="", help="benchmarks/traces (bursty arrivals read the Azure trace)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", type=Path, required=True)
    a = sub.add_parser("analyze", help="every front side by side, and the plot")
    a.add_argument("--res", type=Path, action="append", required=True, help="a sitting's res folder")
    a.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if args.action == "sweep":
        sweep(args)
    else:
        summary = analyze(args.res, args.out, envelope.start())
        for kind, data in summary["by_arrivals"].items():
            print(
                f"{kind}: gateway goodput over best cap min {data['gateway_goodput_over_best_cap_min']} "
                f"(of medians {data['gateway_median_over_best_cap_median_min']}), "
                f"meets p99 budgets at every rate {data['gateway_meets_p99_budgets_at_every_rate']}"
            )


if __name__ == "__main__":
    main()
