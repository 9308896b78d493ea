"""Offline comparison of two dumps (tsprobe or msprobe): align calls, measure, name the first divergence.

Importing this package needs only numpy; torch is imported only to read msprobe ``.pt`` files.
"""
import sys as _sys
import types as _types

from .align.matching import align, default_normalise, parse_key
from .api import compare, write_outputs
from .errors import DumpFormatError, TensorFileError
from .judge.metrics import TensorMetrics, compare_arrays, compare_stats
from .judge.tolerances import DEFAULT_TOLERANCES, Tolerance, pick_tolerance
from .load.loader import Dump, DumpUnit, find_dumps
from .model import CompareResult, FirstDivergence, PairResult, Row
from .report.summary import summarize, summary_text

__all__ = [
    "compare", "summarize", "summary_text", "write_outputs",
    "DumpFormatError", "TensorFileError", "Dump", "DumpUnit", "find_dumps", "align", "default_normalise",
    "parse_key", "TensorMetrics", "compare_arrays", "compare_stats", "CompareResult", "FirstDivergence",
    "PairResult", "Row", "DEFAULT_TOLERANCES", "Tolerance", "pick_tolerance",
]


class _CallableModule(_types.ModuleType):
    """``ts_core.compare`` names both this package and its main function; once the package
    is imported the attribute is the package, so calling it runs ``compare``."""

    def __call__(self, golden, target, output_dir=None, **options):
        return compare(golden, target, output_dir, **options)


_sys.modules[__name__].__class__ = _CallableModule
