"""``gateway bench``: load-test an OpenAI-compatible endpoint and write a report.

Two forms:
- ``--concurrency 1,2,4,...``: closed loop at each level for ``--duration`` seconds, prompts of
  ``--input-len`` tokens and outputs of ``--output-len`` (each ±``--spread``), like
  ``vllm bench serve --max-concurrency``.
- ``--trace FILE[@class]`` (repeatable): open loop, each request at its arrival time
  (``--rate-scale`` times faster, the first ``--duration`` seconds), one result per trace.

Writes ``--out``/results.json, report.png and report.html.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from priority_gateway.bench import envelope, loadgen, report, stats
from priority_gateway.bench.clients import Client, open_client
from priority_gateway.bench.progress import Progress
from priority_gateway.bench.workload import (
    DEFAULT_VOCAB_SIZE,
    FIRST_ORDINARY_ID,
    SyntheticWorkload,
    TokenIds,
    load_arrivals,
    trace_label,
)
from priority_gateway.upstream.h1 import UpstreamError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="endpoint base URL: http://127.0.0.1:8080, https://host/v1")
    p.add_argument(
        "--ca-file",
        default=None,
        help="https: CA bundle that signs the endpoint's certificate (default: the system's trust store)",
    )
    p.add_argument("--out", required=True, type=Path, help="directory for results.json, report.png, report.html")
    p.add_argument(
        "--concurrency", default=None, help="closed loop at each level: 1,2,4,8 (default: none; give this or --trace)"
    )
    p.add_argument(
        "--trace",
        action="append",
        default=[],
        help="replay a trace (Mooncake .jsonl, Azure .csv), @class; repeatable "
        "(default: none; give this or --concurrency)",
    )
    p.add_argument("--duration", type=float, default=None, help="seconds per level (default 30); a trace's first S s")
    p.add_argument("--ramp-up", type=float, default=0.0, help="closed loop: spread client starts over S seconds")
    p.add_argument("--rate-scale", type=float, default=1.0, help="replay the trace X times faster")
    p.add_argument("--x-priority", default=None, help="send X-Priority: CLASS with every request (default: no header)")
    p.add_argument("--model", default=None, help="model name (default: the first of GET /v1/models)")
    p.add_argument(
        "--endpoint", choices=("chat", "completions"), default="chat", help="/v1/chat/completions or /v1/completions"
    )
    p.add_argument("--input-len", type=int, default=1000, help="closed loop: prompt tokens (~4 characters each)")
    p.add_argument("--output-len", type=int, default=128, help="closed loop: output tokens (max_tokens)")
    p.add_argument("--spread", type=float, default=0.25, help="closed loop: lengths drawn within ±this share")
    p.add_argument("--shared-prefix-len", type=int, default=0, help="closed loop: tokens every prompt starts with")
    p.add_argument(
        "--token-ids",
        action="store_true",
        help="send prompts as token ids (exact lengths; needs --endpoint completions)",
    )
    p.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE, help="token ids are drawn below this")
    p.add_argument(
        "--trace-block-tokens",
        type=int,
        default=None,
        help="tokens per trace block: fewer shrinks every block and prompt by that ratio (default: 512, as published)",
    )
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True, help="send ignore_eos")
    p.add_argument("--ttft-ms", type=float, default=500.0, help="TTFT budget (p99)")
    p.add_argument("--itl-ms", type=float, default=50.0, help="ITL budget (p99)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (default $OPENAI_API_KEY)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a stream may stay silent")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and lengths drawn")
    p.add_argument(
        "--stop-after-errors",
        type=int,
        default=50,
        metavar="N",
        help="stop when N requests in a row get the same client error (a 4xx other than 429); 0: never",
    )


def command_line(args: argparse.Namespace) -> str:
    """The command, every setting spelled out (the API key hidden)."""
    parts = ["gateway", "bench", "--url", args.url]
    if args.ca_file:
        parts += ["--ca-file", args.ca_file]
    if args.concurrency:
        parts += ["--concurrency", args.concurrency, "--duration", f"{_duration(args):g}"]
        parts += ["--ramp-up", f"{args.ramp_up:g}"]
        parts += ["--input-len", str(args.input_len), "--output-len", str(args.output_len)]
        parts += ["--spread", f"{args.spread:g}", "--shared-prefix-len", str(args.shared_prefix_len)]
    for trace in args.trace:
        parts += ["--trace", trace]
    if args.trace:
        parts += ["--rate-scale", f"{args.rate_scale:g}"]
        if args.duration is not None:
            parts += ["--duration", f"{args.duration:g}"]
        if args.trace_block_tokens:
            parts += ["--trace-block-tokens", str(args.trace_block_tokens)]
    if args.token_ids:
        parts += ["--token-ids", "--vocab-size", str(args.vocab_size)]
    for flag, value in (("--model", args.model), ("--x-priority", args.x_priority)):
        if value:
            parts += [flag, value]
    parts += ["--endpoint", args.endpoint, "--ttft-ms", f"{args.ttft_ms:g}", "--itl-ms", f"{args.itl_ms:g}"]
    if not args.ignore_eos:
        parts.append("--no-ignore-eos")
    if args.api_key:
        parts += ["--api-key", "***"]
    parts += ["--seed", str(args.seed), "--out", str(args.out)]
    return shlex.join(parts)


def _duration(args: argparse.Namespace) -> float:
    return 30.0 if args.duration is None else args.duration


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


async def _model(client: Client) -> str:
    status, body = await client.get(b"/v1/models", timeout_s=10.0)
    if status != 200:
        raise SystemExit(f"gateway bench: GET /v1/models answered {status}; give --model")
    data = orjson.loads(body).get("data") or []
    if not data:
        raise SystemExit("gateway bench: GET /v1/models lists no model; give --model")
    return str(data[0]["id"])


async def _drive(job: Any, progress: Progress) -> tuple[list[loadgen.Sample], float]:
    """Run ``job`` with the progress line going; also the client's CPU share while it ran."""
    ticker = asyncio.get_running_loop().create_task(progress.run())
    cpu, wall = time.process_time(), time.monotonic()
    try:
        samples: list[loadgen.Sample] = await job
    finally:
        ticker.cancel()
    return samples, round((time.process_time() - cpu) / max(1e-9, time.monotonic() - wall), 3)


