"""Prefix affinity through several gateway replicas: shared routing against none, and precise mode.

Each replica takes every Nth arrival, as a Kubernetes Service spreads connections, and scrapes
every engine. Three parts, each written to its own JSON under ``--out``:

- ``matrix`` (virtual time, ``gateway sim``): the whole hour of the Mooncake conversation trace on
  8 engines of the ``h200-32b-fp8`` profile, admission off, the default prefix policy; N = 1, 2,
  4 and 8 replicas at 1x and 2x the trace's rate; approximate mode with replicas sharing their
  routing (the default on a Redis store), approximate mode sharing nothing (``--share off``), and
  precise mode (the engines' KV events; replicas share their load, there are no blocks to share).
  Hit ratio against the pooled-cache ceiling (``oracle_hit_ratio``), TTFT p50/p99, imbalance,
  bytes per second on the channel.
- ``options`` (virtual time, the first 20 minutes: the caches fill within the first three): the
  ways to make replicas agree that were tried, at N = 2 and 8, 1x and 2x, and the channel's delay
  (1, 10, 100, 1000 ms) at N = 8. The variants that are not the product are patched into the core
  here, each said below (``VARIANTS``).
- ``realtime`` (wall clock): two ``gateway serve`` replicas sharing a real ``redis-server`` in front
  of 8 simulated engines in real time, each replaying every other request of the first minutes of
  the trace (``gateway bench``), sharing on and off: the engines' own hit ratio, the bytes and the
  delay on the channel as the replicas' metrics count them, and the core's cost per fact.

    python benchmarks/replicas.py [--parts matrix,options,realtime] [--minutes M] [--only KEYS] [--out DIR]

``--minutes`` replays only the first M minutes in ``matrix`` (a quicker look; the committed results
replay the whole hour). ``--only 1x/4/precise,2x/4/precise`` runs only those cells of the matrix
and adds them to the ``matrix.json`` already there. Writes ``matrix.json``, ``options.json``,
``realtime.json`` (every run's numbers, with the command that made them), ``summary.json`` and
``replicas.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families

import priority_gateway.simulate.cli as sim_cli
from priority_gateway.bench import envelope
from priority_gateway.core import prefix_policy
from priority_gateway.core.dispatcher import Dispatch, Dispatcher
from priority_gateway.core.fleet import Fleet, FleetDecisions, FleetSettings
from priority_gateway.core.routing import Choice
from priority_gateway.loopback import Proc, free_port, start_engine, start_gateway

ROOT = Path(__file__).resolve().parents[1]

MOONCAKE = str(ROOT / "benchmarks/traces/mooncake/conversation_trace.jsonl")
COMMON = [
    "--trace",
    MOONCAKE,
    "--engines",
    "8",
    "--profile",
    "h200-32b-fp8",
    "--admission",
    "off",
    "--counterfactual",
    "0",
]
REPLICAS = (1, 2, 4, 8)
RATES = (1.0, 2.0)
OPTION_MINUTES = 20.0
DELAYS_MS = (1.0, 10.0, 100.0, 1000.0)
BAR = 0.9


def progress(message: str) -> None:
    print(f"replicas: {message}", file=sys.stderr, flush=True)


def sim(argv: list[str], oracle: bool) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    sim_cli.add_arguments(parser)
    args = parser.parse_args([*COMMON, "--policy", "prefix", *argv, *([] if oracle else ["--no-oracle"])])
    return sim_cli.run(args)["prefix"]


def row(result: dict[str, Any], oracle: float) -> dict[str, Any]:
    share = result.get("share") or {}
    return {
        "prefix_hit_ratio": result["prefix_hit_ratio"],
        "share_of_oracle": round(result["prefix_hit_ratio"] / oracle, 4),
        "ttft_p50_ms": result["ttft_p50_ms"],
        "ttft_p99_ms": result["ttft_p99_ms"],
        "load_imbalance": result["load_imbalance"],
        "channel_bytes_per_s": share.get("published_bytes_per_s"),
        "wall_s": result["wall_s"],
    }


class Runs:
    """Runs one after another, with progress and an estimate of what is left."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.started = total, 0, time.monotonic()

    def run(self, label: str, argv: list[str], oracle: bool = False) -> dict[str, Any]:
        progress(f"[{self.done + 1}/{self.total}] {label}: gateway sim {' '.join(argv)} ...")
        result = sim(argv, oracle)
        self.done += 1
        spent = time.monotonic() - self.started
        left = spent / self.done * (self.total - self.done)
        progress(
            f"[{self.done}/{self.total}] {label}: hit ratio {result['prefix_hit_ratio']}, "
            f"ttft p99 {result['ttft_p99_ms']} ms, {result['wall_s']} s wall; about {left / 60:.0f} min left"
        )
        return result


