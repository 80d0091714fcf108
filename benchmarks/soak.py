"""Soak: 50,000 mixed requests against a real gateway and simulated engines; memory must stay flat.

The mix is what a public endpoint sees: chat and completions, streamed and not, embeddings,
both classes, conversations pinned by random sessions on shared system prompts, clients that
leave mid-stream or before any answer, malformed bodies and bodies over the limit; and what a
hostile one sends: Responses tool items nested a thousand deep (400), methods a path does not
take (405), response ids (the engine's 404), an alias half of whose split no engine serves (404
at once), output limits in both fields, and file downloads streamed from the store. The
gateway's resident memory is sampled throughout; after warm-up it must not keep growing.

    python benchmarks/soak.py [--requests 50000] [--concurrency 48] [--out benchmarks/results/soak]

Writes ``results.json`` (counts by kind and status, the memory timeline, growth after warm-up)
and ``soak.png`` (memory against requests sent).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from priority_gateway.bench import envelope
from priority_gateway.loopback import Proc, rss_bytes, start_engine, start_gateway

ROOT = Path(__file__).resolve().parents[1]

MODEL = "sim-model"
MIB = 1024 * 1024
BODY_LIMIT = MIB
SYSTEM_PROMPTS = [f"You are assistant number {i}. " + "Answer briefly and politely. " * 8 for i in range(40)]
KINDS = [
    ("chat", 34),
    ("chat_stream", 18),
    ("completion", 12),
    ("completion_stream", 6),
    ("embedding", 5),
    ("leave_mid_stream", 8),
    ("leave_before_answer", 5),
    ("malformed", 7),
    ("oversized", 3),
    ("batch_chat", 2),
    ("responses_tools", 2),
    ("responses_nested", 2),
    ("wrong_method", 1),
    ("response_id", 1),
    ("unserved_alias", 2),
    ("completion_limit", 2),
    ("download", 1),
]
DEEP = b"[" * 1000 + b"1" + b"]" * 1000
NESTED_RESPONSE = b'{"model": "sim-model", "input": [{"type": "function_call", "name": "f", "arguments": %s}]}' % DEEP
TOOLS_RESPONSE = {
    "model": MODEL,
    "input": [
        {"role": "user", "content": "What is the weather?"},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
    ],
    "max_output_tokens": 8,
}
# A file of 4 MiB for the downloads, uploaded once at the start.
DOWNLOAD = b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n' * 52_000


def chat_body(rng: random.Random, stream: bool) -> dict:
    system = rng.choice(SYSTEM_PROMPTS)
    user = " ".join(rng.choice(["tell", "me", "about", "caches", "and", "queues", "please"]) for _ in range(12))
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": rng.randint(4, 24),
        "stream": stream,
    }


def completion_body(rng: random.Random, stream: bool) -> dict:
    prompt = rng.choice(SYSTEM_PROMPTS) + str(rng.random())
    return {"model": MODEL, "prompt": prompt, "max_tokens": rng.randint(4, 24), "stream": stream}


MALFORMED = [
    b"{not json",
    b'{"model": "sim-model", "messages": [1, "x", null]}',
    b'{"model": "sim-model", "messages": [{"role": "user", "content": ' + b"[" * 600 + b"]" * 600 + b"}]}",
    b'{"model": "sim-model", "prompt": {"a": 1}}',
    b"[]",
    b"",
]


class Soak:
    def __init__(self, url: str, requests: int, concurrency: int, seed: int) -> None:
        self.url = url
        self.total = requests
        self.concurrency = concurrency
        self.rng = random.Random(seed)
        self.sent = 0
        self.outcomes: Counter[tuple[str, int]] = Counter()
        self.kinds = [k for k, _ in KINDS]
        self.weights = [w for _, w in KINDS]
        self.file_id = ""

    async def one(self, client: httpx.AsyncClient, kind: str) -> int:
        rng = self.rng
        headers = {"x-session-id": f"s{rng.randrange(500)}", "x-priority": "interactive"}
        if kind == "batch_chat":
            headers["x-priority"] = "batch"
        if kind in ("chat", "batch_chat"):
            r = await client.post("/v1/chat/completions", json=chat_body(rng, False), headers=headers)
            return r.status_code
        if kind == "completion":
            r = await client.post("/v1/completions", json=completion_body(rng, False), headers=headers)
            return r.status_code
        if kind == "embedding":
            r = await client.post("/v1/embeddings", json={"model": MODEL, "input": "embed me"}, headers=headers)
            return r.status_code
        if kind in ("chat_stream", "completion_stream", "leave_mid_stream"):
            path, body = (
                ("/v1/completions", completion_body(rng, True))
                if kind == "completion_stream"
                else ("/v1/chat/completions", chat_body(rng, True))
            )
            async with client.stream("POST", path, json=body, headers=headers) as r:
                async for _ in r.aiter_raw():
                    if kind == "leave_mid_stream":
                        break  # closing the response mid-stream drops the connection
                return r.status_code
        if kind == "leave_before_answer":
            try:
                await asyncio.wait_for(
                    client.post("/v1/chat/completions", json=chat_body(rng, False), headers=headers),
                    rng.uniform(0.001, 0.02),
                )
            except TimeoutError:
                return 499
            return 200
        if kind == "malformed":
            r = await client.post("/v1/chat/completions", content=rng.choice(MALFORMED), headers=headers)
            return r.status_code
        if kind == "responses_tools":
            return (await client.post("/v1/responses", json=TOOLS_RESPONSE, headers=headers)).status_code
        if kind == "responses_nested":
            return (await client.post("/v1/responses", content=NESTED_RESPONSE, headers=headers)).status_code
        if kind == "wrong_method":
            path = rng.choice(["/v1/chat/completions", "/v1/completions", "/v1/files", "/health"])
            return (await client.request(rng.choice(["PUT", "DELETE", "PATCH"]), path)).status_code
        if kind == "response_id":
            return (await client.get(f"/v1/responses/resp_{rng.randrange(10**6)}")).status_code
        if kind == "unserved_alias":
            body = {**chat_body(rng, False), "model": "canary"}
            return (await client.post("/v1/chat/completions", json=body, headers=headers)).status_code
        if kind == "completion_limit":
            body = {**chat_body(rng, False), "max_tokens": 1, "max_completion_tokens": rng.randint(4, 24)}
            return (await client.post("/v1/chat/completions", json=body, headers=headers)).status_code
        if kind == "download":
            async with client.stream("GET", f"/v1/files/{self.file_id}/content") as r:
                size = sum([len(chunk) async for chunk in r.aiter_raw()])
                return r.status_code if size == len(DOWNLOAD) or r.status_code != 200 else -3
        body = b'{"model": "sim-model", "prompt": "' + b"a" * (2 * BODY_LIMIT) + b'"}'
        r = await client.post("/v1/completions", content=body, headers=headers)
        return r.status_code

    async def worker(self, client: httpx.AsyncClient) -> None:
        while self.sent < self.total:
            self.sent += 1
            kind = self.rng.choices(self.kinds, self.weights)[0]
            try:
                status = await self.one(client, kind)
            except httpx.HTTPError as exc:
                status = -1 if not isinstance(exc, httpx.RemoteProtocolError) else -2
            self.outcomes[(kind, status)] += 1

    async def run(self, gateway: Proc, sample_s: float) -> list[dict]:
        timeline: list[dict] = []
        started = time.monotonic()
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        async with httpx.AsyncClient(base_url=self.url, timeout=60, limits=limits) as client:
            uploaded = await client.post("/v1/files", data={"purpose": "batch"}, files={"file": ("d.jsonl", DOWNLOAD)})
            self.file_id = uploaded.json()["id"]
            workers = [asyncio.create_task(self.worker(client)) for _ in range(self.concurrency)]
            last_print = 0.0
            while not all(w.done() for w in workers):
                now = time.monotonic() - started
                timeline.append({"t_s": round(now, 2), "requests": self.sent, "rss_mib": rss_bytes(gateway) / MIB})
                if now - last_print >= 10:
                    last_print = now
                    rate = self.sent / max(now, 1e-9)
                    print(
                        f"  {now:6.0f} s  {self.sent:6d}/{self.total} requests  {rate:5.0f}/s  "
                        f"gateway RSS {timeline[-1]['rss_mib']:.1f} MiB",
                        flush=True,
                    )
                await asyncio.sleep(sample_s)
            await asyncio.gather(*workers)
        await asyncio.sleep(1.0)
        timeline.append(
            {"t_s": round(time.monotonic() - started, 2), "requests": self.sent, "rss_mib": rss_bytes(gateway) / MIB}
        )
        return timeline


def growth_after_warmup(timeline: list[dict], warmup_share: float) -> dict:
    total = timeline[-1]["requests"]
    after = [p for p in timeline if p["requests"] >= warmup_share * total]
    first = after[0]
    last = timeline[-1]
    # Least-squares slope of RSS against requests after warm-up, per 10,000 requests.
    xs = [p["requests"] for p in after]
    ys = [p["rss_mib"] for p in after]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs) or 1.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var * 10_000
    return {
        "warmup_requests": first["requests"],
        "rss_after_warmup_mib": round(first["rss_mib"], 1),
        "rss_end_mib": round(last["rss_mib"], 1),
        "rss_peak_after_warmup_mib": round(max(ys), 1),
        "growth_after_warmup_mib": round(last["rss_mib"] - first["rss_mib"], 1),
        "slope_mib_per_10k_requests": round(slope, 2),
    }


def plot(timeline: list[dict], summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot([p["requests"] for p in timeline], [p["rss_mib"] for p in timeline], color="tab:blue")
    ax.axvline(summary["warmup_requests"], color="grey", linestyle="--", label="end of warm-up")
    ax.set_xlabel("requests sent")
    ax.set_ylabel("gateway resident memory (MiB)")
    ax.set_ylim(bottom=0)
    ax.set_title(
        f"soak: {timeline[-1]['requests']:,} mixed requests; after warm-up "
        f"{summary['growth_after_warmup_mib']:+.1f} MiB ({summary['slope_mib_per_10k_requests']:+.2f} MiB per 10k)"
    )
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--concurrency", type=int, default=48)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup-share", type=float, default=0.2, help="share of requests counted as warm-up")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/soak"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        engines = [
            start_engine(tmp, "--token-delay-ms", "1"),
            start_engine(tmp, "--token-delay-ms", "1", "--scheduling-policy", "priority"),
        ]
        procs: list[Proc] = list(engines)
        try:
            for engine in engines:
                engine.wait_ready()
            config = {
                "pools": {
                    # "ghost" is declared but no engine lists it: half the canary's requests are 404 at once.
                    "interactive": {"engines": [engines[0].url], "models": [MODEL, "ghost"]},
                    "batch": {"engines": [engines[1].url], "scheduling_policy": "priority"},
                },
                "models": {"aliases": {"canary": [{"model": MODEL, "weight": 1}, {"model": "ghost", "weight": 1}]}},
                "limits": {"max_body_bytes": BODY_LIMIT},
                "log_level": "warning",
            }
            gateway = start_gateway(tmp, config)
            procs.append(gateway)
            gateway.wait_ready("/ready")
            print(f"soak: {args.requests:,} requests at concurrency {args.concurrency}", flush=True)
            provenance = envelope.start()  # the host's load from here: the engines and the gateway are up
            soak = Soak(gateway.url, args.requests, args.concurrency, args.seed)
            started = time.monotonic()
            timeline = asyncio.run(soak.run(gateway, 0.5))
            elapsed = time.monotonic() - started
            text = gateway.log_path.read_text()  # all of it: a 500 early in the run counts too
            gateway_errors = text.count("request_failed") + text.count("Exception in ASGI")
        finally:
            for proc in reversed(procs):
                proc.stop()
    summary = growth_after_warmup(timeline, args.warmup_share)
    by_kind: dict[str, dict[str, int]] = {}
    for (kind, status), n in sorted(soak.outcomes.items()):
        by_kind.setdefault(kind, {})[str(status)] = n
    report = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "elapsed_s": round(elapsed, 1),
        "requests_per_s": round(args.requests / elapsed, 1),
        "memory": summary,
        "gateway_500s_or_tracebacks": gateway_errors,
        "outcomes": by_kind,
        "status_legend": {
            "499": "the client left before the answer",
            "-1": "connection error on the client side (an oversized body: closed after the 413 while still sending)",
            "-2": "connection closed by the gateway",
            "-3": "a download that ended short of the file",
        },
        "timeline": timeline,
    }
    (out / "results.json").write_text(json.dumps(provenance.wrap(report), indent=1))
    plot(timeline, summary, out / "soak.png")
    print(json.dumps({k: v for k, v in report.items() if k != "timeline"}, indent=1))


if __name__ == "__main__":
    main()
