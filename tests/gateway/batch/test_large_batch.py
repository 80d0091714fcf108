"""A 2,000-line batch next to live interactive traffic: every line once, and the interactive
class served throughout without a single refusal (the gateway refuses an interactive request it
predicts would miss its time-to-first-token budget: none was). The TTFT the clients measured is
printed and bounded loosely, not held to the budget: on a shared host it carries the host's jitter."""

from __future__ import annotations

import threading
import time

import openai

from tests.gateway.batch.support import (
    MODEL,
    chat_line,
    client_for,
    file_lines,
    start_stack,
    submit,
    wait_batch,
)
from tests.support.observe import metric

LINES = 2000
TTFT_BUDGET_S = 0.5


def interactive_load(client: openai.OpenAI, stop: threading.Event, ttfts: list[float], errors: list[str]) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            stream = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "a quick interactive question"}],
                max_tokens=16,
                stream=True,
                extra_headers={"X-Priority": "interactive"},
            )
            first = None
            for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.monotonic() - started
            ttfts.append(first if first is not None else float("inf"))
        except openai.APIError as exc:
            errors.append(repr(exc))


def test_two_thousand_lines_complete_while_interactive_traffic_is_never_refused(procs, tmp_path):
    stack = start_stack(tmp_path, procs)
    gateway = stack.gateways[0]
    client = client_for(gateway)
    lines = [chat_line(i, prefix=f"You are assistant number {i % 20}. " * 6, max_tokens=8) for i in range(LINES)]
    stop = threading.Event()
    ttfts: list[float] = []
    errors: list[str] = []
    users = [threading.Thread(target=interactive_load, args=(client, stop, ttfts, errors)) for _ in range(3)]
    for user in users:
        user.start()
    try:
        started = time.monotonic()
        created = submit(client, lines)
        batch = wait_batch(client, created.id, timeout=240)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        for user in users:
            user.join()
    assert batch.status == "completed", batch
    assert batch.request_counts.model_dump() == {"total": LINES, "completed": LINES, "failed": 0}
    out = file_lines(client, batch.output_file_id)
    custom_ids = [line["custom_id"] for line in out]
    assert len(custom_ids) == LINES and set(custom_ids) == {f"req-{i}" for i in range(LINES)}
    assert all(line["response"]["status_code"] == 200 for line in out)
    assert not errors, errors[:3]
    ttfts.sort()
    assert len(ttfts) >= 20
    p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]
    backfilled = metric(gateway.url, "gateway_routing_decisions_total", pool="interactive", reason="backfill")
    print(
        f"batch_lines={LINES} batch_s={elapsed:.1f} backfilled={backfilled:.0f} "
        f"interactive_requests={len(ttfts)} ttft_p50_s={ttfts[len(ttfts) // 2]:.3f} ttft_p99_s={p99:.3f}"
    )
    # Answered, not left waiting behind the batch: a first token well within the request's deadline.
    assert p99 < 10 * TTFT_BUDGET_S
