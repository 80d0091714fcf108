"""Our gateway against the Rust ``vllm-router`` (``cache_aware`` and ``round_robin``), in real time.

The same 8 simulated engines (``h200-32b-fp8`` profile, real time, restarted for every router so
each starts with empty caches and zeroed counters), the same slice of the Mooncake conversation
trace replayed open-loop by ``gateway bench``. Reported per router: prefix-cache hit ratio from the
engines' own counters (``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total``), TTFT
p50/p99 and ITL as the client saw them.

    pip install vllm-router    # or: python3 -m venv .venv-router && .venv-router/bin/pip install vllm-router
    python benchmarks/router_comparison.py [--minutes 5] [--engines 8] [--out benchmarks/results/router_comparison]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from priority_gateway.bench import envelope
from priority_gateway.loopback import Proc, free_port, start_engine, start_gateway

ROOT = Path(__file__).resolve().parents[1]

MOONCAKE = ROOT / "benchmarks/traces/mooncake/conversation_trace.jsonl"


def progress(message: str) -> None:
    print(f"router-comparison: {message}", file=sys.stderr, flush=True)


def counters(engines: list[Proc]) -> tuple[float, float]:
    hits = queries = 0.0
    for engine in engines:
        for line in httpx.get(engine.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total{"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total{"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def start_router(tmp: Path, engines: list[Proc], policy: str, router_bin: str) -> Proc:
    port = free_port()
    cmd = [
        router_bin,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *[e.url for e in engines],
        "--policy",
        policy,
        "--log-level",
        "warning",
        "--prometheus-port",
        str(free_port()),
    ]
    return Proc(cmd, f"http://127.0.0.1:{port}", tmp / f"router-{policy}.log").start().wait_ready("/health", 60)


def run_one(name: str, args: argparse.Namespace, tmp: Path) -> dict:
    engines = [start_engine(tmp, "--profile", "h200-32b-fp8") for _ in range(args.engines)]
    procs = list(engines)
    try:
        for engine in engines:
            engine.wait_ready()
        if name == "gateway-prefix":
            front = start_gateway(
                tmp,
                {
                    "pools": {"interactive": {"engines": [e.url for e in engines]}},
                    "admission": {"enabled": False},
                    "log_level": "warning",
                },
            )
            front.wait_ready("/ready")
        else:
            front = start_router(tmp, engines, name.removeprefix("vllm-router-"), args.router_bin)
        procs.append(front)
        out = tmp / name
        cmd = [
            sys.executable,
            "-m",
            "gateway",
            "bench",
            "--url",
            front.url,
            "--trace",
            f"{MOONCAKE}@interactive",
            "--duration",
            str(args.minutes * 60),
            "--model",
            "sim-model",
            "--timeout",
            "600",
            "--out",
            str(out),
        ]
        progress(f"{name}: replaying {args.minutes:g} min of Mooncake through {front.url} ...")
        subprocess.run(cmd, check=True, cwd=ROOT)
        hits, queries = counters(engines)
        bench = json.loads((out / "results.json").read_text())
        row = bench["runs"][0]
        return {"engine_hit_ratio": round(hits / queries, 4) if queries else 0.0, "bench": row}
    finally:
        for proc in reversed(procs):
            proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument(
        "--router-bin", default=shutil.which("vllm-router") or str(ROOT / ".venv-router/bin/vllm-router")
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/router_comparison"))
    args = parser.parse_args()
    provenance = envelope.start()
    if not Path(args.router_bin).exists():
        sys.exit("vllm-router not found: pip install vllm-router (or pass --router-bin)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmpdir:
        for name in ("gateway-prefix", "vllm-router-cache_aware", "vllm-router-round_robin"):
            results[name] = run_one(name, args, Path(tmpdir))
    summary = {
        name: {
            "engine_hit_ratio": r["engine_hit_ratio"],
            **{k: r["bench"].get(k) for k in ("completed", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")},
        }
        for name, r in results.items()
    }
    report = {
        "minutes": args.minutes,
        "engines": args.engines,
        "summary": summary,
        "runs": results,
        "wall_s": round(time.monotonic() - started, 1),
    }
    (out / "results.json").write_text(json.dumps(provenance.wrap(report), indent=2))
    print(json.dumps(summary, indent=2))
    plot(summary, out / "router_comparison.png")


def plot(summary: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(summary)
    colors = ["tab:blue", "tab:orange", "tab:grey"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    axes[0].bar(names, [summary[n]["engine_hit_ratio"] for n in names], color=colors)
    axes[0].set_title("prefix hit ratio (engines' own counters)")
    axes[1].bar(names, [summary[n]["ttft_p50_ms"] or 0 for n in names], color=colors)
    axes[1].set_title("TTFT p50 (ms)")
    axes[2].bar(names, [summary[n]["ttft_p99_ms"] or 0 for n in names], color=colors)
    axes[2].set_title("TTFT p99 (ms)")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
