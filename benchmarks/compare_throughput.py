"""Throughput and peak memory of `tsprobe compare` on two tensor dumps of >= 1 GB each.

Builds two synthetic tsprobe tensor dumps (float32 or ``--dtype float16`` .npy files named by a
dump.json, target =
golden + small noise) in msprobe's layout (``dump_tensor_data/``) and the same two in the
packed layout (``tensor_format: packed``, one tar each, written by the tool's own pack
writer), runs `tsprobe compare` on each layout in a child process (interleaved, ``--repeat``
times) and reports MB/s (golden + target bytes read per second of wall time) and the child's
own peak RSS, against a baseline of this process reading the folder dumps with numpy only
(np.load + sum) in the same invocation.

Two kinds of pair: ``agreeing`` (every tensor within tolerance) and ``diverging`` (a third of
the target's tensors perturbed far beyond tolerance, so the compare names a first divergence
and diagnoses it, as a compare that finds something does). Each pair and layout also gets one
instrumented run that reports its time per stage (load, align, judge, explain, report), measured
in the child by timing the pipeline's stage functions; the timed runs are the plain CLI.

    python benchmarks/compare_throughput.py [--gb 1.0] [--tensor-mb 16] [--repeat 2] [--keep DIR]
        [--pairs agreeing,diverging] [--layouts folder,packed] [--dtype float32|float16]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))    # this checkout's ts_core, here and in children
sys.path.insert(0, ROOT)


def build(root: str, n_files: int, elems: int, noise: float, seed: int, diverge_every: int = 0,
          dtype: str = "float32") -> None:
    """A dump of `n_files` tensors of `dtype`; every `diverge_every`-th one (0: none) gets noise of
    1e-2 instead of `noise` (far beyond the float32 and float16 tolerances)."""
    rank = os.path.join(root, "step0", "rank")
    data_dir = os.path.join(rank, "dump_tensor_data")
    os.makedirs(data_dir)
    rng = np.random.default_rng(0)
    noise_rng = np.random.default_rng(seed)
    data = {}
    for i in range(n_files):
        arr = rng.standard_normal(elems, dtype=np.float32)
        scale = 1e-2 if diverge_every and i % diverge_every == 0 else noise
        if scale:
            arr += noise_rng.standard_normal(elems, dtype=np.float32) * scale
        arr = arr.astype(dtype)
        key = f"Functional.linear.{i}.forward"
        name = f"{key}.output.0.npy"
        np.save(os.path.join(data_dir, name), arr)
        a64 = arr.astype(np.float64)
        data[key] = {"input_args": [], "input_kwargs": {}, "output": [{
            "type": "torch.Tensor", "dtype": f"torch.{dtype}", "shape": [elems],
            "Max": float(a64.max()), "Min": float(a64.min()), "Mean": float(a64.mean()),
            "Norm": float(np.sqrt((a64 * a64).sum())), "requires_grad": False, "data_name": name}]}
    with open(os.path.join(rank, "dump.json"), "w") as f:
        json.dump({"task": "tensor", "level": "L1", "framework": "pytorch",
                   "dump_data_dir": data_dir, "data": data}, f)


def pack(root: str, packed: str) -> None:
    """The same dump in the packed layout: dump.json names the tar, the members are the files."""
    from ts_core.writer.tensor_files import TensorPackWriter

    src = os.path.join(root, "step0", "rank")
    rank = os.path.join(packed, "step0", "rank")
    os.makedirs(rank)
    errors = []
    writer = TensorPackWriter(rank, lambda a: a, errors.append)
    for name in sorted(os.listdir(os.path.join(src, "dump_tensor_data"))):
        # from memory, as the tool writes its snapshots: a tar written from memory-mapped sources
        # gets its page cache in another state, and reading it back cost 1.5x the CPU here
        writer.submit(name, np.load(os.path.join(src, "dump_tensor_data", name)))
    writer.close()
    if errors:
        raise errors[0]
    with open(os.path.join(src, "dump.json")) as f:
        doc = json.load(f)
    doc["dump_data_dir"] = os.path.join(rank, "dump_tensor_data.tar")
    doc["tensor_format"] = "packed"
    with open(os.path.join(rank, "dump.json"), "w") as f:
        json.dump(doc, f)


# The child's own peak: VmHWM of its address space (ru_maxrss would carry this parent's peak
# across the fork and exec); its CPU seconds from rusage.
# Stage times come from a second, instrumented run of each pair: the pipeline's stage functions
# wrapped with timers (load = Dump() reading dump.json, align, judge = every value pair, explain =
# first divergence + diagnosis, report = the rest of the wall time: writing compare.csv /
# summary.json, start-up included). The timed runs are not instrumented: wrapping the stages
# imports the compare engine before `tsprobe compare` starts, which its head start
# (ts_core/headstart.py) runs beside.
_STAGES = ("from ts_core.compare import pipeline as P\n"
           "def timed(name, f):\n"
           "    def w(*a, **k):\n"
           "        t0 = time.perf_counter(); r = f(*a, **k); T[name] = T.get(name, 0) + time.perf_counter() - t0\n"
           "        return r\n"
           "    return w\n"
           "for stage, fn in (('load', 'Dump'), ('align', 'align_calls'), ('judge', 'compare_calls'), "
           "('explain', 'find_first_divergence'), ('explain', 'diagnose')):\n"
           "    setattr(P, fn, timed(stage, getattr(P, fn)))\n")
# The child runs the `tsprobe` program itself (cli.entry, which ends a compare without interpreter
# teardown) and reports from an atexit handler, which entry runs.
_CHILD = ("import atexit, resource, sys, time, json; T = {}\n"
          "{stages}"
          "def report():\n"
          "    hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
          "    u = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]\n"
          "    print(json.dumps({'rss_kb': hwm, 'cpu': sum(x.ru_utime + x.ru_stime for x in u), 'stages': T, "
          "'torch': 'torch' in sys.modules}), file=sys.stderr)\n"
          "atexit.register(report)\n"
          "from ts_core.cli import entry; entry()")


def _child_env() -> dict:
    """This checkout first; compiled bytecode cached outside the tree (as an installed package
    has it: with PYTHONDONTWRITEBYTECODE every start-up compiled ts_core again, ~1.4 s here)."""
    env = dict(os.environ, PYTHONPATH=ROOT,
               PYTHONPYCACHEPREFIX=os.path.join(tempfile.gettempdir(), "tsprobe_bench_pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_compare(golden: str, target: str, out: str, stages: bool = False) -> tuple:
    """(wall seconds, peak RSS MB, CPU seconds, stage seconds, torch imported) of one
    `tsprobe compare --workers 1` in a child process (``stages``: the instrumented run).
    CPU seconds say what the compare costs when other jobs share the cores: on an idle
    2-core machine the wall time would be about half of them (the kernel runs on both cores)."""
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    child = _CHILD.replace("{stages}", _STAGES if stages else "")
    proc = subprocess.run([sys.executable, "-c", child, "compare", golden, target, "-o", out, "--no-html",
                           "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, env=_child_env())
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"compare failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    doc = json.loads(proc.stderr.strip().splitlines()[-1])
    stages = dict(doc["stages"])
    stages["report"] = max(0.0, wall - sum(stages.values()))
    return wall, doc["rss_kb"] / 1024, float(doc["cpu"]), stages, doc["torch"]


def numpy_baseline(roots) -> tuple:
    """(wall, CPU) seconds of numpy reading both dumps once."""
    c0 = time.process_time()
    t0 = time.perf_counter()
    for root in roots:
        d = os.path.join(root, "step0", "rank", "dump_tensor_data")
        for name in sorted(os.listdir(d)):
            np.load(os.path.join(d, name), mmap_mode="r").sum(dtype=np.float64)
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, default=1.0, help="size of each dump")
    p.add_argument("--tensor-mb", type=float, default=16.0)
    p.add_argument("--repeat", type=int, default=2, help="compares per layout, interleaved")
    p.add_argument("--keep", help="build the dumps here and keep them")
    p.add_argument("--pairs", default="agreeing,diverging", help="agreeing, diverging or both")
    p.add_argument("--layouts", default="folder,packed", help="folder, packed or both")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16"), help="the tensors' dtype")
    args = p.parse_args()
    kinds = [k for k in ("agreeing", "diverging") if k in args.pairs.split(",")]
    layouts = [(lay, "" if lay == "folder" else "_packed") for lay in ("folder", "packed")
               if lay in args.layouts.split(",")]
    work = args.keep or tempfile.mkdtemp(prefix="tscmp_")
    itemsize = np.dtype(args.dtype).itemsize
    elems = int(args.tensor_mb * 2**20 / itemsize)
    n_files = max(1, int(args.gb * 2**30 / (elems * itemsize)))
    golden, out = os.path.join(work, "golden"), os.path.join(work, "out")
    targets = {"agreeing": os.path.join(work, "target"), "diverging": os.path.join(work, "target_diverging")}
    if not os.path.exists(golden):
        print(f"building dumps of {n_files} x {args.tensor_mb:g} MB in {work} ...", file=sys.stderr)
        build(golden, n_files, elems, 0.0, 1, dtype=args.dtype)
    for kind in kinds:
        if not os.path.exists(targets[kind]):
            build(targets[kind], n_files, elems, 1e-6, 2, diverge_every=3 if kind == "diverging" else 0,
                  dtype=args.dtype)
    if any(lay == "packed" for lay, _ in layouts):
        for root in [golden] + [targets[k] for k in kinds]:
            if not os.path.exists(root + "_packed"):
                pack(root, root + "_packed")
    total_mb = 2 * n_files * elems * itemsize / 2**20
    base = numpy_baseline([golden, targets[kinds[0]]])
    runs: dict = {(k, lay): [] for k in kinds for lay, _ in layouts}
    staged = {(kind, layout): run_compare(golden + suffix, targets[kind] + suffix, out, stages=True)[3]
              for kind in kinds for layout, suffix in layouts}
    for _ in range(args.repeat):
        for kind in kinds:
            for layout, suffix in layouts:
                runs[(kind, layout)].append(run_compare(golden + suffix, targets[kind] + suffix, out))
    print(f"compared {total_mb:.0f} MB ({n_files} {args.dtype} tensor pairs of {args.tensor_mb:g} MB), "
          f"tsprobe compare --workers 1:")
    for (kind, layout), got in runs.items():
        rates = ", ".join(f"{total_mb / g[0]:.0f}" for g in got)
        best = min(got, key=lambda g: g[0])
        cpu = min(g[2] for g in got)
        stages = ", ".join(f"{k} {v:.2f}" for k, v in staged[(kind, layout)].items())
        print(f"  {kind:9s} {layout:6s} layout: {total_mb / best[0]:.0f} MB/s wall, best (runs: {rates} MB/s); "
              f"{total_mb / cpu:.0f} MB per CPU second ({cpu:.2f} CPU s, start-up included); "
              f"peak RSS {max(g[1] for g in got):.0f} MB; seconds per stage (instrumented run): {stages}"
              + ("; torch imported" if any(g[4] for g in got) else ""))
    print(f"baseline (numpy: mmap load + sum of both folder dumps, this process): {total_mb / base[0]:.0f} MB/s "
          f"wall, {total_mb / base[1]:.0f} MB per CPU second")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
