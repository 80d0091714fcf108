"""How long the replicas' limiter takes to find a level over the ITL budget, seeing every request on
the engine, a quarter of them alone, or a quarter of them with the other replicas' evidence shared, with
the stalls the H200's interactive engines made.

The gateway's own ``ConcurrencyLimit`` in virtual time, fed the gaps of an engine held at 3 requests:
decode steps of ``--step-ms``, and a prefill (a new request) every ``1 / --prefills-per-s`` seconds on
average, each one slow step of ``--stall-ms`` for the requests decoding beside it (as measured in
``benchmarks/results/gpu/fleet/itl``: ~23 ms steps, ~300 ms stalls, ~0.65 prefills/s per engine).
Each request on the engine is one of ``N`` replicas', at random; the load every replica judges the
gaps at is the fleet's. Per trial: seconds until the limit first shrinks below 3, or none within
``--seconds``. Modes:

- ``--replicas N``: one replica of ``N`` learning alone, on its own requests' gaps (``N`` = 1: it sees
  every gap);
- ``--shared N``: ``N`` gateway replicas (the product's ``Dispatcher`` and ``Fleet``, as the server
  runs them) that learn one limit together: each feeds its own limiter its own requests' gaps; every
  ``--full-s`` (each at its own phase) its fleet's full batch goes to every replica, itself included,
  whose fleet applies it; every replica polls as the server does. The engine's leader (the lowest id
  of those that learned a limit; before anyone has, each judges alone on everyone's evidence) moves
  the limit, the others follow it. The time is the first shrink of a replica that leads;
  ``all_follow`` when every replica applies it.

The same seed draws the same engine (steps, stalls, which replica owns each request) in every mode:
replica 0 of ``--shared 4`` sees what the replica of ``--replicas 4`` sees.

    python benchmarks/gpu/limiter_evidence.py --out benchmarks/results/gpu/fleet/itl
    python benchmarks/gpu/limiter_evidence.py --replicas 1 4 --shared 4 --out benchmarks/results/gpu/fleet/itl
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from priority_gateway.bench import envelope
from priority_gateway.core.classes import INTERACTIVE
from priority_gateway.core.dispatcher import AdmissionSettings, Dispatcher, PoolSpec
from priority_gateway.core.fleet import FleetSettings
from priority_gateway.core.limiter import ConcurrencyLimit, LimitSettings

LEVEL = 3
ENGINE = "interactive-0"


def engine_steps(seed: int, replicas: int, args: argparse.Namespace) -> Iterator[tuple[float, float, list[int]]]:
    """The engine's steps: (when it ended, its gap, the replicas owning each request that got the gap)."""
    rng = random.Random(seed)
    owners = [int(rng.random() * replicas) for _ in range(LEVEL)]
    now, next_prefill = 0.0, rng.expovariate(args.prefills_per_s)
    while now < args.seconds:
        joined = None
        if now >= next_prefill:  # a new request replaces one that finished: one slow step for the others
            joined = rng.randrange(LEVEL)
            owners[joined] = int(rng.random() * replicas)
            next_prefill = now + rng.expovariate(args.prefills_per_s)
        gap = (args.stall_ms if joined is not None else args.step_ms) / 1000.0
        now += gap
        yield now, gap, [owner for slot, owner in enumerate(owners) if slot != joined]


def new_limit(args: argparse.Namespace) -> ConcurrencyLimit:
    return ConcurrencyLimit(args.budget_ms / 1000.0, LimitSettings(initial=float(LEVEL)))


def first_shrink(seed: int, replicas: int, args: argparse.Namespace) -> float | None:
    """Replica 0 of ``replicas``, learning alone."""
    limit = new_limit(args)
    for now, gap, owners in engine_steps(seed, replicas, args):
        for owner in owners:
            if owner == 0:
                limit.observe_itl(gap, LEVEL, now)
        limit.note_load(LEVEL)
        if limit.update(now, LEVEL) and limit.limit < LEVEL:
            return round(now, 2)
    return None


class SharingReplica:
    """One gateway replica: the product's dispatcher and fleet, in front of the one engine."""

    def __init__(self, index: int, phase: float, args: argparse.Namespace) -> None:
        limits = LimitSettings(initial=float(LEVEL))
        self.dispatcher = Dispatcher(
            [PoolSpec("interactive", [ENGINE], policy="least_loaded")],
            budgets={INTERACTIVE: args.budget_ms / 1000.0},
            admission=AdmissionSettings(enabled=True, limits=limits),
            fleet=FleetSettings(index.to_bytes(16, "big"), settled=True),
        )
        self.next_full = phase

    @property
    def limit(self) -> ConcurrencyLimit:
        return self.dispatcher.limits[ENGINE]

    @property
    def leads(self) -> bool:
        return self.dispatcher.fleet.leads(ENGINE)

    def publish(self, now: float) -> bytes | None:
        return self.dispatcher.fleet.outgoing(now, full=True).send

    def receive(self, data: bytes, now: float) -> None:
        self.dispatcher.fleet.receive(data, now)

    def poll(self, now: float) -> None:
        self.limit.note_load(LEVEL)  # the fleet's load on the engine: it is held at LEVEL
        self.dispatcher.poll(now)


