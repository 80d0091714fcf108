"""Agent sessions in virtual time: plain prefix routing, sessions first, sessions first with retention,
and vllm-router's consistent_hash on the session header, side by side on one workload.

The workload (``priority_gateway.simulate.traces.agent_sessions``), every number's source:
- sessions arrive as a Poisson process (``--sessions`` at ``--rate`` per second), each an agent
  with a system prompt of ``--system`` tokens shared by the sessions of one of 4 agents;
- turns per session, tokens appended per turn and reply lengths are drawn from the Mooncake
  conversation trace (benchmarks/traces/mooncake): chains of requests where each request's blocks
  extend the previous one's (4,565 continuations in the trace): chain lengths clipped to 3-30 turns
  (the issue's range), appended tokens (trace p10/p50/p90 102/531/7,985) clipped to 200-4,000,
  replies (trace p10/p50/p90 24/350/597) as they are; first messages as appended tokens;
- tool pauses log-uniform in 1-60 s: the issue's range; the Mooncake trace's gaps between turns
  (p50 96 s) are a person's, not a tool's, and no public trace of tool latency is in the repository.

Engines: ``--engines`` engines of the ``h200-7b-bf16`` profile (fitted to real vLLM 0.26 on an H200)
with ``--num-blocks`` KV blocks each, so that the live sessions' contexts (running and paused) exceed
the pool's KV cache: the run reports that demand against the capacity. ``--kv-offloading-blocks``
gives each engine a CPU tier of that many blocks below its GPU cache, as vLLM's
``--kv-offloading-size`` does (``engines/sim/cpu_tier.py``). Their seats and prefill step
are the interactive profile's (``engines/profiles/interactive.yaml``: 4 and 384 tokens, as the GPU
runs them), and the gateway's pool declares the seats, as the shipped configuration does.

Setups (one Dispatcher each, the product's core; admission on with the interactive ITL budget and no
TTFT refusals, so every turn runs and sessions complete):
- ``prefix``: the prefix policy with its session pin, sessions off (what the gateway did before);
- ``sessions_first``: sessions on (continuing turns first, ``first_burst``), holds not weighed;
- ``sessions_retention``: sessions on and the prefix policy's ``retention_weight`` 1, continuing turns
  starting wherever there is room;
- ``sessions_wait``: as ``sessions_retention``, a continuing turn waiting for its session's engine while
  waiting costs less than moving (``sessions.wait_for_engine``, the default);
- ``vllm_router_consistent_hash``: vllm-router's consistent_hash as its source has it
  (src/policies/consistent_hash.rs: a ring of 160 virtual nodes per worker, the session header's
  key to the first node at or after its hash, no load or cache signal; xxhash stands in for its
  FurcHash, which changes which worker a key lands on, not how keys spread), no gateway admission
  (the router forwards at once; vLLM queues).
``vllm-router cache_aware`` is not modelled: its decision (src/policies/cache_aware.rs) rests on a
text radix tree per worker, session maps and tree eviction whose defaults this script does not
reproduce faithfully; it belongs to a real-time run with the real binary (not done here).

Per setup: re-prefilled tokens of continuing turns (the previous turn's context the engine had to
compute again; how many turns moved to another engine and what they re-prefilled), turn TTFT p50/p99,
session completion p50/p99 (first arrival to last turn's end), new-session (first turn) TTFT p99,
output tokens/s: each the median over one workload per seed (40 sessions is the GPU plan's size, too
few for one workload to decide). JSON (with commit, command, host load, every seed's run) and a plot.

    python benchmarks/agent_sessions.py [--sessions 40] [--rate 1] [--num-blocks 2340] [--seeds 0,1,2,3,4] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from xxhash import xxh3_64_intdigest

from priority_gateway.bench import envelope
from priority_gateway.core.classes import BATCH, INTERACTIVE, Budget
from priority_gateway.core.dispatcher import AdmissionSettings
from priority_gateway.core.engines import EngineState
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.routing import Choice, _Stateless
from priority_gateway.core.sessions import SessionSettings
from priority_gateway.embedded import pool_args, pool_gateway
from priority_gateway.engines.sim.profile import load_profile
from priority_gateway.simulate.cluster import Cluster, ClusterSetup, PoolSetup, Record
from priority_gateway.simulate.traces import SessionShapes, TraceRequest, agent_sessions

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "benchmarks/traces/mooncake/conversation_trace.jsonl"


def mooncake_shapes(path: Path, system_tokens: int) -> tuple[SessionShapes, dict[str, Any]]:
    """Turns, appended tokens and replies as the Mooncake conversation trace's chains have them."""
    rows = sorted(
        (json.loads(line) for line in path.read_text().splitlines() if line.strip()), key=lambda r: r["timestamp"]
    )
    latest: dict[tuple[int, ...], int] = {}
    turn: list[int] = []
    appended: list[int] = []
    for i, row in enumerate(rows):
        ids = tuple(row["hash_ids"])
        t = 1
        for k in range(len(ids), 0, -1):
            j = latest.get(ids[:k])
            if j is None:
                continue
            before = rows[j]
            if k >= len(before["hash_ids"]) - 1 and row["input_length"] > before["input_length"]:
                appended.append(row["input_length"] - before["input_length"])
                t = turn[j] + 1
            break
        turn.append(t)
        for k in range(1, len(ids) + 1):
            latest[ids[:k]] = i
    chains = _chain_lengths(turn)
    shapes = SessionShapes(
        turns=[min(30, max(3, n)) for n in chains],
        appended=[min(4000, max(200, a)) for a in appended],
        output=[max(1, int(r["output_length"])) for r in rows],
        first=[min(4000, max(200, a)) for a in appended],
        system_tokens=system_tokens,
    )
    stats = {
        "trace": f"benchmarks/traces/mooncake/{path.name}",  # the repository's copy, wherever it was read
        "continuations": len(appended),
        "appended_p10_p50_p90": _quantiles(appended),
        "output_p10_p50_p90": _quantiles([int(r["output_length"]) for r in rows]),
        "chains": len(chains),
        "chain_turns_p50_p90_max": [*_quantiles(chains, (50, 90)), max(chains)],
    }
    return shapes, stats


