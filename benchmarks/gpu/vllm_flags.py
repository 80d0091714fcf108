"""The command-line flags a vLLM wheel's ``serve`` parser defines, read from its source without installing it.

    python benchmarks/gpu/vllm_flags.py vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl \\
        --out benchmarks/gpu/vllm-0.26-flags.json

The device runs vLLM 0.26.0 and our manifests name 0.32 flags; ``engine_args.py`` checks every flag
it passes to a real engine against this list, so a flag 0.26 lacks is found here, not after a
machine start. What is read (the parser is built from these, ``make_arg_parser``):
- every ``add_argument("--flag", ...)`` in ``vllm/engine/arg_utils.py`` and
  ``vllm/entrypoints/openai/cli_args.py`` (boolean flags also as ``--no-flag``, which
  ``BooleanOptionalAction`` adds);
- the fields of the frontend's argument classes (``BaseFrontendArgs``, ``FrontendArgs``), each a
  ``--field-name`` flag;
- the values some flags take (``Literal`` aliases: ``PerformanceMode``, ``SchedulerPolicy``, the
  speculative methods), so a value 0.26 does not know is found too.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import zipfile
from pathlib import Path

PARSER_FILES = ("vllm/engine/arg_utils.py", "vllm/entrypoints/openai/cli_args.py")
FRONTEND_CLASSES = ("BaseFrontendArgs", "FrontendArgs")
CONFIG_FILES = ("vllm/config/vllm.py", "vllm/config/scheduler.py", "vllm/config/speculative.py")
# Literal aliases whose values a flag takes: alias -> the flag.
CHOICES = {
    "PerformanceMode": "--performance-mode",
    "SchedulerPolicy": "--scheduling-policy",
}
SPECULATIVE_ALIASES = ("SpeculativeMethod", "EagleModelTypes", "MTPModelTypes", "NgramGPUTypes")


def _literal_values(node: ast.expr, aliases: dict[str, list[str]]) -> list[str]:
    """The strings a ``Literal[...]`` (or a union of them, or of aliases) allows."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return [item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)]
    if isinstance(node, ast.BinOp):
        return _literal_values(node.left, aliases) + _literal_values(node.right, aliases)
    if isinstance(node, ast.Name):
        return aliases.get(node.id, [])
    return []


def _aliases(tree: ast.Module) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for stmt in tree.body:
        target = value = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            target, value = stmt.targets[0].id, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            target, value = stmt.target.id, stmt.value
        if target is not None and value is not None:
            values = _literal_values(value, out)
            if values:
                out[target] = values
    return out


def _flags(tree: ast.Module) -> set[str]:
    flags: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                    flags.add(arg.value)
        if isinstance(node, ast.ClassDef) and node.name in FRONTEND_CLASSES:
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    flags.add("--" + stmt.target.id.replace("_", "-"))
    return flags


def read_wheel(wheel: Path) -> dict[str, object]:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        trees = {name: ast.parse(archive.read(name)) for name in (*PARSER_FILES, *CONFIG_FILES) if name in names}
        version = next(
            (n.split("/")[0].removeprefix("vllm-").removesuffix(".dist-info") for n in names if n.endswith("METADATA")),
            "",
        )
    flags: set[str] = set()
    for name in PARSER_FILES:
        flags |= _flags(trees[name])
    # BooleanOptionalAction gives every boolean flag its --no- form; listing both is harmless for a check.
    flags |= {"--no-" + f.removeprefix("--") for f in list(flags)}
    aliases: dict[str, list[str]] = {}
    for name in CONFIG_FILES:
        if name in trees:
            aliases.update(_aliases(trees[name]))
    choices = {flag: aliases[alias] for alias, flag in CHOICES.items() if alias in aliases}
    methods = sorted({m for alias in SPECULATIVE_ALIASES for m in aliases.get(alias, [])})
    return {
        "vllm": version,
        "wheel": wheel.name,
        "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "read_from": [*PARSER_FILES, *CONFIG_FILES],
        "flags": sorted(flags),
        "choices": choices,
        "speculative_methods": methods,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wheel", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    data = read_wheel(args.wheel)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{args.out}: {len(data['flags'])} flags of vLLM {data['vllm']}")


if __name__ == "__main__":
    main()
