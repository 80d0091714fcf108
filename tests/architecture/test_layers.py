"""The layering rules, checked on every module's imports (docs/architecture.md says why each holds).

- The core (``priority_gateway/core``) is pure: no I/O, no clock, no event loop, no network or store
  library, and nothing of the gateway outside the core.
- The simulator (``engines``) knows the gateway only through the core's plain data.
- The product imports the simulator in two places only: the embedded default
  (``priority_gateway/embedded.py``, which also lends the simulator's tokenizer to precise mode) and the
  tools whose whole job is simulating or loading engines (``priority_gateway/simulate``, ``priority_gateway/bench``).
- Nothing imports the tests; benchmarks run on the installed package, without ``sys.path`` edits.
"""

from __future__ import annotations

import ast

import pytest

from tests.architecture.imports import ROOT, imports, module_name, python_files, under

# What would make the core do I/O, read a clock or run on an event loop.
CORE_FORBIDDEN = (
    "asyncio",
    "socket",
    "ssl",
    "select",
    "selectors",
    "threading",
    "multiprocessing",
    "subprocess",
    "concurrent",
    "time",
    "datetime",
    "os",
    "io",
    "pathlib",
    "shutil",
    "tempfile",
    "logging",
    "random",
    "http",
    "urllib",
    "email",
    "httpx",
    "httpcore",
    "h11",
    "httptools",
    "uvicorn",
    "uvloop",
    "starlette",
    "fastapi",
    "redis",
    "zmq",
    "prometheus_client",
    "orjson",
    "yaml",
)
SIMULATOR_USERS = ("priority_gateway.embedded", "priority_gateway.simulate", "priority_gateway.bench")


def _violations(folder: str, rule) -> list[str]:
    return [str(imp) for path in python_files(folder) for imp in imports(path) if rule(module_name(path), imp.module)]


def test_the_core_does_no_io_reads_no_clock_and_runs_no_event_loop():
    found = _violations("priority_gateway/core", lambda _, imported: under(imported, *CORE_FORBIDDEN))
    assert found == [], "the core must stay pure:\n" + "\n".join(found)


def test_the_core_imports_nothing_of_the_gateway_outside_it():
    found = _violations(
        "priority_gateway/core",
        lambda _, imported: (
            under(imported, "priority_gateway", "engines") and not under(imported, "priority_gateway.core")
        ),
    )
    assert found == [], "\n".join(found)


def test_the_simulator_knows_the_gateway_only_through_the_core():
    found = _violations(
        "engines",
        lambda _, imported: (
            under(imported, "priority_gateway")
            and not under(imported, "priority_gateway.core", "priority_gateway.engines")
        ),
    )
    assert found == [], "\n".join(found)


def test_the_product_reaches_the_simulator_only_through_its_seams():
    found = _violations(
        "priority_gateway",
        lambda importer, imported: (
            under(imported, "priority_gateway.engines", "engines")
            and not under(importer, *SIMULATOR_USERS, "priority_gateway.engines")
        ),
    )
    assert found == [], "\n".join(found)
    # The rule sees the seam it allows: the embedded default does import the simulator.
    seam = _violations("priority_gateway", lambda importer, _imported: under(importer, "priority_gateway.embedded"))
    assert any("priority_gateway.engines" in line for line in seam)


@pytest.mark.parametrize("folder", ["priority_gateway", "engines", "benchmarks"])
def test_nothing_but_the_tests_imports_the_tests(folder):
    found = _violations(folder, lambda _, imported: under(imported, "tests"))
    assert found == [], "\n".join(found)


# The GPU lane's scripts run from an unpacked bundle on a device host, where the package is not
# installed (benchmarks/gpu/README.md): they alone put the bundle's root on the path.
FROM_A_BUNDLE = ("benchmarks/gpu/", "benchmarks/vllm_calibration.py")


def test_benchmarks_do_not_edit_sys_path():
    found = []
    for path in python_files("benchmarks"):
        if str(path.relative_to(ROOT)).startswith(FROM_A_BUNDLE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], "benchmarks run on the installed package: " + ", ".join(found)


def test_the_walk_sees_every_form_of_import(tmp_path, monkeypatch):
    # The rules pass vacuously if the walk misses an import: it must see each form of it.
    probe = tmp_path / "pkg" / "probe.py"
    probe.parent.mkdir()
    probe.write_text(
        "import time\nfrom asyncio import sleep\nfrom . import sibling\nimport importlib\n"
        "importlib.import_module('redis')\ndef later():\n    import socket\n"
    )
    monkeypatch.setattr("tests.architecture.imports.ROOT", tmp_path)
    found = {imp.module for imp in imports(probe)}
    assert {"time", "asyncio", "asyncio.sleep", "pkg.sibling", "redis", "socket"} <= found
