"""The ``tsprobe`` command: one subparser per command, each a small add/run function pair.

Add a command by writing ``_add_<name>(subparsers)`` that sets ``func`` and listing it in
``_COMMANDS``.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
from typing import Callable, List, Optional


def _add_compare(sub) -> None:
    p = sub.add_parser("compare", help="compare two dumps and name the first call that diverged",
                       description="GOLDEN and TARGET may each be a dump root (step*/rank*), a step folder, "
                                   "a rank folder or a dump.json; each step/rank pair is compared (in parallel). "
                                   "With several ranks, one merged summary names each rank's first divergence, the "
                                   "rank that diverged first and the collectives that carried it (ranks.json). "
                                   "report.html opens its model tree on the first divergence.",
                       epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("golden", nargs="?", help="the reference dump")
    p.add_argument("target", nargs="?", help="the dump under test")
    # msprobe's spelling (`msprobe compare -tp TARGET -gp GOLDEN -o OUT`), so its commands run unchanged
    p.add_argument("-gp", "--golden_path", metavar="GOLDEN", help="the reference dump (msprobe's flag)")
    p.add_argument("-tp", "--target_path", metavar="TARGET", help="the dump under test (msprobe's flag)")
    p.add_argument("-o", "--output", "--output_path", metavar="OUT",
                   help="write compare.csv, summary.json, report.html here")
    p.add_argument("--rtol", type=float, help="relative tolerance (default: by dtype, float32 1e-4)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default: by dtype, float32 1e-5)")
    p.add_argument("--stats-only", action="store_true", help="compare recorded statistics, ignore tensor files")
    p.add_argument("--nan-differs", action="store_true", help="NaN at the same place on both sides fails")
    p.add_argument("--workers", type=int, help="processes for several step/rank pairs (default: CPU count; with "
                                               "--executor dask and no scheduler: the LocalCluster's workers)")
    p.add_argument("--executor", choices=("local", "dask"), default="local",
                   help="where the units (step, rank, chunk) run: local processes (default) or a Dask cluster "
                        "(pip install 'tsprobe[dask]'; a LocalCluster unless --scheduler/--scheduler-file)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="a running Dask scheduler, e.g. tcp://HOST:8786")
    p.add_argument("--scheduler-file", metavar="FILE", help="a running Dask cluster's scheduler file")
    p.add_argument("--chunks", type=int, default=1, metavar="N",
                   help="units per step/rank pair: its tensor reads split N ways (few ranks, large dumps)")
    p.add_argument("--stats-first", action="store_true",
                   help="read tensor files only where the recorded statistics or checksums differ")
    p.add_argument("--no-html", action="store_true", help="skip report.html")
    p.add_argument("--json", action="store_true", help="print summary.json content instead of the table")
    p.add_argument("--fail-on-divergence", action="store_true",
                   help="exit with status 1 also when the first divergence is only a warning (an ERROR verdict "
                        "always exits 1)")
    p.add_argument("--rank-map", metavar="SPEC",
                   help="1 rank against N (single run vs DDP/FSDP2/TP): 'same' (every rank saw the single run's "
                        "batch: compared rank by rank), 'split' (each saw a shard: merged across ranks) or the "
                        "target ranks to compare, e.g. 0,1 (default: decided from the data); N ranks against "
                        "M of another layout (DDP vs TP, 2 vs 4 ranks): both reduced to the global view, "
                        "'global' forces that for two N-rank dumps of one layout")
    p.add_argument("--golden-rerun", metavar="DUMP",
                   help="a second dump of golden (the same program run again): the diagnosis then says whether "
                        "the first divergence is nondeterminism (golden differs from itself)")
    p.add_argument("--target-rerun", metavar="DUMP", help="a second dump of target, likewise")
    p.set_defaults(func=_run_compare)


EXIT_CODES = """exit status:
  0  the compare ran and its verdict is PASS or WARNING
  1  it found a divergence (verdict ERROR), or the two dumps describe different programs
     (with --fail-on-divergence: also a first divergence that is only a warning)
  2  bad input or usage: a missing or unreadable dump (every readable step/rank is still
     compared and written), a wrong option"""


def compare_exit_code(result, fail_on_warning: bool = False) -> int:
    """The exit status of ``tsprobe compare`` (EXIT_CODES, docs/compare.md "Exit status")."""
    from ts_core.verdicts import ERROR

    if getattr(result, "unreadable", None):
        return 2
    if result.different_programs or result.verdict == ERROR:
        return 1
    return 1 if (fail_on_warning and result.first_divergence) else 0


def _head_start(args: argparse.Namespace) -> None:
    """Compare the dumps' same-named tensors while the compare modules load (ts_core/headstart.py),
    when this process is the one that will read them and has them still to load: a fresh
    ``tsprobe`` process, one thread, no numpy (a forked child of a process with threads, or of a
    notebook's large one, would cost more than the import it overlaps)."""
    golden = args.golden if args.golden is not None else args.golden_path
    target = args.target if args.target is not None else args.target_path
    threads = sys.modules.get("threading")          # not imported: no thread but this one
    fresh = "numpy" not in sys.modules and (threads is None or threads.active_count() == 1)
    if fresh and golden and target and not (args.stats_only or args.stats_first) and args.executor == "local" \
            and args.chunks == 1:
        from ts_core import headstart       # no numpy, nothing of ts_core.compare

        headstart.begin(golden, target, args.rtol, args.atol, not args.nan_differs)


def _run_compare(args: argparse.Namespace) -> int:
    from ts_core import headstart

    global _exit_without_teardown
    _head_start(args)
    try:
        return _compare_command(args)
    finally:
        headstart.end()
        # everything it wrote is closed, its process pool shut down; a Dask client tears down its own
        _exit_without_teardown = args.executor == "local"


def _load_compare_engine() -> Callable:
    """``ts_core.compare.compare``, imported without two costs that land on compare's critical path
    (its head start has the other core meanwhile; 2 GB benchmark, perf): the cyclic GC walking
    the ~150 new modules' objects, and OpenBLAS starting a thread per core that spins ~0.07 CPU s
    waiting for work compare never gives it (its BLAS runs on one thread, unless the user set
    OPENBLAS_NUM_THREADS; child processes see the user's environment)."""
    import gc

    own_blas = "OPENBLAS_NUM_THREADS" not in os.environ and "numpy" not in sys.modules
    if own_blas:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        from ts_core.compare import compare
    finally:
        if gc_was_on:
            gc.enable()
        if own_blas:
            del os.environ["OPENBLAS_NUM_THREADS"]
    return compare


def _compare_command(args: argparse.Namespace) -> int:
    compare = _load_compare_engine()

    for side, flag in (("golden", "-gp"), ("target", "-tp")):
        given, by_flag = getattr(args, side), getattr(args, f"{side}_path")
        if given is not None and by_flag is not None:
            print(f"tsprobe compare: error: {side.upper()} given twice (as an argument and as {flag})", file=sys.stderr)
            return 2
        if given is None and by_flag is None:
            print("tsprobe compare: error: give GOLDEN and TARGET (or msprobe's -gp GOLDEN -tp TARGET)",
                  file=sys.stderr)
            return 2
        setattr(args, side, given if given is not None else by_flag)

    if (args.scheduler or args.scheduler_file) and args.executor != "dask":
        print("tsprobe compare: error: --scheduler/--scheduler-file name a Dask cluster: add --executor dask",
              file=sys.stderr)
        return 2
    if args.chunks < 1:
        print(f"tsprobe compare: error: --chunks must be >= 1, got {args.chunks}", file=sys.stderr)
        return 2
    if args.executor == "dask":
        import importlib.util
        if importlib.util.find_spec("distributed") is None:
            print("tsprobe compare: error: --executor dask needs Dask distributed: pip install 'tsprobe[dask]'",
                  file=sys.stderr)
            return 2
    result = compare(args.golden, args.target, args.output, rtol=args.rtol, atol=args.atol,
                     stats_only=args.stats_only, equal_nan=not args.nan_differs, workers=args.workers,
                     html=not args.no_html, verbose=not args.json, rank_map=args.rank_map,
                     stats_first=args.stats_first, executor=args.executor, scheduler=args.scheduler,
                     scheduler_file=args.scheduler_file, chunks=args.chunks,

                     golden_rerun=args.golden_rerun, target_rerun=args.target_rerun)
    if args.json:
        print(json.dumps(result.summary(), indent=2))
    for error in result.unreadable:          # the others were compared; this input is bad
        print(f"tsprobe compare: error: {error}", file=sys.stderr)
    return compare_exit_code(result, args.fail_on_divergence)


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
                                   "one and rewrites its JSON files (marked incomplete); a packed folder's "
                                   "dump_tensor_data.tar keeps every complete member, its torn last one is cut "
                                   "and its index rewritten.")
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


