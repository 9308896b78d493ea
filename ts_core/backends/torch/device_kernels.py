"""Statistics and CRC-32 of device tensors, one Triton launch per tensor, no host sync.

Imported by tensors.py only when a tensor that is not summarised on the host (CUDA, or any tensor
with ``TSPROBE_DEVICE_PATH=1``) meets the tool: ``ts_core`` imports without torch or triton.

Where the results go: a per-device arena (``Arena``), one int64 buffer (a float64 view shares its
memory) zeroed once when it is made, in which every recorded tensor takes a few slots: statistics
4 (max, min, mean, norm as float64) plus 1 (the launch's program counter), a CRC 1 (the CRC as an
integer). A flush brings every arena chunk it needs to the host in one transfer per chunk
(``Slot.value``): one per device per flush in the steady state; nothing is stacked, nothing syncs
while recording.

Statistics (``_stats_kernel``): each of P programs reads a grid-stride share of the elements
(up to 4-D strided: no copy of a non-contiguous tensor), accumulating in float64 the sum and the
sum of squares, and max, min and "a NaN was met". Each program writes its partials to a scratch
area, then counts itself in with an atomic add on an integer-valued float64 (exact, so order does
not matter); the program that counts last reduces the P partials in a fixed tree and writes the
row. Same tensor, same P (set from its size and the GPU's SM count), same bits: deterministic.
Float64 accumulation makes the mean and norm of any finite float32/float16/bfloat16 tensor finite;
float64 input also keeps power-of-two scaled sums, used when its plain sums overflow double.
NaN/Inf as the framework path: a NaN makes every statistic NaN; an Inf makes Max/Min/Norm
infinite and the Mean infinite or NaN (+Inf and -Inf), IEEE arithmetic as torch's ops.

CRC-32 (``_crc_kernel``), zlib's polynomial and values, computed on the device: 4 bytes per tensor
cross the bus. CRC is linear over GF(2). The byte stream is front-padded with zeros (which do not
change a CRC that starts from 0) to P programs x T tiles x TW words. Word j of a tile contributes
``w_j * x^(32*(TW-j)) mod P`` (a per-lane constant, one GF(2) multiply per word); a tile's CRC is
the XOR of its lanes, a program folds its tiles in order (multiply by x^(32*TW)), shifts its CRC
past the programs after it (x^(32*T*TW*k), k's bits from the table of x^(2^i)), and XORs it into
the slot atomically (XOR is exact: order does not matter). The start value 0xFFFFFFFF and the final
XOR are one constant per length, XORed in by program 0 (``_init_term``, computed on the host).

md5 mode wants both of every tensor: ``_stats_crc_kernel`` runs the two bodies (``_stats_part``,
``_crc_part``) in one launch on the CRC's grid (the statistics take any number of programs).
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from .device_arena import STATS_SLOTS, Arenas, Slot

if os.environ.get("TSPROBE_DEVICE_PATH") == "1":
    # host tensors through the kernels (tests, benchmarks): Triton's interpreter, which @triton.jit
    # below reads when this module is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton                     # noqa: E402  (ImportError: tensors.py falls back to torch ops)
import triton.language as tl      # noqa: E402

POLY = 0xEDB88320                  # zlib's CRC-32, reflected
PARTIALS = 7                       # per program: sum, squares, max, min, NaN seen, scaled sum, scaled squares
BLOCK = 1024                       # statistics: elements per program per iteration
LOG_TW = 10                        # CRC: 2^10 32-bit words per tile (2^6 in the interpreter: faster tests)
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
PMAX = 1024                        # most programs per launch (statistics and CRC)

_INTERPRETER_LOCK = threading.Lock()


# Tests and benchmarks wrap this to count launches: ``_launch(kernel, grid, *args, **meta)``.
def _launch(kernel: Any, grid: Tuple[int], *args: Any, **meta: Any) -> None:
    if INTERPRETED:        # the interpreter copies each argument back whole: one launch at a time
        with _INTERPRETER_LOCK:
            kernel[grid](*args, **meta)
    else:
        kernel[grid](*args, **meta)


launch: Callable[..., None] = _launch


# ---- GF(2) helpers (host, Python) -----------------------------------------------------------
def multmodp(a: int, b: int) -> int:
    """a * b modulo the CRC polynomial, reflected (zlib's multmodp)."""
    m, p = 1 << 31, 0
    while m:
        if a & m:
            p ^= b
        b = (b >> 1) ^ POLY if b & 1 else b >> 1
        m >>= 1
    return p


X2N = [1 << 30]                    # x^(2^k) mod P for k = 0..31 (x^1 is bit 30, reflected)
for _ in range(31):
    X2N.append(multmodp(X2N[-1], X2N[-1]))


def x8nmodp(nbytes: int) -> int:
    """x^(8 * nbytes) mod P: the operator that appends `nbytes` zero bytes."""
    p, k = 1 << 31, 3
    while nbytes:
        if nbytes & 1:
            p = multmodp(X2N[k & 31], p)
        nbytes >>= 1
        k += 1
    return p


_INIT: Dict[int, int] = {}


def _init_term(nbytes: int) -> int:
    """What zlib's start value 0xFFFFFFFF and final XOR add to the raw CRC of `nbytes` bytes."""
    v = _INIT.get(nbytes)
    if v is None:
        v = _INIT[nbytes] = multmodp(x8nmodp(nbytes), 0xFFFFFFFF) ^ 0xFFFFFFFF
        if len(_INIT) > 4096:
            _INIT.clear()
    return v


# ---- kernels ----------------------------------------------------------------------------------
@triton.jit
def _mulmod(a, b):
    """Vectorised multmodp (a, b uint32 of the same shape or a scalar a)."""
    p = b * 0
    for i in tl.static_range(32):
        bit = (a >> (31 - i)) & 1
        p = p ^ tl.where(bit != 0, b, 0)
        b = tl.where((b & 1) != 0, (b >> 1) ^ 0xEDB88320, b >> 1)
    return p


@triton.jit
def _finish(out_ptr, n, s, q, mx, mn, nan, ss, sq2, WIDE: tl.constexpr):
    """Write max, min, mean, norm of one tensor (NaN anywhere: all four NaN)."""
    mean = s / n
    norm = tl.sqrt(q)
    if WIDE:      # float64 input whose sums overflowed double: the power-of-two scaled sums
        finite = (mx == mx) & (mn == mn) & (tl.abs(mx) < float("inf")) & (tl.abs(mn) < float("inf"))
        wmean = tl.minimum(tl.maximum((ss / n) * 18446744073709551616.0, mn), mx)
        mean = tl.where(finite & (tl.abs(s) == float("inf")), wmean, mean)
        norm = tl.where(finite & (q == float("inf")), tl.sqrt(sq2) * 4.149515568880993e180, norm)
    nanv = s * 0.0 + float("nan")
    tl.store(out_ptr, tl.where(nan != 0, nanv, mx))
    tl.store(out_ptr + 1, tl.where(nan != 0, nanv, mn))
    tl.store(out_ptr + 2, tl.where(nan != 0, nanv, mean))
    tl.store(out_ptr + 3, tl.where(nan != 0, nanv, norm))


@triton.jit
def _stats_part(x_ptr, out_ptr, scratch_ptr, pid, n, s1, s2, s3, t0, t1, t2, t3, P,
                CONTIG: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr, PMAX: tl.constexpr):
    """Program `pid` of P: its share of the statistics; the last one to finish writes the row."""
    lanes64 = tl.arange(0, BLOCK).to(tl.int64)
    acc_s = tl.zeros([BLOCK], tl.float64)
    acc_q = tl.zeros([BLOCK], tl.float64)
    acc_ss = tl.zeros([BLOCK], tl.float64)
    acc_sq2 = tl.zeros([BLOCK], tl.float64)
    acc_mx = tl.full([BLOCK], float("-inf"), tl.float64)
    acc_mn = tl.full([BLOCK], float("inf"), tl.float64)
    acc_nan = tl.zeros([BLOCK], tl.int32)
    tiles = tl.cdiv(n, BLOCK)
    for tile in range(pid, tiles, P):
        idx = (lanes64 * 0 + tile) * BLOCK + lanes64         # int64 before the product
        mask = idx < n
        if CONTIG:
            off = idx
        else:       # row-major index -> up to 4-D strided offset
            i3 = idx % s3
            r = idx // s3
            i2 = r % s2
            r = r // s2
            i1 = r % s1
            i0 = r // s1
            off = i0 * t0 + i1 * t1 + i2 * t2 + i3 * t3
        v = tl.load(x_ptr + off, mask=mask, other=0).to(tl.float64)
        acc_s += v
        acc_q += v * v
        if WIDE:
            a = v * 5.421010862427522e-20          # 2^-64
            b = v * 2.409919865102884e-181         # 2^-600
            acc_ss += a
            acc_sq2 += b * b
        acc_mx = tl.where(mask, tl.maximum(acc_mx, v), acc_mx)
        acc_mn = tl.where(mask, tl.minimum(acc_mn, v), acc_mn)
        acc_nan = acc_nan | (v != v).to(tl.int32)
    s = tl.sum(acc_s, axis=0)
    q = tl.sum(acc_q, axis=0)
    ss = tl.sum(acc_ss, axis=0)
    sq2 = tl.sum(acc_sq2, axis=0)
    mx = tl.max(acc_mx, axis=0)
    mn = tl.min(acc_mn, axis=0)
    nan = tl.max(acc_nan, axis=0)
    if P == 1:
        _finish(out_ptr, n, s, q, mx, mn, nan, ss, sq2, WIDE)
    else:
        part = scratch_ptr + pid * 7
        tl.store(part, s)
        tl.store(part + 1, q)
        tl.store(part + 2, mx)
        tl.store(part + 3, mn)
        tl.store(part + 4, nan.to(tl.float64))
        tl.store(part + 5, ss)
        tl.store(part + 6, sq2)
        tl.debug_barrier()
        done = tl.atomic_add(out_ptr + 4, 1.0, sem="acq_rel")      # integer-valued: exact in any order
        if done == P - 1:                                            # the last program reduces
            ps = tl.arange(0, PMAX)
            m = ps < P
            base = scratch_ptr + ps * 7
            s = tl.sum(tl.load(base, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
            q = tl.sum(tl.load(base + 1, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
            mx = tl.max(tl.load(base + 2, mask=m, other=float("-inf"), cache_modifier=".cg"), axis=0)
            mn = tl.min(tl.load(base + 3, mask=m, other=float("inf"), cache_modifier=".cg"), axis=0)
            nan = tl.max(tl.load(base + 4, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
            ss = tl.sum(tl.load(base + 5, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
            sq2 = tl.sum(tl.load(base + 6, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
            _finish(out_ptr, n, s, q, mx, mn, nan, ss, sq2, WIDE)


@triton.jit
def _stats_kernel(x_ptr, out_base, out_off, scratch_base, scratch_off, n, s1, s2, s3, t0, t1, t2, t3, P,
                  CONTIG: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr, PMAX: tl.constexpr):
    _stats_part(x_ptr, out_base + out_off, scratch_base + scratch_off, tl.program_id(0), n, s1, s2, s3,
                t0, t1, t2, t3, P, CONTIG, WIDE, BLOCK, PMAX)


@triton.jit
def _crc_part(x_ptr, out_ptr, lane_ptr, x2n_ptr, pid, nbytes, pad, T, LOG_T, init, P, LOG_P,
              TW: tl.constexpr, LOG_TW: tl.constexpr):
    """Program `pid` of P: the CRC of its T tiles, shifted into place and XORed into the slot."""
    src = x_ptr.to(tl.pointer_type(tl.uint8))
    lanes = tl.arange(0, TW)
    lanes64 = lanes.to(tl.int64)
    # the tables are int32 bit patterns (torch's uint32 is not a full dtype everywhere)
    c = tl.load(lane_ptr + lanes).to(tl.uint32, bitcast=True)                 # x^(32*(TW-j)) mod P
    k_tile = tl.load(x2n_ptr + ((5 + LOG_TW) & 31)).to(tl.uint32, bitcast=True)   # x^(32*TW)
    acc = k_tile * 0                                      # uint32 zero
    for i in range(0, T):
        word = ((lanes64 * 0 + pid * T + i) * TW + lanes64) * 4 - pad     # first byte, unpadded
        w = acc * 0 + tl.zeros([TW], tl.uint32)
        for b in tl.static_range(4):
            at = word + b
            byte = tl.load(src + at, mask=(at >= 0) & (at < nbytes), other=0).to(tl.uint32)
            w = w | (byte << (8 * b))
        tile = tl.xor_sum(_mulmod(c, w), axis=0)
        acc = _mulmod(k_tile, acc) ^ tile
    after = P - 1 - pid                                   # programs after this one
    for b in range(0, LOG_P):               # LOG_P bits: P - 1 < 2^LOG_P
        kb = tl.load(x2n_ptr + ((5 + LOG_TW + LOG_T + b) & 31)).to(tl.uint32, bitcast=True)  # x^(32*TW*T*2^b)
        acc = tl.where(((after >> b) & 1) != 0, _mulmod(kb, acc), acc)
    acc = tl.where(pid == 0, acc ^ init, acc)
    tl.atomic_xor(out_ptr, acc.to(tl.int64))


@triton.jit
def _crc_kernel(x_ptr, out_base, out_off, lane_ptr, x2n_ptr, nbytes, pad, T, LOG_T, init, P, LOG_P,
                TW: tl.constexpr, LOG_TW: tl.constexpr):
    _crc_part(x_ptr, out_base + out_off, lane_ptr, x2n_ptr, tl.program_id(0), nbytes, pad, T, LOG_T, init, P,
              LOG_P, TW, LOG_TW)


@triton.jit
def _stats_crc_kernel(x_ptr, out_base, out_off, scratch_base, scratch_off, n, crc_base, crc_off, lane_ptr,
                      x2n_ptr, nbytes, pad, T, LOG_T, init, P, LOG_P, WIDE: tl.constexpr,
                      BLOCK: tl.constexpr, PMAX: tl.constexpr, TW: tl.constexpr, LOG_TW: tl.constexpr):
    """md5 mode: statistics and CRC of one contiguous tensor in one launch, on the CRC's grid (the
    statistics take any number of programs; the bytes are read twice, from the same cache)."""
    pid = tl.program_id(0)
    _stats_part(x_ptr, out_base + out_off, scratch_base + scratch_off, pid, n, 1, 1, n, 0, 0, 0, 1, P,
                True, WIDE, BLOCK, PMAX)
    _crc_part(x_ptr, crc_base + crc_off, lane_ptr, x2n_ptr, pid, nbytes, pad, T, LOG_T, init, P, LOG_P, TW, LOG_TW)


# ---- launches ---------------------------------------------------------------------------------
_SMS: Dict[Any, int] = {}


def _programs_max(device: torch.device) -> int:
    """How many programs a launch may use on `device` (4 per SM; 8 in the interpreter)."""
    sms = _SMS.get(device)
    if sms is None:
        sms = _SMS[device] = 4 * torch.cuda.get_device_properties(device).multi_processor_count \
            if device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1" else 8
    return min(sms, PMAX)


def _collapse(t: torch.Tensor) -> Optional[Tuple[List[int], List[int]]]:
    """Sizes and strides of `t` with mergeable dims merged and size-1 dims dropped, padded to 4
    dims; None when more than 4 remain."""
    dims = [(s, st) for s, st in zip(t.shape, t.stride()) if s != 1]
    merged: List[List[int]] = []
    for s, st in dims:
        if merged and merged[-1][1] == s * st:
            merged[-1] = [merged[-1][0] * s, st]
        else:
            merged.append([s, st])
    if len(merged) > 4:
        return None
    merged = [[1, 0]] * (4 - len(merged)) + merged
    return [m[0] for m in merged], [m[1] for m in merged]


_KERNEL_DTYPES = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
                  torch.int16, torch.int32, torch.int64, torch.bool}


class DeviceKernels:
    """The launches for one adapter: ``stats(t)`` and ``crc32(t)`` return a ``Slot``;
    ``stats_and_crc32(t)`` both, from one launch (md5 mode)."""

    def __init__(self, arenas: Arenas) -> None:
        self.arena = arenas.get
        self._tables_of: Dict[Any, Tuple[torch.Tensor, torch.Tensor]] = {}

    def stats(self, t: torch.Tensor) -> Optional[Slot]:
        """Max, min, mean, norm of a real tensor of a kernel dtype (None: not one)."""
        if t.dtype not in _KERNEL_DTYPES:
            return None
        n = t.numel()
        shape = None if t.is_contiguous() else _collapse(t)
        if shape is None and not t.is_contiguous():
            t = t.contiguous()
        p = max(1, min(triton.cdiv(n, BLOCK), _programs_max(t.device)))
        chunk, off, soff = self.arena(t.device).take(STATS_SLOTS, PARTIALS * p if p > 1 else 0)
        sizes, strides = shape if shape is not None else ([1, 1, 1, n], [0, 0, 0, 1])
        try:
            launch(_stats_kernel, (p,), t, chunk.floats, off, chunk.scratch, soff, n, sizes[1], sizes[2], sizes[3],
                   strides[0], strides[1], strides[2], strides[3], p, CONTIG=shape is None,
                   WIDE=t.dtype == torch.float64, BLOCK=BLOCK, PMAX=PMAX)
        except BaseException:
            chunk.launched(off)          # never written: no fetch waits for it
            raise
        return Slot(chunk, off, 0)

    def crc32(self, t: torch.Tensor) -> Slot:
        """CRC-32 of the bytes of `t` (a contiguous copy first when it is not contiguous)."""
        if not t.is_contiguous():
            t = t.contiguous()
        p, args, meta = self._crc_plan(t)
        chunk, off, _ = self.arena(t.device).take(1, 0)
        try:
            launch(_crc_kernel, (p,), t, chunk.ints, off, *args, **meta)
        except BaseException:
            chunk.launched(off)
            raise
        return Slot(chunk, off, 1)

    def stats_and_crc32(self, t: torch.Tensor) -> Optional[Tuple[Slot, Slot]]:
        """md5 mode: ``(stats(t), crc32(t))`` of a contiguous tensor in one launch (None: not a
        kernel dtype, or not contiguous; ask for the two apart)."""
        if t.dtype not in _KERNEL_DTYPES or not t.is_contiguous() or t.numel() == 0:
            return None
        p, args, meta = self._crc_plan(t)
        arena = self.arena(t.device)
        chunk, off, soff = arena.take(STATS_SLOTS, PARTIALS * p if p > 1 else 0)
        try:
            crc_chunk, crc_off, _ = arena.take(1, 0)
        except BaseException:
            chunk.launched(off)
            raise
        try:
            launch(_stats_crc_kernel, (p,), t, chunk.floats, off, chunk.scratch, soff, t.numel(), crc_chunk.ints,
                   crc_off, *args, WIDE=t.dtype == torch.float64, BLOCK=BLOCK, PMAX=PMAX, **meta)
        except BaseException:
            chunk.launched(off)
            crc_chunk.launched(crc_off)
            raise
        return Slot(chunk, off, 0), Slot(crc_chunk, crc_off, 1)

    def _crc_plan(self, t: torch.Tensor) -> Tuple[int, tuple, dict]:
        """(programs, arguments after the slot, meta) of the CRC of contiguous `t`: P programs of
        T tiles (T a power of two, for the shift table), the stream front-padded to fill them."""
        log_tw = 6 if INTERPRETED else LOG_TW
        tw = 1 << log_tw
        nbytes = t.numel() * t.element_size()
        tiles = max(1, triton.cdiv(triton.cdiv(nbytes, 4), tw))
        pmax = _programs_max(t.device)
        per = 1                              # tiles per program: a power of two (the shift table)
        while per * pmax < tiles:
            per *= 2
        p = triton.cdiv(tiles, per)
        pad = p * per * tw * 4 - nbytes       # leading zero bytes: no change to a CRC started at 0
        lanes, x2n = self._tables(t.device, log_tw)
        return p, (lanes, x2n, nbytes, pad, per, per.bit_length() - 1, _init_term(nbytes), p,
                   (p - 1).bit_length()), {"TW": tw, "LOG_TW": log_tw}

    def _tables(self, device: torch.device, log_tw: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Per-lane constants x^(32*(TW-j)) and x^(2^k), on `device`, made once."""
        tables = self._tables_of.get(device)
        if tables is None:
            tw = 1 << log_tw
            tables = self._tables_of[device] = tuple(
                torch.from_numpy(np.array(v, dtype=np.uint32).view(np.int32)).to(device)
                for v in ([x8nmodp(4 * (tw - j)) for j in range(tw)], X2N))
        return tables
