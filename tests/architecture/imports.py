"""Every import statement of the project's Python files, read from their syntax trees (nothing is run)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Import:
    path: Path
    line: int
    module: str
    """The imported module, absolute (``from . import x`` resolved against the importing package)."""

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} imports {self.module}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def python_files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "results" not in p.parts)


def imports(path: Path, at_import_time: bool = False) -> Iterator[Import]:
    """Every import in ``path``; with ``at_import_time`` only those that run when the module is
    imported (not in a function's body, not under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    for node in _run_on_import(tree.body) if at_import_time else ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(path, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield Import(path, node.lineno, base)
            for alias in node.names:
                # ``from priority_gateway import log`` imports the module priority_gateway.log as well.
                yield Import(path, node.lineno, f"{base}.{alias.name}")
        elif isinstance(node, ast.Call) and _dynamic_import(node):
            yield Import(path, node.lineno, node.args[0].value)


def _run_on_import(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """The statements of ``body`` that run when it runs, into every block but functions, classes'
    methods and ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _run_on_import(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(node, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                yield from _run_on_import(inner)
            elif field == "handlers" and inner:
                for handler in inner:
                    yield from _run_on_import(handler.body)


def _dynamic_import(call: ast.Call) -> bool:
    """``importlib.import_module("x")`` or ``__import__("x")`` with a literal name."""
    name = getattr(call.func, "attr", getattr(call.func, "id", ""))
    first = call.args[0] if call.args else None
    return name in ("import_module", "__import__") and isinstance(first, ast.Constant) and isinstance(first.value, str)


def under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)
