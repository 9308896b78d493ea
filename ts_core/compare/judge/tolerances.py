"""Tolerances by dtype: how close two values of a dtype must be to agree."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from ...dumpfmt.dtypes import LOWEST_PRECISION_PREFIXES, dtype_name, is_exact


@dataclass(frozen=True)
class Tolerance:
    """``rtol``/``atol`` for element-wise checks; ``stat_rtol`` for recorded statistics.

    A statistics difference up to ``stat_rtol`` passes, up to 10x is a warning, beyond is an error.
    """

    rtol: float
    atol: float
    stat_rtol: float

    def to_dict(self) -> dict:
        return asdict(self)


# Float tolerances sit a few units in the last place above each format's precision:
# float32 eps ~1.2e-7 (cross-framework kernels drift ~1e-6), float16 ~9.8e-4, bfloat16 ~7.8e-3.
DEFAULT_TOLERANCES = {
    "float64": Tolerance(1e-7, 1e-9, 1e-7),
    "float32": Tolerance(1e-4, 1e-5, 1e-4),
    "float16": Tolerance(1e-3, 1e-3, 1e-3),
    "bfloat16": Tolerance(1e-2, 1e-3, 8e-3),   # msprobe rounds bf16 statistics to bf16
    "float8": Tolerance(1e-1, 1e-2, 5e-2),
    "exact": Tolerance(0.0, 0.0, 0.0),  # integers and bool
}

_COMPLEX = {"complex64": "float32", "complex128": "float64"}      # judged as their parts' dtype


def dtype_family(dtype: Optional[str]) -> str:
    """Map 'torch.float32', 'Float32', 'mindspore.bfloat16', 'int64' ... to a tolerance class."""
    if not dtype:
        return "float32"
    name = dtype_name(dtype)
    name = _COMPLEX.get(name, name)
    if name.startswith(LOWEST_PRECISION_PREFIXES):
        return "float8"
    if name in DEFAULT_TOLERANCES:
        return name
    if is_exact(name):
        return "exact"
    return "float32"


def pick_tolerance(golden_dtype: Optional[str], target_dtype: Optional[str],
                   rtol: Optional[float] = None, atol: Optional[float] = None) -> Tolerance:
    """The tolerance of the more precise of both sides' dtypes, then the user's overrides.

    A float32 tensor that one side computed in bfloat16 is judged as float32: the call where
    precision was lost fails, not a later exact up-cast of its result. A user ``rtol`` also
    sets ``stat_rtol``: one knob for "how close is close".
    """
    fams = {dtype_family(golden_dtype), dtype_family(target_dtype)}
    tol = min((DEFAULT_TOLERANCES[f] for f in fams), key=lambda t: (t.rtol, t.atol))
    return Tolerance(tol.rtol if rtol is None else rtol, tol.atol if atol is None else atol,
                     tol.stat_rtol if rtol is None else rtol)
