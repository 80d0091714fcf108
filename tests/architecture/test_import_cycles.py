"""No two modules of the package import each other while they load, directly or round a longer
loop: with one, whichever module a program imports first decides whether it starts at all (as
``import priority_gateway.limits`` once failed where ``import priority_gateway.config`` worked)."""

from __future__ import annotations

from tests.architecture.imports import imports, module_name, python_files


def _loading_graph() -> dict[str, set[str]]:
    """Each module's edges to the modules its loading runs: what it imports at import time, and
    the packages above each of those (importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__``).
    Its own packages count only where it reads a name from one (``from a import Config``), not
    where it imports a submodule through it (``from a import env``): they are already loading."""
    modules = {module_name(p): p for p in python_files("priority_gateway")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        found = list(imports(path, at_import_time=True))
        # (line, package) where that line reads a name from the package that is not a module
        reads = {(i.line, i.module.rsplit(".", 1)[0]) for i in found if i.module not in modules}
        for imp in found:
            parts = imp.module.split(".")
            for i in range(1, len(parts) + 1):
                target = ".".join(parts[:i])
                if target not in modules or target == name:
                    continue
                own_package = name.startswith(target + ".")
                if own_package and (target != imp.module or (imp.line, target) not in reads):
                    continue
                graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_of_the_package_imports_itself_round_a_loop_while_loading():
    assert _cycles(_loading_graph()) == []


def test_the_cycle_finder_finds_a_loop_through_a_package():
    graph = {"p": {"p.load"}, "p.load": {"p.sections"}, "p.sections": {"q"}, "q": {"p"}, "r": {"q"}}
    assert _cycles(graph) == [["p", "p.load", "p.sections", "q"]]
