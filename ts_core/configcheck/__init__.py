"""``tsprobe config-check RUN_A RUN_B``: before comparing numerics, compare what the two runs
were given: packages, the environment variables that change determinism or precision, the
frameworks' settings, hyperparameters and config, weight checksums and first-batch checksums
(msprobe's config_check). The debugger records this fingerprint into every dumped step/rank
folder (config key ``fingerprint``, on by default; ``collect.py``); msprobe's config_check packs
(.zip) are read too. Importing this package needs only numpy and pyyaml.
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List

from ..dumpfmt import DumpFormatError, json_safe, write_text_atomic
from .collect import record_hyperparameters
from .diff import ERROR, INFO, PASS, RESULT, SECTIONS, WARNING, Finding, diff
from .sources import Source, load_run

RESULT_JSON, RESULT_CSV = "config_check.json", "config_check.csv"
_RANK = {PASS: 0, INFO: 0, "not recorded": 0, RESULT: 0, WARNING: 1, ERROR: 2}


@dataclass
class PairCheck:
    golden: Source
    target: Source
    findings: List[Finding]
    sections: Dict[str, str]
    notes: List[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        worst = max((_RANK[f.level] for f in self.findings), default=0)
        return {0: PASS, 1: WARNING, 2: ERROR}[worst]

    @property
    def checked(self) -> Dict[str, int]:
        """How many items of each section both fingerprints hold (what was actually compared)."""
        g, t = self.golden.doc, self.target.doc
        out = {}
        for section in SECTIONS:
            a, b = g.get(section), t.get(section)
            if section == "python":
                out[section] = int(a is not None and b is not None)
            elif section == "framework":
                out[section] = sum(len(a[k]) for k in (a or {}) if k in (b or {}) and isinstance(a[k], dict))
            else:
                out[section] = len(set(a or {}) & set(b or {})) if isinstance(a, dict) and isinstance(b, dict) else 0
        return out


@dataclass
class ConfigCheckResult:
    golden: str
    target: str
    pairs: List[PairCheck]
    unpaired_golden: List[str] = field(default_factory=list)
    unpaired_target: List[str] = field(default_factory=list)
    files: Dict[str, str] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        worst = max((_RANK[p.verdict] for p in self.pairs), default=0)
        if self.unpaired_golden or self.unpaired_target:
            worst = max(worst, 1)
        return {0: PASS, 1: WARNING, 2: ERROR}[worst]

    def summary(self) -> dict:
        return json_safe({
            "verdict": self.verdict, "golden": self.golden, "target": self.target,
            "pairs": [{"step": p.golden.step, "rank": p.golden.rank or p.target.rank, "golden": str(p.golden.json_path),
                       "target": str(p.target.json_path), "verdict": p.verdict, "sections": p.sections,
                       "checked": p.checked,
                       "notes": p.notes, "findings": [f.to_dict() for f in p.findings]} for p in self.pairs],
            "unpaired_golden": self.unpaired_golden, "unpaired_target": self.unpaired_target, "files": self.files})

    def text(self, max_rows: int = 25) -> str:
        lines = [f"tsprobe config-check: {self.verdict.upper()}"]
        for p in self.pairs:
            inputs = ", ".join(f"{s} {v}" for s, v in p.sections.items() if v != RESULT)
            results = [s for s, v in p.sections.items() if v == RESULT]
            lines.append(f"{p.golden.label} vs {p.target.label}: {p.verdict}  (inputs: {inputs}"
                         + (f"; results, not inputs: {', '.join(results)}" if results else "") + ")")
            lines.append("  checked: " + ", ".join(f"{n} {s}" for s, n in p.checked.items() if n)
                         if any(p.checked.values()) else "  checked: nothing (the fingerprints hold no section "
                                                         "both record)")
            shown = sorted((f for f in p.findings if f.level in (ERROR, WARNING)), key=lambda f: -_RANK[f.level])
            for f in shown[:max_rows]:
                note = f"  ({f.note})" if f.note else ""
                lines.append(f"  {f.level:<7} {f.section:<15} {f.name}: {_short(f.golden)} -> {_short(f.target)}{note}")
            if len(shown) > max_rows:
                lines.append(f"  ... {len(shown) - max_rows} more (see {self.files.get('json', RESULT_JSON)})")
            info = sum(1 for f in p.findings if f.level == INFO)
            if info:
                lines.append(f"  {info} informational difference(s) (paths, names, tsprobe's own config)")
            lines.extend(f"  {n}" for n in p.notes)
        if self.unpaired_golden or self.unpaired_target:
            lines.append(f"unpaired: golden {self.unpaired_golden}, target {self.unpaired_target}")
        if self.files:
            lines.append(f"written: {', '.join(self.files.values())}")
        return "\n".join(lines)


def _short(v: Any, n: int = 60) -> str:
    s = str(v)
    return s if len(s) <= n else s[:n - 3] + "..."


def config_check(golden: "os.PathLike | str", target: "os.PathLike | str",
                 output_dir: "os.PathLike | str | None" = None, verbose: bool = True) -> ConfigCheckResult:
    """Compare the fingerprints of two runs, step/rank by step/rank (see the module doc)."""
    from ..compare.load.loader import pair_units

    gs, ts = load_run(golden), load_run(target)
    pairs, lone_g, lone_t = pair_units(gs, ts)
    if not pairs:
        raise DumpFormatError(f"nothing to check: no step/rank of {golden} ({', '.join(s.label for s in gs)}) matches "
                              f"one of {target} ({', '.join(s.label for s in ts)})")
    checks = []
    first = min((g.step for g, _ in pairs if g.step is not None), default=None)
    for g, t in pairs:
        # the weights a run starts from are an input; those of its later steps are results
        findings, sections, notes = diff(g.doc, t.doc, weights_are_results=first is not None and g.step is not None
                                         and g.step > first)
        checks.append(PairCheck(g, t, findings, sections, notes))
    result = ConfigCheckResult(str(golden), str(target), checks, [s.label for s in lone_g], [s.label for s in lone_t])
    if output_dir is not None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        result.files = {"json": str(out / RESULT_JSON), "csv": str(out / RESULT_CSV)}
        write_text_atomic(out / RESULT_JSON, json.dumps(result.summary(), indent=1) + "\n")
        write_text_atomic(out / RESULT_CSV, _csv(result))
    if verbose:
        print(result.text())
    return result


def _csv(result: ConfigCheckResult) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["step", "rank", "section", "name", "golden", "target", "level", "note"])
    for p in result.pairs:
        for f in p.findings:
            w.writerow([p.golden.step if p.golden.step is not None else "", p.golden.rank or p.target.rank,
                        f.section, f.name, f.golden, f.target, f.level, f.note])
    return buf.getvalue()


__all__ = ["config_check", "ConfigCheckResult", "Finding", "record_hyperparameters", "SECTIONS"]