def _row(label: str, samples: list[loadgen.Sample], args: argparse.Namespace, cpu_share: float) -> dict[str, Any]:
    row: dict[str, Any] = {"label": label, **stats.summarize(samples, args.ttft_ms, args.itl_ms)}
    row["client_cpu_share"] = cpu_share
    return row


def _summary(row: dict[str, Any]) -> str:
    keys = ("completed", "refused", "errors", "ttft_p99_ms", "itl_p99_ms", "output_tokens_per_s", "slo_attainment")
    line = " ".join(f"{key}={row[key]}" for key in keys)
    for kind in ("refused", "errors"):
        if row[kind]:
            line += f" {kind}_by_code={json.dumps(row[f'{kind}_by_code'], separators=(',', ':'))}"
    return line


def _levels(args: argparse.Namespace) -> list[int]:
    """The closed loop's concurrency levels (none for a trace replay), the options checked first."""
    if bool(args.concurrency) == bool(args.trace):
        raise SystemExit("gateway bench: give either --concurrency 1,2,4 or --trace FILE")
    try:
        levels = [int(x) for x in args.concurrency.split(",") if x.strip()] if args.concurrency else []
    except ValueError:
        raise SystemExit(f"gateway bench: --concurrency takes levels like 1,2,4; got {args.concurrency!r}") from None
    if args.concurrency and (not levels or min(levels) < 1):
        raise SystemExit("gateway bench: concurrency levels must be positive integers")
    if args.token_ids and args.endpoint != "completions":
        raise SystemExit(
            "gateway bench: --token-ids sends prompts as token ids, which only --endpoint completions takes"
        )
    if args.vocab_size <= FIRST_ORDINARY_ID:
        raise SystemExit(f"gateway bench: --vocab-size must be above {FIRST_ORDINARY_ID}")
    if args.trace_block_tokens is not None and args.trace_block_tokens < 1:
        raise SystemExit("gateway bench: --trace-block-tokens must be positive")
    return levels