def _add_unpack(sub) -> None:
    p = sub.add_parser("unpack", help="write a packed dump (tensor_format: packed) in msprobe's layout",
                       description="Extracts each step/rank's dump_tensor_data.tar into dump_tensor_data/ (one .npy "
                                   "per tensor, as the default mode writes them) and fixes dump.json. In place (the "
                                   "tar goes once its files are written), or into a copy with --out.")
    p.add_argument("dump", help="a dump root, step folder or rank folder")
    p.add_argument("--out", help="write the unpacked copy here (a new or empty folder)")
    p.set_defaults(func=_run_unpack)


def _run_unpack(args: argparse.Namespace) -> int:
    from ts_core.dumpfmt.unpack import unpack

    for folder in unpack(args.dump, args.out):
        print(f"{folder}: unpacked")
    return 0


def _add_acc_check(sub) -> None:
    p = sub.add_parser(
        "acc-check", help="API precision without a golden run: replay every API call of a tensor dump in "
                          "float64 and grade the recorded outputs",
        description="Each forward API call of DUMP (task tensor, level L1 or mix) is replayed on CPU from its "
                    "saved inputs in float64 (the reference) and in the recorded dtypes (a standard kernel of the "
                    "same precision), and its recorded outputs and input gradients are graded against the "
                    "reference with msprobe's dtype-aware standards. Calls that cannot be replayed are listed "
                    "with the reason. Writes accuracy_checking_result.csv, accuracy_checking_details.csv and "
                    "acc_check_summary.json to OUT.")
    p.add_argument("dump", nargs="?", help="a dump root, step folder, rank folder or dump.json")
    p.add_argument("-api_info", "--api_info_file", dest="api_info", metavar="DUMP_JSON",
                   help="msprobe's spelling of DUMP (a dump.json)")
    p.add_argument("-o", "--output", "--out_path", dest="output", metavar="OUT", help="write the CSVs and summary here")
    p.add_argument("--reference", action="append", default=[], metavar="NAME=FUNCTION",
                   help="grade the API NAME (a key without counter and direction: mylib.fused_gelu) against "
                        "FUNCTION (module.function or module:function), e.g. a custom kernel against the plain "
                        "composition it replaces; repeatable")
    p.add_argument("--standards", metavar="YAML", help="a copy of ts_core/acccheck/standards.yaml with other thresholds")
    p.add_argument("--no-backward", action="store_true", help="grade forward outputs only")
    p.add_argument("--white-list", nargs="*", default=None, metavar="API", help="check only these API names (linear, __add__)")
    p.add_argument("--black-list", nargs="*", default=None, metavar="API", help="never check these API names")
    p.add_argument("-config", "--config_path", dest="config", metavar="CONFIG",
                   help="an msprobe config.json: its acc_check section's white_list/black_list apply")
    p.add_argument("--json", action="store_true", help="print acc_check_summary.json content instead of the summary")
    p.add_argument("--fail-on-error", action="store_true", help="exit with status 1 when an API fails")
    p.set_defaults(func=_run_acc_check)