def first_shrink_shared(
    seed: int, replicas: int, full_s: float, args: argparse.Namespace
) -> tuple[float | None, float | None]:
    """``replicas`` sharing evidence in full batches every ``full_s``: when the leader first shrank below
    ``LEVEL``, and when all of them applied it."""
    phases = random.Random(-1 - seed)
    fleet = [SharingReplica(i, phases.uniform(0.0, full_s), args) for i in range(replicas)]
    leader_shrank = None
    for now, gap, owners in engine_steps(seed, replicas, args):
        for owner in owners:
            fleet[owner].limit.observe_itl(gap, LEVEL, now)
        for replica in fleet:
            if now >= replica.next_full:
                replica.next_full += full_s
                data = replica.publish(now)
                for every in fleet if data is not None else ():
                    every.receive(data, now)  # the channel delivers a batch to everyone, its publisher too
        for replica in fleet:
            replica.poll(now)
        if leader_shrank is None and any(r.leads and r.limit.limit < LEVEL for r in fleet):
            leader_shrank = round(now, 2)
        if all(r.limit.limit < LEVEL for r in fleet):
            return leader_shrank, round(now, 2)
    return leader_shrank, None


def summary(times: list[float | None]) -> dict[str, Any]:
    found = sorted(t for t in times if t is not None)
    return {
        "shrunk_within_run": round(len(found) / len(times), 3),
        "seconds_to_shrink_p50": statistics.median(found) if found else None,
        "seconds_to_shrink_p90": found[int(0.9 * (len(found) - 1))] if found else None,
    }


def plot(curves: dict[str, list[float | None]], seconds: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, (label, times) in enumerate(curves.items()):
        found = sorted(t for t in times if t is not None)
        xs = [0.0, *found, seconds]
        ys = [0.0, *(100 * (i + 1) / len(times) for i in range(len(found))), 100 * len(found) / len(times)]
        style = {"linestyle": "--", "linewidth": 1.2} if i else {"linewidth": 3.5, "alpha": 0.5}  # curves may coincide
        ax.step(xs, ys, where="post", label=f"{label}: {len(found)}/{len(times)}", **style)
    ax.set_xlabel("seconds (virtual)")
    ax.set_ylabel("% of trials that found level 3 over budget")
    ax.set_xlim(0, seconds)
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"ConcurrencyLimit on the H200's stalls, an engine held at {LEVEL}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--step-ms", type=float, default=23.0)
    p.add_argument("--stall-ms", type=float, default=300.0)
    p.add_argument("--prefills-per-s", type=float, default=0.65)
    p.add_argument("--budget-ms", type=float, default=100.0)
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 4], help="one replica of N learning alone")
    p.add_argument("--shared", type=int, nargs="*", default=[], help="N replicas sharing their evidence")
    p.add_argument(
        "--full-s",
        type=float,
        nargs="+",
        default=[1.0],
        help="seconds between a replica's full batches (the gateway's: 1); a tiny one makes the evidence fresh",
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    provenance = envelope.start()
    rows, curves = {}, {}
    for n in args.replicas:
        times = [first_shrink(seed, n, args) for seed in range(args.trials)]
        rows[str(n)] = summary(times)
        curves["1 replica seeing all" if n == 1 else f"1 of {n} alone"] = times
        found = len(times) - times.count(None)
        print(f"{n} replica(s): level {LEVEL} found over budget in {found}/{len(times)} trials")
        print(f"  {rows[str(n)]}")
    shared = []
    for n in args.shared:
        for full_s in args.full_s:
            runs = [first_shrink_shared(seed, n, full_s, args) for seed in range(args.trials)]
            leader, everyone = [r[0] for r in runs], [r[1] for r in runs]
            shared.append({"replicas": n, "full_s": full_s, **summary(leader), "all_follow": summary(everyone)})
            curves[f"{n} sharing, full batch every {full_s:g} s"] = leader
            found = len(runs) - leader.count(None)
            print(f"{n} replicas sharing every {full_s:g} s: level {LEVEL} found over budget in {found}/{len(runs)}")
            print(f"  {shared[-1]}")
    settings = {k: v for k, v in vars(args).items() if k not in ("shared", "full_s") or args.shared}
    result = provenance.wrap({**settings, "out": None, "by_replicas": rows})
    if args.out is None:
        return
    if not args.shared:
        (args.out / "limiter_evidence.json").write_text(json.dumps(result, indent=1) + "\n")
        return
    result["shared"] = shared
    (args.out / "limiter_evidence_shared.json").write_text(json.dumps(result, indent=1) + "\n")
    try:
        plot(curves, args.seconds, args.out / "limiter_evidence_shared.png")
    except ImportError:
        print("no matplotlib: no plot")


if __name__ == "__main__":
    main()
