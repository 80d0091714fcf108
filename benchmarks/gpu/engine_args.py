"""A pool's engine arguments on the lent GPU: the manifests' own, with only what the device forces replaced.

The pool profiles (``engines/profiles/<pool>.yaml``) are the one source of the flags: the
Kubernetes Deployments and compose run them verbatim (``tests/deploy`` checks), and the GPU harness
derives its ``vllm serve`` command from them here. ``tests/benchmarks/test_gpu_engine_args.py``
checks that what comes out is the profile's arguments plus the substitutions below, each named.

Rules:
- The profile's arguments are kept in their order, each as the profile gives it, unless a rule
  below replaces it; every replacement, addition and drop is a ``Substitution`` with its reason,
  recorded with every result (``EngineLaunch.record``).
- What the device forces: the model (the profile's Gemma 4 NVFP4 weights cannot be carried: a
  7B-shaped model with dummy weights, ``--load-format=dummy``, served as ``llama7b``), where it
  listens (loopback, the harness's port), and memory when several engines share the one GPU
  (each an equal share of the memory and the same 12 GiB of KV cache; one engine alone keeps the
  profile's ``--gpu-memory-utilization``).
- ``--enforce-eager`` is added unless ``graphs``: a fresh machine compiles and captures CUDA graphs
  at every start (minutes of a 20-minute sitting), and the simulator's ``h200-7b-bf16`` profile
  was fitted on eager engines, so device and simulator stay comparable. It makes steps
  host-bound (~13 ms a decode step): ITL on the device is longer than with graphs.
- What vLLM 0.26 (on the device) cannot run is replaced by its nearest real equivalent, or dropped
  when it has none, and named: every flag the device runs must be one that 0.26's parser defines
  (``vllm-0.26-flags.json``, read from the wheel by ``vllm_flags.py``), with a value it takes; a
  profile flag 0.26 lacks that no rule here covers stops the harness before any device time is spent.
- The experiment's own variables (``experiment``: flag -> (value, why), e.g. the ``--max-num-seqs`` a
  static-cap sweep sets; a value None drops the flag) replace the profile's value and are recorded
  like the rest.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
PROFILES = HERE.parents[1] / "engines" / "profiles"
FLAGS_026 = HERE / "vllm-0.26-flags.json"
SERVED_MODEL = "llama7b"
KV_CACHE_BYTES = 12 * 1024**3
MODEL = "model"
"""The positional argument of ``vllm serve`` (the weights), as a substitution names it."""

MODEL_WHY = (
    "the profile's weights (Gemma 4 31B NVFP4) cannot be carried to the device: a 7B-shaped model "
    "(Qwen2.5-7B's shape) with random weights"
)
# Flags of the profiles that vLLM 0.26 does not define: the nearest equivalent there, or why none.
NOT_IN_026 = {
    "--max-num-queued-reqs": (
        None,
        "vLLM 0.26 has no bound on its waiting queue (the flag came later) and nothing equivalent: "
        "requests past --max-num-seqs wait in the engine unbounded; in front of it, the gateway's "
        "own queue and its TTFT deadline are what bound waiting",
    ),
}
SPECULATIVE_WHY = (
    "MTP needs a model with MTP heads (Gemma 4's assistant checkpoint), which the device's dummy 7B "
    "model lacks: vLLM's ngram_gpu (prompt lookup on the GPU; plain ngram needs numba, which the "
    "bundle lacks) with the same number of draft tokens. With random weights the drafts are "
    "accepted about as rarely as chance allows: this pool's throughput gain does not show, only "
    "the cost of verifying drafts (vllm:spec_decode_* in the engine's metrics say how many)"
)


@dataclass(frozen=True, slots=True)
class Substitution:
    flag: str
    shipped: str | None
    """The profile's value (``""`` for a flag without one; None: the profile does not give it)."""
    device: str | None
    """What the device runs (None: dropped)."""
    why: str


@dataclass(frozen=True, slots=True)
class EngineLaunch:
    pool: str
    shipped: tuple[str, ...]
    """The profile's arguments after ``vllm serve``, as the manifests run them."""
    args: tuple[str, ...]
    """The arguments after ``python -m vllm.entrypoints.openai.api_server`` on the device."""
    substitutions: tuple[Substitution, ...]

    def flag(self, name: str) -> str | None:
        """A flag's value as the device runs it (``""`` for a flag without one; None: not given)."""
        return flag_values(self.args).get(name)

    def record(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "profile": f"engines/profiles/{self.pool}.yaml",
            "vllm_on_device": flags_026()["vllm"],
            "shipped_args": list(self.shipped),
            "device_args": list(self.args),
            "substitutions": [asdict(s) for s in self.substitutions],
        }


def profile_args(pool: str) -> list[str]:
    return list(yaml.safe_load((PROFILES / f"{pool}.yaml").read_text())["args"])


def profile_gateway(pool: str) -> dict[str, Any]:
    """What the gateway's pool must say about the profile's engines (its ``gateway:`` section, which
    tests/deploy checks against the flags and the shipped gateway configuration)."""
    return dict(yaml.safe_load((PROFILES / f"{pool}.yaml").read_text()).get("gateway") or {})


def flag_values(args: tuple[str, ...] | list[str]) -> dict[str, str]:
    out = {}
    for arg in args:
        if arg.startswith("--"):
            flag, _, value = arg.partition("=")
            out[flag] = value
    return out


def flags_026() -> dict[str, Any]:
    return json.loads(FLAGS_026.read_text())


