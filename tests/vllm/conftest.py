"""Two real vLLM engines for the whole ``vllm`` lane, started once, in parallel.

Needs ``make vllm-setup`` (``.venv-vllm`` and ``.cache/tiny-model``). Each engine is
pinned to its own core (CI variant, KV 256 MiB, ``--max-num-seqs 4`` so a handful of
requests already queue):

- ``interactive``: fcfs on core 0; its KV events connect to ``kv_endpoint``, which a
  test binds (the gateway-binds style), topic ``interactive``.
- ``batch``: ``--scheduling-policy priority`` on core 1; it binds its KV events on an
  ipc socket a test connects to (the engine-binds style), topic ``batch``.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from priority_gateway.engines.vllm.serve import DEFAULT_MODEL, DEFAULT_PYTHON, Engine, EngineSpec, start
from tests.support.procs import free_port

MODEL = "tiny"
BLOCK_SIZE = 128
MAX_NUM_SEQS = 4


@dataclass(frozen=True)
class VllmEngines:
    interactive: Engine
    batch: Engine
    kv_endpoint: str  # the interactive engine connects here
    batch_kv_endpoint: str  # the batch engine binds here

    @property
    def both(self) -> tuple[Engine, Engine]:
        return self.interactive, self.batch


def gateway_pools(engines: VllmEngines) -> dict[str, Any]:
    """A gateway's pools in front of the two engines: ``batch`` runs vLLM's priority scheduling."""
    return {
        "interactive": {"engines": [engines.interactive.url]},
        "batch": {"engines": [engines.batch.url], "scheduling_policy": "priority"},
    }


@pytest.fixture(scope="session")
def vllm_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmEngines]:
    for needed in (DEFAULT_PYTHON, DEFAULT_MODEL / "config.json"):
        if not needed.exists():
            pytest.fail(f"{needed} is missing: run `make vllm-setup` first", pytrace=False)
    logs = tmp_path_factory.mktemp("vllm")
    kv_endpoint = f"tcp://127.0.0.1:{free_port()}"
    batch_kv_endpoint = f"ipc://{logs / 'batch-kv.sock'}"
    specs = {
        "interactive": EngineSpec(
            port=free_port(),
            core=0,
            max_num_seqs=MAX_NUM_SEQS,
            kv_events_endpoint=kv_endpoint,
            kv_events_topic="interactive",
        ),
        "batch": EngineSpec(
            port=free_port(),
            core=1,
            scheduling_policy="priority",
            max_num_seqs=MAX_NUM_SEQS,
            kv_events_endpoint=batch_kv_endpoint,
            kv_events_topic="batch",
        ),
    }
    started = {name: start(spec, Path(logs) / f"{name}.log") for name, spec in specs.items()}
    try:
        with ThreadPoolExecutor(len(started)) as pool:
            list(pool.map(lambda engine: engine.wait_healthy(240), started.values()))
        yield VllmEngines(started["interactive"], started["batch"], kv_endpoint, batch_kv_endpoint)
    finally:
        for engine in started.values():
            engine.stop()
