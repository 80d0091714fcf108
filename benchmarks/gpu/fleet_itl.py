"""Where the interactive ITL tail comes from, one ``gateway serve`` against several, on real engines.

The scene of ``benchmarks/fleet_admission_realtime.py`` (its gateway config and batch flood; the
interactive Poisson stream; the engines' concurrency sampled every ``--sample-ms``), runs ``one``
and ``fleet`` alternated ``--repeats`` times, each instrumented so that one sitting tells a gap the
engine made from one the gateway, the client or the host made:

    python benchmarks/gpu/fleet_itl.py --engines interactive=URL,URL batch=URL,URL \\
        --replicas 4 --repeats 2 --seconds 75 --redis-server /usr/bin/redis-server --out DIR
    python benchmarks/gpu/fleet_itl.py --analyze DIR      # the summary and plot again, from DIR

Rules:
- Every request (interactive and batch) keeps its timeline: sent, the replica it went through,
  the engine that served it (``x-gateway-engine``, mapped back to the URL), each content event's
  arrival, and how it ended; ``timelines-<setup>-<repeat>.json.gz``.
- A process of its own scrapes every engine's ``/metrics`` each ``--scrape-s`` (its ITL histogram
  ``vllm:inter_token_latency_seconds``, measured in the engine core; ``vllm:iteration_tokens_total``;
  running, waiting, preemptions) and reads ``/proc`` for the host: busy cores and the CPU each role
  took (gateway replicas, redis-server, the client, the samplers, everything else: the engines).
- The client measures its own event loop's lag (a 10 ms ticker), so a stall of the measuring loop
  shows as what it is.
- All times are seconds since the run's start on one monotonic clock.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import gzip
import itertools
import json
import math
import multiprocessing
import os
import re
import secrets
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleet_admission_realtime import Flood, gateway_config
from live_stack import (
    RoundRobin,
    Sampler,
    open_engines,
    redis_server,
    say,
    start_replicas,
    stop_all,
    wait_engines_idle,
)

from priority_gateway.bench import envelope, loadgen, stats
from priority_gateway.bench.loadgen import Sample
from priority_gateway.bench.workload import SyntheticWorkload, load_arrivals
from priority_gateway.core.models import engine_tag

SETUPS = ("one", "fleet")
HELD_KEYS = ("max_held_after_warmup", "limit_max", "series")
GAP_MS = 100.0  # the ITL budget: a gap over it is what the tail is made of
RELAY_LAG_S = 0.5
"""The longest a token may take from the engine's step to the client's read on an idle host (the GPU
machine's); ``--relay-lag-s`` states another host's (a loaded 2-core one, under coverage, takes longer)."""
ENGINE_SERIES = (
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:iteration_tokens_total_bucket",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions_total",
)
_GATEWAY_ITL = re.compile(r'^gateway_itl_seconds_bucket\{class="([^"]*)",le="([^"]*)",pool="([^"]*)"\} (\S+)$', re.M)
_SAMPLE = re.compile(r"^([a-z_:]+)(?:\{([^}]*)\})? (\S+)$")
_LE = re.compile(r'le="([^"]*)"')


def progress(message: str) -> None:
    say("fleet_itl", message)


# --- the client: who served each request -----------------------------------------------------------


class Placed:
    """The client of one request: the next replica of ``replicas``, remembering which, and the
    engine that answered (its ``x-gateway-engine``)."""

    __slots__ = ("engine", "replica", "replicas")

    def __init__(self, replicas: RoundRobin) -> None:
        self.replicas = replicas
        self.replica: int | None = None
        self.engine: str | None = None

    async def request(self, method: bytes, path: bytes, headers: Any = (), body: bytes = b"") -> Any:
        client = self.replicas.pick()
        self.replica = self.replicas.clients.index(client)
        reply = await client.request(method, path, headers, body)
        tag = reply.header(b"x-gateway-engine")
        self.engine = tag.decode() if tag else None
        return reply


class Timeline:
    """One request: its sample, and where it went."""

    __slots__ = ("cls", "placed", "sample")

    def __init__(self, cls: str, sample: Sample, placed: Placed) -> None:
        self.cls, self.sample, self.placed = cls, sample, placed

    def record(self, origin: float, engines: dict[str, str]) -> dict[str, Any]:
        s = self.sample
        ended = s.refused or s.error or ("cancelled" if s.cancelled else "done" if s.done else "open")
        return {
            "class": self.cls,
            "replica": self.placed.replica,
            "engine": engines.get(self.placed.engine or "", self.placed.engine),
            "sent": round(s.sent - origin, 4),
            "chunks": [round(t - origin, 4) for t in s.chunks],
            "done": None if s.done is None else round(s.done - origin, 4),
            "ended": ended,
            "output_tokens": s.output_tokens,
        }


class TracedFlood(Flood):
    """The batch flood of ``fleet_admission_realtime``, each request's placement kept."""

    def __init__(self, replicas: RoundRobin, model: str, workload: SyntheticWorkload) -> None:
        super().__init__(loadgen.Target(replicas, model, x_priority="batch"), workload)
        self.replicas = replicas
        self.timelines: list[Timeline] = []

    async def worker(self, delay: float) -> None:
        await asyncio.sleep(delay)
        while True:
            placed = Placed(self.replicas)
            sample = Sample("batch", loadgen.now())
            self.samples.append(sample)
            self.timelines.append(Timeline("batch", sample, placed))
            target = loadgen.Target(placed, self.target.model, x_priority="batch")
            await loadgen.stream_one(target, self.workload.next(), sample)
            if sample.refused is not None or sample.error is not None:
                await asyncio.sleep(sample.retry_after or 1.0)


async def loop_lag(origin: float, lags: list[tuple[float, float]], tick_s: float = 0.01) -> None:
    """Each tick's lateness over 5 ms: the client's own loop stalling."""
    while True:
        before = loadgen.now()
        await asyncio.sleep(tick_s)
        late = loadgen.now() - before - tick_s
        if late > 0.005:
            lags.append((round(before - origin, 3), round(late * 1000.0, 1)))


async def drive(
    urls: list[str], model: str, engines: dict[str, str], args: argparse.Namespace, seed: int, origin: float
) -> dict:
    """The interactive stream and the flood through ``urls``; every request's timeline, in seconds
    since ``origin`` (the scraper's clock too, so a chunk and a scrape compare directly)."""
    tag = secrets.token_hex(4)
    minutes = args.seconds / 60.0
    arrivals = load_arrivals(
        [f"poisson:rate={args.rate},input={args.input},output={args.output},minutes={minutes:g},seed={seed}"],
        x_priority="interactive",
        tag=tag,
    )
    interactive = RoundRobin(urls, read_timeout=600)
    batch = RoundRobin(urls, read_timeout=3600)
    loop = asyncio.get_running_loop()
    workload = SyntheticWorkload(args.input, args.output, seed=seed, tag=f"{tag}/batch")
    flood = TracedFlood(batch, model, workload)
    lags: list[tuple[float, float]] = []
    side = [loop.create_task(flood.worker(args.ramp_s * n / args.flood)) for n in range(args.flood)]
    side.append(loop.create_task(loop_lag(origin, lags)))
    timelines: list[Timeline] = []
    running: set[asyncio.Task[None]] = set()
    try:
        for arrival in arrivals:
            wait = origin + arrival.arrival - loadgen.now()
            if wait > 0:
                await asyncio.sleep(wait)
            placed = Placed(interactive)
            sample = Sample("interactive", loadgen.now())
            timelines.append(Timeline("interactive", sample, placed))
            target = loadgen.Target(placed, model, x_priority="interactive")
            task = loop.create_task(loadgen.stream_one(target, arrival.spec(), sample))
            running.add(task)
            task.add_done_callback(running.discard)
        if running:
            await asyncio.gather(*running)
    finally:
        # From here on the flood's clients read nothing more, while its requests go on emitting tokens
        # until the gateway sees them leave: the engines' counts are compared up to this moment only.
        reads_stopped = loadgen.now() - origin
        for task in side:
            task.cancel()
        await asyncio.gather(*side, return_exceptions=True)
        await interactive.aclose()
        await batch.aclose()
    warm = [t.sample for t in timelines if t.sample.sent - origin >= args.warmup_s]
    return {
        "interactive": stats.summarize(warm, *args.budget_ms),
        "batch_statuses": flood.statuses(),
        "elapsed_s": round(loadgen.now() - origin, 1),
        "reads_stopped_s": round(reads_stopped, 4),
        "client_loop_lag_ms": lags,
        "timelines": [t.record(origin, engines) for t in [*timelines, *flood.timelines]],
    }


# --- the engines' own histograms and the host, every second, in a process of its own ---------------


def engine_series(text: str) -> dict[str, Any]:
    """The ``ENGINE_SERIES`` of one ``/metrics`` text, summed over label sets (buckets by ``le``)."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if not line.startswith(ENGINE_SERIES):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        if name.endswith("_bucket"):
            le = _LE.search(labels or "")
            buckets = out.setdefault(name.removesuffix("_bucket"), {})
            if le:
                buckets[le.group(1)] = buckets.get(le.group(1), 0.0) + float(value)
        else:
            out[name] = out.get(name, 0.0) + float(value)
    return out


def gateway_itl(text: str) -> dict[str, dict[str, float]]:
    """A replica's own ``gateway_itl_seconds`` buckets (the gaps it saw from the engine), by
    ``class/pool``."""
    out: dict[str, dict[str, float]] = {}
    for cls, le, pool, value in _GATEWAY_ITL.findall(text):
        out.setdefault(f"{cls}/{pool}", {})[le] = float(value)
    return out


def _jiffies(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    return int(fields[11]) + int(fields[12])


def _cores() -> list[tuple[int, int]]:
    """(busy, total) jiffies of each core."""
    out = []
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            values = [int(v) for v in line.split()[1:]]
            idle = values[3] + values[4]
            out.append((sum(values) - idle, sum(values)))
    return out


def host_sample() -> tuple[dict[int, int], list[tuple[int, int]]]:
    """Every process's jiffies, and each core's counters."""
    return {int(e.name): _jiffies(int(e.name)) for e in os.scandir("/proc") if e.name.isdigit()}, _cores()


def by_role(roles: dict[str, list[int]], before: dict[int, int], after: dict[int, int]) -> dict[str, int]:
    """Jiffies each role took between two samples (every other process on the host is ``other``);
    a process only in one of them does not count."""
    known = {pid: role for role, pids in roles.items() for pid in pids}
    out = dict.fromkeys([*roles, "other"], 0)
    for pid, jiffies in after.items():
        if pid in before:
            out[known.get(pid, "other")] += jiffies - before[pid]
    return out


def _scrape(url: str, parse: Callable[[str], Any]) -> Any:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=2) as response:
            return parse(response.read().decode())
    except (OSError, ValueError):
        return None


def _scraper_main(
    urls: list[str],
    gateways: list[str],
    roles: dict[str, list[int]],
    origin: float,
    every_s: float,
    conn: Connection,
) -> None:
    roles = {**roles, "scraper": [os.getpid()]}
    ticks: list[dict[str, Any]] = []
    last_procs, last_cores = host_sample()
    hz = os.sysconf("SC_CLK_TCK")
    while not conn.poll():
        t = time.monotonic() - origin
        engines, engines_at = {}, {}
        for url in urls:  # scraped one after another: each engine's reading has its own moment
            asked = time.monotonic() - origin
            engines[url] = _scrape(url, engine_series)
            engines_at[url] = (round(asked, 4), round(time.monotonic() - origin, 4))
        replicas = [_scrape(url, gateway_itl) for url in gateways]
        procs, cores = host_sample()
        took = by_role(roles, last_procs, procs)
        shares = [(b - b0) / max(1, n - n0) for (b, n), (b0, n0) in zip(cores, last_cores, strict=False)]
        span = max(1e-6, sum(n - n0 for (_, n), (_, n0) in zip(cores, last_cores, strict=False)) / len(cores) / hz)
        ticks.append(
            {
                "t": round(t, 3),
                "engines": engines,
                "engines_at": engines_at,
                "gateway_itl": replicas,
                "busy_cores": round(sum(shares), 2),
                "cores_over_90pct": sum(s > 0.9 for s in shares),
                "cpu_cores_by_role": {r: round(j / hz / span, 2) for r, j in took.items()},
                "loadavg_1m": envelope.load_average()[0],
            }
        )
        last_procs, last_cores = procs, cores
        time.sleep(max(0.0, every_s - (time.monotonic() - origin - t)))
    conn.send(ticks)


class Scraper:
    """``_scraper_main`` in a child process, from ``start`` until ``stop`` (its ticks)."""

    def __init__(
        self, urls: list[str], gateways: list[str], roles: dict[str, list[int]], origin: float, every_s: float
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        args = (urls, gateways, roles, origin, every_s, child)
        self._proc = context.Process(target=_scraper_main, args=args, daemon=True)
        self._proc.start()

    def stop(self) -> list[dict[str, Any]]:
        self._conn.send("stop")
        # A busy host may keep the scraper from answering for a while: its ticks are waited for while
        # it lives, and a run without them says so.
        deadline = time.monotonic() + 300
        while not self._conn.poll(1.0):
            if not self._proc.is_alive() or time.monotonic() > deadline:
                print("fleet_itl: the scraper sent no ticks: no engine or host figures", file=sys.stderr)
                self._proc.join(timeout=10)
                return []
        ticks: list[dict[str, Any]] = self._conn.recv()
        self._proc.join(timeout=10)
        return ticks


# --- one run ---------------------------------------------------------------------------------------


def pool_options(items: Sequence[str]) -> list[tuple[str, str, Any]]:
    """``POOL.KEY=VALUE`` settings for the gateways' pools, each value read as YAML."""
    import yaml

    out = []
    for item in items:
        name, sep, value = item.partition("=")
        pool, dot, key = name.partition(".")
        if not sep or not dot or not pool or not key:
            raise SystemExit(f"--pool-option: expected POOL.KEY=VALUE, got {item!r}")
        out.append((pool, key, yaml.safe_load(value)))
    return out


def one_run(setup: str, rep: int, engines: Any, args: argparse.Namespace, tmp: Path, out: Path) -> dict[str, Any]:
    replicas_n = 1 if setup == "one" else args.replicas
    gateway_args = argparse.Namespace(budget_ms=args.budget_ms, batch_scheduling=args.batch_scheduling)
    redis = redis_server(args.redis_server, tmp).start()
    all_urls = [u for us in engines.urls.values() for u in us]
    tags = {engine_tag(u): u for u in all_urls}
    replicas = []
    try:
        config = gateway_config(engines, redis.url, gateway_args)
        if args.pin_limit is not None:  # no learning: every engine's limit is this, in every replica
            config["admission"] = {f"{k}_limit": args.pin_limit for k in ("initial", "min", "max")}
        for pool, key, value in pool_options(args.pool_option):
            config["pools"][pool][key] = value
        replicas = start_replicas(tmp, config, replicas_n)
        urls = [r.url for r in replicas]
        sampler = Sampler(engines.pool_of, urls, args.sample_ms / 1000.0, args.warmup_s)
        roles = {
            "gateways": [r.popen.pid for r in replicas if r.popen is not None],
            "redis": [redis.proc.popen.pid] if redis.proc and redis.proc.popen else [],
            "client": [os.getpid()],
            "sampler": [sampler._proc.pid] if sampler._proc.pid else [],
        }
        origin_mono, origin = time.monotonic(), loadgen.now()
        scraper = Scraper(all_urls, urls, roles, origin_mono, args.scrape_s)
        result = asyncio.run(drive(urls, engines.model, tags, args, seed=args.seed + rep, origin=origin))
        result["clock_skew_s"] = round((loadgen.now() - origin) - (time.monotonic() - origin_mono), 4)
        ticks = scraper.stop()
        sampled = sampler.stop()
    finally:
        stop_all(replicas)
        redis.stop()
    if not wait_engines_idle(all_urls):
        progress("  engines still hold requests 120 s after the run: the next run starts on a busy fleet")
    timelines = result.pop("timelines")
    run = {
        "setup": setup,
        "repeat": rep,
        "replicas": replicas_n,
        "replica_urls": urls,
        "pools": engines.pool_of,
        "pin_limit": args.pin_limit,
        "pool_options": args.pool_option,
        "budget_ms": list(args.budget_ms),
        "relay_lag_s": args.relay_lag_s,
        "warmup_s": args.warmup_s,
        **result,
        "held": {
            u: {k: e[k] for k in ("max_held_after_warmup", "limit_max", "series")}
            for u, e in sampled["engines"].items()
        },
    }
    with gzip.open(out / f"timelines-{setup}-{rep}.json.gz", "wt") as f:
        json.dump({"timelines": timelines, "ticks": ticks}, f, separators=(",", ":"))
    return run


# --- analysis --------------------------------------------------------------------------------------


def _hist_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    if not before or not after:
        return {}
    return {le: after[le] - before.get(le, 0.0) for le in after}


def _scraped_at(tick: dict, url: str) -> tuple[float, float]:
    """When the scraper asked ``url`` for its metrics in ``tick`` and when the answer came (the
    tick's start for both in results written before each engine's scrape was timed)."""
    at = (tick.get("engines_at") or {}).get(url)
    return (at[0], at[1]) if at else (tick["t"], tick["t"])


def _engine_delta(first: dict | None, last: dict | None, url: str, name: str) -> dict[str, float]:
    """One engine's histogram ``name`` between two scraper ticks."""
    if first is None or last is None:
        return {}
    return _hist_delta((first["engines"].get(url) or {}).get(name), (last["engines"].get(url) or {}).get(name))


def _gateway_delta(first: dict | None, last: dict | None, replica: str, key: str) -> dict[str, float]:
    """Replica ``replica``'s own ITL histogram of ``class/pool`` between two scraper ticks."""

    def at(tick: dict) -> dict[str, float] | None:
        seen = tick.get("gateway_itl") or []
        return (seen[int(replica)] or {}).get(key) if replica.isdigit() and int(replica) < len(seen) else None

    return {} if first is None or last is None else _hist_delta(at(first), at(last))


def _over(hist: dict[str, float], bound_s: float) -> float:
    """Observations over ``bound_s`` in a cumulative histogram (``bound_s`` must be a bucket's bound)."""
    total = hist.get("+Inf", 0.0)
    under = next((v for le, v in hist.items() if le != "+Inf" and math.isclose(float(le), bound_s)), None)
    return total - under if under is not None else float("nan")


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def analyse(run: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """Where the run's gaps over ``GAP_MS`` were: which engine, replica, when; the engines' own count
    of ITLs over the same bound in the same window; the host around each gap."""
    warm = run["warmup_s"]
    timelines, ticks = data["timelines"], data["ticks"]
    pools = run["pools"]
    lag_s = float(run.get("relay_lag_s", RELAY_LAG_S))
    window = [t for t in ticks if t["t"] >= warm]
    # The last scrape that ended while every client still read (runs written before it was recorded:
    # the last scrape of the run).
    stopped = run.get("reads_stopped_s")
    read = [t for t in window if stopped is None or max(_scraped_at(t, u)[1] for u in pools) <= stopped]
    first, last = (read[0], read[-1]) if len(read) > 1 else (None, None)
    per_engine: dict[str, Any] = {}
    gaps_over: list[dict[str, Any]] = []
    for url, pool in sorted(pools.items()):
        # The engine observes a token's ITL when it emits it; the client reads it up to a relay lag
        # later. So the engine's count over its two scrapes lies between the client's gaps that
        # surely fall inside (read after the first scrape ended plus the lag, before the last began)
        # and those that may (read after the first began, before the last ended plus the lag).
        (s0, s1), (e0, e1) = (_scraped_at(first, url), _scraped_at(last, url)) if first and last else ((0, 0), (0, 0))
        ends = [
            (c[i], (c[i] - c[i - 1]) * 1000.0, tl)
            for tl in timelines
            if tl["engine"] == url
            for c in [tl["chunks"]]
            for i in range(1, len(c))
        ]
        client = [(t, g, tl) for t, g, tl in ends if first is not None and (s0 + s1) / 2 < t <= (e0 + e1) / 2]
        itl = _engine_delta(first, last, url, "vllm:inter_token_latency_seconds")
        steps = _engine_delta(first, last, url, "vllm:iteration_tokens_total")
        per_engine[url] = {
            "pool": pool,
            "client_gaps": len(client),
            "client_gaps_surely_in": sum(s1 + lag_s < t <= e0 for t, _, _ in ends),
            "client_gaps_maybe_in": sum(s0 < t <= e1 + lag_s for t, _, _ in ends),
            "client_gaps_over_100ms": sum(g > GAP_MS for _, g, _ in client),
            "client_gaps_over_100ms_interactive": sum(
                g > GAP_MS and tl["class"] == "interactive" for _, g, tl in client
            ),
            "client_gap_p50_ms": _pct([g for _, g, _ in client], 0.5),
            "client_gap_p99_ms": _pct([g for _, g, _ in client], 0.99),
            "engine_itl_count": itl.get("+Inf"),
            "engine_itl_over_100ms": _over(itl, 0.1) if itl else None,
            "engine_itl_over_200ms": _over(itl, 0.2) if itl else None,
            "engine_steps_by_tokens_le": steps,
        }
        for t, g, tl in client:
            if g > GAP_MS:
                gaps_over.append(
                    {
                        "t": round(t, 3),
                        "gap_ms": round(g, 1),
                        "engine": url,
                        "pool": pool,
                        "replica": tl["replica"],
                        "class": tl["class"],
                    }
                )
    # Whole-run ITL of the measured interactive requests (as fleet_admission_realtime counts it).
    measured = [tl for tl in timelines if tl["class"] == "interactive" and tl["sent"] >= warm and tl["ended"] == "done"]
    itl = [(c[i] - c[i - 1]) * 1000.0 for tl in measured for c in [tl["chunks"]] for i in range(1, len(c))]
    tail = [
        {"t": c[i], "gap_ms": (c[i] - c[i - 1]) * 1000.0, "engine": tl["engine"], "replica": tl["replica"]}
        for tl in measured
        for c in [tl["chunks"]]
        for i in range(1, len(c))
        if (c[i] - c[i - 1]) * 1000.0 > GAP_MS
    ]
    by_replica: dict[str, dict[str, int]] = {}
    for tl in measured:
        c = tl["chunks"]
        row = by_replica.setdefault(str(tl["replica"]), {"gaps": 0, "over_100ms": 0})
        row["gaps"] += max(0, len(c) - 1)
        row["over_100ms"] += sum((c[i] - c[i - 1]) * 1000.0 > GAP_MS for i in range(1, len(c)))
    for n, row in by_replica.items():
        for key in ("interactive/interactive", "batch/interactive"):
            seen = _gateway_delta(first, last, n, key)
            row[f"gateway_saw_over_100ms_{key.replace('/', '_on_')}"] = _over(seen, 0.1) if seen else None
        row["client_over_100ms_in_window"] = sum(
            (c[i] - c[i - 1]) * 1000.0 > GAP_MS
            for tl in timelines
            if tl["class"] == "interactive" and str(tl["replica"]) == n and first is not None
            for c in [tl["chunks"]]
            for i in range(1, len(c))
            if first["t"] <= c[i - 1] and c[i] <= last["t"]
        )
    by_engine: dict[str, int] = {}
    for g in tail:
        by_engine[g["engine"]] = by_engine.get(g["engine"], 0) + 1
    # A gap on one engine that others share in time is the GPU's or the host's, not that request's.
    for g in tail:
        start = g["t"] - g["gap_ms"] / 1000.0
        others = [o for o in gaps_over if o["t"] > start and o["t"] - o["gap_ms"] / 1000.0 < g["t"]]
        g["same_engine_concurrent"] = sum(o["engine"] == g["engine"] for o in others) - 1
        g["other_engines_concurrent"] = sorted({o["engine"] for o in others if o["engine"] != g["engine"]})
        tick = min(ticks, key=lambda k: abs(k["t"] - g["t"])) if ticks else None
        g["busy_cores"] = tick["busy_cores"] if tick else None
        g["cores_over_90pct"] = tick["cores_over_90pct"] if tick else None
        g["t"], g["gap_ms"] = round(g["t"], 3), round(g["gap_ms"], 1)
    lag = run.get("client_loop_lag_ms") or []
    busy = [k["busy_cores"] for k in window]
    roles = window[0]["cpu_cores_by_role"].keys() if window else []
    return {
        "setup": run["setup"],
        "repeat": run["repeat"],
        "replicas": run["replicas"],
        "pin_limit": run.get("pin_limit"),
        **interactive_load(run),
        "interactive_gap_over_100ms_share": round(len(tail) / len(itl), 5) if itl else None,
        "interactive_itl_p50_ms": _pct(itl, 0.5),
        "interactive_itl_p99_ms": _pct(itl, 0.99),
        "interactive_itl_p99_ms_as_reported": run["interactive"].get("itl_p99_ms"),
        "interactive_ttft_p99_ms": run["interactive"].get("ttft_p99_ms"),
        "interactive_completed": run["interactive"].get("completed"),
        "interactive_refused": run["interactive"].get("refused"),
        "interactive_gaps": len(itl),
        "interactive_gaps_over_100ms": len(tail),
        "interactive_gaps_over_100ms_by_engine": by_engine,
        "interactive_gaps_by_replica": by_replica,
        "interactive_first_tokens": late_first_tokens(run, timelines, ticks),
        "engines": per_engine,
        "client_loop_lag_over_50ms": sum(ms > 50 for _, ms in lag),
        "client_loop_lag_max_ms": max((ms for _, ms in lag), default=0.0),
        "host_busy_cores_p50": _pct(busy, 0.5),
        "host_busy_cores_max": max(busy, default=None),
        "host_cores_by_role_mean": {
            r: round(statistics.mean(k["cpu_cores_by_role"][r] for k in window), 2) for r in roles
        },
        "interactive_gaps_over_100ms_list": tail,
    }


def late_first_tokens(
    run: dict[str, Any], timelines: list[dict[str, Any]], ticks: list[dict[str, Any]]
) -> dict[str, Any]:
    """The measured interactive requests over the TTFT budget and within it, and of each how many met
    their engine holding requests waiting (``vllm:num_requests_waiting`` above 0 at a scrape between the
    request's send and its first token): a request the gateway started there waits for a seat."""
    budget_s = float(run.get("budget_ms", (1000.0, 100.0))[0]) / 1000.0
    warm = run["warmup_s"]
    times = [k["t"] for k in ticks]
    counts = {"over": 0, "over_at_waiting_engine": 0, "within": 0, "within_at_waiting_engine": 0}
    for tl in timelines:
        if tl["class"] != "interactive" or tl["sent"] < warm or not tl["chunks"]:
            continue
        first = tl["chunks"][0]
        lo, hi = bisect.bisect_left(times, tl["sent"]), bisect.bisect_right(times, first)
        waiting = any(
            (ticks[i]["engines"].get(tl["engine"]) or {}).get("vllm:num_requests_waiting", 0) > 0 for i in range(lo, hi)
        )
        side = "over" if first - tl["sent"] > budget_s else "within"
        counts[side] += 1
        counts[f"{side}_at_waiting_engine"] += waiting
    return {"ttft_budget_ms": budget_s * 1000.0, **counts}


def interactive_load(run: dict[str, Any]) -> dict[str, Any]:
    """What the interactive engines held (running + waiting, their own count) and the limit the fleet
    applied, after the warm-up: the mean over the samples of both engines, and how often each value."""
    held: list[float] = []
    limits: list[float] = []
    for url, trace in run.get("held", {}).items():
        if run["pools"].get(url) == "interactive":
            rows = [row for row in trace["series"] if row[0] >= run["warmup_s"]]
            held += [row[1] for row in rows]
            limits += [row[2] for row in rows]
    share = {str(v): round(held.count(v) / len(held), 3) for v in sorted(set(held))} if held else {}
    return {
        "interactive_engines_held_mean": round(statistics.mean(held), 2) if held else None,
        "interactive_engines_held_share": share,
        "interactive_engines_limit_mean": round(statistics.mean(limits), 2) if limits else None,
    }


def overview(folders: list[Path], out: Path, provenance: envelope.Envelope) -> dict[str, Any]:
    """Every run of several sittings side by side: the interactive tail against what the interactive
    engines held; ``overview.json`` and ``overview.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for folder in folders:
        summary = json.loads((folder / "summary.json").read_text())
        for a in summary["runs"]:
            keep = ("setup", "repeat", "replicas", "pin_limit", "interactive_engines_held_mean")
            keep += ("interactive_engines_limit_mean", "interactive_gap_over_100ms_share", "interactive_itl_p50_ms")
            keep += ("interactive_itl_p99_ms", "interactive_ttft_p99_ms", "interactive_completed")
            keep += ("interactive_refused", "host_busy_cores_p50", "client_loop_lag_max_ms")
            row = {"sitting": folder.name, **{k: a.get(k) for k in keep}}
            row["interactive_goodput_rps"] = _interactive_goodput(folder, a)
            row["interactive_first_tokens"] = a.get("interactive_first_tokens")  # runs analysed since it was
            engines = [e for e in a["engines"].values() if e["pool"] == "interactive"]
            row["interactive_engines_gaps_over_100ms_client"] = sum(e["client_gaps_over_100ms"] for e in engines)
            row["interactive_engines_gaps_over_100ms_engine"] = sum(e["engine_itl_over_100ms"] or 0 for e in engines)
            replicas = a["interactive_gaps_by_replica"].values()
            row["gaps_over_100ms_client_in_window"] = sum(r["client_over_100ms_in_window"] for r in replicas)
            row["gaps_over_100ms_gateways_saw"] = sum(
                r["gateway_saw_over_100ms_interactive_on_interactive"] or 0 for r in replicas
            )
            rows.append(row)
    result = provenance.wrap({"runs": rows, "by_replicas": by_replicas(rows)})
    (out / "overview.json").write_text(json.dumps(result, indent=1) + "\n")
    try:
        plot_overview(rows, out / "overview.png")
    except ImportError:
        progress("no matplotlib: no overview plot")
    return result


def _interactive_goodput(folder: Path, summary_run: dict[str, Any]) -> float | None:
    """The run's interactive goodput (requests/s meeting both budgets), as ``runs.json`` has it."""
    path = folder / "runs.json"
    if not path.exists():
        return None
    for run in json.loads(path.read_text()):
        if run["setup"] == summary_run["setup"] and run["repeat"] == summary_run["repeat"]:
            value = run["interactive"].get("goodput_requests_per_s")
            return float(value) if value is not None else None
    return None


def by_replicas(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per replica count: runs, the worst ITL p99, the median goodput; and the largest count's median
    goodput over one replica's (the issue's "within 10 %")."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if not r["pin_limit"]:
            groups.setdefault(int(r["replicas"]), []).append(r)
    table: dict[str, Any] = {}
    for n, runs in sorted(groups.items()):
        goodput = [r["interactive_goodput_rps"] for r in runs if r["interactive_goodput_rps"] is not None]
        table[str(n)] = {
            "runs": len(runs),
            "itl_p99_ms_max": max(r["interactive_itl_p99_ms"] for r in runs),
            "ttft_p99_ms_median": statistics.median(r["interactive_ttft_p99_ms"] for r in runs),
            "goodput_rps_median": statistics.median(goodput) if goodput else None,
        }
    if len(table) > 1 and "1" in table and table["1"]["goodput_rps_median"]:
        most = table[max(table, key=int)]
        if most["goodput_rps_median"] is not None:
            table["most_over_one_goodput"] = round(most["goodput_rps_median"] / table["1"]["goodput_rps_median"], 3)
    return table


def plot_overview(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    sittings = sorted({r["sitting"] for r in rows})
    # More sittings than shapes: the shapes repeat.
    markers = {sitting: "os^Dv<>P*X"[i % 10] for i, sitting in enumerate(sittings)}
    for r in rows:
        color = "tab:grey" if r["replicas"] == 1 else "tab:blue"
        pinned = f", pinned {r['pin_limit']:g}" if r["pin_limit"] else ""
        label = f"{r['sitting']}: {r['replicas']} replica(s){pinned}"
        x = r["interactive_engines_held_mean"]
        axes[0].scatter(x, r["interactive_itl_p99_ms"], color=color, marker=markers[r["sitting"]], s=50, label=label)
        share = 100 * (r["interactive_gap_over_100ms_share"] or 0.0)
        axes[1].scatter(x, share, color=color, marker=markers[r["sitting"]], s=50, label=label)
    axes[0].axhline(100, color="black", linestyle="--", linewidth=1, label="ITL budget")
    axes[1].axhline(1.0, color="black", linestyle="--", linewidth=1, label="1 % (a p99 budget's allowance)")
    axes[0].set_ylabel("interactive ITL p99 (ms), whole run")
    axes[1].set_ylabel("% of interactive gaps over 100 ms")
    for ax in axes:
        ax.set_xlabel("requests an interactive engine held, mean after warm-up")
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles, strict=False))
        ax.legend(unique.values(), unique.keys(), fontsize=7)
    fig.suptitle("Real vLLM on one H200: the interactive ITL tail follows what the interactive engines hold")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def summarize(analyses: list[dict[str, Any]]) -> dict[str, Any]:
    keys = (
        "interactive_itl_p50_ms",
        "interactive_itl_p99_ms",
        "interactive_ttft_p99_ms",
        "interactive_gaps_over_100ms",
    )
    medians = {}
    for setup in SETUPS:
        rows = [a for a in analyses if a["setup"] == setup]
        medians[setup] = {
            k: (round(statistics.median(v), 2) if (v := [a[k] for a in rows if a[k] is not None]) else None)
            for k in keys
        }
    client_over = {s: 0 for s in SETUPS}
    engine_over = {s: 0.0 for s in SETUPS}
    for a in analyses:
        for e in a["engines"].values():
            if e["pool"] == "interactive":
                client_over[a["setup"]] += e["client_gaps_over_100ms"]
                engine_over[a["setup"]] += e["engine_itl_over_100ms"] or 0.0
    return {
        "medians": medians,
        "interactive_engines_gaps_over_100ms": {"client": client_over, "engine_histogram": engine_over},
    }


def plot(analyses: list[dict[str, Any]], datas: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(analyses), 1, figsize=(14, 2.8 * len(analyses)), sharex=True, squeeze=False)
    markers = "os^Dv"
    for ax, a, data in zip(axes[:, 0], analyses, datas, strict=True):
        pools = {tl["engine"] for tl in data["timelines"] if tl["class"] == "interactive" and tl["engine"]}
        engines = sorted(pools)
        colors = {u: f"C{i}" for i, u in enumerate(engines)}
        for tl in data["timelines"]:
            if tl["class"] != "interactive" or tl["engine"] not in colors or len(tl["chunks"]) < 2:
                continue
            c = tl["chunks"]
            tail = [(c[i], (c[i] - c[i - 1]) * 1000.0) for i in range(1, len(c)) if c[i] - c[i - 1] > 0.04]
            if not tail:
                continue
            ax.scatter(
                [t for t, _ in tail],
                [g for _, g in tail],
                s=4,
                color=colors[tl["engine"]],
                marker=markers[(tl["replica"] or 0) % len(markers)],
                alpha=0.5,
            )
        ax.axhline(GAP_MS, color="black", linestyle="--", linewidth=1)
        ax.set_yscale("log")
        ax.set_ylabel("ITL (ms)")
        twin = ax.twinx()
        ticks = data["ticks"]
        for url in engines:
            xs, ys = [], []
            for before, after in itertools.pairwise(ticks):
                b = (before["engines"].get(url) or {}).get("vllm:inter_token_latency_seconds")
                e = (after["engines"].get(url) or {}).get("vllm:inter_token_latency_seconds")
                if b and e:
                    xs.append(after["t"])
                    ys.append(_over(_hist_delta(b, e), 0.1))
            twin.step(
                xs,
                ys,
                where="pre",
                color=colors[url],
                linewidth=1,
                label=f"{url.rsplit(':', 1)[-1]}: engine ITL>100ms/tick",
            )
        twin.plot(
            [k["t"] for k in ticks],
            [k["busy_cores"] for k in ticks],
            color="grey",
            linewidth=1,
            label="host busy cores",
        )
        twin.set_ylabel("count / cores")
        twin.legend(fontsize=7, loc="upper right")
        ax.set_title(
            f"{a['setup']} (repeat {a['repeat']}, {a['replicas']} replica(s)): interactive ITL p99 "
            f"{a['interactive_itl_p99_ms']} ms, {a['interactive_gaps_over_100ms']} gaps > 100 ms "
            "(dots: client gaps over 40 ms, engine by colour, replica by marker)",
            fontsize=9,
        )
    axes[-1, 0].set_xlabel("seconds into the run")
    fig.tight_layout()
    fig.savefig(path, dpi=70)


def write_summary(out: Path, runs: list[dict[str, Any]], provenance: envelope.Envelope) -> dict[str, Any]:
    datas = []
    analyses = []
    for run in runs:
        with gzip.open(out / f"timelines-{run['setup']}-{run['repeat']}.json.gz", "rt") as f:
            data = json.load(f)
        datas.append(data)
        analyses.append(analyse(run, data))
    summary = provenance.wrap({**summarize(analyses), "runs": analyses})
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    try:
        plot(analyses, datas, out / "fleet_itl.png")
    except ImportError:  # the device may lack matplotlib: plot here with --analyze
        progress("no matplotlib: no plot (run --analyze where it is installed)")
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", nargs="+", metavar="POOL=URL,URL", help="external engines; else simulated here")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seconds", type=float, default=75.0, help="each run's interactive stream")
    p.add_argument("--warmup-s", type=float, default=15.0)
    p.add_argument("--rate", type=float, default=2.0, help="interactive requests/s (Poisson)")
    p.add_argument("--input", type=int, default=1024)
    p.add_argument("--output", type=int, default=128)
    p.add_argument("--flood", type=int, default=192)
    p.add_argument("--ramp-s", type=float, default=10.0)
    p.add_argument("--batch-scheduling", choices=("priority", "fcfs"), default="priority")
    p.add_argument(
        "--budget-ms", type=lambda v: tuple(float(x) for x in v.split(",")), default=(1000.0, 100.0), metavar="TTFT,ITL"
    )
    p.add_argument("--redis-server", default="redis-server")
    p.add_argument(
        "--relay-lag-s",
        type=float,
        default=RELAY_LAG_S,
        help="the longest from an engine's step to the client's read of its token, on this host",
    )
    p.add_argument("--sample-ms", type=float, default=10.0, help="the engines' concurrency, as fleet_admission samples")
    p.add_argument("--scrape-s", type=float, default=1.0, help="the engines' histograms and the host, this often")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--interactive-profile", default="gemma4-nvfp4", help="simulated engines (no --engines)")
    p.add_argument("--batch-profile", default="gemma4-nvfp4-mtp4")
    p.add_argument("--setups", default=",".join(SETUPS), help="which runs, of " + ",".join(SETUPS))
    p.add_argument("--pin-limit", type=float, default=None, help="every engine's concurrency limit fixed at this")
    p.add_argument(
        "--pool-option",
        action="append",
        default=[],
        metavar="POOL.KEY=VALUE",
        help="a pool setting of the gateways (VALUE read as YAML): batch.shares_hardware_with=interactive",
    )
    p.add_argument("--overview", nargs="+", metavar="DIR", help="run nothing: the runs of these folders side by side")
    p.add_argument("--analyze", metavar="DIR", help="run nothing: the summary and plot again from DIR")
    p.add_argument("--out", default="benchmarks/results/gpu/fleet/itl")
    args = p.parse_args()
    provenance = envelope.start()
    if args.overview:
        overview([Path(d) for d in args.overview], Path(args.out), provenance)
        return
    if args.analyze:
        out = Path(args.analyze)
        summary = write_summary(out, json.loads((out / "runs.json").read_text()), provenance)
        print(json.dumps({k: summary[k] for k in ("medians", "interactive_engines_gaps_over_100ms")}, indent=1))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        simulated = {
            "interactive": (2, ["--profile", args.interactive_profile]),
            "batch": (2, ["--profile", args.batch_profile, "--scheduling-policy", args.batch_scheduling]),
        }
        engines = open_engines(tmp, args.engines, simulated)
        try:
            for rep in range(args.repeats):
                for setup in args.setups.split(","):
                    progress(f"repeat {rep + 1}/{args.repeats}, {setup}: {args.seconds:g} s ...")
                    run = one_run(setup, rep, engines, args, tmp, out)
                    runs.append(run)
                    (out / "runs.json").write_text(json.dumps(runs, separators=(",", ":")) + "\n")
                    i = run["interactive"]
                    progress(
                        f"  TTFT p99 {i.get('ttft_p99_ms')} ms, ITL p50 {i.get('itl_p50_ms')} p99 "
                        f"{i.get('itl_p99_ms')} ms, completed {i.get('completed')}, refused {i.get('refused')}"
                    )
        finally:
            engines.stop()
    summary = write_summary(out, runs, provenance)
    print(json.dumps({k: summary[k] for k in ("medians", "interactive_engines_gaps_over_100ms")}, indent=1))


if __name__ == "__main__":
    main()
