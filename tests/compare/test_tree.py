"""The model tree's data (ts_core/compare/tree.py) on a real comparison: hierarchy from
construct.json, worst verdicts folded upward, the first divergence, pruning of large trees."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ts_core.compare import compare  # noqa: E402
from ts_core.compare.report.tree import build_tree  # noqa: E402

from compare_models import dump_mix as dump  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("tree")
    return compare(dump(d / "g"), dump(d / "t", bug={"approximate": "tanh"}), verbose=False).pairs[0]


def _path(tree, i):
    out = []
    while i is not None and i >= 0:
        out.append(tree["nodes"][i][6] or tree["nodes"][i][0])
        i = tree["nodes"][i][1]
    return list(reversed(out))


def test_hierarchy_verdicts_and_first_divergence(pair):
    tree = build_tree(pair)
    nodes = tree["nodes"]
    assert _path(tree, tree["first"]) == ["forward", "Module.layers.1.Block.forward.0",
                                         "Module.layers.1.act.GELU.forward.0", "Functional.gelu.1.forward"]
    assert [n[0] for n in nodes[:3]] == ["forward", "backward", "other"] and tree["roots"] == [0, 1]
    for i, n in enumerate(nodes):
        assert n[1] < i                                  # parents before children
    # a node's failing count is its own plus its children's; its error is the max below it
    kids = {}
    for i, n in enumerate(nodes):
        kids.setdefault(n[1], []).append(i)
    own = {k: sum(r.verdict != "pass" for r in pair.rows if (r.golden_key or r.target_key) == k)
           for k in {n[6] for n in nodes}}
    for i, n in enumerate(nodes):
        if i < 3:
            continue
        assert n[5] == own.get(n[6], 0) + sum(nodes[c][5] for c in kids.get(i, []))
        below = [nodes[c][4] for c in kids.get(i, []) if nodes[c][4] is not None]
        if below:
            assert n[4] >= max(below)
    by_key = {n[6]: n for n in nodes}
    assert by_key["Module.layers.0.Block.forward.0"][3] == "pass"
    assert by_key["Module.layers.1.Block.forward.0"][3] != "pass"


def test_large_trees_keep_modules_failures_and_the_path_to_the_first(pair):
    full, small = build_tree(pair), build_tree(pair, max_nodes=10)
    assert small["hidden"] > 0 and len(small["nodes"]) + small["hidden"] == len(full["nodes"])
    assert small["nodes"][small["first"]][6] == pair.first_divergence.key
    assert all(n[2] != "api" or n[3] != "pass" for n in small["nodes"][3:] if n[6] != pair.first_divergence.key)
    assert {n[6] for n in full["nodes"] if n[2] == "module"} <= {n[6] for n in small["nodes"]}
    assert all(n[1] < i for i, n in enumerate(small["nodes"]))
    assert _path(small, small["first"]) == _path(full, full["first"])


def test_without_construct_modules_nest_by_path(pair):
    tree = build_tree(pair, construct={})
    by_key = {n[6]: i for i, n in enumerate(tree["nodes"])}
    act = tree["nodes"][by_key["Module.layers.1.act.GELU.forward.0"]]
    assert tree["nodes"][act[1]][6] == "Module.layers.1.Block.forward.0"
    assert tree["nodes"][by_key["Functional.gelu.1.forward"]][1] == 0       # calls under their direction