# -- matrix -----------------------------------------------------------------------------------------

MODES = {
    "shared": [],
    "unshared": ["--share", "off"],
    "precise": ["--policy-option", "precise=true"],
}


# Which replica counts each mode runs at, in the order they run: the product first, so a run cut
# short still has what matters.
MATRIX_PLAN = (("shared", REPLICAS), ("unshared", (2, 8)), ("precise", (2, 8)), ("unshared", (4,)), ("precise", (4,)))


def matrix(minutes: float | None, path: Path, only: set[str] | None = None) -> dict[str, Any]:
    span = ["--minutes", f"{minutes:g}"] if minutes else []
    plan = [(rate, n, mode) for mode, counts in MATRIX_PLAN for rate in RATES for n in counts]
    out: dict[str, Any] = {"minutes": minutes or "whole trace", "oracle_hit_ratio": {}, "runs": {}}
    if only is not None:
        plan = [(rate, n, mode) for rate, n, mode in plan if f"{rate:g}x/{n}/{mode}" in only]
        if path.exists():
            out = json.loads(path.read_text())
    runs = Runs(len(plan))
    for rate, n, mode in plan:
        argv = [*span, "--rate-scale", f"{rate:g}", "--replicas", str(n), *MODES[mode]]
        key = f"{rate:g}x"
        first = key not in out["oracle_hit_ratio"]
        result = runs.run(f"{rate:g}x, {n} replicas, {mode}", argv, oracle=first)
        if first:  # the ceilings count the requests of the run's window, which depends on the rate
            out["oracle_hit_ratio"][key] = result["oracle_hit_ratio"]
            out.setdefault("infinite_hit_ratio", {})[key] = result["infinite_hit_ratio"]
        out["runs"][f"{rate:g}x/{n}/{mode}"] = {
            "rate": rate,
            "replicas": n,
            "mode": mode,
            "command": "gateway sim " + " ".join([*COMMON[2:], "--trace", "<mooncake>", "--policy", "prefix", *argv]),
            **row(result, out["oracle_hit_ratio"][key]),
            "full": result,
        }
        path.write_text(json.dumps(out, indent=2))  # every run as it ends: a long run shows its progress
    return out


# -- options ----------------------------------------------------------------------------------------


def _conversation_key_choice(self: Any, req: Any, candidates: Any, now: float) -> Choice | None:  # noqa: ARG001  # replaces Policy.choose
    """Routing keys every replica computes alike: rendezvous hashing of the 40th block (the first
    64-character blocks past the trace's shared 512-token opening, so one key per conversation; a
    deployment would not know where its shared prefix ends, so this is the best case), taking the
    first engine in rendezvous order whose queue is within 20,000 tokens of the shortest, within
    the load bound. No replica's own index changes the choice."""
    if not candidates:
        return None
    eligible = self.eligible(candidates)
    prefix = req.prefix
    key = prefix[min(len(prefix), 40) - 1] if prefix else 0
    costs = {e.id: e.queued_prefill + self.decode_cost_tokens * e.load for e in eligible}
    floor = min(costs.values())
    for engine in sorted(eligible, key=lambda e: prefix_policy.rendezvous_weight(key, e.id), reverse=True):
        if costs[engine.id] <= floor + 20_000:
            depth = self.index.match(prefix, [engine.id])[0] if prefix else 0
            return Choice(engine, self._cached_tokens(req, depth), "rendezvous")
    return None


def _no_load(self: Fleet, engines: set[str], now: float, out: FleetDecisions, leaders: bool = True) -> None:
    """A variant: the others' reports change no engine's load (admission is off in these runs)."""


def _inflight_only(self: Fleet, engines: set[str], now: float, out: FleetDecisions, leaders: bool = True) -> None:  # noqa: ARG001  # replaces a Fleet method
    """A variant: the others' requests in flight count in an engine's load, their pending prefill not."""
    for engine_id in engines:
        engine = self.local.engine_states.get(engine_id)
        if engine is not None:
            engine.peer_inflight = self.table.peer_inflight(engine_id)


