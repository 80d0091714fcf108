"""What the real-time benchmarks run on: engines, a ``redis-server``, ``gateway serve`` replicas, and
the instruments around them (a client spread over the replicas, the engines' own concurrency
sampled in a process of its own, the CPU the run took).

Rules:
- Engines are simulated (``python -m priority_gateway.engines.sim``, started here) or external
  (``--engines interactive=URL,URL batch=URL``: started by someone else, e.g. real vLLM on a GPU
  host); the model name is then the first one their ``/v1/models`` lists.
- A run's replicas share one ``redis-server`` (started here from ``--redis-server``, killed and
  restarted on the same port when a run asks); a replica counts as ready once it answers
  ``/ready`` and, with several, hears every other one on the routing channel.
- Clients go round robin over the replicas' URLs, as a Kubernetes Service spreads connections.
- The engines' ``vllm:num_requests_running`` + ``vllm:num_requests_waiting`` are sampled every few
  ms by a separate process, so the sampling neither shares the clients' event loop nor their GIL;
  the limit each is compared with is the fleet's as the replicas report it: the applied
  ``gateway_engine_concurrency_limit`` while they share, the sum of their safe shares while not.
- CPU is read from ``/proc`` (this machine's busy share, and each process's own seconds): a
  real-time run on a small host measures the host as much as the gateway, and says so.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

from priority_gateway.bench import envelope
from priority_gateway.bench.clients import Reply
from priority_gateway.loopback import Proc, RedisServer, start_engine, start_gateway
from priority_gateway.upstream.h1 import EngineClient, Headers

POOLS = ("interactive", "batch")
_LIMIT = re.compile(r'^gateway_engine_concurrency_limit\{engine="([^"]+)",pool="[^"]*"\} (\S+)$', re.M)
_SAFE_SHARE = re.compile(r"^gateway_admission_safe_share (\S+)$", re.M)
_HELD = re.compile(r"^vllm:num_requests_(?:running|waiting)\{[^}]*\} (\S+)$", re.M)


def say(name: str, message: str) -> None:
    print(f"{name}: {message}", file=sys.stderr, flush=True)


def parse_engines(values: Sequence[str]) -> dict[str, list[str]]:
    """``["interactive=URL,URL", "batch=URL"]`` -> ``{"interactive": [...], "batch": [...]}``."""
    out: dict[str, list[str]] = {}
    for value in values:
        pool, sep, urls = value.partition("=")
        if not sep or pool not in POOLS or not urls:
            raise SystemExit(f"--engines: expected interactive=URL[,URL...] or batch=URL[,URL...], got {value!r}")
        out[pool] = [u.rstrip("/") for u in urls.split(",") if u]
    return out


def served_model(url: str) -> str:
    data = httpx.get(url + "/v1/models", timeout=10).json()["data"]
    return str(data[0]["id"])


def engine_held(metrics_text: str) -> float:
    """Requests an engine holds, by its own count (running + waiting)."""
    return sum(float(v) for v in _HELD.findall(metrics_text))


def redis_server(binary: str, tmp: Path) -> RedisServer:
    """A ``redis-server`` from ``binary`` (a path, or a name on ``PATH``), not started yet."""
    found = shutil.which(binary) or binary
    if not Path(found).is_file():
        raise SystemExit(f"no redis-server at {binary!r}: install it or name it with --redis-server")
    return RedisServer(tmp, found)


@dataclass
class Engines:
    """The pools' engine URLs, and the processes behind them when they are simulated here."""

    urls: dict[str, list[str]]
    model: str
    procs: list[Proc] = field(default_factory=list)

    @property
    def pool_of(self) -> dict[str, str]:
        return {url: pool for pool, urls in self.urls.items() for url in urls}

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


def simulated_engines(tmp: Path, pools: dict[str, tuple[int, list[str]]]) -> Engines:
    """``pools``: pool -> (count, simulator arguments); started and ready."""
    procs: dict[str, list[Proc]] = {
        pool: [start_engine(tmp, *args) for _ in range(count)] for pool, (count, args) in pools.items()
    }
    engines = Engines({pool: [p.url for p in ps] for pool, ps in procs.items()}, "sim-model")
    engines.procs = [p for ps in procs.values() for p in ps]
    for proc in engines.procs:
        proc.wait_ready()
    return engines


def open_engines(tmp: Path, external: Sequence[str] | None, simulated: dict[str, tuple[int, list[str]]]) -> Engines:
    """The ``--engines`` given (``parse_engines``), or else the ``simulated`` ones started here."""
    if external:
        return external_engines(parse_engines(external))
    say("live_stack", "starting " + " + ".join(f"{n} {pool}" for pool, (n, _) in simulated.items()) + " engines ...")
    return simulated_engines(tmp, simulated)


