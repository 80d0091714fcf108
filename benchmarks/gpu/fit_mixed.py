"""The simulator's step model fitted to what ``calibrate.py --phases mixed`` measured on one real engine.

The model is ``engines/sim/profile.py``'s, with the host overlapping the device (eager mode)::

    step = serial_ms + [P > 0 and D > 0] * (mixed_ms + mixed_ms_per_decode_seq * D)
           + max(overhead_ms + per_seq_ms * S + host_ms_per_prefill_token * P,
                 weights_ms,
                 prefill_ms_per_token * P + prefill_ms_per_ktoken2 * (P / 1000) ** 2
                 + prefill_attention_ms_per_mpair * pairs / 1e6)
    ttft = request_overhead_ms + request_ms_per_prompt_token * prompt + its prompt's steps

fitted together (least squares on relative error, terms that come out negative dropped) to:

- plain decode steps, one per D: the level's floor (its steps' first quartile, outside slow phases);
- runs of steps the decoders saw while a prefill of P tokens joined D of them: the step(s) that held
  its chunks (it fits the step's budget or is cut in two: budget - D tokens, then the rest) and the
  plain step after (``step_points``);
- lone requests' TTFT (the D = 0 level and the single-engine phases' TTFT by prompt length, up to
  32k tokens: several chunks with growing attention, which tells attention from per-token growth).

Each step is host- or device-bound; the fit guesses which, solves, and guesses again until the guess
holds. Then the step tail (``tail_quantiles_ms``): percentiles 0-100 of plain decode steps over
their level's floor, every D pooled, from one decoder's whole timeline outside the joining
prefills' windows.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

SLOW = 1.3  # a window whose plain steps before the join are this much over the level's floor: a slow phase
STEPS_BEFORE = 6  # calibrate.py: the gaps kept before the step that ends with the prefill's first token
BUDGET = 8192  # --max-num-batched-tokens
MODEL = (
    "step = serial + [P>0 and D>0](mixed + mixed_per_seq*D)"
    " + max(overhead + per_seq*S + h*P, weights, a*P + b*(P/1000)^2 + q*pairs);"
    " ttft = request + r*prompt_tokens + steps; + a tail drawn per step"
)
TERMS = (
    "serial_ms",
    "overhead_ms",
    "per_seq_ms",
    "host_ms_per_prefill_token",
    "prefill_ms_per_token",
    "prefill_attention_ms_per_mpair",
    "prefill_ms_per_ktoken2",
    "mixed_ms",
    "mixed_ms_per_decode_seq",
    "request_overhead_ms",
    "request_ms_per_prompt_token",
)


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def plain_floor(level: dict) -> float:
    """A level's plain decode step outside its slow phases: the first quartile of its steps."""
    return float(np.percentile(plain_gaps(level), 25))


def step_points(mixed: dict, budget: int = BUDGET) -> list[dict[str, Any]]:
    """Observations in the simulator's terms: each a run of steps (P prefill tokens, D decodes, pairs)
    and the milliseconds they took.

    Plain: one decode step at each D, the level's ``plain_floor``. Joined: from the step that held the
    prefill's first chunk to the plain step after its first token, summed (a late delivery of the first
    token's step shortens the next gap, so the sum holds). The engine has slow phases of seconds (steps
    1.5-2.4x longer at any D, while steps bound by the device are not): a window whose plain steps
    before the join (their median) are over ``SLOW`` times the floor is left out; the others are taken
    back to the floor by that difference, once per step."""
    points: list[dict[str, Any]] = []
    for level in mixed["levels"]:
        d = level["decode_seqs"]
        if not d or len(plain_gaps(level)) < 20:
            continue
        floor = plain_floor(level)
        plain = {"P": 0, "D": d, "pairs": 0.0}
        points.append({"kind": "plain", "D": d, "prefill_tokens": 0, "steps": [plain], "ms": round(floor, 3)})
        windows: dict[int, list[float]] = defaultdict(list)
        for trial in level["trials"]:
            steps, ends = trial.get("steps_ms"), trial.get("steps_end_ms")
            if not steps or trial.get("decoders_seen", 0) < d:
                continue
            # The decoders' step nearest the first token must end with it (else a decoder lagged).
            if abs(ends[STEPS_BEFORE]) > 0.5 * steps[STEPS_BEFORE]:
                continue
            p = trial["prefill_tokens"]
            chunks = 1 if p <= budget - d else 2
            window = steps[STEPS_BEFORE + 1 - chunks : STEPS_BEFORE + 2]
            local = _median(steps[: STEPS_BEFORE + 1 - chunks])
            if local > SLOW * floor:  # in a slow phase, whose host-bound steps are slower and device-bound not
                continue
            windows[p].append(sum(window) - len(window) * (local - floor))
        for p, values in sorted(windows.items()):
            first = min(p, budget - d)
            run = [{"P": first, "D": d, "pairs": first * first / 2}]
            if p > first:
                run.append({"P": p - first, "D": d, "pairs": (p - first) * (first + (p - first) / 2)})
            points.append(
                {
                    "kind": "joined",
                    "D": d,
                    "prefill_tokens": p,
                    "steps": [*run, plain],
                    "ms": round(_median(values), 3),
                    "reps": len(values),
                }
            )
    return points


