"""compare/ is a pipeline of stages (load -> align -> judge -> explain -> report): a stage imports
only earlier stages, transitively, so alignment and judging can change without touching what
the report shows, and the report can change without touching a verdict. Below every stage: the
data model and what all stages share (model, predicates, ops, errors, chunks); above them: what
runs the stages (pipeline, executor, api and the package itself). docs/architecture.md states
the rule; this test holds it.

Every import counts, module level and function-local, read from the source (not from what
ran), and the walk follows imports through any ts_core module, inside compare or not: a stage
that imports a helper which imports a later stage imports that stage."""
from __future__ import annotations

import ast
import os
from collections import deque
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

import ts_core

TS_CORE = os.path.dirname(ts_core.__file__)
PKG = "ts_core.compare"
BELOW = ("model", "predicates", "ops", "errors", "chunks")
STAGES = ("load", "align", "judge", "explain", "report")
ABOVE = ("pipeline", "executor", "executor_dask", "api")
# the one upward edge allowed: ``str(result)`` / ``print(result)`` (used across tests and recipes)
# renders through report/text.py, imported inside CompareResult.__str__ at render time only
ALLOWED = {("ts_core.compare.model", "ts_core.compare.report.text")}


def level(module: str) -> Optional[int]:
    """0 below the stages, 1..5 the stages in order, 6 above; None outside compare."""
    if module == PKG:
        return 6                    # the package: its __init__ imports api
    if not module.startswith(PKG + "."):
        return None
    top = module[len(PKG) + 1:].split(".")[0]
    if top in BELOW:
        return 0
    if top in STAGES:
        return 1 + STAGES.index(top)
    assert top in ABOVE, f"{module}: not placed below, in or above the stages; add it to this test's lists"
    return 6


def module_path(module: str) -> Optional[str]:
    """The source file of a ts_core module, or None for a name that is no module."""
    if module != "ts_core" and not module.startswith("ts_core."):
        return None
    base = os.path.join(os.path.dirname(TS_CORE), *module.split("."))
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def _imports(path: str, module: str) -> Iterator[Tuple[str, int]]:
    """Every name an import in the file reaches (relative ones resolved), with its line."""
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                yield f"{base}.{a.name}", node.lineno   # `from . import x` names module x


def resolve(name: str) -> Optional[str]:
    """The module an imported name belongs to: the longest prefix that is a ts_core module."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if module_path(".".join(parts[:n])):
            return ".".join(parts[:n])
    return None


_EDGES: Dict[str, List[Tuple[str, int]]] = {}


def edges(module: str) -> List[Tuple[str, int]]:
    if module not in _EDGES:
        found = ((resolve(name), line) for name, line in _imports(module_path(module), module))
        _EDGES[module] = [(m, line) for m, line in found if m and m != module and (module, m) not in ALLOWED]
    return _EDGES[module]


def compare_modules() -> List[str]:
    root = os.path.join(TS_CORE, "compare")
    out = []
    for dirpath, _, files in os.walk(root):
        for f in sorted(files):
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), root)[:-3].replace(os.sep, ".")
                out.append(f"{PKG}.{rel}".removesuffix(".__init__"))
    return sorted(out)


def upward(module: str) -> Optional[str]:
    """The first import path from ``module`` to a module of a later level, in words; None when
    there is none."""
    mine = level(module)
    seen = {module: None}
    queue = deque([module])
    while queue:
        m = queue.popleft()
        for nxt, line in edges(m):
            if nxt in seen:
                continue
            seen[nxt] = (m, line)
            lv = level(nxt)
            if lv is not None and lv > mine:
                hops, at = [], nxt
                while seen[at] is not None:
                    prev, ln = seen[at]
                    hops.append(f"{prev}:{ln} -> {at}")
                    at = prev
                return "; ".join(reversed(hops))
            queue.append(nxt)
    return None


MODULES = [m for m in compare_modules() if level(m) < 6]


@pytest.mark.parametrize("module", MODULES)
def test_a_module_reaches_no_later_stage(module):
    path = upward(module)
    assert path is None, f"{module} (level {level(module)}) reaches a later stage: {path}"


def test_every_stage_and_the_model_are_checked():
    assert {level(m) for m in MODULES} == {0, 1, 2, 3, 4, 5}
    assert f"{PKG}.model" in MODULES and f"{PKG}.report.merge" in MODULES


def test_the_checker_sees_a_function_local_import(tmp_path):
    """The walk must not miss what the rule is about: an import inside a function."""
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from ..report.text import terminal_text\n")
    assert ("ts_core.compare.report.text.terminal_text", 2) in list(_imports(str(src), "ts_core.compare.align.m"))


def test_the_walk_follows_imports_transitively(monkeypatch):
    """An edge two hops away counts: align -> (a helper outside compare) -> report."""
    graph = {f"{PKG}.align.a": [("ts_core.helper", 3)], "ts_core.helper": [(f"{PKG}.report.text", 7)]}
    monkeypatch.setitem(globals(), "edges", lambda m: graph.get(m, []))
    found = upward(f"{PKG}.align.a")
    assert found == f"{PKG}.align.a:3 -> ts_core.helper; ts_core.helper:7 -> {PKG}.report.text"


def test_the_architecture_page_states_this_rule():
    """docs/architecture.md names the same layers as this test, in the paragraph that states
    the rule (its claim is checked here, not copied)."""
    doc = open(os.path.join(os.path.dirname(TS_CORE), "docs", "architecture.md"), encoding="utf-8").read()
    para = doc[doc.index("A stage imports only earlier stages, transitively"):]
    para = para[:para.index("\n\n")]
    assert " -> ".join(f"`{s}`" for s in STAGES) in para.replace("->\n", "-> ")
    for name in BELOW + ABOVE:
        assert f"`{name}.py`" in para, f"docs/architecture.md's stage rule does not place {name}.py"
    assert "tests/compare/test_stages.py" in para
