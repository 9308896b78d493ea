"""The verdict words every tool writes (compare, acc-check, config-check) and their order.

One home so that summary.json, compare.csv, the acc-check table and the config-check diff
spell them alike; which value gets which word is each tool's own rule."""
from __future__ import annotations

PASS, INFO, WARNING, ERROR = "pass", "info", "warning", "error"
RANK = {PASS: 0, INFO: 0, WARNING: 1, ERROR: 2}     # INFO (config-check) is no worse than a pass


def worse(a: str, b: str) -> str:
    """The worse of two verdicts (the first on a tie); an unknown word ranks as a pass."""
    return a if RANK.get(a, 0) >= RANK.get(b, 0) else b

