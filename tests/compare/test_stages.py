"""compare/ is a pipeline of stages (load -> align -> judge -> explain -> report): an earlier
stage never imports a later one's code, so alignment and judging can change without touching
what the report shows, and the report can change without touching a verdict. Every import
counts, module level and function-local (read from the source, not from what ran)."""
from __future__ import annotations

import ast
import os

import pytest

import ts_core.compare

ROOT = os.path.dirname(ts_core.compare.__file__)
PKG = "ts_core.compare"
# stage -> the stages (and top-level compare modules) it must never import
FORBIDDEN = {
    "load": ("align", "judge", "explain", "report", "pipeline", "api", "executor"),
    "align": ("judge", "explain", "report", "pipeline", "api", "executor"),
    "judge": ("explain", "report", "pipeline", "api", "executor", "model"),
    "explain": ("report", "pipeline", "api", "executor"),
}


def _imports(path: str, module: str):
    """Every module named by an import in the file (relative ones resolved), with its line."""
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


def _stage_files(stage: str):
    for dirpath, _, files in os.walk(os.path.join(ROOT, stage)):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                yield path, f"{PKG}.{rel}".removesuffix(".__init__")


@pytest.mark.parametrize("stage", sorted(FORBIDDEN))
def test_an_earlier_stage_never_imports_a_later_one(stage):
    files = list(_stage_files(stage))
    assert files, f"no modules under compare/{stage}"
    bad = [f"{module}:{line} imports {name}" for path, module in files for name, line in _imports(path, module)
           if any(name == f"{PKG}.{f}" or name.startswith(f"{PKG}.{f}.") for f in FORBIDDEN[stage])]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_a_function_local_import(tmp_path):
    """The walk must not miss what the rule is about: an import inside a function."""
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from ..report.text import terminal_text\n")
    assert ("ts_core.compare.report.text.terminal_text", 2) in list(_imports(str(src), "ts_core.compare.align.m"))