def _chain_lengths(turn: Sequence[int]) -> list[int]:
    """From each request's turn number, the chains' lengths: a chain of n turns has one request at
    each of turns 1..n, so the chains of length >= t number the requests at turn t."""
    counts: dict[int, int] = {}
    for t in turn:
        counts[t] = counts.get(t, 0) + 1
    lengths: list[int] = []
    for t in sorted(counts):
        longer = counts.get(t + 1, 0)
        lengths += [t] * max(0, counts[t] - longer)
    return lengths


def _quantiles(values: Sequence[float], ps: Sequence[float] = (10, 50, 90)) -> list[float]:
    ordered = sorted(values)
    return [ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] for p in ps] if ordered else []


class ConsistentHash(_Stateless):
    """vllm-router's consistent_hash: a ring of 160 virtual nodes per worker; the request's session
    key goes to the first node at or after its hash (wrapping), whatever the workers' load."""

    name = "consistent_hash"
    VIRTUAL_NODES = 160

    def __init__(self) -> None:
        self._workers: tuple[str, ...] = ()
        self._ring: list[tuple[int, str]] = []

    def choose(self, req: RouteRequest, candidates: Sequence[EngineState], now: float) -> Choice | None:  # noqa: ARG002  # Policy protocol
        if not candidates:
            return None
        ids = tuple(e.id for e in candidates)
        if ids != self._workers:
            self._workers = ids
            self._ring = sorted(
                (xxh3_64_intdigest(f"{url}:{i}".encode()), url) for url in ids for i in range(self.VIRTUAL_NODES)
            )
        key = req.session if req.session is not None else req.id
        at = bisect_left(self._ring, (xxh3_64_intdigest(key.encode()), ""))
        url = self._ring[at % len(self._ring)][1]
        return Choice(next(e for e in candidates if e.id == url), 0, "consistent_hash")


SETUPS = ("prefix", "sessions_first", "sessions_retention", "sessions_wait", "vllm_router_consistent_hash")


