"""What every benchmark's results carry beside its figures, so that a number can be traced to what made it.

One shape for ``gateway bench`` and every script under ``benchmarks/`` (``tests/benchmarks/test_envelope.py``
checks that each one uses it), at the top of the JSON it writes:

- ``command``: the command line, as it would be typed again from the repository's root;
- ``commit``: the commit the code was at (``git rev-parse HEAD``), and ``dirty``: whether tracked files
  outside the results and the docs had uncommitted changes (the code ran was then not the commit's);
  both ``None`` where neither git nor a ``COMMIT`` file (a GPU bundle's, ``benchmarks/gpu/prepare.sh``)
  says;
- ``started``: when the run began (UTC);
- ``host``: its CPU count and load average (1, 5, 15 minutes) at the start and at the end: on a
  shared machine every figure is slowed by what else ran, and ratios measured side by side less so.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
"""The checkout (or unpacked bundle) the package runs from; not one when the package is installed."""

# A rerun rewrites committed results and a regenerated report: that leaves the code as committed.
NOT_CODE = (":(exclude)benchmarks/results", ":(exclude)docs", ":(exclude)*.md")


def code_commit(root: Path = ROOT) -> tuple[str | None, bool | None]:
    """The commit ``root`` is at and whether its code has uncommitted changes; ``(None, None)`` if unknown."""
    try:
        # Only a checkout's own .git: a package installed inside some other repository is not its commit.
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        if (root / ".git").exists() and head.returncode == 0:
            status = ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", ".", *NOT_CODE]
            changed = subprocess.run(status, capture_output=True, text=True, check=True).stdout
            return head.stdout.strip(), bool(changed.strip())
    except (OSError, subprocess.CalledProcessError):
        pass
    stamp = root / "COMMIT"
    if stamp.exists():
        text = stamp.read_text().strip()
        commit = text.removesuffix("-dirty")
        return (None, None) if commit in ("", "unknown") else (commit, text.endswith("-dirty"))
    return None, None


def commit_stamp(root: Path = ROOT) -> str:
    """What a bundle carries in place of git, in its ``COMMIT`` file: ``<sha>`` or ``<sha>-dirty``."""
    commit, dirty = code_commit(root)
    return f"{commit or 'unknown'}{'-dirty' if dirty else ''}"


def script_command(argv: Sequence[str] | None = None, root: Path = ROOT) -> str:
    """``python <script> <args>``, the script's path relative to ``root`` where it lies under it."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]) if argv else Path("-")
    try:
        shown = str(script.resolve().relative_to(root))
    except ValueError:
        shown = str(script)
    return shlex.join(["python", shown, *argv[1:]])


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass(frozen=True, slots=True)
class Envelope:
    command: str
    commit: str | None
    dirty: bool | None
    started: str
    load_at_start: list[float]

    def fields(self) -> dict[str, Any]:
        """The envelope's keys, the load at the end taken now."""
        host = {"cpus": os.cpu_count(), "load_avg_at_start": self.load_at_start, "load_avg_at_end": load_average()}
        return {
            "command": self.command,
            "commit": self.commit,
            "dirty": self.dirty,
            "started": self.started,
            "host": host,
        }

    def wrap(self, results: dict[str, Any]) -> dict[str, Any]:
        """``results`` with the envelope's keys first (a result's own key of the same name is an error)."""
        fields = self.fields()
        clash = sorted(fields.keys() & results.keys())
        if clash:
            raise ValueError(f"results carry the envelope's own keys: {', '.join(clash)}")
        return {**fields, **results}


def start(command: str | None = None, root: Path = ROOT) -> Envelope:
    """Taken when a run begins; ``command`` defaults to this process's own command line."""
    commit, dirty = code_commit(root)
    return Envelope(
        command=command if command is not None else script_command(root=root),
        commit=commit,
        dirty=dirty,
        started=datetime.now(UTC).isoformat(timespec="seconds"),
        load_at_start=load_average(),
    )
