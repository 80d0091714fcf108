"""The embedded default: simulated vLLM engines started by the gateway itself.

``gateway serve`` with no config runs two interactive and two batch simulator processes
on free loopback ports, so a fresh machine has a working stack with no setup. Each runs as the
pool profiles (``engines/profiles/*.yaml``, whose ``simulator`` arguments deploy/sim and compose
run too) say: the interactive engines prefill in chunks of 384 tokens and hold 4 sequences, as
the vLLM manifests do, so the embedded stack keeps the budgets the README quotes.

This is the serving side's one seam to the simulator (``priority_gateway.engines.sim``): it starts it as a
process and lends precise prefix mode its tokenization (``tokenizer: sim``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from priority_gateway import log
from priority_gateway.upstream.h1 import EngineClient, UpstreamError

MODEL = "sim-model"


@dataclass(slots=True)
class EngineSpec:
    pool: str
    args: list[str] = field(default_factory=list)


PROFILES = Path(__file__).resolve().parent / "engines" / "profiles"
# Set here, per engine: where it listens and the model name the README's examples use.
_OWN = ("--host", "--port", "--model")


def pool_args(pool: str) -> list[str]:
    """The simulator arguments of a pool profile (``engines/profiles/<pool>.yaml``), less ``_OWN``."""
    profile = yaml.safe_load((PROFILES / f"{pool}.yaml").read_text())
    args: list[str] = profile["simulator"]["args"]
    return [arg for arg in args if arg.split("=", 1)[0] not in _OWN]


def pool_gateway(pool: str) -> dict[str, Any]:
    """What the gateway's pool says of a pool profile's engines (its ``gateway:`` section: their
    scheduling policy and seats)."""
    profile = yaml.safe_load((PROFILES / f"{pool}.yaml").read_text())
    return dict(profile.get("gateway") or {})


def default_engines() -> list[EngineSpec]:
    """Two interactive and two batch engines, run as the pool profiles say."""
    return [EngineSpec(pool, pool_args(pool)) for pool in ("interactive", "interactive", "batch", "batch")]


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the gateway dies, however it dies (Linux only)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def relay_output(engine: str, stream: IO[bytes]) -> None:
    """An engine's output as the gateway's own log lines, so one terminal shows one format: its JSON
    events as events (``engine=`` added), anything else (a traceback) line by line as ``engine_output``."""
    for raw in stream:
        line = raw.decode(errors="replace").rstrip()
        if not line:
            continue
        try:
            fields = json.loads(line)
        except ValueError:
            fields = None
        if isinstance(fields, dict) and isinstance(fields.get("event"), str):
            name = fields.pop("event")
            fields.pop("ts", None)
            log.info(
                name,
                engine=engine,
                **{k: v if isinstance(v, str | int | float) else json.dumps(v) for k, v in fields.items()},
            )
        else:
            log.warning("engine_output", engine=engine, line=line[:1000])


class EmbeddedEngines:
    def __init__(self, specs: list[EngineSpec] | None = None, model: str = MODEL) -> None:
        self.specs = specs or default_engines()
        self.model = model
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []
        # Ports are chosen before anything starts, so the configuration can be checked first.
        self.ports = [free_port() for _ in self.specs]
        self.urls: dict[str, list[str]] = {}
        for spec, port in zip(self.specs, self.ports, strict=True):
            self.urls.setdefault(spec.pool, []).append(f"http://127.0.0.1:{port}")

    def launch(self) -> None:
        for spec, port in zip(self.specs, self.ports, strict=True):
            cmd = [sys.executable, "-m", "priority_gateway.engines.sim", "--host", "127.0.0.1", "--port", str(port)]
            cmd += ["--model", self.model, *spec.args]
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            # A session of their own: a terminal's Ctrl-C reaches the gateway alone, which stops them.
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
                start_new_session=True,
            )
            url = f"http://127.0.0.1:{port}"
            self.processes.append((url, proc))
            assert proc.stdout is not None
            threading.Thread(target=relay_output, args=(url, proc.stdout), name=f"output {url}", daemon=True).start()

    async def wait_ready(self, timeout_s: float = 60.0) -> dict[str, list[str]]:
        await asyncio.gather(*(self._wait_healthy(url, proc, timeout_s) for url, proc in self.processes))
        log.info("embedded_engines_started", engines=sum(len(v) for v in self.urls.values()), model=self.model)
        return self.urls

    async def _wait_healthy(self, url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        client = EngineClient(url, connect_timeout=1.0)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"simulated engine {url} exited with code {proc.returncode}")
                with contextlib.suppress(UpstreamError):
                    status, _ = await client.get(b"/health", timeout_s=1.0)
                    if status == 200:
                        return
                await asyncio.sleep(0.1)
            raise RuntimeError(f"simulated engine {url} did not become healthy in {timeout_s:g} s")
        finally:
            client.close()

    def stop(self, within_s: float = 5.0) -> None:
        """Stop every engine: SIGTERM, then SIGKILL for those still running ``within_s`` later."""
        for _, proc in self.processes:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + within_s
        for _, proc in self.processes:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.processes.clear()

    def settings(self) -> dict[str, Any]:
        """The configuration these engines need (``pools``), for the rest to come from defaults,
        ``GATEWAY__*`` variables and options."""
        pools: dict[str, dict[str, Any]] = {}
        for pool, urls in self.urls.items():
            pools[pool] = {"engines": urls, **pool_gateway(pool)}
        return {"pools": pools}


class SimTokenizer:
    """The simulator's tokenization (``priority_gateway.engines.sim.tokens``): 4 characters a token."""

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        from priority_gateway.engines.sim import tokens

        return tokens.token_ids(tokens.render_chat(messages))

    def text(self, prompt: str) -> list[int]:
        from priority_gateway.engines.sim import tokens

        return tokens.token_ids(prompt)
