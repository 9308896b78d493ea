"""Guard run by the install scripts after pip: the named packages are installed at exactly the
version a constraints file pins (pip may move a version when another requirement pulls it).

    python requirements/check_pins.py CONSTRAINTS_FILE WHO NAME [NAME ...]

Exits non-zero with "WHO: pinned packages changed: ..." when one differs; names that the file
does not pin are skipped. Standard library only: it runs in whichever venv was just built.
"""
from __future__ import annotations

import importlib.metadata as md
import sys
from typing import Dict, List


def read_pins(path: str) -> Dict[str, str]:
    """``name==version`` lines of a constraints file, names lower-cased, comments dropped."""
    pins = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#")[0].strip()
            if "==" in line:
                name, version = line.split("==", 1)
                pins[name.strip().lower()] = version.strip()
    return pins


def _installed(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"


def changed(pins: Dict[str, str], names: List[str]) -> List[str]:
    """One line per name whose installed version is not its pin."""
    have = {n: _installed(n) for n in names if n in pins}
    return [f"{n} {v} != pinned {pins[n]}" for n, v in have.items() if v != pins[n]]


if __name__ == "__main__":
    constraints, who, *wanted = sys.argv[1:]
    bad = changed(read_pins(constraints), [n.lower() for n in wanted])
    if bad:
        sys.exit(f"{who}: pinned packages changed: " + "; ".join(bad))