def _row(step: dict, device_bound: bool) -> list[float]:
    p, d = step["P"], step["D"]
    mixed = 1.0 if p and d else 0.0
    host = not device_bound
    values = {
        "serial_ms": 1.0,
        "overhead_ms": float(host),
        "per_seq_ms": float(host) * (d + (1 if p else 0)),
        "host_ms_per_prefill_token": float(host) * p,
        "prefill_ms_per_token": float(device_bound) * p,
        "prefill_attention_ms_per_mpair": float(device_bound) * step["pairs"] / 1e6,
        "prefill_ms_per_ktoken2": float(device_bound) * (p / 1000) ** 2,
        "mixed_ms": mixed,
        "mixed_ms_per_decode_seq": mixed * d,
        "request_overhead_ms": 0.0,
        "request_ms_per_prompt_token": 0.0,
    }
    return [values[t] for t in TERMS]


def _point_row(point: dict, device_bound: dict[int, bool]) -> np.ndarray:
    row = np.sum([_row(step, device_bound[id(step)]) for step in point["steps"]], axis=0)
    if point.get("request_tokens"):  # a TTFT: the API server's share first
        row[TERMS.index("request_overhead_ms")] = 1.0
        row[TERMS.index("request_ms_per_prompt_token")] = point["request_tokens"]
    return row


def predict_point(coef: dict[str, float], point: dict, weights_ms: float) -> float:
    ms = sum(predict_ms(coef, step, weights_ms) for step in point["steps"])
    if point.get("request_tokens"):
        ms += coef["request_overhead_ms"] + coef["request_ms_per_prompt_token"] * point["request_tokens"]
    return ms


def _host_device(coef: dict[str, float], step: dict, weights_ms: float) -> tuple[float, float]:
    p, d = step["P"], step["D"]
    host = coef["overhead_ms"] + coef["per_seq_ms"] * (d + (1 if p else 0)) + coef["host_ms_per_prefill_token"] * p
    device = coef["prefill_ms_per_token"] * p + coef["prefill_attention_ms_per_mpair"] * step["pairs"] / 1e6
    device += coef["prefill_ms_per_ktoken2"] * (p / 1000) ** 2
    return host, max(weights_ms, device)


def predict_ms(coef: dict[str, float], step: dict, weights_ms: float) -> float:
    """One step's time."""
    p, d = step["P"], step["D"]
    extra = coef["mixed_ms"] + coef["mixed_ms_per_decode_seq"] * d if p and d else 0.0
    return coef["serial_ms"] + extra + max(_host_device(coef, step, weights_ms))


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
    steps = [step for pt in points for step in pt["steps"]]
    device_bound = {id(step): step["P"] >= 2048 for step in steps}
    coef = dict.fromkeys(TERMS, 0.0)
    for _ in range(30):
        x = np.array([_point_row(pt, device_bound) for pt in points])
        coef = relative_lstsq(x, y, TERMS, [TERMS.index(t) for t in terms])
        guess = {id(st): _host_device(coef, st, weights_ms)[1] > _host_device(coef, st, weights_ms)[0] for st in steps}
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


def ttft_points(ttfts: list[tuple[int, float]], budget: int = BUDGET) -> list[dict[str, Any]]:
    """A lone request's TTFT: the API server's share, then its prompt's chunks, one step each."""
    points = []
    for n, ttft in ttfts:
        steps, done = [], 0
        while done < n:
            chunk = min(budget, n - done)
            steps.append({"P": chunk, "D": 0, "pairs": chunk * (done + chunk / 2)})
            done += chunk
        points.append(
            {"kind": "lone ttft", "D": 0, "prefill_tokens": n, "request_tokens": n, "steps": steps, "ms": ttft}
        )
    return points


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


def tail_extra(mixed: dict) -> list[float]:
    """Plain decode steps beyond their level's floor (ms), every D pooled."""
    extra: list[float] = []
    for level in mixed["levels"]:
        gaps = plain_gaps(level)
        if len(gaps) >= 20:
            floor = float(np.percentile(gaps, 25))
            extra += [g - floor for g in gaps]
    return extra


def fit_tail(mixed: dict) -> dict[str, Any]:
    by_level = {}
    for level in mixed["levels"]:
        gaps = plain_gaps(level)
        if len(gaps) >= 20:
            by_level[str(level["decode_seqs"])] = {
                "gaps": len(gaps),
                **{f"p{q}_ms": round(float(np.percentile(gaps, q)), 2) for q in (25, 50, 90, 99)},
                "mean_ms": round(statistics.fmean(gaps), 2),
            }
    extra = tail_extra(mixed)
    if not extra:
        return {"quantiles_ms": [], "by_decode_seqs": by_level}
    quantiles = np.maximum.accumulate(np.maximum(0.0, np.percentile(extra, np.arange(101))))
    return {
        "quantiles_ms": [round(float(q), 2) for q in quantiles],
        "samples": len(extra),
        "mean_ms": round(statistics.fmean(max(0.0, e) for e in extra), 2),
        "by_decode_seqs": by_level,
    }


