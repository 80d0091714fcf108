"""No function of the package (``priority_gateway``, ``engines``) is longer than ``MAX_LINES``: one that
grows past it is split into parts whose names say what each does."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.architecture.imports import ROOT, python_files

MAX_LINES = 70


def long_functions(source: str, name: str) -> Iterator[tuple[str, int]]:
    """``(where, lines)`` of each function in ``source`` longer than ``MAX_LINES``, nested ones included."""
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES:
                yield f"{name}:{node.lineno} {node.name}", lines


def test_no_function_of_the_package_is_longer_than_the_bound():
    files = [*python_files("priority_gateway"), *python_files("engines")]
    assert len(files) > 100  # the walk found the package, not nothing
    found = [
        f"{where} ({lines} lines)"
        for path in files
        for where, lines in long_functions(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == [], f"longer than {MAX_LINES} lines: " + ", ".join(found)


def test_the_walk_counts_a_function_from_its_def_to_its_last_line():
    at_the_bound = "def fits():\n" + "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES - 1))
    assert list(long_functions(at_the_bound, "m.py")) == []
    one_over = "class C:\n    async def grows(self):\n" + "".join(f"        x{i} = {i}\n" for i in range(MAX_LINES))
    assert list(long_functions(one_over, "m.py")) == [("m.py:2 grows", MAX_LINES + 1)]
