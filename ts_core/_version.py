"""The package version: pyproject.toml reads it from here (one place), ``tsprobe --version`` says it."""
__version__ = "0.1.0"
