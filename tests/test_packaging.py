"""The wheel a user installs: one top-level package with a name of its own, the simulator inside it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_holds_one_specific_top_level_package_with_the_simulator_and_its_profiles(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("priority_gateway-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"priority_gateway"}
    assert "priority_gateway/engines/sim/__main__.py" in names
    assert any(n.startswith("priority_gateway/engines/sim/profiles/") and n.endswith(".yaml") for n in names)
    assert any(n.startswith("priority_gateway/engines/profiles/") and n.endswith(".yaml") for n in names)
    assert "priority_gateway/py.typed" in names
