"""The embedded default: simulated vLLM engines started by the gateway itself.

``gateway serve`` with no config runs two interactive and two batch simulator processes
on free loopback ports, so a fresh machine has a working stack with no setup.

This is the serving side's one seam to the simulator (``priority_gateway.engines.sim``): it starts it as a
process and lends precise prefix mode its tokenization (``tokenizer: sim``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from priority_gateway import log
from priority_gateway.upstream.h1 import EngineClient, UpstreamError

MODEL = "sim-model"


@dataclass(slots=True)
class EngineSpec:
    pool: str
    args: list[str] = field(default_factory=list)


DEFAULT_ENGINES = [
    EngineSpec("interactive", ["--profile", "gemma4-nvfp4"]),
    EngineSpec("interactive", ["--profile", "gemma4-nvfp4"]),
    EngineSpec("batch", ["--profile", "gemma4-nvfp4-mtp4", "--scheduling-policy", "priority"]),
    EngineSpec("batch", ["--profile", "gemma4-nvfp4-mtp4", "--scheduling-policy", "priority"]),
]


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


class EmbeddedEngines:
    def __init__(self, specs: list[EngineSpec] | None = None, model: str = MODEL) -> None:
        self.specs = specs or DEFAULT_ENGINES
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
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
            self.processes.append((f"http://127.0.0.1:{port}", proc))

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

    def stop(self) -> None:
        for _, proc in self.processes:
            if proc.poll() is None:
                proc.terminate()
        for _, proc in self.processes:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.processes.clear()

    def settings(self) -> dict[str, Any]:
        """The configuration these engines need (``pools``), for the rest to come from defaults,
        ``GATEWAY__*`` variables and options."""
        pools: dict[str, dict[str, Any]] = {}
        for pool, urls in self.urls.items():
            pools[pool] = {"engines": urls}
            if pool == "batch":
                pools[pool]["scheduling_policy"] = "priority"
        return {"pools": pools}


class SimTokenizer:
    """The simulator's tokenization (``priority_gateway.engines.sim.tokens``): 4 characters a token."""

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        from priority_gateway.engines.sim import tokens

        return tokens.token_ids(tokens.render_chat(messages))

    def text(self, prompt: str) -> list[int]:
        from priority_gateway.engines.sim import tokens

        return tokens.token_ids(prompt)
