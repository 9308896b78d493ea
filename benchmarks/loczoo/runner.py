"""Run the cases: dump golden and target, compare, score.

Golden dumps are shared within one invocation (one per family, level, task and optimizer);
nothing is kept between invocations. The MindSpore sides of the torch<->MindSpore cases are
dumped by one child process (``ms_child``) that runs while this process does the torch
cases. For L1 cases a mix dump of each program is made as well (or reused when mix is run):
its construct.json tells the scorer which module an L1 call ran in.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from .arrays import effect
from .score import score, score_cause
from .spec import LEVELS, Case

RERUN_KINDS = ("nondeterministic",)     # compared with a rerun of golden (compare's golden_rerun)

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
REPO = os.path.dirname(BENCH)
QUICK = {
    "torch-torch": {"mlp": ("transposed_weight", "clean_noop"),
                    "gpt_block": ("cancelled_weight_row", "clean_decomp")},
    "torch-ms": {"mlp": ("clean_port", "transposed_weight")},
}
QUICK_LEVELS = ("L0", "mix")


@dataclass
class Options:
    levels: Tuple[str, ...] = LEVELS
    pairs: Tuple[str, ...] = ("torch-torch", "torch-ms")
    families: Optional[Tuple[str, ...]] = None
    bugs: Optional[Tuple[str, ...]] = None
    tasks: Tuple[str, ...] = ("tensor",)
    quick: bool = False
    optimizer: str = "sgd"
    workdir: str = ""
    progress: bool = True


@dataclass
class Outcome:
    case: Case
    score: Dict = field(default_factory=dict)
    first_divergence: Optional[Dict] = None
    note: str = ""
    counts: Dict = field(default_factory=dict)
    effect: Dict = field(default_factory=dict)
    seconds: Dict = field(default_factory=dict)
    error: str = ""
    diagnosis: List[Dict] = field(default_factory=list)
    cause: Dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        c = self.case
        place = None if c.place is None else {"modules": list(c.place.modules), "ops": list(c.place.ops),
                                              "param": c.place.param, "direction": c.place.direction}
        return {"id": c.id, "pair": c.pair, "family": c.family, "variant": c.variant, "level": c.level,
                "task": c.task, "clean": c.clean, "expected": place, "score": self.score,
                "first_divergence": self.first_divergence, "note": self.note, "counts": self.counts,
                "effect": self.effect, "seconds": self.seconds, "error": self.error,
                "diagnosis": self.diagnosis, "cause": self.cause}


def _selected(name: str, wanted: Optional[Tuple[str, ...]]) -> bool:
    if not wanted:
        return True
    return name in wanted or (name.startswith("clean_") and "clean" in wanted)


def build_cases(opts: Options) -> List[Case]:
    from .torch_zoo import FAMILIES

    cases: List[Case] = []
    levels = [lv for lv in opts.levels if not opts.quick or lv in QUICK_LEVELS]
    for task in opts.tasks:
        for pair in opts.pairs:
            for fname, fam in FAMILIES.items():
                if opts.families and fname not in opts.families:
                    continue
                variants = fam.variants() if pair == "torch-torch" else list(fam.ms_variants)
                if opts.quick:
                    variants = [v for v in variants if v in QUICK.get(pair, {}).get(fname, ())]
                for variant in variants:
                    if not _selected(variant, opts.bugs):
                        continue
                    place = None if variant.startswith("clean_") else (
                        fam.ms_places.get(variant, fam.cases[variant]) if pair == "torch-ms" else fam.cases[variant])
                    for level in levels:
                        cases.append(Case(pair, fname, variant, level, place, task))
    return cases


class Runner:
    def __init__(self, opts: Options):
        self.opts = opts
        self.dumps: Dict[tuple, Tuple[str, Dict]] = {}
        self.states: Dict[str, Dict[str, np.ndarray]] = {}
        self.t0 = time.perf_counter()

    # ------------------------------------------------------------------ torch side
    def _state(self, family: str):
        if family not in self.states:
            from .torch_run import golden_state
            from .torch_zoo import FAMILIES
            self.states[family] = golden_state(FAMILIES[family])
        return self.states[family]

    def torch_dump(self, family: str, variant: str, level: str, task: str, optimizer: str,
                   run_tag: str = "") -> Tuple[str, Dict]:
        """One dump of a program; `run_tag` names another run of the same program (a
        nondeterministic one differs run to run)."""
        key = ("torch", family, variant, level, task, optimizer, run_tag)
        if key not in self.dumps:
            from .torch_run import run
            from .torch_zoo import FAMILIES
            path = os.path.join(self.opts.workdir, "torch", family, variant, f"{level}_{task}_{optimizer}{run_tag}")
            self.dumps[key] = run(family, variant, level, task, path, optimizer,
                                  FAMILIES[family].edits.get(variant), self._state(family))
        return self.dumps[key]

    # -------------------------------------------------------------- MindSpore side
    def start_ms(self, cases: List[Case]) -> Optional[subprocess.Popen]:
        """Write weights/inputs and the job list, start the MindSpore child; returns it."""
        from .torch_run import module_classes
        from .torch_zoo import FAMILIES

        jobs, seen = [], set()
        for c in cases:
            if c.pair != "torch-ms":
                continue
            for level in self._levels_needed(c):
                key = (c.family, c.variant, level, c.task)
                if key in seen:
                    continue
                seen.add(key)
                fam = FAMILIES[c.family]
                fdir = os.path.join(self.opts.workdir, "ms_inputs", c.family)
                if not os.path.isdir(fdir):
                    os.makedirs(fdir)
                    np.savez(os.path.join(fdir, "weights.npz"), **self._state(c.family))
                    np.savez(os.path.join(fdir, "inputs.npz"), *fam.inputs())
                    with open(os.path.join(fdir, "classes.json"), "w") as f:
                        json.dump(module_classes(fam), f)
                with open(os.path.join(fdir, "classes.json")) as f:
                    classes = json.load(f)
                edit = fam.edits.get(c.variant)
                jobs.append({"id": "|".join(key), "family": c.family, "variant": c.variant, "level": level,
                             "task": c.task, "classes": classes, "loss": fam.loss,
                             "dump_path": os.path.join(self.opts.workdir, "ms", c.family, c.variant, f"{level}_{c.task}"),
                             "weights": os.path.join(fdir, "weights.npz"), "inputs": os.path.join(fdir, "inputs.npz"),
                             "edit": [edit.param, edit.how] if edit else None})
        if not jobs:
            return None
        spec = os.path.join(self.opts.workdir, "ms_jobs.json")
        with open(spec, "w") as f:
            json.dump({"jobs": jobs}, f)
        env = dict(os.environ, TSPROBE_QUIET="1",
                   PYTHONPATH=os.pathsep.join([REPO, BENCH] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        self._ms_log = open(os.path.join(self.opts.workdir, "ms_child.log"), "w")
        return subprocess.Popen([sys.executable, "-m", "loczoo.ms_child", spec], cwd=BENCH, env=env,
                                stdout=subprocess.PIPE, stderr=self._ms_log, text=True)

    def collect_ms(self, proc: subprocess.Popen) -> None:
        self.ms_failed: Dict[str, str] = {}
        for line in proc.stdout:
            if line.startswith("DONE "):
                d = json.loads(line[5:])
                self._progress(f"MindSpore dump: {d['id']}")
                family, variant, level, task = d["id"].split("|")
                with np.load(d["signature"]) as z:
                    sig = {k: z[k] for k in z.files}
                self.dumps[("ms", family, variant, level, task)] = (d["rank_dir"], sig)
            elif line.startswith("FAILED "):
                d = json.loads(line[7:])
                self._progress(f"MindSpore dump FAILED: {d['id']}: {d['error'][:150]}")
                self.ms_failed[d["id"]] = d["error"] + "\n" + d.get("trace", "")
        proc.wait()
        self._ms_log.close()
        if proc.returncode:
            self.ms_failed["__child__"] = f"MindSpore child exited with {proc.returncode}; see ms_child.log"

    # -------------------------------------------------------------------- cases
    def _levels_needed(self, c: Case) -> List[str]:
        return [c.level, "mix"] if c.level == "L1" else [c.level]

    def _sides(self, c: Case, level: str):
        opt = self.opts.optimizer if c.pair == "torch-torch" else "none"
        if c.variant in RERUN_KINDS:        # golden is the same program: two runs of it, the target a third
            return (self.torch_dump(c.family, c.variant, level, c.task, opt, "_golden"),
                    self.torch_dump(c.family, c.variant, level, c.task, opt, "_target"))
        golden = self.torch_dump(c.family, "clean_same", level, c.task, opt)
        if c.pair == "torch-torch":
            target = self.torch_dump(c.family, c.variant, level, c.task, opt)
        else:
            key = ("ms", c.family, c.variant, level, c.task)
            if key not in self.dumps:
                err = self.ms_failed.get("|".join(key[1:]), self.ms_failed.get("__child__", "no MindSpore dump"))
                raise RuntimeError(f"MindSpore side failed: {err}")
            target = self.dumps[key]
        return golden, target

    def run_case(self, c: Case) -> Outcome:
        from ts_core.compare import compare

        o = Outcome(c)
        try:
            t = time.perf_counter()
            (g_dir, g_sig), (t_dir, t_sig) = self._sides(c, c.level)
            parents = (None, None)
            if c.level == "L1":
                (gm, _), (tm, _) = self._sides(c, "mix")
                parents = (_construct(gm), _construct(tm))
            o.seconds["dump"] = round(time.perf_counter() - t, 3)
            o.effect = effect(g_sig, t_sig)
            t = time.perf_counter()
            out = os.path.join(self.opts.workdir, "compare", c.id.replace("/", "__"))
            rerun = None
            if c.variant in RERUN_KINDS:
                rerun = self.torch_dump(c.family, c.variant, c.level, c.task,
                                        self.opts.optimizer if c.pair == "torch-torch" else "none", "_rerun")[0]
            result = compare(g_dir, t_dir, out, verbose=False, html=False, golden_rerun=rerun)
            o.seconds["compare"] = round(time.perf_counter() - t, 3)
            fd = result.first_divergence
            o.first_divergence = fd.to_dict() if fd is not None else None
            summary = result.summary()
            o.note = summary.get("first_divergence_note") or ""
            o.counts = summary.get("counts", {})
            o.score = score(c, fd, result.verdict, *parents)
            o.score["order"] = _order_of(g_dir, t_dir, fd)
            o.diagnosis = result.diagnosis
            o.cause = score_cause(c, o.diagnosis)
        except Exception as e:   # a crash is a result too: counted as a miss / false alarm, listed
            o.error = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"
            o.score = {"ok": False, "false_alarm": c.clean, "module_ok": None if c.level == "L1" else False,
                       "op_ok": None if c.level == "L0" else False, "named": None, "crashed": True}
        return o

    def run(self, cases: List[Case]) -> List[Outcome]:
        """torch<->torch cases first, while the MindSpore child dumps; then the torch goldens
        of the torch<->MindSpore cases (still in parallel with the child), then those cases."""
        torch_cases = [c for c in cases if c.pair == "torch-torch"]
        ms_cases = [c for c in cases if c.pair == "torch-ms"]
        self.ms_failed = {}
        proc = self.start_ms(ms_cases) if ms_cases else None
        outcomes = []
        for c in torch_cases:
            outcomes.append(self._run_logged(c, len(outcomes) + 1, len(cases)))
        if proc is not None:
            for c in ms_cases:
                for level in self._levels_needed(c):
                    self.torch_dump(c.family, "clean_same", level, c.task, "none")
            self._progress(f"waiting for the MindSpore child ({len(ms_cases)} cases)")
            self.collect_ms(proc)
        for c in ms_cases:
            outcomes.append(self._run_logged(c, len(outcomes) + 1, len(cases)))
        return outcomes

    def _run_logged(self, c: Case, i: int, n: int) -> Outcome:
        o = self.run_case(c)
        self._progress(f"[{i}/{n}] {c.id}: {_short(o)}")
        return o

    def _progress(self, msg: str) -> None:
        if self.opts.progress:
            print(f"{time.perf_counter() - self.t0:7.1f}s {msg}", file=sys.stderr, flush=True)


def _construct(rank_dir: str) -> Dict[str, Optional[str]]:
    from ts_core.dumpfmt import read_construct

    return read_construct(rank_dir) or {}


def _order_of(g_dir: str, t_dir: str, fd) -> Optional[str]:
    """Where the named call sits in golden's dump: 'forward', 'backward' or 'after backward'
    (an optimizer step); used to group misses."""
    if fd is None:
        return None
    from ts_core.dumpfmt import parse_key, read_header_and_data

    for rank_dir, key in ((g_dir, fd.key), (t_dir, fd.target_key)):
        if not key:
            continue
        keys = list(read_header_and_data(rank_dir)[1])
        member = key.split("+")[0]
        if member not in keys:
            continue
        pos = keys.index(member)
        last_bwd = max((i for i, k in enumerate(keys)
                        if parse_key(k).direction == "backward" and parse_key(k).kind != "parameters_grad"), default=-1)
        if pos > last_bwd >= 0:
            return "after backward"
        return parse_key(member).direction
    return None


def _short(o: Outcome) -> str:
    if o.error:
        return "CRASH " + o.error.splitlines()[0][:100]
    s = o.score
    named = s.get("named") or {}
    what = ", ".join(named.get("keys", [])) or "nothing"
    tag = ("ok" if s["ok"] else ("FALSE ALARM" if s.get("false_alarm") else "miss"))
    return f"{tag}: {what}"
