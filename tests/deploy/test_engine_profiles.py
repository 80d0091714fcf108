"""The vLLM pool profiles (engines/profiles/*.yaml): well-formed, explained, and carrying the
flags each pool is defined by; their simulator stand-ins mirror them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from priority_gateway.engines.sim.cli import build_parser
from priority_gateway.engines.sim.profile import available_profiles
from tests.deploy.support import POOLS, PROFILES, REPO, flag_values, profile

REQUIRED_KEYS = {"pool", "image", "command", "port", "gateway", "simulator", "args"}


@pytest.mark.parametrize("pool", POOLS)
def test_profile_is_well_formed(pool: str) -> None:
    data = profile(pool)
    assert set(data) == REQUIRED_KEYS
    assert data["pool"] == pool
    assert data["image"].startswith("vllm/vllm-openai:v")
    assert data["command"] == ["vllm", "serve"]
    args = data["args"]
    assert args and all(isinstance(arg, str) and arg for arg in args)
    assert not args[0].startswith("-"), "the model comes first, as vllm serve's positional argument"
    flags = [arg.partition("=")[0] for arg in args[1:]]
    assert all(flag.startswith("--") for flag in flags)
    assert len(flags) == len(set(flags)), "a flag given twice"
    values = flag_values(args)
    assert values["--port"] == str(data["port"])
    assert values["--host"] == "0.0.0.0"
    for arg in args:
        if "={" in arg:
            json.loads(arg.partition("=")[2])


@pytest.mark.parametrize("pool", POOLS)
def test_every_argument_has_a_reason(pool: str) -> None:
    """Each argument, or a pair of arguments that go together, follows a comment saying why."""
    lines = (PROFILES / f"{pool}.yaml").read_text().splitlines()
    start = lines.index("args:") + 1
    run = 0
    previous = ""
    for line in lines[start:]:
        stripped = line.strip()
        if stripped.startswith("- "):
            run = run + 1 if previous.startswith("- ") else 1
            assert previous.startswith(("#", "- ")), f"no comment before {stripped}"
            assert run <= 2, f"{stripped} has no comment of its own"
        previous = stripped
    assert run > 0


def test_interactive_pool_flags() -> None:
    values = flag_values(profile("interactive")["args"])
    assert "--enable-prefix-caching" in values
    assert json.loads(values["--limit-mm-per-prompt"]) == {"image": 0, "video": 0, "audio": 0}
    # The SLO holds up to concurrency 4 on one GPU (NVFP4): that is the engine's seat count.
    assert values["--max-num-seqs"] == "4"
    # Prefill chunks small enough that a step beside decoding requests stays within the ITL budget.
    assert "--enable-chunked-prefill" in values
    assert int(values["--max-num-batched-tokens"]) <= 512
    assert "--speculative-config" not in values
    assert values["--scheduling-policy"] == "fcfs"
    assert values["--tensor-parallel-size"] == "1"


def test_batch_pool_flags() -> None:
    batch = flag_values(profile("batch")["args"])
    interactive = flag_values(profile("interactive")["args"])
    speculative = json.loads(batch["--speculative-config"])
    assert speculative["method"] == "mtp"
    assert speculative["num_speculative_tokens"] == 4
    assert batch["--scheduling-policy"] == "priority"
    assert int(batch["--max-num-seqs"]) > int(interactive["--max-num-seqs"])
    assert "--enable-prefix-caching" in batch
    assert json.loads(batch["--limit-mm-per-prompt"]) == {"image": 0, "video": 0, "audio": 0}


def test_pools_serve_one_model_under_one_name() -> None:
    interactive, batch = (profile(pool) for pool in POOLS)
    assert interactive["args"][0] == batch["args"][0]
    assert interactive["image"] == batch["image"]
    for key in ("--served-model-name", "--max-model-len"):
        assert flag_values(interactive["args"])[key] == flag_values(batch["args"])[key]


@pytest.mark.parametrize("pool", POOLS)
def test_gateway_expectation_matches_the_engine(pool: str) -> None:
    data = profile(pool)
    assert data["gateway"]["scheduling_policy"] == flag_values(data["args"])["--scheduling-policy"]
    assert str(data["gateway"]["max_num_seqs"]) == flag_values(data["args"])["--max-num-seqs"]


@pytest.mark.parametrize("pool", POOLS)
def test_simulator_stands_in_for_the_pool(pool: str) -> None:
    data = profile(pool)
    sim = data["simulator"]
    assert sim["command"] == ["python", "-m", "priority_gateway.engines.sim"]
    parsed = build_parser().parse_args(sim["args"])
    vllm = flag_values(data["args"])
    assert parsed.profile in available_profiles()
    assert parsed.host == "0.0.0.0"
    assert parsed.port == data["port"]
    assert parsed.model == vllm["--served-model-name"]
    assert parsed.max_num_seqs == int(vllm["--max-num-seqs"])
    if "--max-num-batched-tokens" in vllm:
        assert parsed.max_num_batched_tokens == int(vllm["--max-num-batched-tokens"])
    assert parsed.max_model_len == int(vllm["--max-model-len"])
    assert parsed.scheduling_policy == vllm["--scheduling-policy"]
    assert parsed.enable_prompt_tokens_details == ("--enable-prompt-tokens-details" in vllm)


VLLM_PYTHON = Path(os.environ.get("VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))

PARSE_WITH_VLLM = """
import json, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

args = make_arg_parser(FlexibleArgumentParser()).parse_args(json.loads(sys.argv[1]))
args.model = args.model_tag  # what `vllm serve MODEL` does with the positional argument
engine = AsyncEngineArgs.from_cli_args(args)
print(json.dumps({
    "model": engine.model,
    "served_model_name": engine.served_model_name,
    "max_num_seqs": engine.max_num_seqs,
    "max_num_batched_tokens": engine.max_num_batched_tokens,
    "enable_chunked_prefill": engine.enable_chunked_prefill,
    "scheduling_policy": engine.scheduling_policy,
    "enable_prefix_caching": engine.enable_prefix_caching,
    "limit_mm_per_prompt": engine.limit_mm_per_prompt,
    "speculative_config": engine.speculative_config,
}))
"""


@pytest.mark.vllm
@pytest.mark.parametrize("pool", POOLS)
def test_real_vllm_accepts_the_arguments(pool: str) -> None:
    """vLLM's own `serve` parser takes every argument and reads it as the profile means it."""
    data = profile(pool)
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", PARSE_WITH_VLLM, json.dumps(data["args"])],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    engine = json.loads(done.stdout.strip().splitlines()[-1])
    values = flag_values(data["args"])
    assert engine["model"] == data["args"][0]
    assert engine["served_model_name"] in (values["--served-model-name"], [values["--served-model-name"]])
    assert engine["max_num_seqs"] == int(values["--max-num-seqs"])
    if "--max-num-batched-tokens" in values:
        assert engine["max_num_batched_tokens"] == int(values["--max-num-batched-tokens"])
        assert engine["enable_chunked_prefill"] is True
    assert engine["scheduling_policy"] == values["--scheduling-policy"]
    assert engine["enable_prefix_caching"] is True
    assert engine["limit_mm_per_prompt"] == json.loads(values["--limit-mm-per-prompt"])
    expected_speculative = json.loads(values["--speculative-config"]) if "--speculative-config" in values else None
    assert engine["speculative_config"] == expected_speculative
