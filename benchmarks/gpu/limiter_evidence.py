"""How long one replica's limiter takes to find a level over the ITL budget, seeing every request on
the engine or a quarter of them, with the stalls the H200's interactive engines made.

The gateway's own ``ConcurrencyLimit`` in virtual time, fed the gaps of an engine held at 3 requests:
decode steps of ``--step-ms``, and a prefill (a new request) every ``1 / --prefills-per-s`` seconds on
average, each one slow step of ``--stall-ms`` for the requests decoding beside it (as measured in
``benchmarks/results/gpu/fleet/itl``: ~23 ms steps, ~300 ms stalls, ~0.65 prefills/s per engine).
A replica of a fleet of ``N`` sees only its own requests' gaps (each request is its with chance
1/N) while the load it judges them at is the fleet's. Per trial: seconds until the limit first
shrinks below 3, or none within ``--seconds``.

    python benchmarks/gpu/limiter_evidence.py --out benchmarks/results/gpu/fleet/itl
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from priority_gateway.core.limiter import ConcurrencyLimit, LimitSettings

LEVEL = 3


def first_shrink(seed: int, replicas: int, args: argparse.Namespace) -> float | None:
    rng = random.Random(seed)
    limit = ConcurrencyLimit(args.budget_ms / 1000.0, LimitSettings(initial=float(LEVEL)))
    mine = [rng.random() < 1 / replicas for _ in range(LEVEL)]
    now, next_prefill = 0.0, rng.expovariate(args.prefills_per_s)
    while now < args.seconds:
        joined = None
        if now >= next_prefill:  # a new request replaces one that finished: one slow step for the others
            joined = rng.randrange(LEVEL)
            mine[joined] = rng.random() < 1 / replicas
            next_prefill = now + rng.expovariate(args.prefills_per_s)
        now += (args.stall_ms if joined is not None else args.step_ms) / 1000.0
        for slot in range(LEVEL):
            if mine[slot] and slot != joined:
                limit.observe_itl((args.stall_ms if joined is not None else args.step_ms) / 1000.0, LEVEL, now)
        limit.note_load(LEVEL)
        if limit.update(now, LEVEL) and limit.limit < LEVEL:
            return round(now, 2)
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--step-ms", type=float, default=23.0)
    p.add_argument("--stall-ms", type=float, default=300.0)
    p.add_argument("--prefills-per-s", type=float, default=0.65)
    p.add_argument("--budget-ms", type=float, default=100.0)
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 4])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    rows = {}
    for n in args.replicas:
        times = [first_shrink(seed, n, args) for seed in range(args.trials)]
        found = sorted(t for t in times if t is not None)
        rows[str(n)] = {
            "shrunk_within_run": round(len(found) / len(times), 3),
            "seconds_to_shrink_p50": statistics.median(found) if found else None,
            "seconds_to_shrink_p90": found[int(0.9 * (len(found) - 1))] if found else None,
        }
        print(f"{n} replica(s): level {LEVEL} found over budget in {len(found)}/{len(times)} trials, {rows[str(n)]}")
    result = {"command": " ".join(["python", "benchmarks/gpu/limiter_evidence.py", *sys.argv[1:]]), **vars(args)}
    result = {**result, "out": None, "by_replicas": rows}
    if args.out is not None:
        (args.out / "limiter_evidence.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
