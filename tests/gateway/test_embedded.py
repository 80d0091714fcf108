"""``gateway serve`` with no config: simulated engines of its own, stopped with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import openai

from tests.support.observe import wait_for
from tests.support.procs import Proc, free_port


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_embedded_default_serves_and_cleans_up(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    proc = Proc(
        [sys.executable, "-m", "priority_gateway", "serve", "--port", str(port)],
        f"http://127.0.0.1:{port}",
        tmp_path / "gateway.log",
        env=env,
    )
    proc.env = env
    proc.start()
    try:
        proc.wait_ready("/ready", timeout=60)
        assert proc.popen is not None
        engines = children_of(proc.popen.pid)
        assert len(engines) == 4
        client = openai.OpenAI(base_url=proc.url + "/v1", api_key="none", max_retries=0)
        chat = client.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert chat.usage.completion_tokens == 4
        batch = client.chat.completions.with_raw_response.create(
            model="sim-model",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=4,
            extra_headers={"X-Priority": "batch"},
        )
        assert batch.headers["x-gateway-pool"] == "batch"
        assert "curl" in proc.log()
        # One format in the terminal: the engines' lines come through the gateway's logger too.
        lines = [line for line in proc.log().splitlines() if line.strip()]
        try_it = {"Try it:"} | {line for line in lines if line.startswith("  curl ")}
        assert all(line.startswith("ts=") or line in try_it for line in lines), proc.log()
        started = [line for line in lines if "event=engine_start " in line]
        assert len(started) == 4 and all(" engine=http://127.0.0.1:" in line for line in started)
        assert sum(" max_num_batched_tokens=384 " in line for line in started) == 2, "interactive: 384-token chunks"
        os.kill(proc.popen.pid, signal.SIGTERM)
        proc.popen.wait(timeout=20)
        gone = wait_for(lambda: not any(_alive(pid) for pid in engines), timeout=10)
        assert gone, "simulated engines outlived the gateway"
    finally:
        proc.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return bool(state) and not state.startswith("Z")
