"""Cross-framework compare: pair the calls of a PyTorch dump with those of its MindSpore port.

The mapping data lives in ``ts_core/backends/mindspore/torch_mapping.yaml`` (its header
documents every section). Used automatically by ``compare()`` when the two dumps' ``framework``
fields are ``pytorch`` and ``mindspore`` (either side may be the golden one):

- every MindSpore key gets an *alignment name* in torch vocabulary: ``Cell.fc.Dense.forward.0``
  -> ``Module.fc.Linear.forward.0``, ``Functional.dense.2.forward`` -> ``Functional.linear.2.forward``,
  ``Mint.matmul`` -> ``Torch.matmul``, ``Primitive.matmul.MatMul`` -> ``Torch.matmul``; the
  existing order-preserving alignment then runs on those names (keys shown in reports stay real);
- MindSpore parameter names become torch's inside module records and parameters_grad
  (``gamma`` -> ``weight`` for a LayerNorm), so values pair by name;
- many-to-many groups (torch ``sigmoid`` + ``mul`` <-> MindSpore ``silu``): a run of consecutive
  forward API calls matching a group's pattern is merged into one call (the inputs its members
  take from outside the run, the outputs no later member consumes) on each side, and the two
  merged calls pair. A group is applied only when it makes more calls pair than leaving it out
  does. These are hints: calls the mapping does not cover are paired by data flow (refine.py).
- ``mindspore.jit`` regions: a ``Jit.{name}`` record (seed 003) stands for the calls the torch
  side makes inside the function or module it ports; data flow merges that run of torch calls
  into one call paired with it (forward and backward). A torch module record inside a jit Cell
  (a Cell of class ``name`` at path P: the torch modules under P) has no MindSpore counterpart,
  since MindSpore ran it compiled: it is marked as such (``inside_region``), never a
  divergence by itself; the region is compared at its boundary.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from ...dumpfmt import FORWARD, PARAMETER, Entry, api_key, module_base, parse_key, split_module_name
from ...dumpfmt.keys import JIT_PREFIX
from ..load.loader import Call
from ..ops import load_mapping
from .matching import align, default_normalise
from .pairs import merge

TORCH, MINDSPORE = "pytorch", "mindspore"
# mindtorch (torch's API on MindSpore, msprobe's MSAdapter scenario) records torch's vocabulary:
# against PyTorch it is the same framework here, against MindSpore it is crossed like PyTorch.
_ALIASES = {"pytorch": TORCH, "torch": TORCH, "pt": TORCH, "mindtorch": TORCH,
            "mindspore": MINDSPORE, "ms": MINDSPORE}
_GROUP_EVAL_LIMIT = 20_000      # above this many forward calls, groups are applied without trying both ways

def framework_of(name: str) -> str:
    """The vocabulary a dump's framework records: ``pytorch`` (also for mindtorch) or
    ``mindspore`` (aliases accepted), else the lower-cased name ("" if unknown)."""
    n = (name or "").strip().lower()
    return _ALIASES.get(n, n)


def is_cross(golden_fw: str, target_fw: str) -> bool:
    return {framework_of(golden_fw), framework_of(target_fw)} == {TORCH, MINDSPORE}


@dataclass
class Group:
    index: int
    torch: List[str]
    mindspore: List[str]


@dataclass
class Mapping:
    """The mapping file, indexed for MindSpore -> torch lookups."""

    modules: Dict[str, List[str]] = field(default_factory=dict)        # ms class -> torch classes
    apis: List[Tuple[str, str]] = field(default_factory=list)           # (ms pattern, torch base)
    prefixes: Dict[str, List[str]] = field(default_factory=dict)       # ms prefix -> torch prefixes
    params: Dict[str, Dict[str, str]] = field(default_factory=dict)    # torch class -> {ms name: torch name}
    groups: List[Group] = field(default_factory=list)

    @classmethod
    def from_data(cls, data: dict) -> "Mapping":
        m = cls()
        for tcls, mclasses in (data.get("modules") or {}).items():
            for mc in mclasses or []:
                m.modules.setdefault(mc, []).append(tcls)
        for tbase, mbases in (data.get("apis") or {}).items():
            for mb in mbases or []:
                m.apis.append((mb, tbase))
        for tpre, mpres in (data.get("same_name_prefixes") or {}).items():
            for mp in mpres or []:
                m.prefixes.setdefault(mp, []).append(tpre)
        for tcls, names in (data.get("parameters") or {}).items():
            m.params[tcls] = {v: k for k, v in (names or {}).items()}
        for i, g in enumerate(data.get("groups") or []):
            m.groups.append(Group(i, list(g.get("torch") or []), list(g.get("mindspore") or [])))
        return m

    def api_candidates(self, ms_name: str) -> List[str]:
        """Torch API bases a MindSpore API base may stand for, most specific first."""
        out = [t for pat, t in self.apis if fnmatch.fnmatchcase(ms_name, pat)]
        prefix, _, rest = ms_name.partition(".")
        if rest and not prefix == "Primitive":
            out += [f"{tp}.{rest}" for tp in self.prefixes.get(prefix, [])]
        return list(dict.fromkeys(out))


class Translator:
    """Alignment names for the calls of a torch dump and a MindSpore dump.

    `torch_keys` are the keys of the torch side: where the mapping offers several torch names
    for one MindSpore name, the one that side used wins."""

    def __init__(self, mapping: Mapping, torch_keys: Iterable[str]):
        self.m = mapping
        self.torch_names = {parse_key(k).name for k in torch_keys}

    def _pick(self, candidates: List[str], fallback: str) -> str:
        for c in candidates:
            if c in self.torch_names:
                return c
        return candidates[0] if candidates else fallback

    def torch_name(self, ms_name: str, kind: str) -> str:
        if kind in ("module", "parameters_grad"):
            prefix, path, mcls = split_module_name(ms_name)
            if prefix != "Cell" or not mcls:
                return ms_name
            cands = [module_base(path, t) for t in self.m.modules.get(mcls, [])]
            same = module_base(path, mcls)
            return self._pick(cands + [same], same)
        if kind == "api":
            return self._pick(self.m.api_candidates(ms_name), ms_name)
        return ms_name

    def key(self, ms_key: str) -> str:
        info = parse_key(ms_key)
        name = self.torch_name(info.name, info.kind)
        if name == info.name:
            return ms_key
        return name + ms_key[len(info.name):]

    def torch_class(self, ms_key: str) -> str:
        info = parse_key(ms_key)
        return split_module_name(self.torch_name(info.name, info.kind))[2]

    def rename_entries(self, call: Call) -> Call:
        """MindSpore parameter names -> torch's (``parameters.gamma`` -> ``parameters.weight``)."""
        if call.kind not in ("module", "parameters_grad"):
            return call
        names = self.m.params.get(self.torch_class(call.key))
        if not names:
            return call
        entries = []
        for e in call.entries:
            arg = e.arg
            if call.kind == "parameters_grad":
                head, dot, rest = arg.partition(".")
                arg = names.get(head, head) + dot + rest
            elif e.role == PARAMETER and arg.startswith("parameters."):
                head, dot, rest = arg[len("parameters."):].partition(".")
                arg = "parameters." + names.get(head, head) + dot + rest
            entries.append(Entry(e.role, arg, e.leaf))
        return Call(call.key, call.direction, call.kind, call.index, entries)