@contextlib.contextmanager
def _scrape_every(seconds: float) -> Iterator[None]:
    build = sim_cli.build_setup

    def faster(*args: Any, **kwargs: Any) -> Any:
        setup = build(*args, **kwargs)
        setup.scrape_s = seconds
        return setup

    with mock.patch.object(sim_cli, "build_setup", faster):
        yield


# name -> (what it is, gateway sim options, the patch that makes it, when it is not the product)
VARIANTS: dict[str, tuple[str, list[str], Callable[[], contextlib.AbstractContextManager[Any]] | None]] = {
    "unshared": ("replicas share nothing (as before)", ["--share", "off"], None),
    "unshared_tolerance_1": (
        "share nothing; engines within 100 % of the prompt's size of the cheapest are equally good",
        ["--share", "off", "--policy-option", "tolerance=1.0"],
        None,
    ),
    "conversation_key": (
        "share nothing; rendezvous on a per-conversation key every replica computes alike",
        ["--share", "off"],
        lambda: mock.patch.object(prefix_policy.PrefixAffinity, "choose", _conversation_key_choice),
    ),
    "blocks_only": (
        "share the index's facts (blocks), not the load",
        [],
        lambda: mock.patch.object(Fleet, "_refresh_peers", _no_load),
    ),
    "blocks_fast_scrapes": (
        "share the blocks, not the load; every replica scrapes every engine every 0.5 s instead of 2 s",
        [],
        lambda: _stack(mock.patch.object(Fleet, "_refresh_peers", _no_load), _scrape_every(0.5)),
    ),
    "blocks_inflight": (
        "share the blocks and each replica's requests in flight, not its pending prefill",
        [],
        lambda: mock.patch.object(Fleet, "_refresh_peers", _inflight_only),
    ),
    "shared": ("share the blocks, requests in flight and pending prefill (the product)", [], None),
    "precise": ("precise mode (the engines' KV events), sharing load", ["--policy-option", "precise=true"], None),
}


@contextlib.contextmanager
def _stack(*managers: contextlib.AbstractContextManager[Any]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for manager in managers:
            stack.enter_context(manager)
        yield


def options(minutes: float, rates: tuple[float, ...], counts: tuple[int, ...]) -> dict[str, Any]:
    span = ["--minutes", f"{minutes:g}"]
    plan: list[tuple[str, float, int, list[str], Callable[[], Any] | None]] = []
    for rate in rates:
        plan.append(("one_replica", rate, 1, [], None))
        for name, (_, argv, patch) in VARIANTS.items():
            for n in counts:
                plan.append((name, rate, n, argv, patch))
        for delay in DELAYS_MS:
            plan.append((f"shared_delay_{delay:g}ms", rate, max(counts), ["--share-delay-ms", f"{delay:g}"], None))
    runs = Runs(len(plan))
    out: dict[str, Any] = {
        "minutes": minutes,
        "variants": {name: what for name, (what, _, _) in VARIANTS.items()},
        "runs": {},
    }
    oracle = None
    for name, rate, n, argv, patch in plan:
        full = [*span, "--rate-scale", f"{rate:g}", "--replicas", str(n), *argv]
        with patch() if patch else contextlib.nullcontext():
            result = runs.run(f"{name}, {rate:g}x, {n} replicas", full, oracle=oracle is None)
        if oracle is None:
            oracle = result["oracle_hit_ratio"]
            out["oracle_hit_ratio"] = oracle
        out["runs"][f"{rate:g}x/{n}/{name}"] = {"rate": rate, "replicas": n, "variant": name, **row(result, oracle)}
    return out


# -- realtime ---------------------------------------------------------------------------------------


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(metrics: dict, name: str, **labels: str) -> float:
    want = tuple(sorted(labels.items()))
    return sum(v for (n, ls), v in metrics.items() if n == name and all(item in ls for item in want))


def _quantile(metrics: dict, name: str, q: float) -> float | None:
    """Upper bound of the histogram bucket the ``q`` quantile falls in (summed over replicas)."""
    buckets: dict[float, float] = {}
    for (n, labels), v in metrics.items():
        if n == name + "_bucket":
            le = float(dict(labels)["le"])
            buckets[le] = buckets.get(le, 0.0) + v
    if not buckets or not buckets.get(float("inf")):
        return None
    total = buckets[float("inf")]
    for le in sorted(buckets):
        if buckets[le] >= q * total:
            return le
    return None


def _half_traces(tmp: Path, minutes: float) -> list[Path]:
    rows = [line for line in Path(MOONCAKE).read_text().splitlines() if line.strip()]
    rows = [r for r in rows if json.loads(r)["timestamp"] < minutes * 60_000]
    halves = []
    for i in range(2):
        path = tmp / f"conversation_trace_replica{i}.jsonl"
        path.write_text("\n".join(rows[i::2]) + "\n")
        halves.append(path)
    return halves


def _redis_server(tmp: Path) -> Proc:
    port = free_port()
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp), "--save", ""]
    server = Proc(cmd, f"redis://127.0.0.1:{port}/0", tmp / "redis.log").start()
    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    deadline = time.monotonic() + 10
    while True:
        try:
            if client.ping():
                client.close()
                return server
        except redis.exceptions.RedisError:
            if time.monotonic() > deadline or not server.alive:
                raise RuntimeError(f"redis-server did not start:\n{server.log()}") from None
            time.sleep(0.05)


