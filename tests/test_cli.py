"""``gateway`` as a person first meets it: its version, its help, and one line for a mistake."""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import version

import pytest

from priority_gateway import cli

COMMANDS = [
    [],
    ["serve"],
    ["sim"],
    ["bench"],
    ["keys"],
    ["keys", "create"],
    ["keys", "list"],
    ["keys", "revoke"],
    ["config"],
    ["config", "check"],
    ["config", "reference"],
]


def gateway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "priority_gateway", *args], capture_output=True, text=True, timeout=60, env=env
    )


def parsers() -> dict[str, argparse.ArgumentParser]:
    """The parsers ``cli.main`` builds, by command (caught as it parses)."""
    found: dict[str, argparse.ArgumentParser] = {}

    def capture(self: argparse.ArgumentParser, *_args: object, **_kwargs: object) -> None:
        found[""] = self
        raise SystemExit(0)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
        with pytest.raises(SystemExit):
            cli.main([])
    (choices,) = [a.choices for a in found[""]._actions if isinstance(a, argparse._SubParsersAction)]
    return {"": found[""], **choices}


def test_version_is_the_installed_package_version():
    done = gateway("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"gateway {version('priority-gateway')}"


def test_plain_gateway_prints_its_help():
    done = gateway()
    assert done.returncode == 0
    assert done.stdout.startswith("usage: gateway") and all(c in done.stdout for c in ("serve", "sim", "bench"))


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "gateway")
def test_help_has_no_doc_markup(command):
    done = gateway(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert "``" not in done.stdout and "`" not in done.stdout, done.stdout


@pytest.mark.parametrize("command", ["sim", "bench"])
def test_every_sim_and_bench_option_says_what_it_does_and_its_default(command):
    parser = parsers()[command]
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        text = formatter._get_help_string(action) or ""
        flag = action.default is False
        assert text, f"{action.option_strings}: no help"
        assert flag or action.required or "default" in text, f"{action.option_strings}: no default in {text!r}"


def test_an_unknown_sim_profile_is_one_line_without_a_traceback():
    done = gateway("sim", "--profile", "nope", "--concurrency", "1")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert "unknown profile 'nope'" in done.stderr and "gemma4-nvfp4" in done.stderr and "Traceback" not in done.stderr


def test_config_check_shows_the_effective_configuration_and_warns_as_serve_does(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text("pools:\n  interactive:\n    engines: ['http://10.0.0.1:8000']\nstore: memory\n")
    env = {"PATH": "/usr/bin:/bin", "GATEWAY__LISTEN__PORT": "9123", "GATEWAY_STORE": "redis://x", "HOME": "/tmp"}
    done = gateway("config", "check", "--config", str(path), env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{path}: ok; pools: interactive (1)"
    assert "  listen: http://127.0.0.1:9123" in lines, "the environment's override is applied"
    assert "  store: memory" in lines
    assert "    interactive: http://10.0.0.1:8000; policy prefix, scheduling fcfs" in lines
    assert any(line.startswith("    interactive: pool interactive, priority 0") for line in lines)
    assert any(line.startswith("    batch: pool interactive, priority 1") for line in lines)
    warnings = done.stderr.splitlines()
    assert any(w.startswith("warning: GATEWAY_STORE: not read") for w in warnings), warnings
    assert any(w.startswith("warning: store: memory") for w in warnings), warnings