# ------------------------------------------------------------------------------- groups

def _matches(name: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern)


def _find_runs(calls: List[Call], pattern: List[str]) -> List[List[int]]:
    """Non-overlapping runs of consecutive forward API calls (indices into ``calls``) whose
    names match ``pattern`` element-wise."""
    idx = [i for i, c in enumerate(calls) if c.direction == FORWARD and c.kind == "api"]
    names = [parse_key(calls[i].key).name for i in idx]
    runs, k, n = [], 0, len(pattern)
    while n and k + n <= len(idx):
        if all(_matches(names[k + j], pattern[j]) for j in range(n)):
            runs.append(idx[k:k + n]); k += n
        else:
            k += 1
    return runs


def _apply(calls: List[Call], runs: List[List[int]], label: str, names: Dict[str, str]) -> List[Call]:
    starts = {r[0]: r for r in runs}
    inside = {i for r in runs for i in r}
    out, n = [], 0
    for i, c in enumerate(calls):
        if i in starts:
            merged = merge([calls[j] for j in starts[i]])
            names[merged.key] = api_key(label, n, FORWARD)
            n += 1
            out.append(merged)
        elif i not in inside:
            out.append(c)
    return out


def jit_cell_paths(mcalls: List[Call]) -> Dict[str, str]:
    """Paths of the MindSpore Cells that ran as jit regions (a Cell whose class names a ``Jit``
    record) -> the first such record's forward key."""
    regions: Dict[str, str] = {}
    for c in mcalls:
        info = parse_key(c.key)
        if info.kind == "api" and info.prefix == JIT_PREFIX and info.direction == FORWARD:
            regions.setdefault(info.api_name, c.key)
    paths: Dict[str, str] = {}
    for c in mcalls:
        info = parse_key(c.key)
        if info.kind == "module" and info.prefix == "Cell" and info.class_name in regions:
            paths.setdefault(info.module_path, regions[info.class_name])
    return paths


