"""The admin key from ``keys.admin_file``: generated once at first start, never logged, kept across
restarts and shared by replicas; a file that cannot serve stops the gateway with one line."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from priority_gateway.config import Config, ConfigError, KeysConfig
from priority_gateway.keys.admin import _create, admin_key_from, with_admin_key
from tests.support.procs import ROOT, free_port, start_gateway


def config_without_engines() -> dict:
    """The admin API needs no engine: one pool whose only engine never answers."""
    return {"pools": {"interactive": {"engines": [f"http://127.0.0.1:{free_port()}"]}}}


def admin_status(url: str, key: str) -> int:
    return httpx.get(url + "/admin/keys", headers={"authorization": f"Bearer {key}"}, timeout=5).status_code


def test_the_first_start_generates_a_key_that_later_starts_keep(procs, tmp_path: Path) -> None:
    key_file = tmp_path / "state" / "admin-key"
    env = {"GATEWAY__KEYS__ADMIN_FILE": str(key_file)}
    first = start_gateway(tmp_path, config_without_engines(), env=env)
    procs.append(first)
    first.wait_ready("/health")
    key = key_file.read_text().strip()
    assert len(key) >= 40
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert admin_status(first.url, key) == 200
    assert admin_status(first.url, "guess") == 401
    log = first.log()
    assert "event=admin_key_generated" in log and f'read_it_with="cat {key_file}"' in log
    assert key not in log
    first.stop()

    again = start_gateway(tmp_path, config_without_engines(), env=env)
    procs.append(again)
    again.wait_ready("/health")
    assert key_file.read_text().strip() == key
    assert admin_status(again.url, key) == 200
    assert "admin_key_generated" not in again.log().split("event=admin_key_read")[-1]


def test_a_given_admin_key_wins_and_no_file_is_written(tmp_path: Path) -> None:
    key_file = tmp_path / "admin-key"
    config = Config(keys=KeysConfig(admin="from-the-secret", admin_file=str(key_file)))
    assert with_admin_key(config).keys.admin == "from-the-secret"
    assert not key_file.exists()
    assert with_admin_key(Config()).keys.admin is None


def test_replicas_sharing_the_file_end_with_the_first_key(tmp_path: Path) -> None:
    key_file = tmp_path / "admin-key"
    assert _create(key_file, "first")
    assert not _create(key_file, "second")
    assert admin_key_from(key_file) == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["admin-key"], "no draft left behind"


@pytest.mark.parametrize("kind", ["empty", "directory"])
def test_a_file_that_cannot_serve_is_refused(tmp_path: Path, kind: str) -> None:
    key_file = tmp_path / "admin-key"
    if kind == "empty":
        key_file.write_text("\n")
    else:
        key_file.mkdir()
    with pytest.raises(ConfigError) as refused:
        admin_key_from(key_file)
    assert str(refused.value).startswith("keys.admin_file: ")


def test_gateway_serve_stops_with_one_line_naming_the_setting(tmp_path: Path) -> None:
    (tmp_path / "admin-key").write_text("")
    config = tmp_path / "gateway.yaml"
    config.write_text(f"pools: {{interactive: {{engines: ['http://127.0.0.1:{free_port()}']}}}}\n")
    cmd = [sys.executable, "-m", "priority_gateway", "serve", "--config", str(config), "--port", str(free_port())]
    env = {"GATEWAY__KEYS__ADMIN_FILE": str(tmp_path / "admin-key"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("gateway serve: keys.admin_file: ")
