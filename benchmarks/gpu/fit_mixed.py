"""The simulator's step model fitted to what ``calibrate.py --phases mixed`` measured on one real engine.

The model is ``engines/sim/profile.py``'s, with the host overlapping the device (eager mode)::

    step = serial_ms + [P > 0 and D > 0] * (mixed_ms + mixed_ms_per_decode_seq * D)
           + max(overhead_ms + per_seq_ms * S + host_ms_per_prefill_token * P,
                 weights_ms, prefill_ms_per_token * P + prefill_attention_ms_per_mpair * pairs / 1e6)

fitted (least squares on relative error, terms that come out negative dropped) to step durations the
decoders saw: the median plain decode step at each D, and the steps that held a joining prefill's
chunks (a prefill of P tokens beside D decodes fits the step's budget or is cut in two: budget - D
tokens, then the rest). Each point is host- or device-bound; the fit guesses which, solves, and
guesses again until the guess holds. Then the API server's share of a TTFT (``request_overhead_ms``
+ ``request_ms_per_prompt_token`` * P) from lone requests' TTFT less the fitted step, and the step
tail (``tail_quantiles_ms``): percentiles 0-100 of plain decode steps beyond their level's median,
every D pooled, from one decoder's whole timeline outside the joining prefills' windows.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

STEPS_BEFORE = 6  # calibrate.py: the gaps kept before the step that ends with the prefill's first token
BUDGET = 8192  # --max-num-batched-tokens
MODEL = (
    "step = serial + [P>0 and D>0](mixed + mixed_per_seq*D) + max(overhead + per_seq*S + h*P, weights, a*P + q*pairs);"
    " ttft += request + r*prompt_tokens; + a tail drawn per step"
)
TERMS = (
    "serial_ms",
    "overhead_ms",
    "per_seq_ms",
    "host_ms_per_prefill_token",
    "prefill_ms_per_token",
    "prefill_attention_ms_per_mpair",
    "mixed_ms",
    "mixed_ms_per_decode_seq",
)


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def step_points(mixed: dict, budget: int = BUDGET) -> list[dict[str, Any]]:
    """Step durations in the simulator's terms: P prefill tokens, D decodes, pairs, measured ms."""
    points: list[dict[str, Any]] = []
    for level in mixed["levels"]:
        d = level["decode_seqs"]
        if not d:
            continue
        if level.get("plain", {}).get("n"):
            points.append({"kind": "plain", "P": 0, "D": d, "pairs": 0.0, "ms": level["plain"]["p50_ms"]})
        cells: dict[tuple[int, int], list[float]] = defaultdict(list)
        for trial in level["trials"]:
            steps, ends = trial.get("steps_ms"), trial.get("steps_end_ms")
            if not steps or trial.get("decoders_seen", 0) < d:
                continue
            # The decoders' step nearest the first token must end with it (else a decoder lagged).
            if abs(ends[STEPS_BEFORE]) > 0.5 * steps[STEPS_BEFORE]:
                continue
            p = trial["prefill_tokens"]
            first = min(p, budget - d)
            cells[(p, 0)].append(steps[STEPS_BEFORE - (1 if p > first else 0)])
            if p > first:
                cells[(p, 1)].append(steps[STEPS_BEFORE])
        for (p, chunk), values in sorted(cells.items()):
            first = min(p, budget - d)
            n, done = (first, 0) if chunk == 0 else (p - first, first)
            points.append(
                {
                    "kind": "mixed" if chunk == 0 else "mixed, second chunk",
                    "P": n,
                    "D": d,
                    "pairs": n * (done + n / 2),
                    "ms": round(_median(values), 3),
                    "prefill_tokens": p,
                    "reps": len(values),
                }
            )
    return points


def _row(point: dict, device_bound: bool) -> list[float]:
    p, d = point["P"], point["D"]
    mixed = 1.0 if p and d else 0.0
    host = not device_bound
    values = {
        "serial_ms": 1.0,
        "overhead_ms": float(host),
        "per_seq_ms": float(host) * (d + (1 if p else 0)),
        "host_ms_per_prefill_token": float(host) * p,
        "prefill_ms_per_token": float(device_bound) * p,
        "prefill_attention_ms_per_mpair": float(device_bound) * point["pairs"] / 1e6,
        "mixed_ms": mixed,
        "mixed_ms_per_decode_seq": mixed * d,
    }
    return [values[t] for t in TERMS]


def _host_device(coef: dict[str, float], point: dict, weights_ms: float) -> tuple[float, float]:
    p, d = point["P"], point["D"]
    host = coef["overhead_ms"] + coef["per_seq_ms"] * (d + (1 if p else 0)) + coef["host_ms_per_prefill_token"] * p
    device = coef["prefill_ms_per_token"] * p + coef["prefill_attention_ms_per_mpair"] * point["pairs"] / 1e6
    return host, max(weights_ms, device)


