"""Relations between a golden and a target array that name a cause: one is a permutation of
the other, a constant multiple, differs only at the border, or by another recorded value.
numpy only; every function returns None when the relation does not hold."""
from __future__ import annotations

from itertools import permutations
from typing import Dict, List, Optional, Tuple

import numpy as np

RTOL, ATOL = 1e-5, 1e-7          # "the same number" for values copied or recomputed in float32


def magnitude(*arrays: np.ndarray) -> float:
    """The largest finite |value| of the arrays (0 when none): a scale for tolerances that a
    masked -inf score must not make infinite."""
    return max((float(np.abs(a[np.isfinite(a)]).max(initial=0)) for a in arrays), default=0.0)


def close(a: np.ndarray, b: np.ndarray, rtol: float = RTOL, atol: float = ATOL) -> bool:
    """The same numbers (an exact copy or a float32 recomputation); infinities only where both
    hold the same one."""
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=atol * max(1.0, magnitude(b))))


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / ||b|| (inf on a shape mismatch)."""
    if a.shape != b.shape:
        return float("inf")
    den = float(np.linalg.norm(b))
    num = float(np.linalg.norm(a - b))
    return num / den if den else (0.0 if num == 0 else float("inf"))


def permutation(g: np.ndarray, t: np.ndarray) -> Optional[str]:
    """How `t` rearranges `g`'s elements (a transposed or permuted weight), in words."""
    if g.shape != t.shape or g.size < 2 or close(t, g):
        return None
    if not np.allclose(np.sort(g, axis=None), np.sort(t, axis=None), rtol=RTOL, atol=ATOL):
        return None                  # not the same multiset of numbers: no rearrangement
    nd = g.ndim
    if nd >= 2 and g.shape[-1] == g.shape[-2] and close(t, np.swapaxes(g, -1, -2)):
        return "the transpose of golden's (last two axes swapped)"
    if 2 <= nd <= 4:
        for p in permutations(range(nd)):
            if p != tuple(range(nd)) and all(g.shape[p[i]] == g.shape[i] for i in range(nd)) \
                    and close(t, np.transpose(g, p)):
                return f"golden's with its axes permuted {p}"
    for k in (2, 3, 4, 8):          # blocks of axis 0 reordered (LSTM/GRU gates, fused q/k/v)
        if g.shape[0] % k or g.shape[0] // k < 1:
            continue
        blocks = np.split(g, k, axis=0)
        for p in permutations(range(k)):
            if p != tuple(range(k)) and close(t, np.concatenate([blocks[i] for i in p], axis=0)):
                return f"golden's with its {k} blocks along axis 0 reordered {p}"
    blocks = block_permutation(g, t)
    if blocks is not None:
        return blocks
    flat_g, flat_t = g.reshape(-1), t.reshape(-1)
    if g.ndim == 2 and close(flat_t.reshape(g.shape[::-1]).T.reshape(-1), flat_g):
        return "golden's read in the other memory order (a reshape where a transpose was meant)"
    return None


MAX_BLOCKS = 1024       # block counts tried for a reordering of axis 0 (heads x q/k/v of a large model)


def block_permutation(g: np.ndarray, t: np.ndarray) -> Optional[str]:
    """`t` is `g` with equal blocks of axis 0 reordered, for the fewest blocks that show it: a
    fused q/k/v weight interleaved per head (Megatron's [q0 k0 v0 q1 k1 v1 ...] against
    [q0 q1 ... k0 k1 ... v0 v1 ...]), gates in another order. Blocks are matched by their bytes
    (a reordering copies them exactly), so every block count costs one pass."""
    n = g.shape[0] if g.ndim else 0
    if g.shape != t.shape or n < 2:
        return None
    gc, tc = np.ascontiguousarray(g), np.ascontiguousarray(t)
    for k in range(2, min(n, MAX_BLOCKS) + 1):
        if n % k:
            continue
        size = n // k
        where: Dict[bytes, List[int]] = {}
        for i in range(k):
            where.setdefault(gc[i * size:(i + 1) * size].tobytes(), []).append(i)
        order = []
        for j in range(k):
            src = where.get(tc[j * size:(j + 1) * size].tobytes())
            if not src:
                break
            order.append(src.pop(0))
        if len(order) < k or order == sorted(order):
            continue
        return f"golden's with its {k} blocks of {size} along axis 0 reordered" + _grid(order)
    return None


def _grid(order: List[int]) -> str:
    """An order of blocks in words: read as the transpose of an a x b grid (interleaved per head:
    [q0 k0 v0 q1 k1 v1] against [q0 q1 k0 k1 v0 v1]) when it is one, else the order itself."""
    k = len(order)
    for a in range(2, k):
        if k % a:
            continue
        b = k // a
        if order == [j * a + i for i in range(a) for j in range(b)]:
            return (f": read as a {b} x {a} grid in the other order (blocks interleaved per group, e.g. q/k/v "
                    f"per head, Megatron's layout, against grouped)")
    shown = ", ".join(map(str, order[:16])) + (", ..." if k > 16 else "")
    return f" ({shown})"