def _run_acc_check(args: argparse.Namespace) -> int:
    from ts_core.acccheck import acc_check

    dump = args.dump or args.api_info
    if not dump:
        print("tsprobe acc-check: error: give the dump to check (DUMP or -api_info dump.json)", file=sys.stderr)
        return 2
    refs = {}
    for item in args.reference:
        name, sep, target = item.partition("=")
        if not sep or not name or not target:
            print(f"tsprobe acc-check: error: --reference {item!r}: use NAME=module.function", file=sys.stderr)
            return 2
        refs[name.strip()] = target.strip()
    white, black = args.white_list, args.black_list
    if args.config:
        from ts_core.dumpfmt import read_json

        section = read_json(args.config).get("acc_check") or {}
        white = white if white is not None else (section.get("white_list") or None)
        black = black if black is not None else (section.get("black_list") or None)
    result = acc_check(dump, args.output, references=refs, standards=args.standards, backward=not args.no_backward,
                       white_list=white, black_list=black, verbose=not args.json)
    if args.json:
        print(json.dumps(result.summary(), indent=2))
    why = result.nothing_checked()
    if why:                     # an analysis that checked nothing is no pass
        if args.json:           # (the summary printed without --json says it already)
            print(f"tsprobe acc-check: error: nothing was checked: {why[0]}; {why[1]}", file=sys.stderr)
        return 1
    return 1 if (args.fail_on_error and result.failed) else 0