def mark_inside_jit(tcalls: List[Call], paths: Dict[str, str]) -> int:
    """Mark the torch module records under a jit Cell's path (see the module doc); returns how many."""
    n = 0
    for c in tcalls:
        info = parse_key(c.key)
        if info.kind != "module":
            continue
        path = info.module_path
        region = next((paths[p] for p in paths if p and path.startswith(p + ".")), None)
        if region is not None:
            c.inside_region = f"ran inside a region the other side ran compiled ({region}), compared at its boundary"
            n += 1
    return n


@dataclass
class Prepared:
    golden: List[Call]
    target: List[Call]
    golden_name: Callable[[str], str]
    target_name: Callable[[str], str]
    groups: List[str]             # the groups applied, described


def _covered(g: List[Call], t: List[Call], gname, tname) -> int:
    gs = [c for c in g if c.direction == FORWARD and c.kind != "parameters_grad"]
    ts = [c for c in t if c.direction == FORWARD and c.kind != "parameters_grad"]
    n = 0
    for i, j in align([gname(c.key) for c in gs], [tname(c.key) for c in ts], default_normalise):
        if i is not None and j is not None:
            n += gs[i].key.count("+") + ts[j].key.count("+") + 2
    return n


def prepare(golden: List[Call], target: List[Call], golden_fw: str, target_fw: str,
            mapping_path: Optional[str] = None) -> Prepared:
    """Calls of both sides ready for alignment: groups merged, MindSpore parameter names
    renamed, and the function giving each side's alignment name of a key."""
    ms_is_golden = framework_of(golden_fw) == MINDSPORE
    tcalls, mcalls = (target, golden) if ms_is_golden else (golden, target)
    mapping = Mapping.from_data(load_mapping(mapping_path))
    tr = Translator(mapping, [c.key for c in tcalls])
    mcalls = [tr.rename_entries(c) for c in mcalls]
    inside = mark_inside_jit(tcalls, jit_cell_paths(mcalls))
    names_t: Dict[str, str] = {}
    names_m: Dict[str, str] = {}
    t_name = lambda k: names_t.get(k, k)                       # noqa: E731
    m_name = lambda k: names_m.get(k, None) or tr.key(k)       # noqa: E731
    applied = []
    evaluate = len(tcalls) + len(mcalls) <= _GROUP_EVAL_LIMIT
    score = _covered(tcalls, mcalls, t_name, m_name) if evaluate else 0
    for g in mapping.groups:
        if not g.torch or not g.mindspore:
            continue
        t_runs, m_runs = _find_runs(tcalls, g.torch), _find_runs(mcalls, g.mindspore)
        if not t_runs or not m_runs:
            continue
        label = f"Group.{'+'.join(g.torch)}"
        nt, nm = dict(names_t), dict(names_m)
        new_t = _apply(tcalls, t_runs, label, nt)
        new_m = _apply(mcalls, m_runs, label, nm)
        if evaluate:
            new_score = _covered(new_t, new_m, lambda k: nt.get(k, k), lambda k: nm.get(k, None) or tr.key(k))
            if new_score <= score:
                continue
            score = new_score
        tcalls, mcalls, names_t, names_m = new_t, new_m, nt, nm
        applied.append(f"{' + '.join(g.torch)} <-> {' + '.join(g.mindspore)} "
                       f"({len(t_runs)} torch, {len(m_runs)} MindSpore)")
    if inside:
        applied.append(f"{inside} torch module records inside MindSpore jit Cells, compared at the Jit records")
    if ms_is_golden:
        return Prepared(mcalls, tcalls, m_name, t_name, applied)
    return Prepared(tcalls, mcalls, t_name, m_name, applied)


__all__ = ["Mapping", "Translator", "Prepared", "prepare", "load_mapping", "is_cross",
           "framework_of", "merge", "jit_cell_paths", "mark_inside_jit"]
