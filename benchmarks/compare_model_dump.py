"""Throughput of `tsprobe compare` on a real model's tensor dump, a third of whose tensors diverge.

compare_throughput.py times equal-sized synthetic tensors; a user's dump is one training step of
a model: hundreds of tensors from a few bytes to tens of MB, recorded per API call, forward and
backward, each row aligned, judged, explained and written. This script dumps one step of a
transformers GPT-2 (built from a config, no download) with tsprobe's tensor task, makes the
target a copy whose every third tensor file is perturbed far beyond tolerance (so the compare
names a first divergence and diagnoses it), and times the `tsprobe` program on the pair,
``--repeat`` times, reporting MB/s of tensor bytes read (both sides), its peak RSS, CPU seconds
and the time per stage of one instrumented run (see compare_throughput.run_compare).

    python benchmarks/compare_model_dump.py [--batch 8] [--seq 256] [--dtype float32|float16]
        [--repeat 3] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_throughput import run_compare  # noqa: E402


def dump_step(out: str, batch: int, seq: int, dtype: str) -> None:
    """One training step of a 4-layer GPT-2 dumped by tsprobe (tensor task, L1: every API call)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from ts_core import PrecisionDebugger

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, n_embd=384, n_head=6, vocab_size=8000, n_positions=seq, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg).to(getattr(torch, dtype))
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    dbg = PrecisionDebugger(dump_path=out, task="tensor", level="L1", step=[0])
    dbg.start(model)
    model(input_ids=ids, labels=ids).loss.backward()
    dbg.stop()
    dbg.step()
    dbg.close()


def perturb_copy(golden: str, target: str) -> int:
    """`target` = `golden` (hard links between its tensor files kept, as tsprobe writes one file
    for a tensor recorded under several names) with every third float tensor (in name order)
    scaled by 1 + 1e-2 noise, in place, and its statistics in dump.json recomputed; returns how
    many tensors were perturbed."""
    subprocess.run(["cp", "-a", golden, target], check=True)       # -a keeps the links among the copies
    rng = np.random.default_rng(1)
    perturbed = {}
    for root, _, files in os.walk(target):
        seen, floats = set(), []
        for name in sorted(f for f in files if f.endswith(".npy")):
            ino = os.stat(os.path.join(root, name)).st_ino
            if ino not in seen:
                seen.add(ino)
                arr = np.load(os.path.join(root, name))
                if arr.dtype.kind == "f" and arr.size:
                    floats.append((name, arr))
        for name, arr in floats[::3]:
            noisy = (arr * (1 + 1e-2 * rng.standard_normal(arr.shape))).astype(arr.dtype)
            with open(os.path.join(root, name), "r+b") as f:        # the same inode: every name of it
                np.save(f, noisy)
                f.truncate()
            ino = os.stat(os.path.join(root, name)).st_ino
            perturbed.update({n: noisy for n in files if os.stat(os.path.join(root, n)).st_ino == ino})
        if "dump.json" in files and perturbed:
            _restat(os.path.join(root, "dump.json"), perturbed)
    return sum(1 for _ in {id(a) for a in perturbed.values()})


def _restat(path: str, arrays: dict) -> None:
    """Max/Min/Mean/Norm of every leaf naming one of `arrays` recomputed (float64)."""
    with open(path) as f:
        doc = json.load(f)

    def walk(node):
        if isinstance(node, dict):
            arr = arrays.get(node.get("data_name"))
            if arr is not None:
                a = arr.astype(np.float64)
                node.update(Max=float(a.max()), Min=float(a.min()), Mean=float(a.mean()),
                            Norm=float(np.sqrt((a * a).sum())))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(doc["data"])
    with open(path, "w") as f:
        json.dump(doc, f)


def tensor_bytes(root: str) -> tuple:
    """(bytes of the tensor files as the compare names them, bytes stored (each linked file once), files)."""
    stats = [os.stat(os.path.join(r, f)) for r, _, fs in os.walk(root) for f in fs if f.endswith(".npy")]
    return sum(s.st_size for s in stats), sum({s.st_ino: s.st_size for s in stats}.values()), len(stats)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--keep", help="build the dumps here and keep them")
    args = p.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="tscmp_model_")
    golden, target, out = (os.path.join(work, k) for k in ("golden", "target", "out"))
    if not os.path.exists(golden):
        print(f"dumping one GPT-2 step ({args.dtype}, batch {args.batch}, seq {args.seq}) in {work} ...",
              file=sys.stderr)
        dump_step(golden, args.batch, args.seq, args.dtype)
    if not os.path.exists(target):
        print(f"perturbed {perturb_copy(golden, target)} tensor files of the target", file=sys.stderr)
    size, stored, files = tensor_bytes(golden)
    total_mb, stored_mb = 2 * size / 2**20, 2 * stored / 2**20
    stages = run_compare(golden, target, out, stages=True)[3]     # also warms the page cache
    runs = [run_compare(golden, target, out) for _ in range(args.repeat)]
    best = min(runs, key=lambda r: r[0])
    print(f"compared {total_mb:.0f} MB ({files} tensor files a side, {stored_mb:.0f} MB stored: a tensor recorded "
          f"under several names is one file; {args.dtype}; a third of the target's tensors perturbed), "
          f"tsprobe compare --workers 1 (MB/s: named bytes):")
    print(f"  {total_mb / best[0]:.0f} MB/s wall, best (runs: {', '.join(f'{total_mb / r[0]:.0f}' for r in runs)} "
          f"MB/s; {best[0]:.2f} s); {min(r[2] for r in runs):.2f} CPU s; peak RSS {max(r[1] for r in runs):.0f} MB; "
          f"seconds per stage (instrumented run): {', '.join(f'{k} {v:.2f}' for k, v in stages.items())}"
          + ("; torch imported" if any(r[4] for r in runs) else ""))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
