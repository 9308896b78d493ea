"""Many-rank synthetic dumps written through tsprobe's own writer (ts_core.writer.DumpDir), for
the executor tests and benchmarks/compare_scale.py.

Each step/rank records a small data-parallel layer stack computed in numpy: ``linear.i`` (input,
weight, output = relu(x @ W)), then one ``all_reduce`` of the last activation. The target equals
the golden bit for bit except: a weight perturbed on one rank of the last step (a real
divergence there, carried to every rank by the all_reduce) and, on every rank, float32 rounding
noise on the all_reduce output (different bytes within tolerance: read, and passes).
"""
from __future__ import annotations

import zlib

from typing import Optional, Tuple

import numpy as np

from ts_core.dumpfmt import rank_dir
from ts_core.dumpfmt.refstats import reference_stats
from ts_core.writer import DumpDir


def crc32_hex(a) -> str:
    """The summary's ``md5`` field computed independently: zlib's CRC-32 of the raw bytes."""
    return f"{zlib.crc32(np.ascontiguousarray(a).view(np.uint8)) & 0xFFFFFFFF:08x}"

HEADER = {"task": "tensor", "level": "L1", "framework": "pytorch"}


def _summary(d: DumpDir, name: str, a: np.ndarray) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(a.shape), **reference_stats(a),
            "requires_grad": False, "md5": crc32_hex(a), "data_name": d.save_tensor(name, a)}


def write_rank(path: str, step: int, rank: int, *, layers: int = 3, width: int = 16, batch: int = 4,
               perturb: Optional[Tuple[int, int]] = None, noise: bool = False) -> None:
    """One rank folder. ``perturb``: (rank, layer) whose weight is scaled by 1.01 here."""
    rng = np.random.default_rng(1000 * step + rank)
    d = DumpDir(path, HEADER, tensor_to_numpy=np.asarray, raise_on_error=True)
    x = rng.standard_normal((batch, width), dtype=np.float32)
    for i in range(layers):
        w = np.random.default_rng(i).standard_normal((width, width), dtype=np.float32) / 4   # same on every rank
        if perturb is not None and perturb == (rank, i):
            w = w * np.float32(1.01)
        y = np.maximum(x @ w, 0).astype(np.float32)
        key = f"Functional.linear.{i}.forward"
        d.add_record(key, {"input_args": [_summary(d, f"{key}.input.0", x), _summary(d, f"{key}.input.1", w)],
                           "input_kwargs": {}, "output": [_summary(d, f"{key}.output.0", y)]})
        x = y
    key = "Distributed.all_reduce.0.forward"
    out = x * np.float32(2.0)
    if perturb is not None:         # the perturbed rank's difference reaches every rank
        out = out * np.float32(1.003)
    if noise:
        out = (out.astype(np.float64) * (1 + 1e-7 * rng.standard_normal(out.shape))).astype(np.float32)
    d.add_record(key, {"input_args": [_summary(d, f"{key}.input.0", x)], "input_kwargs": {},
                       "output": [_summary(d, f"{key}.output.0", out)]})
    d.close()


def write_dumps(root: str, ranks: int, steps: int, **kw) -> Tuple[str, str]:
    """golden and target dump roots under ``root`` (``steps`` x ``ranks`` rank folders each)."""
    golden, target = f"{root}/golden", f"{root}/target"
    for s in range(steps):
        for r in range(ranks):
            write_rank(rank_dir(golden, s, r), s, r, **kw)
            perturb = (ranks // 2, 1) if s == steps - 1 else None
            write_rank(rank_dir(target, s, r), s, r, perturb=perturb, noise=True, **kw)
    return golden, target
