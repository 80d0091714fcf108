"""``gateway sim``: experiments on simulated engines in virtual time.

Two forms:
- ``--concurrency 1,2,4,...`` runs closed-loop clients against one engine of ``--profile``
  at each level (default prompts 1000 tokens, outputs 128, each ±25 %, ignore_eos).
- ``--trace FILE[@class]`` replays traces through the gateway's core and a cluster of
  engines, once per ``--policy``, on the same arrivals. With admission on, refused requests are
  judged by replaying them admitted (``--counterfactual``): ``false_refusals`` per class.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from priority_gateway.config import ClassesConfig, ConfigError, PrefixPolicyConfig, Raw
from priority_gateway.config.schema import build, convert
from priority_gateway.core.classes import BATCH, INTERACTIVE, Budget
from priority_gateway.core.dispatcher import AdmissionSettings
from priority_gateway.engines.sim.profile import Profile, load_profile
from priority_gateway.simulate.cluster import Cluster, ClusterSetup, PoolSetup
from priority_gateway.simulate.counterfactual import false_refusals
from priority_gateway.simulate.report import summarize
from priority_gateway.simulate.traces import TraceRequest, load_trace, merge, parse_trace_arg, scale_blocks

POLICIES = ("round_robin", "least_loaded", "prefix")


def add_arguments(p: argparse.ArgumentParser) -> None:
    _replay_arguments(p)
    _engine_and_admission_arguments(p)
    _replica_arguments(p)
    _sweep_arguments(p)


def _replay_arguments(p: argparse.ArgumentParser) -> None:
    """The traces replayed, the pools they are replayed on and the batch flood beside them."""
    p.add_argument(
        "--trace",
        action="append",
        default=[],
        help="trace file (Mooncake .jsonl, Azure .csv), @class; repeat for several (default: none, then --concurrency)",
    )
    p.add_argument("--engines", default="8", help="engines per pool: N, or interactive=16,batch=8")
    p.add_argument("--profile", default="gemma4-nvfp4", help="engine profile: P, or interactive=P1,batch=P2")
    p.add_argument("--policy", default="prefix", help=f"comma-separated routing policies: {', '.join(POLICIES)}")
    p.add_argument("--rate-scale", type=float, default=1.0, help="replay the trace X times faster")
    p.add_argument(
        "--minutes", type=float, default=None, help="replay only the first M minutes (default: the whole trace)"
    )
    p.add_argument("--engines-per-device", type=int, default=1, help="engines sharing one GPU (taking turns on it)")
    p.add_argument(
        "--trace-block-tokens",
        type=int,
        default=None,
        help="tokens per trace block: fewer shrinks every block and prompt by that ratio (default: 512, as published)",
    )
    p.add_argument("--batch-flood", type=int, default=0, help="keep N batch requests outstanding")
    p.add_argument(
        "--flood-lengths",
        default=None,
        metavar="INPUT,OUTPUT",
        help="flood request lengths in tokens (each ±25 %%); default: drawn from the traces",
    )


def _engine_and_admission_arguments(p: argparse.ArgumentParser) -> None:
    """SLO admission and its budgets, the engines' KV cache and context, the pooled-cache ceilings."""
    p.add_argument("--admission", choices=("on", "off"), default="on", help="SLO admission control")
    p.add_argument("--shared-pool", action="store_true", help="one FCFS pool for both classes (the naive baseline)")
    interactive = ClassesConfig().interactive
    p.add_argument("--ttft-ms", type=float, default=interactive.ttft_p99_ms, help="interactive TTFT p99 budget")
    p.add_argument("--itl-ms", type=float, default=interactive.itl_p99_ms, help="interactive ITL p99 budget")
    p.add_argument("--num-blocks", type=int, default=None, help="KV cache blocks per engine (default: the profile's)")
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="longest context per request (default: the profile's max_model_len)",
    )
    p.add_argument("--no-oracle", action="store_true", help="skip the pooled-cache ceilings (faster)")


def _replica_arguments(p: argparse.ArgumentParser) -> None:
    """Gateway replicas and what they share, the refusals judged, the prefix policy's settings, the seed."""
    p.add_argument("--replicas", type=int, default=1, help="gateway replicas, arrivals spread round robin")
    p.add_argument(
        "--counterfactual",
        type=int,
        default=30,
        metavar="N",
        help="judge up to N refusals per class by replaying them admitted (0: skip; costs one more run)",
    )
    p.add_argument(
        "--share",
        choices=("on", "off"),
        default="on",
        help="replicas share what their prefix index learns, as they do on a Redis store (off: as with no store)",
    )
    p.add_argument(
        "--share-delay-ms", type=float, default=2.0, help="from a batch of learned facts sent to its arrival"
    )
    p.add_argument("--share-interval-ms", type=float, default=5.0, help="a replica sends what it learned this often")
    p.add_argument(
        "--share-down",
        default=None,
        metavar="FROM:UNTIL",
        help="the replicas' channel breaks from FROM until UNTIL seconds into the run, each admitting its "
        "safe share (default: never)",
    )
    p.add_argument(
        "--policy-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="prefix policy setting (prefix.policy in docs/configuration.md, or precise=true), e.g. "
        "load_factor=2; repeatable (default: none, the configuration's defaults)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (arrivals, lengths)")