def _family(delta: dict[str, float], name: str) -> float:
    return sum(v for k, v in delta.items() if k.startswith(name))


def server_view(mixed: dict) -> dict[str, Any]:
    """vLLM's own account of each plain decode window (``/metrics`` after less before): steps it ran,
    its mean ITL and the share of ITLs over 25 ms, beside the client's mean gap."""
    out = {}
    for level in mixed["levels"]:
        before, after = level["metrics"].get("plain_before"), level["metrics"].get("plain_after")
        if not level.get("plain") or not before or not after:
            continue
        delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
        itl = "vllm:inter_token_latency_seconds"
        count = _family(delta, f"{itl}_count")
        steps = _family(delta, "vllm:iteration_tokens_total_count")
        under = _family(delta, f'{itl}_bucket{{engine="0",le="0.025"')
        out[str(level["decode_seqs"])] = {
            "client_mean_gap_ms": level["plain"]["mean_ms"],
            "server_mean_itl_ms": round(1000 * _family(delta, f"{itl}_sum") / count, 2) if count else None,
            "server_steps": int(steps),
            "window_over_steps_ms": round(1000 * level["plain"]["window_s"] / steps, 2) if steps else None,
            "server_itl_over_25ms": round(1 - under / count, 3) if count else None,
        }
    return out


def fit(mixed: dict, calibration: dict | None = None, weights_ms: float = 3.2) -> dict[str, Any]:
    ttfts = lone_ttfts(mixed, calibration)
    points = step_points(mixed) + ttft_points(ttfts)
    coef = fit_steps(points, weights_ms)
    for point in points:
        point["fitted_ms"] = round(predict_point(coef, point, weights_ms), 3)
    errors = [abs(pt["fitted_ms"] - pt["ms"]) / pt["ms"] for pt in points]
    request = {key: coef[key] for key in ("request_overhead_ms", "request_ms_per_prompt_token")}
    tail = fit_tail(mixed)
    timing = {
        "overhead_ms": round(coef["overhead_ms"], 3),
        "per_seq_ms": round(coef["per_seq_ms"], 4),
        "prefill_ms_per_token": round(coef["prefill_ms_per_token"], 6),
        "weights_ms": weights_ms,
        "prefill_attention_ms_per_mpair": round(coef["prefill_attention_ms_per_mpair"], 4),
        "prefill_ms_per_ktoken2": round(coef["prefill_ms_per_ktoken2"], 4),
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
        "tail": tail,
        "server_view": server_view(mixed),
    }


def plot(mixed: dict, fitted: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from priority_gateway.engines.sim.profile import Timing

    timing = Timing(**fitted["profile_timing"])
    fig, axes = plt.subplots(1, 3, figsize=(18, 5))
    ax = axes[0]
    joined = [p for p in fitted["points"] if p["kind"] == "joined"]
    for d in sorted({p["D"] for p in joined}):
        row = sorted((p for p in joined if p["D"] == d), key=lambda p: p["prefill_tokens"])
        line = ax.plot([p["prefill_tokens"] for p in row], [p["ms"] for p in row], "o-", label=f"D={d}")
        ax.plot([p["prefill_tokens"] for p in row], [p["fitted_ms"] for p in row], "--", color=line[0].get_color())
    ax.set(xlabel="prefill tokens P joining D decodes", ylabel="ms", xscale="log", yscale="log")
    sizes = sorted({p["prefill_tokens"] for p in joined})
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.minorticks_off()
    ax.set_title("steps holding the prefill + the plain step after: measured o-, fit --", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1]
    plain = sorted((p for p in fitted["points"] if p["kind"] == "plain"), key=lambda p: p["D"])
    levels = fitted["tail"]["by_decode_seqs"]
    ds = [int(d) for d in levels]
    for key, style in (("p25_ms", "o-"), ("p50_ms", "s-"), ("mean_ms", "d-"), ("p99_ms", "^-")):
        ax.plot(ds, [v[key] for v in levels.values()], style, label=key.removesuffix("_ms"))
    ax.plot([p["D"] for p in plain], [p["fitted_ms"] for p in plain], "k--", label="fit (floor)")
    ax.set(title="plain decode steps by batch size", xlabel="decoding sequences D", ylabel="ms")
    ax.legend(fontsize=8)
    ax = axes[2]
    extra = tail_extra(mixed)
    if extra:
        ax.plot(np.sort(extra), np.linspace(0, 1, len(extra)), label="measured: step - its level's floor")
        rng = np.random.default_rng(0)
        drawn = [timing.tail_s(u) * 1000 for u in rng.random(len(extra))]
        ax.plot(np.sort(drawn), np.linspace(0, 1, len(drawn)), "--", label="simulator's tail draws")
    ax.set(title="step tail (every D pooled)", xlabel="ms beyond the floor", ylabel="fraction of steps")
    ax.legend(fontsize=8)
    fig.suptitle("One vLLM 0.26 engine (7B shape) alone on an H200: prefills joining decodes, the decode tail")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
