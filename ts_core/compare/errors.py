"""Errors raised for bad compare input (defined with the dump format, re-exported here)."""
from ..dumpfmt.errors import DumpFormatError, TensorFileError

__all__ = ["DumpFormatError", "TensorFileError"]
