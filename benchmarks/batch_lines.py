"""Batch lines per second through the embedded default: ``gateway serve`` with no configuration.

The gateway starts its own simulated engines (two interactive, two batch) and runs an OpenAI
Batch job of ``--lines`` chat requests through its own request path (``Proxy.call``, no HTTP).
Lines per second is the job's lines over the time from its creation until the client sees it
``completed``, polled every 50 ms. With ``--baseline CHECKOUT`` the gateway of that checkout is
measured too, the two alternating round by round (never at once: each starts its own engines on
the same two cores), and the medians and their ratio are reported, with the host's load.

    python benchmarks/batch_lines.py [--lines 2000] [--rounds 3] [--baseline CHECKOUT]
        [--out benchmarks/results/batch_lines]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import openai

from priority_gateway.bench import envelope
from priority_gateway.loopback import Proc, free_port

ROOT = Path(__file__).resolve().parents[1]
MODEL = "sim-model"


def lines(n: int, max_tokens: int) -> bytes:
    rows = []
    for i in range(n):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"Line {i}: say hi."}],
            "max_tokens": max_tokens,
        }
        rows.append({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def start(tmp: Path, source: Path | None) -> Proc:
    port = free_port()
    package = "gateway" if source is not None and not (source / "priority_gateway").is_dir() else "priority_gateway"
    cmd = [sys.executable, "-m", package, "serve", "--port", str(port)]
    env = {"PYTHONPATH": str(source)} if source is not None else {}
    proc = Proc(cmd, f"http://127.0.0.1:{port}", tmp / f"gateway-{port}.log", env, cwd=source)
    return proc.start().wait_ready("/ready", timeout=120)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_job(proc: Proc, data: bytes, n: int) -> dict:
    client = openai.OpenAI(base_url=proc.url + "/v1", api_key="none", max_retries=0, timeout=60)
    file_id = client.files.create(file=("lines.jsonl", io.BytesIO(data)), purpose="batch").id
    assert proc.popen is not None
    cpu_before = cpu_s(proc.popen.pid)
    started = time.monotonic()
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.05)
        batch = client.batches.retrieve(batch.id)
    seconds = time.monotonic() - started
    counts = batch.request_counts
    done = counts.completed if counts is not None else 0
    return {
        "status": batch.status,
        "lines": n,
        "completed": done,
        "failed": counts.failed if counts is not None else None,
        "seconds": round(seconds, 3),
        "lines_per_s": round(done / seconds, 1),
        "gateway_cpu_ms_per_line": round((cpu_s(proc.popen.pid) - cpu_before) * 1000 / max(1, done), 4),
        "load_average": envelope.load_average(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", default=None, help="also measure the gateway of this checkout")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/batch_lines"))
    args = parser.parse_args()
    provenance = envelope.start()
    data = lines(args.lines, args.max_tokens)
    targets: dict[str, Path | None] = {"gateway": None}
    if args.baseline:
        targets["baseline"] = Path(args.baseline).resolve()
    runs: dict[str, list[dict]] = {name: [] for name in targets}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        for round_no in range(args.rounds):
            names = list(targets)
            order = names[round_no % len(names) :] + names[: round_no % len(names)]
            for name in order:
                proc = start(tmp, targets[name])
                try:
                    r = run_job(proc, data, args.lines)
                finally:
                    proc.stop()
                runs[name].append(r)
                print(f"round {round_no + 1} {name:9s} {r['lines_per_s']:8.1f} lines/s  {r}", flush=True)
    summary = {
        name: {
            "lines_per_s": statistics.median(r["lines_per_s"] for r in rs),
            "gateway_cpu_ms_per_line": statistics.median(r["gateway_cpu_ms_per_line"] for r in rs),
        }
        for name, rs in runs.items()
    }
    if "baseline" in summary:
        summary["gateway_vs_baseline_lines_per_s"] = round(
            summary["gateway"]["lines_per_s"] / summary["baseline"]["lines_per_s"], 3
        )
    report = {
        "baseline": args.baseline,
        "baseline_commit": envelope.code_commit(Path(args.baseline).resolve())[0] if args.baseline else None,
        "lines": args.lines,
        "max_tokens": args.max_tokens,
        "summary": summary,
        "runs": runs,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(provenance.wrap(report), indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