def realtime(minutes: float) -> dict[str, Any]:
    out: dict[str, Any] = {"minutes": minutes, "engines": 8, "replicas": 2, "runs": {}}
    for share in (True, False):
        name = "shared" if share else "unshared"
        with tempfile.TemporaryDirectory() as tmpdir:
            tmp = Path(tmpdir)
            store = _redis_server(tmp)
            engines = [start_engine(tmp, "--profile", "h200-32b-fp8") for _ in range(8)]
            procs = list(engines)
            try:
                for engine in engines:
                    engine.wait_ready()
                config = {
                    "pools": {"interactive": {"engines": [e.url for e in engines]}},
                    "admission": {"enabled": False},
                    "store": store.url,
                    "fleet": {"enabled": share},
                    "log_level": "warning",
                }
                gateways = [start_gateway(tmp, config) for _ in range(2)]
                procs += gateways
                for gateway in gateways:
                    gateway.wait_ready("/ready")
                progress(f"realtime {name}: {minutes:g} min of Mooncake, every other request to each replica ...")
                benches = []
                for gateway, half in zip(gateways, _half_traces(tmp, minutes), strict=True):
                    cmd = [sys.executable, "-m", "priority_gateway", "bench", "--url", gateway.url]
                    cmd += ["--trace", f"{half}@interactive", "--duration", str(minutes * 60), "--model", "sim-model"]
                    cmd += ["--timeout", "600", "--out", str(tmp / f"bench-{gateway.url[-5:]}")]
                    benches.append((subprocess.Popen(cmd, cwd=ROOT), tmp / f"bench-{gateway.url[-5:]}"))
                for proc, _ in benches:
                    if proc.wait() != 0:
                        raise RuntimeError(f"gateway bench failed ({proc.returncode})")
                out["runs"][name] = _realtime_row(engines, gateways, [d for _, d in benches], minutes)
                progress(f"realtime {name}: {json.dumps(out['runs'][name]['summary'])}")
            finally:
                for proc in reversed(procs):
                    proc.stop()
                store.stop()
    out["core_cost_per_fact_us"] = _core_cost()
    return out


def _realtime_row(engines: list, gateways: list, bench_dirs: list[Path], minutes: float) -> dict[str, Any]:
    hits = queries = 0.0
    for engine in engines:
        m = _metrics(engine.url)
        hits += _value(m, "vllm:prefix_cache_hits_total")
        queries += _value(m, "vllm:prefix_cache_queries_total")
    merged: dict = {}
    for gateway in gateways:
        for key, value in _metrics(gateway.url).items():
            merged[key] = merged.get(key, 0.0) + value
    benches = [json.loads((d / "results.json").read_text())["runs"][0] for d in bench_dirs]
    seconds = minutes * 60
    summary = {
        "engine_hit_ratio": round(hits / queries, 4) if queries else 0.0,
        "completed": sum(b["completed"] for b in benches),
        "errors": sum(b["errors"] for b in benches),
        "ttft_p50_ms_per_replica": [b["ttft_p50_ms"] for b in benches],
        "ttft_p99_ms_per_replica": [b["ttft_p99_ms"] for b in benches],
        "channel_bytes_sent_per_s_per_replica": round(
            _value(merged, "gateway_routing_share_bytes_total", direction="sent") / seconds / 2, 1
        ),
        "channel_bytes_received_per_s_per_replica": round(
            _value(merged, "gateway_routing_share_bytes_total", direction="received") / seconds / 2, 1
        ),
        "batches_sent": _value(merged, "gateway_routing_share_batches_total", event="sent"),
        "batches_missed": _value(merged, "gateway_routing_share_batches_total", event="missed"),
        "batches_dropped": _value(merged, "gateway_routing_share_batches_total", event="dropped"),
        "facts_applied": _value(merged, "gateway_routing_share_facts_total", direction="applied"),
        "delay_p50_s_at_most": _quantile(merged, "gateway_routing_share_delay_seconds", 0.5),
        "delay_p99_s_at_most": _quantile(merged, "gateway_routing_share_delay_seconds", 0.99),
    }
    return {"summary": summary, "bench": benches}


