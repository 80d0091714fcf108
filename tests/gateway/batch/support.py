"""Helpers for batch tests: input files, stacks of engines and gateways, waiting for jobs."""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from tests.support.procs import Proc, start_engine, start_gateway

MODEL = "sim-model"
TERMINAL = ("completed", "failed", "expired", "cancelled")


def chat_line(i: int, prefix: str = "", max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"{prefix}question {i}"}],
        "max_tokens": max_tokens,
    }
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body, **extra}


def jsonl(items: list[Any]) -> bytes:
    return b"".join((item if isinstance(item, bytes) else json.dumps(item).encode()) + b"\n" for item in items)


def upload(client: openai.OpenAI, data: bytes, name: str = "input.jsonl") -> str:
    return client.files.create(file=(name, io.BytesIO(data)), purpose="batch").id


def submit(client: openai.OpenAI, lines: list[Any], endpoint: str = "/v1/chat/completions", **kwargs: Any) -> Any:
    file_id = upload(client, jsonl(lines))
    return client.batches.create(input_file_id=file_id, endpoint=endpoint, completion_window="24h", **kwargs)


def wait_batch(client: openai.OpenAI, batch_id: str, timeout: float = 60.0, until: tuple[str, ...] = TERMINAL) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            batch = client.batches.retrieve(batch_id)
            if batch.status in until:
                return batch
        except (openai.APIConnectionError, openai.InternalServerError):
            pass  # a replica restarting, or its store
        if time.monotonic() > deadline:
            raise AssertionError(f"batch {batch_id} not {until} after {timeout}s")
        time.sleep(0.1)


def file_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines() if line]


def client_for(gateway: Proc, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=30)


@dataclass
class Stack:
    tmp: Path
    procs: list[Proc]
    config: dict[str, Any]
    interactive: list[Proc] = field(default_factory=list)
    batch: list[Proc] = field(default_factory=list)
    gateways: list[Proc] = field(default_factory=list)

    def add_gateway(self, env: dict[str, str] | None = None, port: int | None = None) -> Proc:
        gateway = start_gateway(self.tmp, self.config, env=env, port=port)
        self.procs.append(gateway)
        gateway.wait_ready("/ready")
        self.gateways.append(gateway)
        return gateway


def start_stack(
    tmp: Path,
    procs: list[Proc],
    store: str = "memory",
    batch: dict[str, Any] | None = None,
    engine_args: tuple[str, ...] = ("--token-delay-ms", "1"),
    gateways: int = 1,
    **extra: Any,
) -> Stack:
    interactive = start_engine(tmp, *engine_args)
    batch_engine = start_engine(tmp, *engine_args, "--scheduling-policy", "priority")
    procs.extend([interactive, batch_engine])
    for engine in (interactive, batch_engine):
        engine.wait_ready()
    config = {
        "pools": {
            "interactive": {"engines": [interactive.url]},
            "batch": {"engines": [batch_engine.url], "scheduling_policy": "priority"},
        },
        "store": store,
        "health": {"interval_s": 0.2, "timeout_s": 0.5, "unhealthy_after": 1},
        "scrape": {"interval_s": 0.5},
        "batch": {"poll_s": 0.1, **(batch or {})},
        **extra,
    }
    stack = Stack(tmp, procs, config, [interactive], [batch_engine])
    for _ in range(gateways):
        stack.add_gateway()
    return stack
