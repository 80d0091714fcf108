"""The Dockerfile, read as Docker would: built from python:3.11-slim, runs as a non-root uid,
starts `gateway`, and everything it copies is in the build context .dockerignore leaves."""

from __future__ import annotations

import fnmatch
import json
import shlex
import tomllib
from pathlib import Path

from tests.deploy.support import REPO, compose_config


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    steps: list[tuple[str, str]] = []
    pending = ""
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip().removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            keyword, _, rest = pending.strip().partition(" ")
            steps.append((keyword.upper(), rest.strip()))
            pending = ""
    return steps


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!").rstrip("/")
        parts = Path(path).parts
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes):
            result = not negate
    return result


def dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_stages_build_on_python_311_slim() -> None:
    bases = [args.split()[0] for keyword, args in instructions() if keyword == "FROM"]
    assert bases
    assert all(base == "python:3.11-slim" for base in bases)


def test_runs_as_a_numeric_non_root_user() -> None:
    users = [args for keyword, args in final_stage() if keyword == "USER"]
    assert users, "the final stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0


def test_entrypoint_is_the_gateway_command() -> None:
    entrypoints = [json.loads(args) for keyword, args in final_stage() if keyword == "ENTRYPOINT"]
    assert entrypoints[-1] == ["gateway"]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "gateway" in pyproject["project"]["scripts"]
    command = [json.loads(args) for keyword, args in final_stage() if keyword == "CMD"][-1]
    assert command[0] == "serve"
    assert "0.0.0.0" in command, "a container must listen beyond its own loopback"


def test_copied_sources_are_in_the_build_context() -> None:
    patterns = dockerignore()
    for keyword, args in instructions():
        if keyword != "COPY" or args.startswith("--from"):
            continue
        *sources, _destination = args.split()
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: not in the repository"
            assert not ignored(source, patterns), f"COPY {source}: excluded by .dockerignore"


def test_package_sources_and_data_reach_the_build() -> None:
    patterns = dockerignore()
    for path in [*REPO.glob("gateway/**/*.py"), *REPO.glob("engines/**/*.py"), *REPO.glob("engines/**/*.yaml")]:
        relative = path.relative_to(REPO).as_posix()
        assert not ignored(relative, patterns), relative


def test_local_state_stays_out_of_the_build_context() -> None:
    patterns = dockerignore()
    for path in (".venv/bin/python", ".git/config", "tests/conftest.py", "gateway/__pycache__/cli.cpython-311.pyc"):
        assert ignored(path, patterns), path


def test_the_state_directory_belongs_to_the_runtime_user() -> None:
    """Compose mounts a volume where the gateway generates its admin key; a new volume takes the
    owner of the image's directory, so that directory must belong to the user the image runs as."""
    key_file = compose_config("cpu")["services"]["gateway"]["environment"]["GATEWAY__KEYS__ADMIN_FILE"]
    directory = str(Path(key_file).parent)
    user = [args for keyword, args in final_stage() if keyword == "USER"][-1].split(":")[0]
    made = {}
    for keyword, args in final_stage():
        words = shlex.split(args) if keyword == "RUN" else []
        for start in (i for i, word in enumerate(words) if word == "install" and words[i + 1] == "-d"):
            rest, options = words[start + 2 :], {}
            while rest[0].startswith("-"):
                options[rest[0]], rest = rest[1], rest[2:]
            made[rest[0]] = options
    assert directory in made, f"the image does not create {directory}"
    assert made[directory]["-o"] == user and made[directory]["-m"] == "0700"