def _core_cost() -> dict[str, float]:
    """Microseconds of core work per fact, on facts like the trace's: encoding a batch on the sender,
    decoding and applying it on a receiver."""
    from priority_gateway.core.dispatcher import PoolSpec
    from priority_gateway.core.prefix import chain_seed, hash_blocks
    from priority_gateway.core.request import RouteRequest
    from priority_gateway.simulate.traces import load_trace

    trace = load_trace(Path(MOONCAKE), "interactive", minutes=5)
    engines = [f"http://10.0.0.{i}:8000" for i in range(8)]
    sender = Dispatcher(
        [PoolSpec("interactive", engines, policy="prefix")], fleet=FleetSettings(b"p" * 16, settled=True)
    )
    receiver = Dispatcher(
        [PoolSpec("interactive", engines, policy="prefix")], fleet=FleetSettings(b"q" * 16, settled=True)
    )
    batches = []
    encoded = 0.0
    for i, tr in enumerate(trace):
        prefix = hash_blocks(tr.text(), chain_seed("sim-model"))
        req = RouteRequest(f"r{i}", "interactive", "sim-model", 0.0, tr.input_len, prefix=prefix)
        out = sender.submit(req, 0.0).answer
        assert isinstance(out, Dispatch)
        sender.finish(out, 0.0)
        started = time.perf_counter()
        data = sender.fleet.outgoing(0.0).send
        encoded += time.perf_counter() - started
        assert data is not None
        batches.append(data)
    raw = batches
    started = time.perf_counter()
    for data in raw:
        receiver.fleet.receive(data, 0.0)
    applied = time.perf_counter() - started
    n = len(batches)
    return {
        "facts": n,
        "bytes_per_fact": round(sum(len(r) for r in raw) / n, 1),
        "encode_us": round(encoded / n * 1e6, 1),  # what to tell, and its bytes
        "decode_and_apply_us": round(applied / n * 1e6, 1),
    }


# -- summary and plot -------------------------------------------------------------------------------


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    if "matrix" in results:
        m = results["matrix"]
        table = {key: {k: r[k] for k in r if k not in ("full", "command")} for key, r in m["runs"].items()}
        summary["matrix"] = {
            "minutes": m["minutes"],
            "oracle_hit_ratio": m["oracle_hit_ratio"],
            "runs": table,
            "shared_meets_the_bar": all(
                r["share_of_oracle"] >= BAR for r in table.values() if r["mode"] == "shared" and r["replicas"] > 1
            ),
            "shared_minus_precise_points": {
                key.rsplit("/", 1)[0]: round(
                    100 * (r["share_of_oracle"] - table[key.replace("/shared", "/precise")]["share_of_oracle"]), 1
                )
                for key, r in table.items()
                if r["mode"] == "shared" and key.replace("/shared", "/precise") in table
            },
        }
    if "options" in results:
        summary["options"] = {
            key: {k: r[k] for k in ("share_of_oracle", "ttft_p99_ms", "load_imbalance", "channel_bytes_per_s")}
            for key, r in results["options"]["runs"].items()
        }
    if "realtime" in results:
        summary["realtime"] = {name: r["summary"] for name, r in results["realtime"]["runs"].items()}
        summary["realtime"]["core_cost_per_fact_us"] = results["realtime"]["core_cost_per_fact_us"]
    return summary


