"""examples/: the sample config passes `gateway config check` and serves both classes in front of
simulated engines standing in for the user's `vllm serve`; the sample batch input passes the
gateway's own validation for the model `make run` serves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import openai
import yaml

from priority_gateway.batch.validate import parse_input
from priority_gateway.embedded import MODEL
from tests.support.procs import ROOT, Proc, free_port, start_engine

EXAMPLES = ROOT / "examples"
CONFIG = EXAMPLES / "gateway.yaml"


def config_check(path: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "priority_gateway", "config", "check", "--config", str(path)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_sample_config_passes_the_check() -> None:
    done = config_check(CONFIG)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"{CONFIG}: ok; pools: interactive (1), batch (1)"
    assert "  store: sqlite://" in done.stdout and done.stderr == "", "the sample keeps its state and warns of nothing"


def test_the_check_is_real(tmp_path: Path) -> None:
    broken = tmp_path / "gateway.yaml"
    broken.write_text(CONFIG.read_text().replace("policy: prefix", "policy: prefx"))
    done = config_check(broken)
    assert done.returncode == 2
    assert "pools.interactive.policy" in done.stderr


def test_the_sample_config_serves_both_classes(procs: list[Proc], tmp_path: Path) -> None:
    """The sample file as written; only the engines' and the gateway's addresses change (free ports)."""
    pools = yaml.safe_load(CONFIG.read_text())["pools"]
    engines = {
        "interactive": start_engine(tmp_path),
        "batch": start_engine(tmp_path, "--scheduling-policy", "priority"),
    }
    procs.extend(engines.values())
    port = free_port()
    env = {f"GATEWAY__POOLS__{pool.upper()}__ENGINES": f'["{engines[pool].url}"]' for pool in pools}
    env["GATEWAY__LISTEN__PORT"] = str(port)
    cmd = [sys.executable, "-m", "priority_gateway", "serve", "--config", str(CONFIG)]
    gateway = Proc(cmd, f"http://127.0.0.1:{port}", tmp_path / "gateway.log", env=env).start()
    procs.append(gateway)
    for engine in engines.values():
        engine.wait_ready("/health")
    gateway.wait_ready("/ready")
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    for pool in pools:
        response = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=4,
            extra_headers={"X-Priority": pool},
        )
        assert response.headers["x-gateway-pool"] == pool
        assert response.parse().choices[0].message.content


def test_the_sample_batch_input_is_valid_for_the_model_make_run_serves() -> None:
    data = (EXAMPLES / "requests.jsonl").read_bytes()
    parsed = parse_input(data, "/v1/chat/completions", {MODEL}, max_lines=50000)
    assert parsed.errors == []
    assert len(parsed.lines) == 4
    assert parse_input(data, "/v1/chat/completions", {"another-model"}, max_lines=50000).errors
