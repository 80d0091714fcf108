"""Running outside coverage what need not be traced.

A CPU-bound loop in virtual time (the simulator's replays, the limiter's and the fleet's long
property runs) runs 3-5x slower under coverage's tracer while faster tests cover the same lines:
a test marked ``untraced`` runs with the tracer off in its thread (``tests/conftest.py``), and a
process it starts with ``untraced_env()`` is not measured (coverage's subprocess patch starts
measuring in a child only when the child's environment asks for it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def untraced_env() -> dict[str, str]:
    """This process's environment, less what would make a Python child measure itself."""
    return {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_PROCESS")}


@contextmanager
def untraced() -> Iterator[None]:
    """The current thread runs without coverage's tracer (or any other) until the block ends."""
    tracer = sys.gettrace()
    sys.settrace(None)
    try:
        yield
    finally:
        sys.settrace(tracer)
