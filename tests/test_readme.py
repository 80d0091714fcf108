"""The README's commands, run as written against the gateway its first command starts.

Every ``sh`` and ``python`` block of README.md is run, in order, from the repository root with
``.venv/bin`` first on ``PATH`` (what ``. .venv/bin/activate`` gives), except where the README
says otherwise in an HTML comment on the line before the block:
- ``<!-- readme-test: serves -->``: a server; the test starts it first (``make run``) and the other
  blocks talk to it.
- ``<!-- readme-test: not run: why -->``: a block that cannot run here (GPUs, Docker, a cluster,
  minutes of load, the test suite itself); the set of these is pinned below, so a new block is
  either run or added there on purpose.
Only addresses change: the gateway listens on a free port instead of 8080
(``GATEWAY__LISTEN__PORT``), and the blocks' ``127.0.0.1:8080`` says that port. Blocks run in a
directory that links to every entry of the repository, so what they write stays out of it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.procs import ROOT, Proc, free_port

README = ROOT / "README.md"
RUNNABLE = {"sh", "python"}
MARKER = re.compile(r"^<!-- readme-test: (?P<kind>serves|not run: (?P<why>.+)) -->$")
ADDRESS = "127.0.0.1:8080"

# The first line of each block the test does not run.
NOT_RUN = {
    "make test",
    "CUDA_VISIBLE_DEVICES=0 vllm serve google/gemma-4-31B-it --port 8000 --enable-prefix-caching",
    "gateway serve --config examples/gateway.yaml",
    "GATEWAY__STORE=redis://localhost:6379/0 GATEWAY__POOLS__BATCH__POLICY=least_loaded"
    " gateway serve --config gateway.yaml",
    "OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 OTEL_SERVICE_NAME=gateway gateway serve --config gateway.yaml",
    "gateway keys create --name nightly-jobs --classes batch --rpm 600 --tpm 2000000 --config gateway.yaml",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True python -m priority_gateway.engines.sim --port 8001 "
    "--model /models/llama-8b \\",
    "gateway sim --trace benchmarks/traces/mooncake/conversation_trace.jsonl --engines 8 --admission off \\",
    "gateway bench --url http://127.0.0.1:8080 --concurrency 1,2,4,8,16,32 --duration 30 --ramp-up 10 \\",
}
SERVES = {"make run"}


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    text: str
    kind: str | None  # "serves", "not run", or None: run to completion

    @property
    def first(self) -> str:
        return self.text.splitlines()[0].split("  #")[0].strip()


def blocks(text: str) -> list[Block]:
    found, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence or not fence.group(1):
            i += 1
            continue
        end = lines.index("```", i + 1)
        before = next((line for line in reversed(lines[:i]) if line.strip()), "")
        marker = MARKER.match(before)
        kind = None if marker is None else ("serves" if marker["kind"] == "serves" else "not run")
        found.append(Block(i + 1, fence.group(1), "\n".join(lines[i + 1 : end]) + "\n", kind))
        i = end + 1
    return found


def runnable() -> list[Block]:
    return [b for b in blocks(README.read_text()) if b.lang in RUNNABLE]


def test_every_marker_stands_before_a_block() -> None:
    lines = README.read_text().splitlines()
    marked = {b.line for b in blocks(README.read_text()) if b.kind}
    for number, line in enumerate(lines, start=1):
        if line.startswith("<!-- readme-test"):
            assert MARKER.match(line), f"README.md:{number}: malformed marker {line!r}"
            following = next(n for n in range(number + 1, len(lines) + 1) if lines[n - 1].strip())
            assert following in marked, f"README.md:{number}: the marker is not followed by a block"


def test_the_blocks_not_run_are_exactly_the_expected_ones() -> None:
    assert {b.first for b in runnable() if b.kind == "not run"} == NOT_RUN
    assert {b.first for b in runnable() if b.kind == "serves"} == SERVES
    assert all(b.lang in RUNNABLE or b.kind is None for b in blocks(README.read_text()))


def test_blocks_are_found(tmp_path: Path) -> None:
    """The parser sees fences, languages and markers as a reader does."""
    sample = (
        "text\n\n<!-- readme-test: not run: needs a GPU -->\n```sh\nvllm serve x\n```\n\n```python\nprint(1)\n```\n"
    )
    found = blocks(sample)
    assert [(b.line, b.lang, b.kind, b.first) for b in found] == [
        (4, "sh", "not run", "vllm serve x"),
        (8, "python", None, "print(1)"),
    ]


def environment(port: int) -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}", "GATEWAY__LISTEN__PORT": str(port)}


@pytest.fixture(scope="module")
def gateway(procs: list[Proc], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    stale = subprocess.run(["make", "-q", ".venv/.installed"], cwd=ROOT, capture_output=True)
    assert stale.returncode == 0, "the .venv is older than pyproject.toml: `make run` would reinstall; run make first"
    port = free_port()
    (serves,) = [b for b in runnable() if b.kind == "serves"]
    log = tmp_path_factory.mktemp("readme") / "server.log"
    server = Proc(["bash", "-c", serves.text], f"http://127.0.0.1:{port}", log, env=environment(port)).start()
    procs.append(server)
    yield server.wait_ready("/ready", timeout=60)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository as the blocks see it, in a directory of its own."""
    work = tmp_path_factory.mktemp("clone")
    for entry in ROOT.iterdir():
        if entry.name != ".git":
            (work / entry.name).symlink_to(entry)
    return work


def expected_output(block: Block, stdout: str, workdir: Path) -> None:
    """What a reader would see, for the blocks whose output says whether they worked."""
    if block.first.startswith("gateway sim --profile"):
        sweep = json.loads((workdir / "sweep.json").read_text())
        assert list(sweep) == ["1", "2", "4", "8", "16", "32"]
    elif block.first.startswith("curl -s http://127.0.0.1:8080/v1/chat/completions"):
        assert json.loads(stdout)["choices"][0]["message"]["content"]
    elif block.first.startswith("gateway config check"):
        assert stdout.strip().endswith("ok; pools: interactive (1), batch (1)")
    elif "client.batches.create" in block.text:
        sent = {json.loads(line)["custom_id"] for line in (ROOT / "examples/requests.jsonl").read_text().splitlines()}
        done = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
        assert {line["custom_id"] for line in done} == sent
        assert all(line["response"]["status_code"] == 200 for line in done)
    else:
        assert stdout.strip(), "the block printed nothing"


@pytest.mark.parametrize("block", [b for b in runnable() if b.kind is None], ids=lambda b: f"README.md:{b.line}")
def test_the_block_runs_as_written(gateway: Proc, workdir: Path, block: Block) -> None:
    port = gateway.url.rsplit(":", 1)[1]
    text = block.text.replace(ADDRESS, f"127.0.0.1:{port}")
    command = ["bash", "-e", "-o", "pipefail", "-c", text] if block.lang == "sh" else [sys.executable, "-c", text]
    env = environment(int(port))
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"README.md:{block.line} failed:\n{done.stdout}\n{done.stderr}\n{gateway.log()}"
    expected_output(block, done.stdout, workdir)


def test_the_license_is_the_one_pyproject_names() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]["text"]
    license_text = (ROOT / "LICENSE").read_text()
    assert declared == "Apache-2.0"
    assert license_text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in license_text and len(license_text.splitlines()) > 200
