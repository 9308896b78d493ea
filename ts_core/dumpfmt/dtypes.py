"""Dtype names as dumps write them: ``torch.float32``, MindSpore's ``Float32``, numpy's
``float32`` and the short spellings (``half``, ``bf16``) all name ``float32``/``float16``/...

One reading for every tool (compare's tolerances and data flow, acc-check's standards, the
backends' summaries), so a dtype two tools see is the same dtype to both."""
from __future__ import annotations

from typing import Optional

ALIASES = {"half": "float16", "float": "float32", "double": "float64", "bf16": "bfloat16",
           "fp16": "float16", "fp32": "float32", "fp64": "float64"}
EXACT_PREFIXES = ("int", "uint", "bool")          # integers and bool: no rounding
LOWEST_PRECISION_PREFIXES = ("float8", "hifloat8", "float4")
_PRECISION = {"float64": 4, "complex128": 4, "float32": 3, "complex64": 3, "float16": 2, "bfloat16": 2}
MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23, "float64": 52}   # explicit fraction bits


def dtype_name(dtype: object) -> str:
    """``torch.float32`` / ``Float32`` / ``float32`` / ``half`` -> ``float32`` / ``float16``;
    ``""`` for None."""
    if dtype is None:
        return ""
    name = str(dtype).rsplit(".", 1)[-1].lower()
    return ALIASES.get(name, name)


def is_exact(dtype: object) -> bool:
    """Integer and bool dtypes: their values carry no rounding error."""
    return dtype_name(dtype).startswith(EXACT_PREFIXES)


def precision(dtype: object) -> Optional[int]:
    """Rank of a floating dtype's precision (float64 4 ... float8 1); None for exact types
    and names it does not know."""
    name = dtype_name(dtype)
    if name.startswith(LOWEST_PRECISION_PREFIXES):
        return 1
    return _PRECISION.get(name)


def mantissa_bits(dtype: object) -> Optional[int]:
    """Fraction bits of a floating dtype (bfloat16 7, float16 10, float32 23); None otherwise."""
    return MANTISSA_BITS.get(dtype_name(dtype))
