"""Agent sessions in real time against one front (the gateway or vllm-router): closed loop, as agents run.

Each session is a chain of chat turns (``priority_gateway.simulate.traces.agent_sessions``, the issue's
ranges or the Mooncake shapes of ``benchmarks/agent_sessions.py``): a turn sends the session's whole
conversation so far with ``X-Session-ID``, streams the answer, pauses for its tool (``pause_s``),
then appends the answer and a tool output of the drawn length and sends the next turn. Sessions start
as a Poisson process for ``--seconds``; every started session runs to its end (bounded by
``--limit-s``). Per turn: TTFT (first content delta), prompt and cached tokens (the engine's usage,
``--enable-prompt-tokens-details``), end time; the summary is ``benchmarks/agent_sessions.py``'s.

    python benchmarks/agent_sessions_client.py --url http://127.0.0.1:8200 --model llama7b --out DIR
    python benchmarks/agent_sessions_client.py --overview RUN1 RUN2 --out DIR   # runs side by side
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from priority_gateway.bench import envelope
from priority_gateway.simulate.traces import TraceRequest, agent_sessions


def _shapes_module() -> Any:
    """``benchmarks/agent_sessions.py``, for its Mooncake-derived shapes (one definition of them)."""
    here = Path(__file__).resolve().parent / "agent_sessions.py"
    spec = importlib.util.spec_from_file_location("agent_sessions", here)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WORDS = tuple(
    "the a of to and in is it for on was as be by at or an we if so do up my no go me us".split()  # noqa: SIM905
)


def text(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens of words (one word is about one token for the models run here)."""
    return " ".join(rng.choice(WORDS) for _ in range(max(1, tokens)))


async def session(
    client: httpx.AsyncClient, args: argparse.Namespace, first: TraceRequest, start: float, turns: list[dict]
) -> None:
    rng = random.Random(first.session)
    agent = int(first.hash_ids[0]) if first.hash_ids else 0
    messages = [{"role": "system", "content": f"agent {agent} " + text(random.Random(agent), 2048)}]
    messages.append({"role": "user", "content": text(rng, max(1, first.input_len - 2048))})
    turn: TraceRequest | None = first
    await asyncio.sleep(max(0.0, start + first.arrival - time.monotonic()))
    while turn is not None:
        sent = time.monotonic()
        body = {
            "model": args.model,
            "messages": messages,
            "max_tokens": turn.output_len,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        record: dict[str, Any] = {"session": turn.session, "turn": turn.turn, "sent": sent - start}
        reply: list[str] = []
        try:
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers={"X-Session-ID": turn.session or ""}
            ) as r:
                record["status"] = r.status_code
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    for choice in event.get("choices") or ():
                        delta = choice.get("delta", {}).get("content")
                        if delta:
                            record.setdefault("ttft", time.monotonic() - sent)
                            reply.append(delta)
                    usage = event.get("usage")
                    if usage:
                        record["prompt_tokens"] = usage.get("prompt_tokens")
                        details = usage.get("prompt_tokens_details") or {}
                        record["cached_tokens"] = details.get("cached_tokens") or 0
                        record["output_tokens"] = usage.get("completion_tokens")
        except httpx.HTTPError as exc:
            record["error"] = str(exc)
        record["done"] = time.monotonic() - start
        turns.append(record)
        if record.get("status") != 200:
            return  # the agent fails: its session ends here
        nxt = turn.next_turn
        if nxt is not None:
            messages.append({"role": "assistant", "content": "".join(reply)})
            appended = nxt.input_len - turn.input_len - turn.output_len
            messages.append({"role": "user", "content": "tool output: " + text(rng, appended)})
            await asyncio.sleep(nxt.pause_s)
        turn = nxt