def _speculative(value: str) -> tuple[str, str]:
    config = json.loads(value)
    if config.get("method") != "mtp":
        return value, ""
    tokens = int(config.get("num_speculative_tokens", 4))
    lookup = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}
    device = {"method": "ngram_gpu", "num_speculative_tokens": tokens, **lookup}
    return json.dumps(device, separators=(",", ":")), SPECULATIVE_WHY


def device_launch(
    pool: str,
    *,
    model_dir: str,
    port: int,
    engines_on_gpu: int = 1,
    graphs: bool = False,
    experiment: dict[str, tuple[str | None, str]] | None = None,
    shipped: list[str] | None = None,
) -> EngineLaunch:
    """The device's arguments for one engine of ``pool`` (``shipped``: the profile's, by default)."""
    given = profile_args(pool) if shipped is None else list(shipped)
    experiment = dict(experiment or {})
    known = flags_026()
    subs: list[Substitution] = [Substitution(MODEL, given[0], f"--model={model_dir}", MODEL_WHY)]
    args = [f"--model={model_dir}"]
    share = engines_on_gpu > 1
    for arg in given[1:]:
        flag, eq, value = arg.partition("=")
        shipped_value = value if eq else ""
        replaced: tuple[str | None, str] | None = None  # (what the device runs, None: dropped; why)
        if flag in experiment:
            replaced = experiment.pop(flag)
        elif flag == "--served-model-name":
            replaced = (SERVED_MODEL, "the harness's clients and fronts ask for the device's model by this name")
        elif flag == "--host":
            replaced = ("127.0.0.1", "everything of a sitting runs on the one machine")
        elif flag == "--port":
            replaced = (str(port), "each engine of a sitting on its own port")
        elif flag == "--gpu-memory-utilization" and share:
            each = f"{min(float(value), 0.88 / engines_on_gpu):.2f}"
            why = f"memory sizing: {engines_on_gpu} engines share the one GPU, each an equal share of it"
            replaced = (each, why)
        elif flag == "--speculative-config":
            device, why = _speculative(value)
            if why:
                replaced = (device, why)
        elif flag not in known["flags"]:
            if flag not in NOT_IN_026:
                raise ValueError(f"{pool}: {flag} is not a flag of vLLM {known['vllm']} and no rule says what to run")
            replaced = NOT_IN_026[flag]
        if replaced is None:
            args.append(arg)
            continue
        device_value, why = replaced
        subs.append(Substitution(flag, shipped_value, device_value, why))
        if device_value is not None:
            args.append(f"{flag}={device_value}" if device_value != "" else flag)
    additions: list[tuple[str, str, str]] = [
        ("--load-format", "dummy", "no weights on the device: random ones, seeded, of the model's shape"),
    ]
    if not graphs:
        additions.append(
            (
                "--enforce-eager",
                "",
                "start time: a fresh machine compiles and captures CUDA graphs at every start; the "
                "simulator's h200-7b-bf16 profile was fitted eager, so the two stay comparable (eager "
                "steps are host-bound, ~13 ms a decode step)",
            )
        )
    if share and "--kv-cache-memory-bytes" not in experiment:
        additions.append(
            (
                "--kv-cache-memory-bytes",
                str(KV_CACHE_BYTES),
                f"memory sizing: the same 12 GiB of KV cache in each of the {engines_on_gpu} engines "
                "sharing the GPU (224,688 tokens of the 7B shape)",
            )
        )
    for flag, (value, why) in experiment.items():  # experiment flags the profile does not give
        if value is not None:
            additions.append((flag, value, why))
    for flag, value, why in additions:
        subs.append(Substitution(flag, None, value, why))
        args.append(f"{flag}={value}" if value != "" else flag)
    launch = EngineLaunch(pool, tuple(given), tuple(args), tuple(subs))
    check_026(launch, known)
    return launch


def check_026(launch: EngineLaunch, known: dict[str, Any] | None = None) -> None:
    """Every flag the device runs is one vLLM 0.26 defines, with a value it takes."""
    known = known or flags_026()
    values = flag_values(launch.args)
    missing = sorted(set(values) - set(known["flags"]))
    if missing:
        raise ValueError(f"{launch.pool}: vLLM {known['vllm']} does not define {', '.join(missing)}")
    for flag, allowed in known["choices"].items():
        if flag in values and values[flag] not in allowed:
            raise ValueError(f"{launch.pool}: {flag}={values[flag]}: vLLM {known['vllm']} takes {allowed}")
    if "--speculative-config" in values:
        method = json.loads(values["--speculative-config"]).get("method")
        if method not in known["speculative_methods"]:
            raise ValueError(f"{launch.pool}: speculative method {method!r} is not one of vLLM {known['vllm']}'s")


SIM_FLAGS = (
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--max-model-len",
    "--scheduling-policy",
    "--enable-prefix-caching",
    "--enable-prompt-tokens-details",
    "--kv-offloading-size",
    "--kv-offloading-backend",
)


def sim_args(launch: EngineLaunch, port: int, sim_profile: str) -> list[str]:
    """The simulator's arguments standing in for ``launch`` in a dry run: its limits, on ``sim_profile``."""
    values = flag_values(launch.args)
    args = ["--port", str(port), "--model", SERVED_MODEL, "--profile", sim_profile]
    for flag in SIM_FLAGS:
        if flag in values:
            args += [flag] if values[flag] == "" else [flag, values[flag]]
    return args