def _sweep_arguments(p: argparse.ArgumentParser) -> None:
    """The single-engine closed-loop sweep (``--concurrency``), and where the results go."""
    p.add_argument(
        "--concurrency",
        default=None,
        help="single-engine closed-loop sweep at these levels, like 1,2,4,8 (default: none, replay --trace)",
    )
    p.add_argument(
        "--input-len",
        type=int,
        default=2048,
        help="sweep prompt length in tokens, each drawn within +/-25 %% (default 2048, as make engine-sweep)",
    )
    p.add_argument(
        "--output-len",
        type=int,
        default=512,
        help="sweep output length in tokens, each drawn within +/-25 %% (default 512, as make engine-sweep)",
    )
    p.add_argument(
        "--json", dest="json_out", default=None, help="write the results to this JSON file (default: print them)"
    )


def _span(value: str | None) -> tuple[float, float] | None:
    if value is None:
        return None
    start, _, end = value.partition(":")
    try:
        span = (float(start), float(end))
    except ValueError:
        raise SystemExit(f"--share-down: expected FROM:UNTIL in seconds, got {value!r}") from None
    if not 0 <= span[0] < span[1]:
        raise SystemExit(f"--share-down: FROM must be before UNTIL, got {value!r}")
    return span


def _split(value: str, kinds: tuple[str, ...]) -> dict[str, str]:
    if "=" not in value:
        return dict.fromkeys(kinds, value)
    out = {}
    for part in value.split(","):
        key, _, val = part.partition("=")
        out[key.strip()] = val.strip()
    return out


def _profile(name: str, args: argparse.Namespace) -> Profile:
    try:
        profile = load_profile(name)
    except ValueError as exc:  # unknown, or a file that is not a profile: one line, no traceback
        raise SystemExit(f"gateway sim: --profile: {exc}") from None
    return profile.with_overrides(num_blocks=args.num_blocks, max_model_len=args.max_model_len)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.concurrency:
        return _sweep(args)
    if not args.trace and not (args.batch_flood and args.flood_lengths):
        raise SystemExit("gateway sim: give --trace FILE[@class] (or --concurrency for a single-engine sweep)")
    traces = []
    for arg in args.trace:
        path, cls = parse_trace_arg(arg)
        synthetic = str(path).startswith(("poisson:", "hot:"))
        if not synthetic and not Path(path).is_file():
            raise SystemExit(f"gateway sim: --trace: no file {str(path)!r}")
        try:
            loaded = load_trace(path, cls, args.minutes)
        except ValueError as exc:  # a spec or file of the wrong kind: one line
            raise SystemExit(f"gateway sim: --trace: {exc}") from None
        traces.append(scale_blocks(loaded, args.trace_block_tokens) if args.trace_block_tokens else loaded)
    trace = merge(traces, args.rate_scale)
    classes = {r.cls for r in trace} | ({BATCH} if args.batch_flood else set())
    flood_source = _flood_source(args, [r for t in traces for r in t])
    results: dict[str, Any] = {}
    for policy in [p.strip() for p in args.policy.split(",") if p.strip()]:
        if policy not in POLICIES:
            raise SystemExit(f"gateway sim: unknown policy {policy!r}; known: {', '.join(POLICIES)}")
        setup = build_setup(args, policy, classes)
        started = time.monotonic()
        _progress(f"sim: {policy}: {len(trace)} requests on {sum(p.engines for p in setup.pools)} engines ...")
        outcome = Cluster(setup).run(_fresh(trace), flood_source)
        summary = summarize(setup, outcome, oracle=not args.no_oracle)
        if setup.admission.enabled and args.counterfactual > 0:
            judged = false_refusals(setup, _fresh(trace), flood_source, outcome, args.counterfactual)
            for cls, figures in judged.items():
                summary["by_class"][cls]["false_refusals"] = figures
        summary["wall_s"] = round(time.monotonic() - started, 1)
        results[policy] = summary
        _progress(
            f"sim: {policy}: done in {summary['wall_s']} s wall for {summary['duration_s']} s virtual; "
            f"ttft p99 {summary['ttft_p99_ms']} ms, hit ratio {summary['prefix_hit_ratio']}"
        )
    return results


