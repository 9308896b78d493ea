"""Throughput and peak memory of `tsprobe compare` on two tensor dumps of >= 1 GB each.

Builds two synthetic tsprobe tensor dumps (float32 .npy files named by a dump.json, target =
golden + small noise) in msprobe's layout (``dump_tensor_data/``) and the same two in the
packed layout (``tensor_format: packed``, one tar each, written by the tool's own pack
writer), runs `tsprobe compare` on each layout in a child process (interleaved, ``--repeat``
times) and reports MB/s (golden + target bytes read per second of wall time) and the child's
own peak RSS, against a baseline of this process reading the folder dumps with numpy only
(np.load + sum) in the same invocation.

    python benchmarks/compare_throughput.py [--gb 1.0] [--tensor-mb 16] [--repeat 2] [--keep DIR]
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


def build(root: str, n_files: int, elems: int, noise: float, seed: int) -> None:
    rank = os.path.join(root, "step0", "rank")
    data_dir = os.path.join(rank, "dump_tensor_data")
    os.makedirs(data_dir)
    rng = np.random.default_rng(0)
    noise_rng = np.random.default_rng(seed)
    data = {}
    for i in range(n_files):
        arr = rng.standard_normal(elems, dtype=np.float32)
        if noise:
            arr += noise_rng.standard_normal(elems, dtype=np.float32) * noise
        key = f"Functional.linear.{i}.forward"
        name = f"{key}.output.0.npy"
        np.save(os.path.join(data_dir, name), arr)
        a64 = arr.astype(np.float64)
        data[key] = {"input_args": [], "input_kwargs": {}, "output": [{
            "type": "torch.Tensor", "dtype": "torch.float32", "shape": [elems],
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
_CHILD = ("import resource, sys; from ts_core.cli import main; rc = main(sys.argv[1:]); "
          "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')); "
          "u = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]; "
          "print(hwm, sum(x.ru_utime + x.ru_stime for x in u), file=sys.stderr); sys.exit(rc)")


def run_compare(golden: str, target: str, out: str) -> tuple:
    """(wall seconds, peak RSS MB, CPU seconds) of one `tsprobe compare --workers 1` in a child
    process. CPU seconds say what the compare costs when other jobs share the cores: on an idle
    2-core machine the wall time would be about half of them (the kernel runs on both cores)."""
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, "compare", golden, target, "-o", out, "--no-html",
                           "--workers", "1"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    wall = time.perf_counter() - t0
    rss, cpu = proc.stderr.strip().splitlines()[-1].split()
    return wall, int(rss) / 1024, float(cpu)


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
    args = p.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="tscmp_")
    elems = int(args.tensor_mb * 2**20 / 4)
    n_files = max(1, int(args.gb * 2**30 / (elems * 4)))
    golden, target, out = (os.path.join(work, n) for n in ("golden", "target", "out"))
    if not os.path.exists(golden):
        print(f"building 2 dumps of {n_files} x {args.tensor_mb:g} MB in {work} ...", file=sys.stderr)
        build(golden, n_files, elems, 0.0, 1)
        build(target, n_files, elems, 1e-6, 2)
    if not os.path.exists(golden + "_packed"):
        pack(golden, golden + "_packed")
        pack(target, target + "_packed")
    total_mb = 2 * n_files * elems * 4 / 2**20
    base = numpy_baseline([golden, target])
    runs: dict = {"folder": [], "packed": []}
    for _ in range(args.repeat):
        for layout, suffix in (("folder", ""), ("packed", "_packed")):
            runs[layout].append(run_compare(golden + suffix, target + suffix, out))
    print(f"compared {total_mb:.0f} MB ({n_files} tensor pairs of {args.tensor_mb:g} MB), tsprobe compare --workers 1:")
    for layout, got in runs.items():
        rates = ", ".join(f"{total_mb / w:.0f}" for w, _, _ in got)
        best = min(w for w, _, _ in got)
        cpu = min(c for _, _, c in got)
        print(f"  {layout:6s} layout: {total_mb / best:.0f} MB/s wall, best (runs: {rates} MB/s); "
              f"{total_mb / cpu:.0f} MB per CPU second ({cpu:.2f} CPU s, start-up included); "
              f"peak RSS {max(r for _, r, _ in got):.0f} MB")
    print(f"baseline (numpy: mmap load + sum of both folder dumps, this process): {total_mb / base[0]:.0f} MB/s "
          f"wall, {total_mb / base[1]:.0f} MB per CPU second")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
