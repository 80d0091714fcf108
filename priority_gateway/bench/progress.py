"""A progress line on stderr while a run goes: requests done, current rate, errors.

On a terminal the line is redrawn in place twice a second; otherwise (a log, CI) one
``key=value`` line is written every few seconds.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TextIO

from priority_gateway.bench.loadgen import Sample

_BAR = 24


class Progress:
    def __init__(
        self, label: str, *, total: int | None = None, duration: float | None = None, out: TextIO | None = None
    ) -> None:
        self.label = label
        self.total = total
        self.duration = duration
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self.interval = 0.5 if self.tty else 5.0
        self.done = 0
        self.errors = 0
        self.refused = 0
        self._start = time.monotonic()
        self._last = (self._start, 0)
        self._rate = 0.0

    def add(self, sample: Sample) -> None:
        self.done += 1
        self.errors += sample.error is not None
        self.refused += sample.refused is not None

    def _fraction(self, elapsed: float) -> float:
        if self.total:
            return min(1.0, self.done / self.total)
        if self.duration:
            return min(1.0, elapsed / self.duration)
        return 0.0

    def render(self) -> str:
        t = time.monotonic()
        elapsed = t - self._start
        last_t, last_done = self._last
        if t - last_t >= 0.2:
            self._rate = (self.done - last_done) / (t - last_t)
            self._last = (t, self.done)
        if not self.tty:
            total = f"/{self.total}" if self.total else ""
            return (
                f"bench_progress run={self.label} done={self.done}{total} rate_rps={self._rate:.2f} "
                f"refused={self.refused} errors={self.errors} elapsed_s={elapsed:.1f}"
            )
        filled = round(self._fraction(elapsed) * _BAR)
        bar = "#" * filled + "-" * (_BAR - filled)
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        clock = f" {elapsed:5.1f}/{self.duration:g} s" if self.duration else f" {elapsed:5.1f} s"
        return (
            f"\r{self.label} [{bar}] {count} done{clock}  {self._rate:6.2f} req/s  "
            f"refused {self.refused}  errors {self.errors}  "
        )

    def _write(self, text: str) -> None:
        self.out.write(text if self.tty else text + "\n")
        self.out.flush()

    async def run(self) -> None:
        """Redraw until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            self._write(self.render())

    def finish(self, summary: str) -> None:
        self._write(self.render())
        self.out.write(("\n" if self.tty else "") + f"bench_run run={self.label} {summary}\n")
        self.out.flush()
