"""Errors raised for bad compare input: one clear message naming the file."""


class DumpFormatError(ValueError):
    """A path holds no dump, or a dump file cannot be read (missing, truncated, malformed)."""


class TensorFileError(ValueError):
    """A tensor file referenced by a dump is missing or unreadable; only its row is affected."""