def _flood_source(args: argparse.Namespace, traces: list[TraceRequest]) -> list[TraceRequest]:
    if not args.flood_lengths:
        if args.batch_flood and not traces:
            raise SystemExit("gateway sim: --batch-flood needs --flood-lengths when the traces are empty")
        return traces
    try:
        input_len, output_len = (int(x) for x in args.flood_lengths.split(","))
    except ValueError:
        raise SystemExit(f"gateway sim: --flood-lengths takes INPUT,OUTPUT, got {args.flood_lengths!r}") from None
    spec = f"poisson:rate=1,input={input_len},output={output_len},minutes=10,seed=flood"
    return load_trace(Path(spec), BATCH)


def _fresh(trace: list[TraceRequest]) -> list[TraceRequest]:
    return [replace(r) for r in trace]


def _policy_options(args: argparse.Namespace) -> dict[str, object]:
    """``--policy-option KEY=VALUE`` as the ``prefix.policy`` section of the configuration reads it,
    plus ``precise`` (the simulator's stand-in for a pool's ``kv_events``)."""
    given: dict[str, Raw] = {}
    for item in args.policy_option:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"expected KEY=VALUE, got {item!r}", source="--policy-option")
        given[key.strip()] = Raw(value.strip(), "--policy-option")
    precise = given.pop("precise", None)
    try:
        options: dict[str, object] = asdict(build(PrefixPolicyConfig, given, ("prefix", "policy")))
    except ConfigError as exc:
        raise exc.from_source("--policy-option") from None
    if precise is not None:
        options["precise"] = convert(bool, precise, ("precise",))
    return options


def build_setup(args: argparse.Namespace, policy: str, classes: set[str]) -> ClusterSetup:
    budgets = {INTERACTIVE: Budget(args.ttft_ms / 1000, args.itl_ms / 1000), BATCH: Budget()}
    admission = AdmissionSettings(enabled=args.admission == "on")
    common: dict[str, Any] = {
        "flood": args.batch_flood,
        "flood_until": args.minutes * 60.0 if args.minutes is not None else None,
        "seed": args.seed,
        "policy_options": _policy_options(args),
        "replicas": args.replicas,
        "share": args.share == "on",
        "share_delay_s": args.share_delay_ms / 1000,
        "share_interval_s": args.share_interval_ms / 1000,
        "share_down": _span(args.share_down),
        "engines_per_device": args.engines_per_device,
    }
    profiles = _split(args.profile, (INTERACTIVE, BATCH))
    counts = _split(args.engines, (INTERACTIVE, BATCH))
    if args.shared_pool:
        total = sum(int(counts.get(c, 0)) for c in (INTERACTIVE, BATCH) if c in classes) or int(counts[INTERACTIVE])
        pools = [PoolSetup("shared", total, _profile(profiles.get(INTERACTIVE, args.profile), args))]
        return ClusterSetup(pools, policy, admission, budgets, {INTERACTIVE: "shared", BATCH: "shared"}, **common)
    pools = []
    for cls in (INTERACTIVE, BATCH):
        # A pool per class that has traffic, or that --engines names explicitly.
        if cls not in classes and not ("=" in args.engines and cls in counts):
            continue
        sched = "priority" if cls == BATCH else "fcfs"
        pools.append(PoolSetup(cls, int(counts.get(cls, 8)), _profile(profiles.get(cls, args.profile), args), sched))
    return ClusterSetup(pools, policy, admission, budgets, **common)


def _sweep(args: argparse.Namespace) -> dict[str, Any]:
    from priority_gateway.engines.sim.sweep import run_sweep

    try:
        levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(
            f"gateway sim: --concurrency: expected levels like 1,2,4,8, got {args.concurrency!r}"
        ) from None
    profile = _profile(args.profile, args)
    _progress(f"sim: sweep {profile.name} at concurrency {levels} ...")
    results = run_sweep(
        profile,
        levels,
        args.input_len,
        args.output_len,
        ttft_slo_ms=args.ttft_ms,
        itl_slo_ms=args.itl_ms,
        seed=args.seed,
    )
    for level, r in results.items():
        _progress(
            f"  c={level}: ttft p99 {r['ttft_p99_ms']} ms, itl p99 {r['itl_p99_ms']} ms, "
            f"{r['output_tokens_per_s']} tok/s"
        )
    return results


def main(args: argparse.Namespace) -> int:
    results = run(args)
    text = json.dumps(results, indent=2)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(text)
        _progress(f"sim: wrote {args.json_out}")
    else:
        print(text)
    return 0