def predict_ms(coef: dict[str, float], point: dict, weights_ms: float) -> float:
    p, d = point["P"], point["D"]
    extra = coef["mixed_ms"] + coef["mixed_ms_per_decode_seq"] * d if p and d else 0.0
    return coef["serial_ms"] + extra + max(_host_device(coef, point, weights_ms))


def relative_lstsq(x: np.ndarray, y: np.ndarray, terms: tuple[str, ...], active: list[int]) -> dict[str, float]:
    """Least squares on relative error over the ``active`` columns, dropping any that comes out negative."""
    while True:
        solution, *_ = np.linalg.lstsq(x[:, active] / y[:, None], np.ones(len(y)), rcond=None)
        negative = [i for i, v in zip(active, solution, strict=True) if v < 0]
        if not negative:
            break
        active.remove(negative[0])
    return dict.fromkeys(terms, 0.0) | {terms[i]: float(v) for i, v in zip(active, solution, strict=True)}


def fit_steps(points: list[dict], weights_ms: float, terms: tuple[str, ...] = TERMS) -> dict[str, float]:
    """Piecewise-linear least squares on relative error; negative terms dropped, the bound regime iterated."""
    y = np.array([pt["ms"] for pt in points])
    device_bound = [pt["P"] >= 2048 for pt in points]
    coef = dict.fromkeys(TERMS, 0.0)
    for _ in range(30):
        x = np.array([_row(pt, dev) for pt, dev in zip(points, device_bound, strict=True)])
        coef = relative_lstsq(x, y, TERMS, [TERMS.index(t) for t in terms])
        guess = [_host_device(coef, pt, weights_ms)[1] > _host_device(coef, pt, weights_ms)[0] for pt in points]
        if guess == device_bound:
            break
        device_bound = guess
    return coef


def lone_ttfts(mixed: dict, calibration: dict | None) -> list[tuple[int, float]]:
    """(prompt tokens, median TTFT ms) of requests alone on the engine: the mixed phase's D = 0 level
    and the single-engine phases' TTFT by prompt length."""
    by_length: dict[int, list[float]] = defaultdict(list)
    for level in mixed["levels"]:
        if level["decode_seqs"] == 0:
            for trial in level["trials"]:
                by_length[trial["prefill_tokens"]].append(trial["ttft_ms"])
    for row in (calibration or {}).get("ttft_vs_prompt", []):
        by_length[row["prompt_tokens"]].extend(row["ttft_ms"])
    return sorted((n, _median(v)) for n, v in by_length.items())


def fit_request(coef: dict[str, float], ttfts: list[tuple[int, float]], weights_ms: float) -> dict[str, float]:
    """The API server's share: TTFT less the fitted step(s) of the lone prompt, linear in its length."""
    rows, residuals = [], []
    for n, ttft in ttfts:
        steps, done = 0.0, 0
        while done < n:  # a lone prompt over the budget is prefilled in chunks
            chunk = min(BUDGET, n - done)
            steps += predict_ms(coef, {"P": chunk, "D": 0, "pairs": chunk * (done + chunk / 2)}, weights_ms)
            done += chunk
        rows.append([1.0, float(n)])
        residuals.append(ttft - steps)
    x, y = np.array(rows), np.array(residuals)
    weights = 1.0 / np.array([t for _, t in ttfts])
    solution, *_ = np.linalg.lstsq(x * weights[:, None], y * weights, rcond=None)
    if solution[1] < 0:
        solution = [float(np.average(y, weights=weights**2)), 0.0]
    return {"request_overhead_ms": max(0.0, float(solution[0])), "request_ms_per_prompt_token": float(solution[1])}


def plain_gaps(level: dict) -> list[float]:
    """One decoder's step gaps (ms) outside the ramp and the joining prefills' windows."""
    timeline = level.get("timeline") or []
    start = level.get("plain", {}).get("began_s", level.get("ramp_s", 0.0) + 0.05)
    busy = [(t["sent_s"] - 0.03, t["sent_s"] + t["ttft_ms"] / 1000 + 0.06) for t in level["trials"]]
    gaps = []
    for (before, _), (now, tokens) in itertools.pairwise(timeline):
        if before < start or not tokens or any(a <= now and before <= b for a, b in busy):
            continue
        gaps.append((now - before) * 1000 / tokens)
    return gaps


def fit_tail(mixed: dict) -> dict[str, Any]:
    extra: list[float] = []
    by_level = {}
    for level in mixed["levels"]:
        gaps = plain_gaps(level)
        if len(gaps) < 20:
            continue
        median = _median(gaps)
        extra += [g - median for g in gaps]
        by_level[str(level["decode_seqs"])] = {
            "gaps": len(gaps),
            "p50_ms": round(median, 2),
            "mean_ms": round(statistics.fmean(gaps), 2),
            "p90_ms": round(float(np.percentile(gaps, 90)), 2),
            "p99_ms": round(float(np.percentile(gaps, 99)), 2),
        }
    if not extra:
        return {"quantiles_ms": [], "by_decode_seqs": by_level}
    quantiles = np.maximum.accumulate(np.maximum(0.0, np.percentile(extra, np.arange(101))))
    return {
        "quantiles_ms": [round(float(q), 2) for q in quantiles],
        "samples": len(extra),
        "by_decode_seqs": by_level,
    }


