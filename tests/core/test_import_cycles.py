"""ts_core has no import cycle, counting function-local imports (a cycle hidden behind a local
import is still a cycle: the two modules cannot be understood, tested or moved apart).

Every ``import`` / ``from ... import`` of every module of ts_core (module level, inside
functions and classes; relative and absolute) is an edge to the ts_core module it names (a
submodule when ``from package import submodule``); strongly connected components of more than
one module are cycles.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import ts_core

ROOT = Path(ts_core.__file__).resolve().parent


def _modules(root: Path) -> Dict[str, Path]:
    mods = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _known(name: str, mods: Dict[str, Path]) -> str:
    """`name` or its closest enclosing ts_core module ('' when outside ts_core)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name


def import_graph(root: Path = ROOT) -> Dict[str, Set[str]]:
    mods = _modules(root)
    graph: Dict[str, Set[str]] = {}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        deps: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in mods else prefix for a in node.names]
            else:
                continue
            deps.update(t for t in (_known(t, mods) for t in targets) if t and t != mod)
        graph[mod] = deps
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_the_walker_sees_function_local_and_relative_imports():
    graph = import_graph()
    # debugger.start() imports configcheck.collect inside the function, relatively
    assert "ts_core.configcheck.collect" in graph["ts_core.debugger"]
    # a package's `from .x import y` resolves against the package itself
    assert "ts_core.backends.frameworks" in graph["ts_core.backends"]


def test_cycle_finder_names_a_cycle_and_ignores_a_chain():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_ts_core_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles in ts_core (function-local imports included): " + "; ".join(
        " <-> ".join(c) for c in found)