def constant_ratio(g: np.ndarray, t: np.ndarray, rtol: float = 1e-4) -> Optional[Tuple[float, float, int]]:
    """`t` = c * `g` for one constant c != 1 on the elements that differ (elements equal on
    both sides, such as masked -1e9 entries, are allowed). Returns (c, share of differing
    elements that fit, how many differ)."""
    if g.shape != t.shape or g.size == 0:
        return None
    same = t == g                       # masked fills, zeros: equal on both sides, left out of the scale
    if same.all():
        return None
    scale = max(float(np.abs(g[~same]).max()), float(np.abs(t[~same]).max()))
    if scale == 0:
        return None
    differ = ~same & ~np.isclose(t, g, rtol=1e-6, atol=1e-9 * scale)
    use = differ & (np.abs(g) > 1e-6 * scale)
    if use.sum() < max(2, 0.05 * g.size):
        return None
    c = float(np.median(t[use] / g[use]))
    if not np.isfinite(c) or abs(c - 1.0) < 10 * rtol or c == 0:
        return None
    fits = np.isclose(t[differ], c * g[differ], rtol=rtol * 10, atol=rtol * scale)
    share = float(fits.mean())
    return (c, share, int(differ.sum())) if share >= 0.98 else None


def stats_ratio(gs: Dict, ts: Dict, rtol: float = 1e-3) -> Optional[float]:
    """The same constant ratio between target's and golden's Max/Min/Mean/Norm (statistics of
    c * x are c times those of x for c > 0; Max and Min swap for c < 0)."""
    names = ("Max", "Min", "Mean", "Norm")
    try:
        g = {k: float(gs[k]) for k in names}
        t = {k: float(ts[k]) for k in names}
    except (KeyError, TypeError, ValueError):
        return None
    if g["Norm"] == 0:
        return None
    c = t["Norm"] / g["Norm"]
    if abs(c - 1) < 10 * rtol:
        return None
    pairs = [("Max", "Max"), ("Min", "Min"), ("Mean", "Mean")]
    if c < 0:
        pairs = [("Max", "Min"), ("Min", "Max"), ("Mean", "Mean")]
    for tk, gk in pairs:
        want = c * g[gk]
        if abs(t[tk] - want) > rtol * max(abs(want), 1e-12 * abs(g["Norm"])) + 1e-30:
            return None
    return c


def border_only(g: np.ndarray, t: np.ndarray, tol: float) -> Optional[Tuple[int, int, int]]:
    """Every element beyond `tol` lies within k (1 or 2) of the border of the last two axes,
    and the interior agrees. Returns (k, differing elements, all elements)."""
    if g.shape != t.shape or g.ndim < 3 or min(g.shape[-2:]) < 5:
        return None
    bad = np.abs(t - g) > tol
    if not bad.any():
        return None
    h, w = g.shape[-2:]
    for k in (1, 2):
        if (h - 2 * k) * (w - 2 * k) * 3 < h * w:      # too small an interior to tell a border apart
            break
        interior = np.zeros(g.shape[-2:], dtype=bool)
        interior[k:-k, k:-k] = True
        if not bad[..., interior].any():
            sides = sum(bool(x.any()) for x in (bad[..., :k, :], bad[..., -k:, :], bad[..., :, :k], bad[..., :, -k:]))
            return (k, int(bad.sum()), int(bad.size)) if sides >= 2 else None
    return None


def difference_is(g: np.ndarray, t: np.ndarray, candidates: List[Tuple[str, np.ndarray]]) -> Optional[Tuple[str, str]]:
    """golden - target (or target - golden) equals one candidate value: a dropped (or added)
    residual. Returns (candidate name, "golden - target" | "target - golden")."""
    if g.shape != t.shape or close(t, g):
        return None
    finite = np.isfinite(g) & np.isfinite(t)
    if not np.array_equal(g[~finite], t[~finite]):
        return None                  # NaN, or infinities in different places: no difference to read
    d = g[finite] - t[finite]        # masked (-inf) scores are equal on both sides: left out
    for name, c in candidates:
        if c.shape != g.shape:
            continue
        c = c[finite]
        if not np.isfinite(c).all() or not np.abs(c).max(initial=0):
            continue
        scale = max(magnitude(c), magnitude(g))
        if np.allclose(d, c, rtol=1e-4, atol=1e-5 * scale):
            return name, "golden - target"
        if np.allclose(-d, c, rtol=1e-4, atol=1e-5 * scale):
            return name, "target - golden"
    return None


def element_changes(g: np.ndarray, t: np.ndarray) -> Optional[str]:
    """Where two arrays of one shape differ, in words: one element, one row shifted by a
    constant, or how many elements and the worst one."""
    if g.shape != t.shape:
        return f"shapes differ: golden {list(g.shape)}, target {list(t.shape)}"
    scale = max(float(np.abs(g).max(initial=0)), 1e-30)
    diff = ~np.isclose(t, g, rtol=1e-6, atol=1e-9 * scale)
    n = int(diff.sum())
    if n == 0:
        return None
    idx = np.unravel_index(int(np.argmax(np.abs(t - g))), g.shape)
    worst = f"[{', '.join(str(int(i)) for i in idx)}] golden {g[idx]:.6g}, target {t[idx]:.6g}"
    if n == 1:
        return f"1 element of {g.size} differs: {worst}"
    if g.ndim >= 2:
        rows = np.unique(np.argwhere(diff)[:, 0])
        if len(rows) == 1:
            r = int(rows[0])
            delta = (t[r] - g[r]).reshape(-1)
            if np.allclose(delta, delta[0], rtol=1e-4, atol=1e-6 * scale):
                return f"only row {r} differs, shifted by a constant {delta[0]:+.6g} ({n} of {g.size} elements)"
            return f"only row {r} differs ({n} of {g.size} elements; worst {worst})"
    return f"{n} of {g.size} elements differ; worst {worst}"