def _add_merge(sub) -> None:
    p = sub.add_parser("merge", help="merge per-rank compare results into one many-rank summary",
                       description="Each RESULT is the output folder of a tsprobe compare (or a folder holding "
                                   "several). Writes compare.csv, summary.json, ranks.json (each rank's first "
                                   "divergence, which rank diverged first, collectives linked across ranks), "
                                   "report.html and merged.csv (one row per value of the chosen APIs, one column "
                                   "per rank and metric) to OUT.")
    p.add_argument("results", nargs="*", metavar="RESULT", help="compare output folders")
    p.add_argument("-i", "--input_dir", dest="input_dir", help="msprobe's spelling: a folder holding the results")
    p.add_argument("-o", "--output", "--output_dir", dest="output", required=True, metavar="OUT")
    p.add_argument("--api", nargs="*", default=None, metavar="API",
                   help="APIs for merged.csv (Distributed.all_reduce, Functional.linear); default: the collectives "
                        "and each rank's first divergence")
    p.add_argument("--index", nargs="*", default=None, metavar="METRIC",
                   help="merged.csv metrics: compare.csv columns or msprobe names (Cosine, MaxRelativeErr, Max diff)")
    p.add_argument("-config", "--config-path", dest="config", metavar="YAML",
                   help="msprobe's merge config (api:, compare_index:)")
    p.add_argument("--no-html", action="store_true", help="skip report.html")
    p.set_defaults(func=_run_merge)


def _run_merge(args: argparse.Namespace) -> int:
    from ts_core.compare.api import write_merged
    from ts_core.compare.report.merge import index_columns, merge_results, read_merge_config
    from ts_core.compare.report.text import terminal_text

    folders = list(args.results) + ([args.input_dir] if args.input_dir else [])
    if not folders:
        print("tsprobe merge: error: give the compare results to merge (RESULT... or -i DIR)", file=sys.stderr)
        return 2
    apis, index = args.api, args.index
    if args.config:
        cfg = read_merge_config(args.config)
        apis = apis if apis is not None else (cfg["api"] or None)
        index = index if index is not None else (cfg["compare_index"] or None)
    try:
        index_columns(index)
    except ValueError as e:
        print(f"tsprobe merge: error: {e}", file=sys.stderr)
        return 2
    result = merge_results(folders)
    write_merged(result, args.output, apis, index, html=not args.no_html)
    print(terminal_text(result))
    return 0