async def run(args: argparse.Namespace) -> dict[str, Any]:
    levels = _levels(args)
    token_ids = TokenIds(args.vocab_size) if args.token_ids else None
    url = _base_url(args.url)
    try:
        connections = max([*levels, 1024])
        client = open_client(
            url, read_timeout=args.timeout, connections=connections, api_key=args.api_key, ca_file=args.ca_file
        )
    except ValueError as exc:
        raise SystemExit(f"gateway bench: {exc}") from None
    run = envelope.start(command_line(args))
    try:
        model = args.model or await _model(client)
    except UpstreamError as exc:
        raise SystemExit(f"gateway bench: {url}: {exc}") from None
    target = loadgen.Target(client, model, args.endpoint, args.x_priority, args.ignore_eos)
    run_tag = secrets.token_hex(4)
    results: dict[str, Any] = {
        "url": url,
        "model": model,
        "endpoint": args.endpoint,
        "prompts": "token ids" if token_ids else "text",
        "x_priority": args.x_priority,
        "budget": {"ttft_p99_ms": args.ttft_ms, "itl_p99_ms": args.itl_ms},
        "mode": "closed loop" if levels else "trace replay",
        "run_tag": run_tag,
        "runs": [],
    }
    errors = loadgen.ErrorRun(args.stop_after_errors)
    try:
        if levels:
            results["workload"], results["runs"] = await _closed_loops(args, target, levels, token_ids, run_tag, errors)
        else:
            results["workload"], results["runs"] = await _trace_replay(args, target, token_ids, run_tag, errors)
    except loadgen.ClientErrors as exc:
        raise SystemExit(f"gateway bench: stopped: {exc}; {_hint(exc.key)}") from None
    finally:
        await client.aclose()
    return run.wrap(results)


async def _closed_loops(
    args: argparse.Namespace,
    target: loadgen.Target,
    levels: list[int],
    token_ids: TokenIds | None,
    run_tag: str,
    errors: loadgen.ErrorRun,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One closed-loop run per concurrency level: the workload, and a row per level."""
    workload_info = {
        "input_len": args.input_len,
        "output_len": args.output_len,
        "spread": args.spread,
        "shared_prefix_len": args.shared_prefix_len,
        "duration_s": _duration(args),
        "ramp_up_s": args.ramp_up,
    }
    rows = []
    for level in levels:
        workload = SyntheticWorkload(
            args.input_len,
            args.output_len,
            spread=args.spread,
            shared_prefix_len=args.shared_prefix_len,
            seed=args.seed,
            group=f"c={level}",
            tag=f"{run_tag} c={level}",
            token_ids=token_ids,
        )
        progress = Progress(f"c={level}", duration=args.ramp_up + _duration(args))
        job = loadgen.closed_loop(target, workload, level, _duration(args), _watched(progress, errors), args.ramp_up)
        samples, cpu_share = await _drive(job, progress)
        row = {"concurrency": level, **_row(f"c={level}", samples, args, cpu_share)}
        progress.finish(_summary(row))
        rows.append(row)
    return workload_info, rows


async def _trace_replay(
    args: argparse.Namespace,
    target: loadgen.Target,
    token_ids: TokenIds | None,
    run_tag: str,
    errors: loadgen.ErrorRun,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every trace's arrivals replayed together in one open loop: the workload, and a row per trace."""
    arrivals = load_arrivals(
        args.trace, args.rate_scale, args.duration, args.x_priority, run_tag, token_ids, args.trace_block_tokens
    )
    workload = {
        "traces": args.trace,
        "rate_scale": args.rate_scale,
        "duration_s": args.duration,
        "trace_block_tokens": args.trace_block_tokens,
    }
    progress = Progress("trace", total=len(arrivals))
    samples, cpu_share = await _drive(loadgen.open_loop(target, arrivals, _watched(progress, errors)), progress)
    progress.finish(f"requests={len(samples)}")
    rows = []
    for trace in args.trace:
        label = trace_label(trace)
        row = {"trace": trace, **_row(label, [s for s in samples if s.group == label], args, cpu_share)}
        print(f"bench_run run={label} {_summary(row)}", file=sys.stderr, flush=True)
        rows.append(row)
    return workload, rows


def _watched(progress: Progress, errors: loadgen.ErrorRun) -> Callable[[loadgen.Sample], None]:
    def done(sample: loadgen.Sample) -> None:
        progress.add(sample)
        errors.observe(sample)

    return done


def _hint(key: str) -> str:
    """What to check when every request gets the client error ``key`` (``"404 model_not_found"``)."""
    status = key.split(" ", 1)[0]
    if status == "404":
        return "check --model (GET /v1/models lists what the endpoint serves) and --endpoint"
    if status in ("401", "403"):
        return "check --api-key (and that the key may use --x-priority)"
    if status == "413":
        return "check --input-len against the endpoint's body limit"
    return "check the options that shape each request (--model, --endpoint, --input-len, --output-len)"


def main(args: argparse.Namespace) -> int:
    from priority_gateway.cli import event_loop_factory

    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        results = runner.run(run(args))
    for path in report.write(args.out, results):
        print(f"bench: wrote {path}", file=sys.stderr, flush=True)
    return 1 if all(r["completed"] == 0 for r in results["runs"]) else 0
