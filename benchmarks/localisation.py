"""Localisation benchmark: does ``tsprobe compare`` name each injected bug at its place, and
stay quiet on clean pairs? Per level (L0, L1, mix) and pair kind (torch<->torch,
torch<->MindSpore).

For each case a golden and a target program (same weights, same inputs; one forward, backward
and, for torch<->torch, an optimizer step) are dumped with PrecisionDebugger, compared with
``ts_core.compare.compare``, and ``result.first_divergence`` is scored against the place the
bug was put (``loczoo/torch_zoo.py``: module path and op names, written by hand). Clean pairs
(same program twice, inserted no-op calls, other decompositions, re-ordered ops, float noise,
a faithful MindSpore port) count a false alarm for any first divergence or an "error" verdict.
The diagnosis of each first divergence (``result.diagnosis``) is scored too: top-1 and top-3
cause accuracy per bug kind (``spec.EXPECTED_CAUSE``), and clean pairs given a cause with high
confidence. The nondeterministic kind compares two runs of one program, with a third as
``golden_rerun``.

    python benchmarks/localisation.py [--levels L0,L1,mix] [--pairs torch-torch,torch-ms]
        [--families mlp,gpt_block] [--bugs wrong_eps,clean] [--task tensor|statistics|tensor,statistics]
        [--quick] [--out results.json] [--keep DIR] [--optimizer sgd|adamw|none] [--list]

MindSpore runs in a child process (``loczoo/ms_child.py``). Models are tiny; the full run is
meant to take well under 15 minutes on 2 cores. Nothing is cached between runs.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]       # this checkout's ts_core, then loczoo

from loczoo import report  # noqa: E402
from loczoo.runner import Options, Runner, build_cases  # noqa: E402
from loczoo.spec import BUG_KINDS, CLEAN_KINDS, LEVELS, PAIRS, TASKS  # noqa: E402


def _csv(value: str, allowed=None, what: str = ""):
    items = tuple(v.strip() for v in value.split(",") if v.strip())
    if allowed is not None:
        bad = [v for v in items if v not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(bad)}; choose from {', '.join(allowed)}")
    return items


def parse_args(argv=None) -> argparse.Namespace:
    from loczoo.torch_zoo import FAMILIES

    variants = sorted({v for f in FAMILIES.values() for v in list(f.cases) + list(f.ms_variants)})
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", type=lambda s: _csv(s, LEVELS, "level"), default=LEVELS)
    p.add_argument("--pairs", type=lambda s: _csv(s, PAIRS, "pair kind"), default=PAIRS)
    p.add_argument("--families", type=lambda s: _csv(s, sorted(FAMILIES), "family"), default=None)
    p.add_argument("--bugs", type=lambda s: _csv(s, variants + ["clean"], "variant"), default=None,
                   help="variants to run: bug kinds, clean_<kind>, or 'clean' for every clean pair")
    p.add_argument("--task", type=lambda s: _csv(s, TASKS, "task"), default=("tensor",))
    p.add_argument("--quick", action="store_true", help="a small subset (< 1 min)")
    p.add_argument("--optimizer", choices=("sgd", "adamw", "none"), default="sgd",
                   help="torch<->torch: the optimizer step run inside the dumped step (default sgd: "
                        "momentum + weight decay; adamw records ~3x more optimizer calls)")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--keep", help="write dumps and compare outputs here and keep them")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TSPROBE_QUIET", "1")
    workdir = args.keep or tempfile.mkdtemp(prefix="tsprobe_loc_")
    os.makedirs(workdir, exist_ok=True)
    opts = Options(levels=args.levels, pairs=args.pairs, families=args.families, bugs=args.bugs, tasks=args.task,
                   quick=args.quick, optimizer=args.optimizer, workdir=workdir, progress=not args.quiet)
    cases = build_cases(opts)
    if args.list:
        for c in cases:
            print(c.id, "clean" if c.clean else f"{c.place.modules} {c.place.ops}")
        return 0
    if not cases:
        print("no case matches the selection", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        outcomes = Runner(opts).run(cases)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    seconds = time.perf_counter() - t0
    print(f"\nLocalisation benchmark: {len(cases)} cases in {seconds:.0f} s "
          f"(bug kinds: {len(BUG_KINDS)} defined, clean kinds: {len(CLEAN_KINDS)})\n")
    print(report.table(outcomes))
    print("\nPer family (right place / bugs, false alarms / clean pairs):")
    print(report.family_table(outcomes))
    print("\nMisses and false alarms, by automatic cause:")
    print(report.cause_counts(outcomes))
    print("\nMisses and false alarms:")
    print(report.misses(outcomes))
    print("\nDiagnosis: cause named for each bug kind (compare/explain/diagnosis.py):")
    print(report.cause_table(outcomes))
    print("\nWrong first cause:")
    print(report.cause_misses(outcomes))
    if args.out:
        report.write_json(args.out, outcomes, {k: v for k, v in vars(args).items()}, seconds)
        print(f"\nresults: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