def external_engines(urls: dict[str, list[str]]) -> Engines:
    for url in (u for us in urls.values() for u in us):
        httpx.get(url + "/health", timeout=10).raise_for_status()
    return Engines(urls, served_model(next(iter(urls.values()))[0]))


def start_replicas(tmp: Path, config: dict[str, Any], count: int) -> list[Proc]:
    """``count`` ``gateway serve`` processes with ``config``, ready and (several) hearing each other."""
    replicas = [start_gateway(tmp, config) for _ in range(count)]
    try:
        for replica in replicas:
            replica.wait_ready("/ready", timeout=60)
        if count > 1:
            deadline = time.monotonic() + 30
            while not all(gateway_gauge(r.url, "gateway_routing_share_peers") == count - 1 for r in replicas):
                if time.monotonic() > deadline:
                    raise RuntimeError("replicas do not hear each other:\n" + replicas[0].log())
                time.sleep(0.1)
    except BaseException:
        stop_all(replicas)
        raise
    return replicas


def stop_all(procs: Sequence[Proc]) -> None:
    for proc in reversed(procs):
        proc.stop()


def gateway_gauge(url: str, name: str) -> float | None:
    match = re.search(rf"^{re.escape(name)} (\S+)$", httpx.get(url + "/metrics", timeout=5).text, re.M)
    return float(match.group(1)) if match else None


def wait_engines_idle(urls: Sequence[str], timeout_s: float = 120.0) -> bool:
    """Whether every engine holds nothing (the last run's aborted requests gone) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(engine_held(httpx.get(u + "/metrics", timeout=5).text) == 0 for u in urls):
            return True
        time.sleep(0.5)
    return False


class RoundRobin:
    """One client per replica, each request to the next replica (``priority_gateway.bench.clients.Client``)."""

    def __init__(self, urls: Sequence[str], read_timeout: float, api_key: str | None = None) -> None:
        self.clients = [EngineClient(u, read_timeout=read_timeout, max_idle=256, api_key=api_key) for u in urls]
        self._next = 0

    def pick(self) -> EngineClient:
        self._next += 1
        return self.clients[self._next % len(self.clients)]

    async def request(self, method: bytes, path: bytes, headers: Headers = (), body: bytes = b"") -> Reply:
        return await self.pick().request(method, path, headers, body)

    async def get(self, path: bytes, timeout_s: float | None = None) -> tuple[int, bytes]:
        return await self.pick().get(path, timeout_s)

    async def aclose(self) -> None:
        for client in self.clients:
            client.close()


# --- CPU ---------------------------------------------------------------------------------------


def _proc_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return float(sum(values) - idle), float(sum(values))


class CpuMeter:
    """CPU seconds of named processes, and the machine's busy share, between ``start`` and ``stop``."""

    def __init__(self) -> None:
        self._pids: dict[str, list[int]] = {}
        self._before: dict[int, float] = {}
        self._machine = (0.0, 0.0)
        self._wall = 0.0

    def start(self, roles: dict[str, Sequence[Proc]]) -> None:
        self._pids = {role: [p.popen.pid for p in procs if p.popen is not None] for role, procs in roles.items()}
        self._pids["client"] = [os.getpid()]
        self._before = {pid: _proc_cpu_s(pid) for pids in self._pids.values() for pid in pids}
        self._machine = _machine_busy()
        self._wall = time.monotonic()

    def stop(self, extra: dict[str, float] | None = None) -> dict[str, Any]:
        wall = time.monotonic() - self._wall
        busy, total = _machine_busy()
        by_role = {
            role: round(sum(_proc_cpu_s(pid) - self._before[pid] for pid in pids), 1)
            for role, pids in self._pids.items()
        }
        by_role.update(extra or {})
        cores = os.cpu_count() or 1
        return {
            "wall_s": round(wall, 1),
            "cores": cores,
            "machine_busy_share": round((busy - self._machine[0]) / max(1.0, total - self._machine[1]), 3),
            "cpu_s_by_role": by_role,
            "ours_share_of_cores": round(sum(by_role.values()) / (wall * cores), 3) if wall > 0 else None,
            "loadavg_1m_at_end": envelope.load_average()[0],
        }


# --- the engines' own concurrency, sampled in a process of its own -------------------------------


@dataclass
class EngineTrace:
    """One engine's samples: what it held, against the fleet's limit for it at that moment."""

    pool: str
    samples: int = 0
    max_held: float = 0.0
    max_held_after_warmup: float = 0.0
    limit_max: float = 0.0
    over: int = 0
    """Samples after warm-up that held more than the fleet's limit (rounded up: admission starts a
    request while the load is under the limit, so a limit of 2.5 lets 3 run)."""
    over_by_max: float = 0.0
    down_samples: int = 0
    down_max_held: float = 0.0
    down_over: int = 0
    series: list[tuple[float, float, float]] = field(default_factory=list)
    """(seconds into the run, max held, limit) per ``SERIES_S``."""

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "series"}
        out["over_share"] = round(self.over / self.samples, 5) if self.samples else None
        out["series"] = self.series
        return out