def summarize(turns: list[dict], seconds: float) -> dict[str, Any]:
    by_session: dict[str, list[dict]] = {}
    for t in turns:
        by_session.setdefault(t["session"], []).append(t)
    reprefilled = continuing = 0
    completion, new_ttft, ttft = [], [], []
    for chain in by_session.values():
        chain.sort(key=lambda t: t["turn"])
        for before, after in itertools.pairwise(chain):
            if after.get("prompt_tokens") and before.get("prompt_tokens"):
                known = min(before["prompt_tokens"] + (before.get("output_tokens") or 0), after["prompt_tokens"] - 1)
                reprefilled += max(0, known - after.get("cached_tokens", 0))
                continuing += 1
        ttft += [t["ttft"] for t in chain if "ttft" in t]
        if "ttft" in chain[0]:
            new_ttft.append(chain[0]["ttft"])
        if all(t.get("status") == 200 and t.get("session_finished") for t in chain):
            completion.append(chain[-1]["done"] - chain[0]["sent"])
    output = sum(t.get("output_tokens") or 0 for t in turns)
    return {
        "sessions": len(by_session),
        "sessions_complete": len(completion),
        "turns": len(turns),
        "continuing_turns": continuing,
        "reprefilled_tokens": reprefilled,
        "turn_ttft_p50_s": _p(ttft, 50),
        "turn_ttft_p99_s": _p(ttft, 99),
        "session_completion_p50_s": _p(completion, 50),
        "session_completion_p99_s": _p(completion, 99),
        "new_session_ttft_p99_s": _p(new_ttft, 99),
        "output_tokens_per_s": round(output / seconds, 1) if seconds else None,
    }


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, int(q / 100 * len(ordered) + 0.999) - 1))], 3)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    shapes_of = _shapes_module()
    shapes, stats = shapes_of.mooncake_shapes(Path(args.trace) if args.trace else shapes_of.MOONCAKE, 2048)
    trace = [t for t in agent_sessions(10_000, args.rate, shapes, args.seed) if t.arrival < args.seconds]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=args.url, timeout=args.limit_s, limits=limits) as client:
        start = time.monotonic()
        turns: list[dict] = []
        tasks = [asyncio.create_task(session(client, args, t, start, turns)) for t in trace]
        _, unfinished = await asyncio.wait(tasks, timeout=args.limit_s)
        for task in unfinished:  # sessions still running at the limit: counted as not complete
            task.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)
        elapsed = time.monotonic() - start
    finished = {t["session"] for t in turns} - {
        f.session for f, task in zip(trace, tasks, strict=True) if task in unfinished
    }
    for t in turns:
        t["session_finished"] = t["session"] in finished
    return {"summary": summarize(turns, elapsed), "shapes_from": stats, "turns": turns, "elapsed_s": round(elapsed, 1)}


MEDIAN_KEYS = (
    "reprefilled_tokens",
    "reprefilled_per_continuing_turn",
    "turn_ttft_p50_s",
    "turn_ttft_p99_s",
    "session_completion_p50_s",
    "session_completion_p99_s",
    "new_session_ttft_p99_s",
    "output_tokens_per_s",
)


def overview(runs: list[Path], out: Path, provenance: envelope.Envelope) -> dict[str, Any]:
    """Several runs of every front (``RUN/<front>/sessions.json``, as the GPU's sessions plan writes
    them): each run's summary, the medians per front, and the medians' ratios against the gateway's
    plain prefix routing (``agent_sessions.ratios``, the simulator's); ``sessions.json`` and a plot."""
    shapes_of = _shapes_module()
    fronts: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for path in sorted(run.glob("*/sessions.json")):
            summary = dict(json.loads(path.read_text())["summary"])
            continuing = summary["continuing_turns"]
            summary["reprefilled_per_continuing_turn"] = (
                round(summary["reprefilled_tokens"] / continuing, 1) if continuing else None
            )
            fronts.setdefault(path.parent.name, []).append({"run": run.name, **summary})
    medians: dict[str, dict[str, Any]] = {}
    for front, rows in fronts.items():
        medians[front] = {"runs": len(rows)}
        for key in MEDIAN_KEYS:
            values = [r[key] for r in rows if r.get(key) is not None]
            medians[front][key] = round(statistics.median(values), 3) if values else None
    result = provenance.wrap(
        {
            "runs": fronts,
            "medians": medians,
            "ratios_against_ours_prefix": shapes_of.ratios(medians, "ours-prefix") if "ours-prefix" in medians else {},
        }
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "sessions.json").write_text(json.dumps(result, indent=1) + "\n")
    try:
        shapes_of.plot(medians, out / "sessions.png")
    except ImportError:
        print("no matplotlib: no plot")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--overview", nargs="+", type=Path, help="runs to put side by side (RUN/<front>/sessions.json)")
    parser.add_argument("--url")
    parser.add_argument("--model", default="llama7b")
    parser.add_argument("--rate", type=float, default=0.5, help="sessions starting per second")
    parser.add_argument("--seconds", type=float, default=60.0, help="sessions start during this long")
    parser.add_argument("--limit-s", type=float, default=240.0, help="the whole run's limit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", help="the Mooncake conversation trace (default: the repository's copy)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    provenance = envelope.start()
    if args.overview:
        print(json.dumps(overview(args.overview, Path(args.out), provenance)["ratios_against_ours_prefix"], indent=1))
        return
    if not args.url:
        parser.error("--url is required (or --overview)")
    result = asyncio.run(run(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sessions.json").write_text(json.dumps(provenance.wrap(result), indent=1))
    print(json.dumps(result["summary"]))


if __name__ == "__main__":
    main()
