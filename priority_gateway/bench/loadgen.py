"""Sending requests and timing their streams: closed loop at a concurrency, or a trace replay.

Rules:
- Every request streams (``stream_options.include_usage``) with ``max_tokens`` its wanted output
  length and ``ignore_eos``, so it produces that many tokens.
- TTFT is from sending to the first event with content; ITL the gaps between content events,
  one gap per event even when it carries several tokens, as ``vllm bench serve`` counts. Output
  tokens come from the usage event; without one, each content event counts as one token. The
  usage event's ``prompt_tokens`` and ``prompt_tokens_details.cached_tokens`` (engines started
  with ``--enable-prompt-tokens-details``) are kept: how much of each prompt the engine had cached.
- A status other than 200, an error event inside the stream, or a transport failure is an
  error, keyed ``"<status> <code>"`` (``"404 model_not_found"``), ``"stream <code>"``,
  ``"connect"``, ``"timeout"`` or ``"transport"``; except a 429, which is a refusal (the endpoint
  protecting its budgets or limits, not failing), keyed the same way and kept apart, with the
  ``Retry-After`` it asked for.
- Closed loop at concurrency c: c clients each send, read to the end and send again. Client i
  starts ``ramp_up * i / c`` seconds in (spread starts desynchronize the clients at once; started
  together, their prefills collide for several rounds). A client's first request is warm-up.
  Requests sent in the ``duration`` seconds after the ramp-up are measured; after it the clients
  keep the load up with cool-down requests, cancelled once every measured request has finished,
  so every measured request ran among c streams. A client that was refused waits what
  ``Retry-After`` asks (1 s without one, at most ``MAX_RETRY_AFTER_S``) before it sends again, as
  a well-behaved client does; a client that resent at once would measure only how fast the
  endpoint can say no.
- Open loop: each request is sent at its arrival time whatever is in flight; all are measured,
  and how late the client sent each one is kept (``lag``) to show the client kept up.
- A run of identical client errors (the same 4xx other than 429, ``ErrorRun.limit`` requests in a
  row with nothing else between) stops the run with ``ClientErrors``: the endpoint will answer
  every request so (a wrong ``--model``, a missing key), and measuring that only floods it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson

from priority_gateway.bench.clients import Client
from priority_gateway.bench.workload import RequestSpec, SyntheticWorkload, TraceArrival
from priority_gateway.upstream.h1 import ConnectError, ReadTimeout, UpstreamError

now = time.perf_counter
MAX_RETRY_AFTER_S = 60.0
MESSAGE_CHARS = 200


class ClientErrors(Exception):
    """Every request of a run in a row got the same client error."""

    def __init__(self, key: str, count: int, message: str | None) -> None:
        super().__init__(f"{count} requests in a row answered {key}" + (f" ({message})" if message else ""))
        self.key = key
        self.count = count
        self.message = message


class ErrorRun:
    """Counts identical client errors in a row; ``observe`` raises ``ClientErrors`` at ``limit`` (0: never)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._key: str | None = None
        self._count = 0
        self.stopped: ClientErrors | None = None

    def observe(self, sample: Sample) -> None:
        if self.stopped is not None:  # every client stops on the same run
            raise self.stopped
        key = sample.error
        if key is None or key[:1] != "4":  # refusals (429) are sample.refused, not errors
            self._key, self._count = None, 0
            return
        self._count = self._count + 1 if key == self._key else 1
        self._key = key
        if self.limit and self._count >= self.limit:
            self.stopped = ClientErrors(key, self._count, sample.message)
            raise self.stopped


@dataclass(slots=True, eq=False)
class Sample:
    """One request as the client saw it (times from ``time.perf_counter``)."""

    group: str
    sent: float
    measured: bool = True
    warmup: bool = False
    cancelled: bool = False
    chunks: list[float] = field(default_factory=list)
    done: float | None = None
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None
    message: str | None = None
    """The endpoint's error message, for an error with one (its first ``MESSAGE_CHARS`` characters)."""
    refused: str | None = None
    retry_after: float | None = None
    lag: float = 0.0


@dataclass(slots=True)
class Target:
    """The endpoint and how to ask it: path, model, class header, body options."""

    client: Client
    model: str
    endpoint: str = "chat"
    x_priority: str | None = None
    ignore_eos: bool = True

    @property
    def path(self) -> bytes:
        return b"/v1/chat/completions" if self.endpoint == "chat" else b"/v1/completions"

    def request(self, spec: RequestSpec) -> tuple[list[tuple[bytes, bytes]], bytes]:
        body: dict[str, object] = {
            "model": self.model,
            "max_tokens": spec.output_len,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": spec.prompt}]
        else:
            body["prompt"] = spec.prompt
        headers = [(b"content-type", b"application/json"), (b"accept", b"text/event-stream")]
        cls = self.x_priority or spec.cls
        if cls:
            headers.append((b"x-priority", cls.encode()))
        return headers, orjson.dumps(body)


def _error_key(prefix: str, payload: object) -> str:
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return prefix
    code = error.get("code")
    if code is None or str(code) == prefix:
        code = error.get("type")  # vLLM puts the status in ``code``; the type says more
    return f"{prefix} {code}" if code is not None else prefix


def _error_message(payload: object) -> str | None:
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message[:MESSAGE_CHARS] if isinstance(message, str) else None


class _EventReader:
    """The ``data:`` payloads of an SSE byte stream, however it is split into reads."""

    __slots__ = ("_tail",)

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, data: bytes) -> list[bytes]:
        lines = (self._tail + data).split(b"\n")
        self._tail = lines.pop()
        return [line[5:].strip() for line in lines if line.startswith(b"data:")]


