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
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import ROOT, Proc, free_port

README = ROOT / "README.md"
RUNNABLE = {"sh", "python"}
MARKER = re.compile(r"^<!-- readme-test: (?P<kind>serves|not run: (?P<why>.+)) -->$")
ADDRESS = "127.0.0.1:8080"

# The first line of each block the test does not run.
NOT_RUN = {
    "make test",
    "pip wheel --no-deps -w dist . && pip install 'dist/priority_gateway-0.1.0-py3-none-any.whl[otel]'",
    "CUDA_VISIBLE_DEVICES=0 vllm serve google/gemma-4-31B-it --port 8000 --enable-prefix-caching",
    "gateway serve --config examples/gateway.yaml",
    "GATEWAY__STORE=redis://localhost:6379/0 GATEWAY__POOLS__BATCH__POLICY=least_loaded"
    " gateway serve --config gateway.yaml",
    "OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 OTEL_SERVICE_NAME=gateway gateway serve --config gateway.yaml",
    "gateway keys create --name nightly-jobs --classes batch --rpm 600 --tpm 2000000 --config gateway.yaml",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True python -m priority_gateway.engines.sim --port 8001 "
    "--model /models/llama-8b \\",
    "gateway sim --trace benchmarks/traces/mooncake/conversation_trace.jsonl --engines 8 --admission off \\",
    "gateway bench --url http://127.0.0.1:8000 --rate-scale 0.25 --duration 600 --out bench-trace/ \\",
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


def test_blocks_are_found() -> None:
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
    stale = subprocess.run(["make", "-q", ".venv/.runtime"], cwd=ROOT, capture_output=True)
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
        # What the README's Engines line and the text after this sweep say: the budgets hold up to 4, not at 8.
        sweep = json.loads((workdir / "sweep.json").read_text())
        assert list(sweep) == ["1", "2", "4", "8", "16", "32"]
        for level in ("1", "2", "4"):
            assert sweep[level]["ttft_p99_ms"] <= 500 and sweep[level]["itl_p99_ms"] <= 50, sweep[level]
        assert sweep["8"]["itl_p99_ms"] > 150, sweep["8"]
    elif block.first.startswith("gateway bench --url http://127.0.0.1:8080"):
        bench_within_budgets(json.loads((workdir / "bench" / "results.json").read_text()))
    elif block.first.startswith("curl -s http://127.0.0.1:8080/v1/chat/completions"):
        assert json.loads(stdout)["choices"][0]["message"]["content"]
    elif block.first.startswith("gateway config check"):
        assert stdout.splitlines()[0].endswith("ok; pools: interactive (1), batch (1)")
        assert any(line.startswith("  store: sqlite://") for line in stdout.splitlines()), stdout
    elif "client.batches.create" in block.text:
        sent = {json.loads(line)["custom_id"] for line in (ROOT / "examples/requests.jsonl").read_text().splitlines()}
        done = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
        assert {line["custom_id"] for line in done} == sent
        assert all(line["response"]["status_code"] == 200 for line in done)
    else:
        assert stdout.strip(), "the block printed nothing"


# The host is shared and the engines are simulated in real time: a latency may pass its budget by this much.
HOST_NOISE = 1.3
# A p99 over fewer requests than this is their slowest one, which a stall of the host decides (on a
# busy CI machine one request of nine took 2.8 s); such a level is judged on its median.
P99_SAMPLES = 20


def bench_within_budgets(results: dict[str, Any]) -> None:
    """The README's bench against ``make run``: nothing refused and budgets held while the engines have
    seats, refusals (429 only) once they are full, and what is admitted within the budgets either way."""
    runs = {run["concurrency"]: run for run in results["runs"]}
    assert list(runs) == [1, 4, 16]
    budget = results["budget"]
    for concurrency, run in runs.items():
        assert run["errors"] == 0, run
        assert run["completed"] > 0, run
        quantile = "p99" if run["completed"] >= P99_SAMPLES else "p50"
        assert run[f"itl_{quantile}_ms"] <= budget["itl_p99_ms"] * HOST_NOISE, run
        if concurrency <= 4:
            # Past the seats, the limit's probe of one more request waits in the engine until two
            # scrapes show it queueing (the README says so): TTFT is held where the engines seat the load.
            assert run[f"ttft_{quantile}_ms"] <= budget["ttft_p99_ms"] * HOST_NOISE, run
        assert set(run["refused_by_code"]) <= {"429 slo_budget_exceeded"}, run
    assert runs[1]["refused"] == 0 and runs[4]["refused"] == 0, runs
    assert runs[16]["refused"] > runs[16]["completed"], "twice the seats: most of the load is refused"


@pytest.mark.parametrize("block", [b for b in runnable() if b.kind is None], ids=lambda b: f"README.md:{b.line}")
def test_the_block_runs_as_written(gateway: Proc, workdir: Path, block: Block) -> None:
    port = gateway.url.rsplit(":", 1)[1]
    text = block.text.replace(ADDRESS, f"127.0.0.1:{port}")
    command = ["bash", "-e", "-o", "pipefail", "-c", text] if block.lang == "sh" else [sys.executable, "-c", text]
    env = environment(int(port))
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"README.md:{block.line} failed:\n{done.stdout}\n{done.stderr}\n{gateway.log()}"
    expected_output(block, done.stdout, workdir)


def test_the_license_is_the_one_pyproject_names() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    license_text = (ROOT / "LICENSE").read_text()
    assert declared == "Apache-2.0"
    assert license_text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in license_text and len(license_text.splitlines()) > 200


def start_make_run(tmp: Path, port: int, state: Path) -> Proc:
    (serves,) = [b for b in runnable() if b.kind == "serves"]
    env = {**environment(port), "XDG_STATE_HOME": str(state)}
    return Proc(["bash", "-c", serves.text], f"http://127.0.0.1:{port}", tmp / f"server-{port}.log", env=env).start()


def interrupt(proc: Proc) -> None:
    """Ctrl-C in the terminal of ``make run``, then wait for every process of it to end."""
    assert proc.popen is not None
    os.killpg(proc.popen.pid, signal.SIGINT)
    proc.popen.wait(timeout=60)
    deadline = time.monotonic() + 60
    while True:
        try:
            os.killpg(proc.popen.pid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, "make run's processes outlived Ctrl-C by a minute"
        time.sleep(0.1)


def test_the_batch_example_finishes_across_a_restart_of_make_run(workdir: Path, tmp_path: Path) -> None:
    """Ctrl-C on ``make run`` right after the README's batch was created, ``make run`` again: the batch
    is still there and ends with every line (the default store keeps it in the data directory)."""
    (block,) = [b for b in runnable() if "client.batches.create" in b.text]
    head, _, rest = block.text.partition("batch_input = ")
    create, _, wait = ("batch_input = " + rest).partition("while batch.status")
    state = tmp_path / "state"

    def run(code: str, port: int) -> str:
        text = code.replace(ADDRESS, f"127.0.0.1:{port}")
        done = subprocess.run([sys.executable, "-c", text], cwd=workdir, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
        return done.stdout

    first_port, second_port = free_port(), free_port()
    first = start_make_run(tmp_path, first_port, state).wait_ready("/ready", timeout=60)
    try:
        batch_id = run(head + create + "print(batch.id)\n", first_port).split()[-1]
    finally:
        interrupt(first)
    second = start_make_run(tmp_path, second_port, state).wait_ready("/ready", timeout=60)
    try:
        out = run(f"{head}batch = client.batches.retrieve({batch_id!r})\nwhile batch.status{wait}", second_port)
    finally:
        interrupt(second)
    expected_output(block, out, workdir)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_the_routing_figures_are_those_of_the_result_files() -> None:
    """The README quotes the routing command's figures and make bench-routing's as their result files
    hold them (the command that writes each file is in it, or is the target's script)."""
    readme = flat(README.read_text())
    command = json.loads((ROOT / "benchmarks/results/routing/readme_command.json").read_text())
    assert flat(command["command"]).endswith(
        "gateway sim --trace benchmarks/traces/mooncake/conversation_trace.jsonl --engines 8 --admission off"
        " --profile h200-32b-fp8 --policy round_robin,least_loaded,prefix --json routing.json"
    )
    rr, prefix = command["results"]["round_robin"], command["results"]["prefix"]
    minutes, seconds = divmod(round(command["wall_s"]), 60)
    quoted = (
        f"serves {prefix['prefix_hit_ratio'] * 100:.1f} % of prompt tokens from cache against "
        f"{rr['prefix_hit_ratio'] * 100:.1f} % for round robin (ceiling {prefix['oracle_hit_ratio'] * 100:.1f} %), "
        f"TTFT p99 {prefix['ttft_p99_ms'] / 1000:.1f} s against {rr['ttft_p99_ms'] / 1000:.1f} s, "
        f"p50 {prefix['ttft_p50_ms'] / 1000:.2f} s against {rr['ttft_p50_ms'] / 1000:.2f} s. "
        f"It took {minutes} min {seconds} s of wall time"
    )
    assert quoted in readme, quoted
    assert f"and {command['max_rss_kb'] / 1e6:.1f} GB of memory at most" in readme

    one = json.loads((ROOT / "benchmarks/results/routing/summary.json").read_text())["mooncake_1x"]
    rr, prefix = one["round_robin"], one["prefix"]
    results = (
        f"the prefix policy serves {prefix['prefix_hit_ratio'] * 100:.1f} % of prompt tokens from cache against "
        f"{rr['prefix_hit_ratio'] * 100:.1f} % for round robin, {one['prefix_share_of_oracle'] * 100:.0f} % of the "
        f"pooled-cache ceiling ({one['oracle_hit_ratio'] * 100:.1f} %), with TTFT p99 "
        f"{one['prefix_ttft_p99_over_round_robin']:.2f}x round robin's ({prefix['ttft_p99_ms'] / 1000:.1f} s "
        f"against {rr['ttft_p99_ms'] / 1000:.1f} s; p50 {prefix['ttft_p50_ms'] / 1000:.2f} s against "
        f"{rr['ttft_p50_ms'] / 1000:.2f} s) and load imbalance {prefix['load_imbalance']:.2f}"
    )
    assert results in readme, results
