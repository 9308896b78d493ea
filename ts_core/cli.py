"""The ``tsprobe`` command: one subparser per command, each a small add/run function pair.

Add a command by writing ``_add_<name>(subparsers)`` that sets ``func`` and listing it in
``_COMMANDS``.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, List, Optional


def _add_compare(sub) -> None:
    p = sub.add_parser("compare", help="compare two dumps and name the first call that diverged",
                       description="GOLDEN and TARGET may each be a dump root (step*/rank*), a step folder, "
                                   "a rank folder or a dump.json; each step/rank pair is compared.")
    p.add_argument("golden", help="the reference dump")
    p.add_argument("target", help="the dump under test")
    p.add_argument("-o", "--output", metavar="OUT", help="write compare.csv, summary.json, report.html here")
    p.add_argument("--rtol", type=float, help="relative tolerance (default: by dtype, float32 1e-4)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default: by dtype, float32 1e-5)")
    p.add_argument("--stats-only", action="store_true", help="compare recorded statistics, ignore tensor files")
    p.add_argument("--nan-differs", action="store_true", help="NaN at the same place on both sides fails")
    p.add_argument("--workers", type=int, help="processes for several step/rank pairs (default: CPU count)")
    p.add_argument("--no-html", action="store_true", help="skip report.html")
    p.add_argument("--json", action="store_true", help="print summary.json content instead of the table")
    p.add_argument("--fail-on-divergence", action="store_true", help="exit with status 1 when a divergence is found")
    p.set_defaults(func=_run_compare)


def _run_compare(args: argparse.Namespace) -> int:
    from ts_core.compare import compare

    result = compare(args.golden, args.target, args.output, rtol=args.rtol, atol=args.atol,
                     stats_only=args.stats_only, equal_nan=not args.nan_differs, workers=args.workers,
                     html=not args.no_html, verbose=not args.json)
    if args.json:
        print(json.dumps(result.summary(), indent=2))
    return 1 if (args.fail_on_divergence and result.first_divergence) else 0


def _add_summary(sub) -> None:
    p = sub.add_parser("summary", help="steps, ranks, record counts and the first NaN/Inf of a dump")
    p.add_argument("dump", help="a dump root, step folder, rank folder or dump.json")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_run_summary)


def _run_summary(args: argparse.Namespace) -> int:
    from ts_core.compare import summarize, summary_text

    items = summarize(args.dump)
    print(json.dumps(items, indent=2) if args.json else summary_text(items))
    return 0


def _add_recover(sub) -> None:
    p = sub.add_parser("recover", help="rebuild dump.json/stack.json/construct.json of a run that was killed",
                       description="Reads the append-only journal of every rank folder under DUMP that has "
                                   "one and rewrites its JSON files (marked incomplete).")
    p.add_argument("dump", help="a dump root, step folder or rank folder")
    p.set_defaults(func=_run_recover)


def _run_recover(args: argparse.Namespace) -> int:
    import os

    from ts_core.dumpfmt import JOURNAL, find_journal_dirs
    from ts_core.writer import recover

    if not os.path.isdir(args.dump):
        raise FileNotFoundError(f"tsprobe recover: {args.dump} is not a folder")
    folders = find_journal_dirs(args.dump)
    for folder in folders:
        print(f"{folder}: {recover(folder)} records recovered")
    if not folders:
        print(f"tsprobe recover: no {JOURNAL} under {args.dump}: nothing to recover", file=sys.stderr)
        return 2
    return 0


_COMMANDS: List[Callable] = [_add_compare, _add_summary, _add_recover]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tsprobe", description="Precision debugging: dump, compare, find the "
                                                                 "first divergent op.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in _COMMANDS:
        add(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run one command; bad input (missing path, unreadable dump) prints one line and exits 2."""
    from ts_core.compare.errors import DumpFormatError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (DumpFormatError, OSError) as e:
        print(f"tsprobe {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
