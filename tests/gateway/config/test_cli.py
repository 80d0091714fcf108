"""The real ``gateway`` process: a configuration error is one line and exit status 2, for every command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from priority_gateway.config.reference import render

ROOT = Path(__file__).resolve().parents[3]
GOOD = "pools:\n  p:\n    engines: [http://127.0.0.1:9]\n"


def gateway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return subprocess.run(
        [sys.executable, "-m", "priority_gateway", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**clean, **(env or {})},
        timeout=60,
    )


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(GOOD)
    bad.write_text(GOOD + "admission: {enabld: false}\n")
    return good, bad


def assert_one_line(done: subprocess.CompletedProcess[str], line: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [line]
    assert done.stdout == ""


def test_serve_refuses_a_misspelt_key_in_one_line(files):
    _, bad = files
    done = gateway("serve", "--config", str(bad))
    assert_one_line(done, f"gateway serve: {bad}: admission.enabld: unknown key; did you mean 'enabled'?")


def test_serve_names_a_bad_variable_or_option(files):
    good, _ = files
    done = gateway("serve", "--config", str(good), env={"GATEWAY__LISTEN__PORT": "eighty"})
    line = "gateway serve: GATEWAY__LISTEN__PORT: listen.port: expected an integer >= 1, <= 65535, got 'eighty'"
    assert_one_line(done, line)
    done = gateway("serve", "--config", str(good), "--log-level", "loud")
    assert done.returncode == 2 and done.stderr.startswith("gateway serve: --log-level: log_level: expected one of")
    done = gateway("serve", env={"GATEWAY__POOLS__P__ENGINES": "ftp://x"})
    assert_one_line(
        done,
        "gateway serve: GATEWAY__POOLS__P__ENGINES: pools.p.engines[0]: expected an http:// or https:// URL, "
        "got 'ftp://x'",
    )


def test_the_keys_commands_check_the_file_too(files):
    _, bad = files
    done = gateway("keys", "list", "--config", str(bad))
    assert_one_line(done, f"gateway keys: {bad}: admission.enabld: unknown key; did you mean 'enabled'?")


def test_config_check(files, tmp_path):
    good, bad = files
    done = gateway("config", "check", "--config", str(good))
    assert (done.returncode, done.stdout.splitlines()[0]) == (0, f"{good}: ok; pools: p (1)")
    done = gateway("config", "check", "--config", str(bad))
    assert_one_line(done, f"gateway config: {bad}: admission.enabld: unknown key; did you mean 'enabled'?")
    done = gateway("config", "check", "--config", str(tmp_path / "missing.yaml"))
    assert_one_line(
        done, f"gateway config: {tmp_path / 'missing.yaml'}: cannot read the file (No such file or directory)"
    )


def test_config_check_and_serve_refuse_an_alias_no_pool_serves(tmp_path):
    config = tmp_path / "alias.yaml"
    config.write_text(
        GOOD
        + "    models: [m-a]\nmodels:\n  aliases:\n    canary: [{model: m-a, weight: 1}, {model: m-x, weight: 1}]\n"
    )
    line = "models.aliases.canary: 'm-x' is declared by no pool: add it to the models of the pool that serves it"
    for command in ("config check", "serve"):
        done = gateway(*command.split(), "--config", str(config))
        assert_one_line(done, f"gateway {command.split()[0]}: {config}: {line} (pools.<name>.models)")


def test_config_reference_prints_the_page():
    done = gateway("config", "reference")
    assert (done.returncode, done.stdout) == (0, render())


def test_serve_help_shows_the_defaults():
    done = gateway("serve", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for shown in (
        "listen address (default: listen.host, else 127.0.0.1)",
        "listen port (default: listen.port, else 8080)",
        "(default: log_level, else info)",
        "docs/configuration.md",
        "GATEWAY__<SECTION>__<KEY>=value",
    ):
        assert shown in text, shown


def test_serve_refuses_https_without_its_key_or_with_a_certificate_it_cannot_load(tmp_path):
    half = tmp_path / "half.yaml"
    half.write_text(GOOD + "listen: {ssl_certfile: cert.pem}\n")
    done = gateway("serve", "--config", str(half))
    assert_one_line(done, f"gateway serve: {half}: listen.ssl_keyfile: HTTPS needs both ssl_certfile and ssl_keyfile")
    missing = tmp_path / "missing.yaml"
    missing.write_text(GOOD + f"listen: {{ssl_certfile: {tmp_path}/no.pem, ssl_keyfile: {tmp_path}/no.key}}\n")
    done = gateway("serve", "--config", str(missing))
    assert_one_line(
        done, "gateway serve: listen.ssl_certfile: cannot load the certificate and key: No such file or directory"
    )