SERIES_S = 0.5


def fleet_limits(texts: Sequence[str]) -> dict[str, float]:
    """The fleet's limit per engine from the replicas' ``/metrics``: the applied limit while they
    share (the largest any replica applies), plus each safe share while some do not."""
    shared: dict[str, float] = {}
    alone: dict[str, float] = {}
    for text in texts:
        safe = _SAFE_SHARE.search(text)
        into = alone if safe and float(safe.group(1)) > 0 else None
        for engine, value in _LIMIT.findall(text):
            if into is None:
                shared[engine] = max(shared.get(engine, 0.0), float(value))
            else:
                alone[engine] = alone.get(engine, 0.0) + float(value)
    return {e: shared.get(e, 0.0) + alone.get(e, 0.0) for e in shared.keys() | alone.keys()}


async def _sample(
    pools: dict[str, str], gateways: list[str], interval_s: float, start: float, warmup_s: float, conn: Connection
) -> dict[str, Any]:
    engines = {url: EngineClient(url, read_timeout=5) for url in pools}
    replicas = [EngineClient(url, read_timeout=5) for url in gateways]
    traces = {url: EngineTrace(pool) for url, pool in pools.items()}
    limits: dict[str, float] = {}
    down: tuple[float, float] | None = None
    bucket: dict[str, tuple[int, float]] = {}
    next_limits = 0.0
    while True:
        while conn.poll():
            message = conn.recv()
            if message == "stop":
                return _finish(traces, engines, replicas)
            down = message
        t = time.monotonic() - start
        if t >= next_limits:
            texts = await asyncio.gather(*(r.get(b"/metrics") for r in replicas), return_exceptions=True)
            got = fleet_limits([body.decode() for status, body in (x for x in texts if isinstance(x, tuple))])
            limits.update(got)
            next_limits = t + SERIES_S
        bodies = await asyncio.gather(*(c.get(b"/metrics") for c in engines.values()), return_exceptions=True)
        for url, body in zip(engines, bodies, strict=True):
            if not isinstance(body, tuple):
                continue
            held, limit, trace = engine_held(body[1].decode()), limits.get(url, 0.0), traces[url]
            trace.samples += 1
            trace.max_held = max(trace.max_held, held)
            slot = int(t / SERIES_S)
            seen = bucket.get(url)
            if seen is None or seen[0] != slot:
                if seen is not None:
                    trace.series.append((round(seen[0] * SERIES_S, 2), seen[1], limits.get(url, 0.0)))
                bucket[url] = (slot, held)
            else:
                bucket[url] = (slot, max(seen[1], held))
            if t < warmup_s or not limit:
                continue
            trace.max_held_after_warmup = max(trace.max_held_after_warmup, held)
            trace.limit_max = max(trace.limit_max, limit)
            ceiling = math.ceil(limit - 1e-9)  # admission starts a request while load < limit
            trace.over += held > ceiling
            trace.over_by_max = max(trace.over_by_max, held - ceiling)
            if down is not None and down[0] <= t < down[1]:
                trace.down_samples += 1
                trace.down_max_held = max(trace.down_max_held, held)
                trace.down_over += held > ceiling
        await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - start - t)))


def _finish(
    traces: dict[str, EngineTrace], engines: dict[str, EngineClient], replicas: list[EngineClient]
) -> dict[str, Any]:
    for client in [*engines.values(), *replicas]:
        client.close()
    return {
        "engines": {url: t.summary() for url, t in traces.items()},
        "sampler_cpu_s": round(time.process_time(), 1),
    }


def _sampler_main(
    pools: dict[str, str], gateways: list[str], interval_s: float, start: float, warmup_s: float, conn: Connection
) -> None:
    conn.send(asyncio.run(_sample(pools, gateways, interval_s, start, warmup_s, conn)))


class Sampler:
    """The engines' own running + waiting every ``interval_s``, in a child process (see the rules)."""

    def __init__(self, pools: dict[str, str], gateways: list[str], interval_s: float, warmup_s: float) -> None:
        self._conn, child = multiprocessing.get_context("spawn").Pipe()
        self.start_time = time.monotonic()
        self._proc = multiprocessing.get_context("spawn").Process(
            target=_sampler_main, args=(pools, gateways, interval_s, self.start_time, warmup_s, child), daemon=True
        )
        self._proc.start()

    def down_window(self, start_s: float, end_s: float) -> None:
        """Tell the sampler when the shared state is down (seconds into the run), to count it apart."""
        self._conn.send((start_s, end_s))

    def stop(self) -> dict[str, Any]:
        self._conn.send("stop")
        result = self._conn.recv() if self._conn.poll(30) else {"engines": {}, "sampler_cpu_s": None}
        self._proc.join(timeout=10)
        return result
