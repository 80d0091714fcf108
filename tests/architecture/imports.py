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


def imports(path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    for node in ast.walk(tree):
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


def _dynamic_import(call: ast.Call) -> bool:
    """``importlib.import_module("x")`` or ``__import__("x")`` with a literal name."""
    name = getattr(call.func, "attr", getattr(call.func, "id", ""))
    first = call.args[0] if call.args else None
    return name in ("import_module", "__import__") and isinstance(first, ast.Constant) and isinstance(first.value, str)


def under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)
