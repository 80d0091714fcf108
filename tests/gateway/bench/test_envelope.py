"""The envelope every benchmark's results carry: the commit and whether the code had changed, the command
line, the host's load."""

from __future__ import annotations

import os
import subprocess

import pytest

from priority_gateway.bench import envelope


def git(root, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / "repo"
    (root / "priority_gateway").mkdir(parents=True)
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "priority_gateway" / "core.py").write_text("x = 1\n")
    (root / "benchmarks" / "results" / "r.json").write_text("{}\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    return root


def test_a_clean_checkout_gives_its_head(checkout):
    assert envelope.code_commit(checkout) == (git(checkout, "rev-parse", "HEAD"), False)


def test_a_changed_module_makes_it_dirty_and_a_rewritten_result_does_not(checkout):
    (checkout / "benchmarks" / "results" / "r.json").write_text('{"new": 1}\n')
    (checkout / "notes.md").write_text("untracked\n")
    assert envelope.code_commit(checkout)[1] is False
    (checkout / "priority_gateway" / "core.py").write_text("x = 2\n")
    assert envelope.code_commit(checkout)[1] is True


def test_a_bundle_without_git_reads_its_commit_file(tmp_path):
    (tmp_path / "COMMIT").write_text("85061fe0a1b2-dirty\n")
    assert envelope.code_commit(tmp_path) == ("85061fe0a1b2", True)
    (tmp_path / "COMMIT").write_text("85061fe0a1b2\n")
    assert envelope.code_commit(tmp_path) == ("85061fe0a1b2", False)


def test_neither_git_nor_a_commit_file_says_unknown(tmp_path):
    assert envelope.code_commit(tmp_path) == (None, None)
    assert envelope.commit_stamp(tmp_path) == "unknown"
    (tmp_path / "COMMIT").write_text("unknown\n")
    assert envelope.code_commit(tmp_path) == (None, None)


def test_the_stamp_a_bundle_carries_reads_back_as_the_checkouts_commit(checkout, tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (checkout / "priority_gateway" / "core.py").write_text("x = 3\n")
    (bundle / "COMMIT").write_text(envelope.commit_stamp(checkout) + "\n")
    assert envelope.code_commit(bundle) == envelope.code_commit(checkout) == (git(checkout, "rev-parse", "HEAD"), True)


def test_the_command_names_the_script_from_the_root(checkout):
    argv = [str(checkout / "benchmarks" / "soak.py"), "--requests", "10", "--note", "two words"]
    assert envelope.script_command(argv, checkout) == "python benchmarks/soak.py --requests 10 --note 'two words'"
    assert envelope.script_command(["/elsewhere/x.py"], checkout) == "python /elsewhere/x.py"


def test_the_fields_come_first_with_the_host_load(checkout):
    run = envelope.start("python benchmarks/x.py --quick", checkout)
    wrapped = run.wrap({"figure": 1.5})
    assert list(wrapped)[:5] == ["command", "commit", "dirty", "started", "host"]
    assert wrapped["command"] == "python benchmarks/x.py --quick"
    assert wrapped["commit"] == git(checkout, "rev-parse", "HEAD") and wrapped["dirty"] is False
    host = wrapped["host"]
    assert host["cpus"] == os.cpu_count()
    assert len(host["load_avg_at_start"]) == 3 and len(host["load_avg_at_end"]) == 3
    assert wrapped["figure"] == 1.5


def test_results_cannot_shadow_the_envelope(checkout):
    with pytest.raises(ValueError, match="command"):
        envelope.start("x", checkout).wrap({"command": "another"})