def plot(results: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    panels = [p for p in ("matrix", "options") if p in results]
    if not panels:
        return
    fig, axes = plt.subplots(1, 2 + ("options" in results), figsize=(16, 4.6))
    if "matrix" in results:
        runs = results["matrix"]["runs"].values()
        colors = {"shared": "tab:green", "unshared": "tab:red", "precise": "tab:blue"}
        for mode, color in colors.items():
            for rate, style in ((1.0, "-"), (2.0, "--")):
                pts = sorted((r["replicas"], r) for r in runs if r["mode"] == mode and r["rate"] == rate)
                if not pts:
                    continue
                xs = [n for n, _ in pts]
                label = f"{mode}, {rate:g}x"
                axes[0].plot(xs, [r["share_of_oracle"] for _, r in pts], style, color=color, marker="o", label=label)
                axes[1].plot(xs, [r["ttft_p99_ms"] / 1000 for _, r in pts], style, color=color, marker="o", label=label)
        axes[0].axhline(BAR, color="black", linewidth=1, linestyle=":")
        axes[0].set_title(f"hit ratio / pooled-cache ceiling ({results['matrix']['minutes']} of Mooncake)")
        axes[0].set_ylim(0, 1.05)
        axes[1].set_title("TTFT p99 (s)")
        for ax in axes[:2]:
            ax.set_xlabel("gateway replicas")
            ax.set_xticks(REPLICAS)
        axes[0].legend(fontsize=7)
    if "options" in results:
        ax = axes[-1]
        runs = results["options"]["runs"]
        names = list(dict.fromkeys(r["variant"] for r in runs.values() if r["replicas"] > 1))
        combos = sorted({(r["rate"], r["replicas"]) for r in runs.values() if r["replicas"] > 1})
        width = 0.8 / len(combos)
        for i, (rate, n) in enumerate(combos):
            xs = [j + (i - (len(combos) - 1) / 2) * width for j in range(len(names))]
            ys = [runs.get(f"{rate:g}x/{n}/{name}", {}).get("share_of_oracle", 0.0) for name in names]
            ax.bar(xs, ys, width, label=f"{n} replicas, {rate:g}x")
        ax.axhline(BAR, color="black", linewidth=1, linestyle=":")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([n.replace("_", " ") for n in names], rotation=25, fontsize=7, ha="right")
        ax.set_title(f"ways tried (first {results['options']['minutes']:g} min): hit ratio / ceiling")
        ax.legend(fontsize=7)
    fig.suptitle("8 engines (h200-32b-fp8), gateway core in virtual time, admission off, default prefix policy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="matrix,options,realtime")
    parser.add_argument("--minutes", type=float, default=None, help="matrix: replay only the first M minutes")
    parser.add_argument("--only", default=None, help="matrix: only these cells (rate/replicas/mode, comma-separated)")
    parser.add_argument("--option-minutes", type=float, default=OPTION_MINUTES, help="options: the first M minutes")
    parser.add_argument("--option-rates", default="1,2", help="options: rate scales")
    parser.add_argument("--option-replicas", default="2,8", help="options: replica counts (delays at the largest)")
    parser.add_argument("--realtime-minutes", type=float, default=5.0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/replicas"))
    args = parser.parse_args()
    provenance = envelope.start()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    started = time.monotonic()
    results: dict[str, Any] = {}
    for part in ("matrix", "options", "realtime"):
        path = out / f"{part}.json"
        if part in parts:
            progress(f"{part} ...")
            part_started = time.monotonic()
            if part == "matrix":
                only = None if args.only is None else {key.strip() for key in args.only.split(",")}
                results[part] = matrix(args.minutes, path, only)
            elif part == "options":
                rates = tuple(float(r) for r in args.option_rates.split(","))
                counts = tuple(int(n) for n in args.option_replicas.split(","))
                results[part] = options(args.option_minutes, rates, counts)
            else:
                results[part] = realtime(args.realtime_minutes)
            wall_s = round(time.monotonic() - part_started, 1)
            if part == "matrix" and args.only is not None and "command" in results[part]:
                # Cells added to an earlier matrix: the file keeps its envelope, each addition its own.
                results[part].setdefault("added", []).append({**provenance.fields(), "wall_s": wall_s})
            else:
                results[part] = provenance.wrap({**results[part], "wall_s": wall_s})
            path.write_text(json.dumps(results[part], indent=2))
        elif path.exists():
            results[part] = json.loads(path.read_text())  # the summary and plot cover the committed parts too
    summary = summarize(results)
    summary["wall_s"] = round(time.monotonic() - started, 1)
    (out / "summary.json").write_text(json.dumps(provenance.wrap(summary), indent=2))
    print(json.dumps(summary, indent=2))
    plot(results, out / "replicas.png")


if __name__ == "__main__":
    main()
