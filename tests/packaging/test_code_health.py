"""The code-health bar that can be counted: every integration (ts_integrations/*.py) is a thin
adapter over ts_core, at most 250 lines; what more it needs belongs in ts_core or _common.py."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIMIT = 250


def test_every_integration_is_at_most_250_lines():
    folder = os.path.join(ROOT, "ts_integrations")
    sizes = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                sizes[name] = sum(1 for _ in f)
    assert "transformers.py" in sizes and len(sizes) > 5
    assert {n: s for n, s in sizes.items() if s > LIMIT} == {}, sizes