def _add_config_check(sub) -> None:
    p = sub.add_parser(
        "config-check", help="before comparing numerics: compare what two runs were given (packages, environment, "
                             "framework settings, hyperparameters, weights, first batch)",
        description="RUN_A (golden) and RUN_B are dumps made with fingerprint: true (the default: each dumped "
                    "step/rank folder holds a fingerprint.json), fingerprint.json files, or msprobe config_check "
                    "packs (.zip). Each step/rank pair is checked; with -o, config_check.json and config_check.csv "
                    "are written.")
    p.add_argument("runs", nargs="*", metavar="RUN", help="RUN_A RUN_B")
    p.add_argument("-c", "--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="msprobe's spelling of RUN_A RUN_B")
    p.add_argument("-o", "--output", metavar="OUT", help="write config_check.json and config_check.csv here")
    p.add_argument("--json", action="store_true", help="print config_check.json content instead of the summary")
    p.add_argument("--fail-on-error", action="store_true", help="exit with status 1 when an error-level difference "
                                                                 "is found")
    p.set_defaults(func=_run_config_check)


def _run_config_check(args: argparse.Namespace) -> int:
    from ts_core.configcheck import config_check

    runs = list(args.compare or args.runs)
    if len(runs) != 2:
        print("tsprobe config-check: error: give two runs: RUN_A RUN_B", file=sys.stderr)
        return 2
    result = config_check(runs[0], runs[1], args.output, verbose=not args.json)
    if args.json:
        print(json.dumps(result.summary(), indent=2))
    return 1 if (args.fail_on_error and result.verdict == "error") else 0


def _add_config(sub) -> None:
    p = sub.add_parser("config", help="the ready configs shipped with tsprobe: list them, or print one to start from",
                       description="`tsprobe config init statistics_mix > config.json` writes a ready config to "
                                   "edit; any ready config also goes by name: "
                                   "PrecisionDebugger(config_path=\"statistics_mix\").")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    init = actions.add_parser("init", help="print a ready config (JSON, or YAML with --yaml)")
    init.add_argument("name", help="a ready config's name (tsprobe config list)")
    init.add_argument("--yaml", action="store_true", help="its YAML twin")
    actions.add_parser("list", help="the ready configs, one per line: name and what it records")
    p.set_defaults(func=_run_config)


def _run_config(args: argparse.Namespace) -> int:
    from ts_core.config import READY_DIR, ready_config_description, ready_configs

    names = ready_configs()
    if args.action == "list":
        width = max(map(len, names))
        print("\n".join(f"{n:<{width}}  {ready_config_description(n)}".rstrip() for n in names))
        return 0
    name = os.path.splitext(args.name)[0]
    if name not in names:
        import difflib

        near = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean '{near[0]}'? " if near else ""
        print(f"tsprobe config: error: no ready config {args.name!r}; {hint}ready: {', '.join(names)}",
              file=sys.stderr)
        return 2
    with open(os.path.join(READY_DIR, name + (".yaml" if args.yaml else ".json")), encoding="utf-8") as f:
        sys.stdout.write(f.read())
    return 0


def _add_check_replicas(sub) -> None:
    p = sub.add_parser("check-replicas", help="values that must be equal on every rank (replicated parameters, "
                                              "reduced gradients, Replicate() DTensors), checked across ranks",
                       description="Per step of DUMP (a dump root or step folder with rank0..rankN): the "
                                   "replicated values whose recorded statistics differ across ranks, and the "
                                   "first one, with the ranks holding each version. Exit status 1 when any differs.")
    p.add_argument("dump", help="a dump root or step folder")
    p.add_argument("--rtol", type=float, default=0.0, help="relative tolerance (default 0: replicas are copies)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_run_check_replicas)


def _run_check_replicas(args: argparse.Namespace) -> int:
    from ts_core.compare.explain.replicas import check_replicas, replicas_text

    report = check_replicas(args.dump, rtol=args.rtol)
    print(json.dumps(report, indent=2) if args.json else replicas_text(report))
    return 1 if any(s["mismatches"] for s in report["steps"]) else 0


_COMMANDS: List[Callable] = [_add_compare, _add_summary, _add_recover, _add_unpack, _add_acc_check, _add_merge, _add_config_check,
                             _add_config, _add_check_replicas]


# rl-check: RL train<->rollout consistency; its parser and logic live in ts_core/rl/cli.py
def _add_rl_check(sub: argparse._SubParsersAction) -> None:
    from ts_core.rl.cli import add_parser

    add_parser(sub)


_COMMANDS.append(_add_rl_check)


def version_text() -> str:
    """``tsprobe --version``: the version, the interpreter, and whether the C kernels are in use
    (a wheel built without a compiler, or ``TSPROBE_NATIVE=0``, runs the pure paths: slower,
    same values)."""
    import platform

    from ts_core import native
    from ts_core._version import __version__

    return (f"tsprobe {__version__} (Python {platform.python_version()}, {platform.machine()})\n"
            f"{native.describe()}\n" + "\n".join(_optional_lines()))


def _optional_lines() -> List[str]:
    """Whether the extra ``fast`` (isal, msgspec) is in use: same values without it, slower."""
    from ts_core import native
    from ts_core.dumpfmt import jsonio

    hint = "; pip install 'tsprobe[fast]'"
    isal = "isal" in (getattr(native._crc32, "__module__", None) or "")     # the CRC-32 native uses
    return [f"isal: {'in use' if isal else 'not installed'} (CRC-32 of summary_mode md5"
            + ("" if isal else ": zlib's, the same values, ~4x slower" + hint) + ")",
            f"msgspec: {'in use' if jsonio.fast_json() else 'not installed'} (dump records"
            + ("" if jsonio.fast_json() else ": the stdlib json encoder, the same text, ~10x slower" + hint) + ")"]


class _VersionAction(argparse.Action):
    """--version, worked out only when asked (it loads the extension)."""

    def __init__(self, option_strings: List[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, help="show the version and whether the native "
                                                                  "kernels, isal and msgspec are in use, then exit")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tsprobe", description="Precision debugging: dump, compare, find the "
                                                                 "first divergent op.")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in _COMMANDS:
        add(sub)
    return parser


def _input_errors() -> tuple:
    """The errors that mean bad input. Imported only once one is raised: ``ts_core.compare``
    loads numpy and the whole compare engine, which ``compare``'s head start runs beside."""
    from ts_core.compare.errors import DumpFormatError

    return (DumpFormatError, OSError)


def main(argv: Optional[List[str]] = None) -> int:
    """Run one command; bad input (missing path, unreadable dump) prints one line and exits 2."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        return _closed_pipe()
    except _input_errors() as e:        # evaluated only when something was raised
        print(f"tsprobe {args.command}: error: {e}", file=sys.stderr)
        return 2


_exit_without_teardown = False        # set by a command that leaves nothing to clean up but memory


def entry() -> None:
    """The ``tsprobe`` program: ``main``, then exit. After a local compare the process ends without
    tearing the interpreter down (atexit handlers run, both streams are flushed): freeing numpy's
    and the engine's ~150 modules and stopping OpenBLAS's threads took 0.04-0.09 s, a tenth of
    a 2 GB compare (benchmarks/compare_throughput.py). ``main`` itself returns, for callers in a
    process of their own."""
    rc = main()
    if _exit_without_teardown:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):      # a closed pipe or stream: nothing left to say
                pass
        atexit._run_exitfuncs()
        os._exit(rc)
    sys.exit(rc)


def _closed_pipe() -> int:
    """The reader went away (``tsprobe summary DUMP | head``): stop quietly, as a program killed by
    SIGPIPE would. stdout is pointed at /dev/null so the interpreter's final flush does not
    print a second traceback (the recipe of Python's signal documentation)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 128 + 13          # the shell's status for a process ended by SIGPIPE


if __name__ == "__main__":
    entry()
