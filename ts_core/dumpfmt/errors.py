"""Errors met while reading a dump: each names the file and what is wrong with it."""


class DumpFormatError(ValueError):
    """A path holds no dump, or a dump file cannot be read (missing, truncated, malformed)."""


class TensorFileError(ValueError):
    """A tensor file referenced by a dump is missing or unreadable; only its row is affected."""