def setup_for(name: str, args: argparse.Namespace) -> ClusterSetup:
    # The interactive pool's engines as its profile runs them (seats, prefill step), the gateway's pool
    # declaring those seats as the shipped configuration does.
    shipped = dict(arg.removeprefix("--").split("=", 1) for arg in pool_args(INTERACTIVE) if "=" in arg)
    profile = load_profile("h200-7b-bf16").with_overrides(
        num_blocks=args.num_blocks,
        kv_offloading_blocks=args.kv_offloading_blocks,
        max_num_seqs=int(shipped["max-num-seqs"]),
        max_num_batched_tokens=int(shipped["max-num-batched-tokens"]),
    )
    sessions = SessionSettings(
        enabled=name.startswith("sessions"),
        first_burst=args.first_burst,
        wait_for_engine=name == "sessions_wait",
        wait_factor=args.wait_factor,
    )
    admission = AdmissionSettings(enabled=name != "vllm_router_consistent_hash", sessions=sessions)
    retention = 1.0 if name in ("sessions_retention", "sessions_wait") else 0.0
    return ClusterSetup(
        [PoolSetup(INTERACTIVE, args.engines, profile, seats=pool_gateway(INTERACTIVE).get("max_num_seqs"))],
        "prefix",
        admission,
        budgets={INTERACTIVE: Budget(None, args.itl_ms / 1000), BATCH: Budget(None, None, None)},
        policy_options={"retention_weight": retention},
        seed=args.seed,
    )


def run_setup(name: str, trace: list[TraceRequest], args: argparse.Namespace) -> dict[str, Any]:
    setup = setup_for(name, args)
    cluster = Cluster(setup)
    if name == "vllm_router_consistent_hash":
        for dispatcher in cluster.dispatchers:
            for pool in dispatcher.pools.values():
                pool.policy = ConsistentHash()
    started = time.monotonic()
    outcome = cluster.run([replace(r) for r in trace])
    wall = time.monotonic() - started
    records: list[Record] = list(outcome["records"].values())
    capacity = args.engines * args.num_blocks * setup.pools[0].profile.block_size
    return {**measure(records, outcome["duration_s"], capacity), "wall_s": round(wall, 1)}


