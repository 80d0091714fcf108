"""Start one real vLLM engine on this CPU-only machine, pinned to one core.

Uses the CI variant of the recipe: ``--enforce-eager``, the worker inside the engine
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), one OpenMP thread, a fixed KV cache
size and block size 128. The engine runs in its own process group; ``Engine.stop``
signals the whole group so no worker outlives it.

Standard library only, so it runs from the project venv or from ``.venv-vllm``:

    python -m priority_gateway.engines.vllm.serve --port 8100 --core 0
    python -m priority_gateway.engines.vllm.serve --port 8101 --core 1 --scheduling-policy priority \\
        --kv-events-endpoint tcp://127.0.0.1:5557 --kv-events-topic e8101

In the foreground it prints one ``event=engine_ready`` line once ``/health`` answers 200
and stops the engine on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
DEFAULT_MODEL = REPO / ".cache" / "tiny-model"
SERVED_MODEL_NAME = "tiny"


@dataclass(frozen=True)
class EngineSpec:
    port: int
    core: int | None = 0
    model_dir: Path = DEFAULT_MODEL
    served_model_name: str = SERVED_MODEL_NAME
    kv_cache_bytes: str = "256M"
    block_size: int = 128
    max_model_len: int = 2048
    scheduling_policy: str = "fcfs"
    max_num_seqs: int | None = None
    kv_events_endpoint: str | None = None
    kv_events_topic: str = ""
    enable_prompt_tokens_details: bool = True
    extra_args: tuple[str, ...] = ()
    python: Path = field(default_factory=lambda: Path(os.environ.get("VLLM_PYTHON", DEFAULT_PYTHON)))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kv_events_config(self) -> str | None:
        if self.kv_events_endpoint is None:
            return None
        return json.dumps(
            {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": self.kv_events_endpoint,
                "topic": self.kv_events_topic,
            }
        )

    def argv(self) -> list[str]:
        pin = ["taskset", "-c", str(self.core)] if self.core is not None else []
        args = [
            *pin,
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_model_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "bfloat16",
            "--max-model-len",
            str(self.max_model_len),
            "--enable-prefix-caching",
            "--block-size",
            str(self.block_size),
            "--kv-cache-memory-bytes",
            self.kv_cache_bytes,
            "--enforce-eager",
            "--scheduling-policy",
            self.scheduling_policy,
        ]
        if self.max_num_seqs is not None:
            args += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.enable_prompt_tokens_details:
            args.append("--enable-prompt-tokens-details")
        kv_events = self.kv_events_config()
        if kv_events is not None:
            args += ["--kv-events-config", kv_events]
        return [*args, *self.extra_args]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            OMP_NUM_THREADS="1",
            HF_HUB_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            VLLM_LOGGING_LEVEL=env.get("VLLM_LOGGING_LEVEL", "WARNING"),
        )
        return env


class EngineFailed(RuntimeError):
    pass


class Engine:
    """A started engine process group; ``stop`` is idempotent."""

    def __init__(self, spec: EngineSpec, process: subprocess.Popen[bytes], log_path: Path | None) -> None:
        self.spec = spec
        self.process = process
        self.log_path = log_path

    @property
    def url(self) -> str:
        return self.spec.url

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_healthy(self, timeout_s: float = 180.0) -> float:
        """Block until ``/health`` answers 200; returns the seconds waited."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise EngineFailed(
                    f"engine on port {self.spec.port} exited rc={self.process.returncode}\n{self.log_tail()}"
                )
            if health_ok(self.url):
                return time.monotonic() - started
            time.sleep(0.5)
        raise EngineFailed(f"engine on port {self.spec.port} not healthy after {timeout_s}s\n{self.log_tail()}")

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass


def health_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def start(spec: EngineSpec, log_path: Path | None = None) -> Engine:
    """Start the engine in a new process group; output goes to ``log_path`` (or is inherited)."""
    if not spec.python.exists():
        raise EngineFailed(f"{spec.python} is missing: run `make vllm-setup`")
    if not (spec.model_dir / "config.json").exists():
        raise EngineFailed(f"no model in {spec.model_dir}: run `make vllm-setup`")
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as sink:
            process = subprocess.Popen(
                spec.argv(), env=spec.env(), stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
    else:
        process = subprocess.Popen(spec.argv(), env=spec.env(), start_new_session=True)
    return Engine(spec, process, log_path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Start one pinned real vLLM engine (CI variant).")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--core", type=int, default=0, help="CPU core for taskset; -1 leaves it unpinned")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--kv-cache-bytes", default="256M")
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs")
    parser.add_argument("--kv-events-endpoint", default=None, help="e.g. tcp://127.0.0.1:5557 (connects)")
    parser.add_argument("--kv-events-topic", default=None, help="defaults to e<port>")
    parser.add_argument("--log", type=Path, default=None, help="engine output file (default: inherit)")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more vllm flags")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    extra = tuple(arg for arg in args.extra if arg != "--")
    spec = EngineSpec(
        port=args.port,
        core=None if args.core < 0 else args.core,
        model_dir=args.model,
        kv_cache_bytes=args.kv_cache_bytes,
        block_size=args.block_size,
        scheduling_policy=args.scheduling_policy,
        max_num_seqs=args.max_num_seqs,
        kv_events_endpoint=args.kv_events_endpoint,
        kv_events_topic=args.kv_events_topic if args.kv_events_topic is not None else f"e{args.port}",
        extra_args=extra,
    )
    engine = start(spec, args.log)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        waited = engine.wait_healthy(args.timeout)
        print(f"event=engine_ready url={engine.url} pid={engine.process.pid} seconds={waited:.1f}", flush=True)
        return engine.process.wait()
    except EngineFailed as failure:
        print(f"event=engine_failed port={spec.port} error={str(failure).splitlines()[0]!r}", flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        engine.stop()


if __name__ == "__main__":
    raise SystemExit(main())