def _retry_after(value: bytes | None) -> float:
    """Seconds a ``Retry-After`` header asks for (its HTTP-date form is not used by gateways: 1 s)."""
    try:
        seconds = float(value) if value is not None else 1.0
    except ValueError:
        seconds = 1.0
    return min(MAX_RETRY_AFTER_S, max(0.0, seconds))


def _content(event: dict[str, object]) -> bool:
    choices = event.get("choices")
    if not choices or not isinstance(choices, list):
        return False
    choice = choices[0]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content"))
    return bool(choice.get("text"))


async def stream_one(target: Target, spec: RequestSpec, sample: Sample) -> None:
    """Send one request and fill ``sample`` with what came back."""
    headers, body = target.request(spec)
    sample.sent = now()
    try:
        response = await target.client.request(b"POST", target.path, headers, body)
    except ConnectError:
        sample.error, sample.done = "connect", now()
        return
    except UpstreamError as exc:
        sample.error, sample.done = ("timeout" if isinstance(exc, ReadTimeout) else "transport"), now()
        return
    try:
        if response.status != 200:
            text = await response.read()
            try:
                payload = orjson.loads(text)
            except orjson.JSONDecodeError:
                payload = None
            key = _error_key(str(response.status), payload)
            if response.status == 429:
                sample.refused, sample.retry_after = key, _retry_after(response.header(b"retry-after"))
            else:
                sample.error, sample.message = key, _error_message(payload)
            return
        reader = _EventReader()
        while (data := await response.next_chunk()) is not None:
            arrived = now()
            for raw in reader.feed(data):
                if raw == b"[DONE]":
                    continue
                event = orjson.loads(raw)
                if _content(event):
                    sample.chunks.append(arrived)
                if usage := event.get("usage"):
                    sample.output_tokens = usage.get("completion_tokens")
                    sample.prompt_tokens = usage.get("prompt_tokens")
                    if isinstance(details := usage.get("prompt_tokens_details"), dict):
                        sample.cached_tokens = details.get("cached_tokens")
                if "error" in event:
                    sample.error = _error_key("stream", event)
    except ReadTimeout:
        sample.error = "timeout"
    except (UpstreamError, orjson.JSONDecodeError):
        sample.error = "transport"
    except asyncio.CancelledError:
        sample.cancelled = True
        raise
    finally:
        await response.aclose()
        sample.done = now()


async def closed_loop(
    target: Target,
    workload: SyntheticWorkload,
    concurrency: int,
    duration: float,
    on_done: Callable[[Sample], None] = lambda _: None,
    ramp_up: float = 0.0,
) -> list[Sample]:
    """``concurrency`` clients back to back for ``duration`` seconds (see the module's rules)."""
    loop = asyncio.get_running_loop()
    samples: list[Sample] = []
    deadline = now() + ramp_up + duration
    finished: asyncio.Future[None] = loop.create_future()
    outstanding = concurrency  # warm-up (one per client) and measured requests not yet done

    def check() -> None:
        if outstanding == 0 and now() >= deadline and not finished.done():
            finished.set_result(None)

    async def client(delay: float) -> None:
        nonlocal outstanding
        await asyncio.sleep(delay)
        warmup = True
        while True:
            spec = workload.next()
            sample = Sample(spec.group, now(), warmup=warmup)
            sample.measured = not warmup and sample.sent < deadline
            counted = warmup or sample.measured
            samples.append(sample)
            outstanding += sample.measured
            await stream_one(target, spec, sample)
            on_done(sample)
            outstanding -= counted
            check()
            warmup = False
            if sample.retry_after is not None:
                await asyncio.sleep(sample.retry_after)

    timer = loop.call_at(loop.time() + ramp_up + duration, check)
    clients = [loop.create_task(client(ramp_up * i / concurrency)) for i in range(concurrency)]
    try:
        await asyncio.wait([finished, *clients], return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
    for task in clients:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error
    return samples


async def open_loop(
    target: Target, arrivals: Sequence[TraceArrival], on_done: Callable[[Sample], None] = lambda _: None
) -> list[Sample]:
    """Send each request at its arrival time (seconds after the start)."""
    loop = asyncio.get_running_loop()
    samples: list[Sample] = []
    running: set[asyncio.Task[None]] = set()
    failed: list[BaseException] = []
    start = now()

    def ended(task: asyncio.Task[None]) -> None:
        running.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            failed.append(error)

    async def one(spec: RequestSpec, sample: Sample) -> None:
        await stream_one(target, spec, sample)
        on_done(sample)

    for arrival in arrivals:
        if failed:
            break
        wait = start + arrival.arrival - now()
        if wait > 0:
            await asyncio.sleep(wait)
        spec = arrival.spec()
        sample = Sample(arrival.group, now())
        sample.lag = max(0.0, sample.sent - start - arrival.arrival)
        samples.append(sample)
        task = loop.create_task(one(spec, sample))
        running.add(task)
        task.add_done_callback(ended)
    if failed:
        for task in list(running):
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        raise failed[0]
    if running:
        await asyncio.gather(*running)
    return samples