def fit(mixed: dict, calibration: dict | None = None, weights_ms: float = 3.2) -> dict[str, Any]:
    points = step_points(mixed)
    coef = fit_steps(points, weights_ms)
    for point in points:
        point["fitted_ms"] = round(predict_ms(coef, point, weights_ms), 3)
    errors = [abs(pt["fitted_ms"] - pt["ms"]) / pt["ms"] for pt in points]
    ttfts = lone_ttfts(mixed, calibration)
    request = fit_request(coef, ttfts, weights_ms)
    tail = fit_tail(mixed)
    timing = {
        "overhead_ms": round(coef["overhead_ms"], 3),
        "per_seq_ms": round(coef["per_seq_ms"], 4),
        "prefill_ms_per_token": round(coef["prefill_ms_per_token"], 6),
        "weights_ms": weights_ms,
        "prefill_attention_ms_per_mpair": round(coef["prefill_attention_ms_per_mpair"], 4),
        "request_overhead_ms": round(request["request_overhead_ms"], 3),
        "request_ms_per_prompt_token": round(request["request_ms_per_prompt_token"], 6),
        "host_overlaps_device": True,
        "serial_ms": round(coef["serial_ms"], 3),
        "host_ms_per_prefill_token": round(coef["host_ms_per_prefill_token"], 6),
        "mixed_ms": round(coef["mixed_ms"], 3),
        "mixed_ms_per_decode_seq": round(coef["mixed_ms_per_decode_seq"], 4),
        "tail_quantiles_ms": tail["quantiles_ms"],
    }
    return {
        "model": MODEL,
        "profile_timing": timing,
        "median_relative_error": round(statistics.median(errors), 3) if errors else None,
        "max_relative_error": round(max(errors), 3) if errors else None,
        "points": points,
        "lone_ttft_ms": [{"prompt_tokens": n, "ttft_ms": t} for n, t in ttfts],
        "tail": tail,
    }


def plot(mixed: dict, fitted: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from priority_gateway.engines.sim.profile import Timing

    timing = Timing(**fitted["profile_timing"])
    fig, axes = plt.subplots(1, 3, figsize=(18, 5))
    ax = axes[0]
    points = [p for p in fitted["points"] if p["kind"] == "mixed"]
    for d in sorted({p["D"] for p in points}):
        row = sorted((p for p in points if p["D"] == d), key=lambda p: p["P"])
        line = ax.plot([p["P"] for p in row], [p["ms"] for p in row], "o-", label=f"D={d}")
        ax.plot([p["P"] for p in row], [p["fitted_ms"] for p in row], "--", color=line[0].get_color())
    ax.set(title="step holding a joining prefill (first chunk): measured o-, fit --", xlabel="prefill tokens P")
    ax.set(ylabel="ms")
    ax.legend(fontsize=8)
    ax = axes[1]
    plain = sorted((p for p in fitted["points"] if p["kind"] == "plain"), key=lambda p: p["D"])
    by_level = fitted["tail"]["by_decode_seqs"]
    ax.plot([p["D"] for p in plain], [p["ms"] for p in plain], "o-", label="plain step, median")
    ax.plot([int(d) for d in by_level], [v["mean_ms"] for v in by_level.values()], "s-", label="mean")
    ax.plot([int(d) for d in by_level], [v["p99_ms"] for v in by_level.values()], "^-", label="p99")
    ax.plot([p["D"] for p in plain], [p["fitted_ms"] for p in plain], "k--", label="fit (median)")
    ax.set(title="plain decode steps by batch size", xlabel="decoding sequences D", ylabel="ms")
    ax.legend(fontsize=8)
    ax = axes[2]
    extra = []
    for level in mixed["levels"]:
        gaps = plain_gaps(level)
        if len(gaps) >= 20:
            median = _median(gaps)
            extra += [g - median for g in gaps]
    if extra:
        ax.plot(np.sort(extra), np.linspace(0, 1, len(extra)), label="measured: step - its level's median")
        rng = np.random.default_rng(0)
        drawn = [timing.tail_s(u) * 1000 for u in rng.random(len(extra))]
        ax.plot(np.sort(drawn), np.linspace(0, 1, len(drawn)), "--", label="simulator's tail draws")
    ax.set(title="step tail (every D pooled)", xlabel="ms beyond the median", ylabel="fraction of steps")
    ax.legend(fontsize=8)
    fig.suptitle("One vLLM 0.26 engine (7B shape) alone on an H200: mixed steps and the decode tail", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
