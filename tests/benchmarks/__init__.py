"""Smoke runs of the benchmarks: each script runs small, as a user would run it, and what it writes is checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.coverage import untraced_env
from tests.support.procs import ROOT


def run_script(script: str, args: str, out: Path, *extra: str, timeout: float = 120, traced: bool = True) -> None:
    """Run ``benchmarks/<script>`` with ``args`` writing to ``out``; fail with its stderr's tail if it fails.
    ``traced=False``: the script runs outside coverage (a CPU-bound loop of product code that faster
    tests cover, which the tracer would slow 3-5x)."""
    cmd = [sys.executable, f"benchmarks/{script}", *args.split(), *extra, "--out", str(out)]
    env = None if traced else untraced_env()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