def measure(records: list[Record], duration: float, capacity: int) -> dict[str, Any]:
    by_session: dict[str, list[Record]] = {}
    for rec in records:
        by_session.setdefault(rec.trace.session or rec.req.id, []).append(rec)
    reprefilled = continuing = moved = reprefilled_moved = 0
    context_seconds = 0.0
    completion: list[float] = []
    failed = 0
    for turns in by_session.values():
        turns.sort(key=lambda r: r.trace.turn)
        for before, after in itertools.pairwise(turns):
            if after.first is None:
                continue
            known = min(before.trace.input_len + before.output_tokens, after.trace.input_len - 1)
            again = max(0, known - after.cached_tokens)
            reprefilled += again
            continuing += 1
            if before.dispatch and after.dispatch and before.dispatch.engine.id != after.dispatch.engine.id:
                moved += 1
                reprefilled_moved += again
        for rec, following in zip(turns, [*turns[1:], None], strict=True):
            end = following.req.arrival if following is not None else (rec.done or rec.req.arrival)
            context_seconds += (rec.trace.input_len + rec.output_tokens) * max(0.0, end - rec.req.arrival)
        last = turns[-1]
        if last.done is not None and last.trace.next_turn is None:
            completion.append(last.done - turns[0].req.arrival)
        else:
            failed += 1
    ttft = [r.first - r.req.arrival for r in records if r.first is not None]
    new = [r.first - r.req.arrival for r in records if r.first is not None and r.trace.turn == 1]
    output = sum(r.output_tokens for r in records if r.done is not None)
    return {
        "sessions": len(by_session),
        "sessions_incomplete": failed,
        "turns": len(records),
        "continuing_turns": continuing,
        "reprefilled_tokens": reprefilled,
        "reprefilled_per_continuing_turn": round(reprefilled / continuing, 1) if continuing else None,
        "continuing_turns_moved": moved,
        "reprefilled_tokens_of_moved_turns": reprefilled_moved,
        "turn_ttft_p50_s": _p(ttft, 50),
        "turn_ttft_p99_s": _p(ttft, 99),
        "session_completion_p50_s": _p(completion, 50),
        "session_completion_p99_s": _p(completion, 99),
        "new_session_ttft_p99_s": _p(new, 99),
        "output_tokens_per_s": round(output / duration, 1) if duration else None,
        "duration_s": round(duration, 1),
        "kv_demand_over_capacity": round(context_seconds / duration / capacity, 2) if duration else None,
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the runs (of one setup, one workload per seed)."""
    out: dict[str, Any] = {"runs": len(runs)}
    for key in runs[0]:
        values = [r[key] for r in runs if isinstance(r.get(key), int | float)]
        out[key] = statistics.median(values) if values else None
    return out


def _p(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)], 3)


def ratios(results: dict[str, dict[str, Any]], against: str = "prefix") -> dict[str, Any]:
    base = results[against]
    out: dict[str, Any] = {}
    for name, r in results.items():
        if name == against:
            continue
        out[name] = {
            "reprefill_fewer_x": _ratio(base["reprefilled_tokens"], r["reprefilled_tokens"]),
            "completion_p99_lower_x": _ratio(base["session_completion_p99_s"], r["session_completion_p99_s"]),
            "new_session_ttft_p99_change": _ratio(r["new_session_ttft_p99_s"], base["new_session_ttft_p99_s"]),
        }
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    panels = [
        ("reprefilled_tokens", "re-prefilled tokens of continuing turns"),
        ("session_completion_p99_s", "session completion p99 (s)"),
        ("turn_ttft_p99_s", "turn TTFT p99 (s)"),
        ("new_session_ttft_p99_s", "new-session TTFT p99 (s)"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4))
    for ax, (key, title) in zip(axes, panels, strict=True):
        colors = ["#999", "#6a9", "#2a6", "#184", "#c84", "#a63"][: len(names)]
        ax.bar(range(len(names)), [results[n][key] or 0 for n in names], color=colors)
        ax.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=7)
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=40, help="sessions per workload (the GPU plan's 40)")
    parser.add_argument("--rate", type=float, default=1.0, help="sessions starting per second")
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument(
        "--num-blocks", type=int, default=2340, help="KV blocks per engine (16 tokens; the GPU plan's 37,440 tokens)"
    )
    parser.add_argument(
        "--kv-offloading-blocks",
        type=int,
        default=0,
        help="a CPU KV tier of this many blocks per engine (engines/sim/cpu_tier.py: vLLM's native offloading; "
        "0: none)",
    )
    parser.add_argument("--system", type=int, default=2048, help="system prompt tokens")
    parser.add_argument("--first-burst", type=int, default=SessionSettings().first_burst)
    parser.add_argument(
        "--wait-factor",
        type=float,
        default=SessionSettings().wait_factor,
        help="sessions_wait: a continuing turn waits for its engine this many times its first token elsewhere",
    )
    parser.add_argument(
        "--itl-ms", type=float, default=250.0, help="ITL budget (50 ms cannot hold with 8k-token prefill chunks)"
    )
    parser.add_argument(
        "--seeds", default="0,1,2,3,4", help="one workload per seed; each setup's figures are their medians"
    )
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/agent_sessions"))
    args = parser.parse_args()
    provenance = envelope.start()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes, stats = mooncake_shapes(MOONCAKE, args.system)
    seeds = [int(s) for s in args.seeds.split(",")]
    by_seed: dict[str, dict[str, dict[str, Any]]] = {}
    for seed in seeds:
        trace = agent_sessions(args.sessions, args.rate, shapes, seed)
        for name in args.setups.split(","):
            print(f"agent_sessions: seed {seed}, {name} ...", file=sys.stderr, flush=True)
            args.seed = seed
            by_seed.setdefault(name, {})[str(seed)] = run = run_setup(name, trace, args)
            print(f"  {json.dumps(run)}", file=sys.stderr, flush=True)
    results = {name: medians(list(runs.values())) for name, runs in by_seed.items()}
    report = {
        "workload": {
            "sessions": args.sessions,
            "rate_per_s": args.rate,
            "system_tokens": args.system,
            "pause_s": list(shapes.pause_s),
            "engines": args.engines,
            "num_blocks": args.num_blocks,
            "kv_offloading_blocks": args.kv_offloading_blocks,
            "seeds": seeds,
            "profile": "h200-7b-bf16",
            "shapes_from": stats,
        },
        "results": results,
        "ratios_against_prefix": ratios(results) if "prefix" in results else {},
        "by_seed": by_seed,
    }
    (out / "results.json").write_text(json.dumps(provenance.wrap(report), indent=2))
    plot(results, out / "agent_sessions.png")
    print(json.dumps(report["ratios_against_prefix"], indent=2))


if __name__ == "__main__":
    main()
