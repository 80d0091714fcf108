"""The wheel a user installs: one top-level package with a name of its own, the simulator inside it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build_wheel(tmp_path: Path) -> tuple[Path, str]:
    """The wheel, as the README builds it, and what the build printed."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path), str(REPO)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    (wheel,) = tmp_path.glob("priority_gateway-*.whl")
    return wheel, done.stdout + done.stderr


def test_the_package_metadata_builds_without_a_warning_and_names_its_license(tmp_path):
    wheel, output = build_wheel(tmp_path)
    assert "Warning" not in output and "deprecated" not in output, output[-3000:]
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in archive.namelist())
    assert "License-Expression: Apache-2.0" in text
    assert {"Provides-Extra: otel", "Provides-Extra: precise"} <= set(text.splitlines())


def test_the_wheel_installs_with_an_extra_as_the_readme_says(tmp_path):
    wheel, _ = build_wheel(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--disable-pip-version-check", f"{wheel}[otel]"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "opentelemetry-sdk" in done.stdout or "Would install priority-gateway" in done.stdout, done.stdout


def test_the_wheel_holds_one_specific_top_level_package_with_the_simulator_and_its_profiles(tmp_path):
    wheel, _ = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"priority_gateway"}
    assert "priority_gateway/engines/sim/__main__.py" in names
    assert any(n.startswith("priority_gateway/engines/sim/profiles/") and n.endswith(".yaml") for n in names)
    assert any(n.startswith("priority_gateway/engines/profiles/") and n.endswith(".yaml") for n in names)
    assert "priority_gateway/py.typed" in names
