"""No class of the package (``priority_gateway``, ``engines``) has more than ``MAX_METHODS`` methods: one
that grows past it holds more than one concept, and its parts become objects of their own (the
dispatcher composes capacity, tenant fairness, preemption and session turns that way)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.architecture.imports import ROOT, python_files

MAX_METHODS = 45


def large_classes(source: str, name: str) -> Iterator[tuple[str, int]]:
    """``(where, methods)`` of each class in ``source`` with more than ``MAX_METHODS`` methods."""
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.ClassDef):
            methods = sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in node.body)
            if methods > MAX_METHODS:
                yield f"{name}:{node.lineno} {node.name}", methods


def test_no_class_of_the_package_has_more_methods_than_the_bound():
    files = [*python_files("priority_gateway"), *python_files("engines")]
    assert len(files) > 100
    found = [
        f"{where} ({methods} methods)"
        for path in files
        for where, methods in large_classes(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == [], f"more than {MAX_METHODS} methods: " + ", ".join(found)


def test_the_count_takes_a_class_s_own_methods_and_not_its_nested_functions():
    at_the_bound = "class C:\n" + "".join(
        f"    def m{i}(self):\n        def inner(): pass\n" for i in range(MAX_METHODS)
    )
    assert list(large_classes(at_the_bound, "m.py")) == []
    one_over = "class D:\n" + "".join(f"    async def m{i}(self): pass\n" for i in range(MAX_METHODS + 1))
    assert list(large_classes(one_over, "m.py")) == [("m.py:1 D", MAX_METHODS + 1)]
