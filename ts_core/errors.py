"""Exceptions users see: each names what to change."""


class ConfigError(ValueError):
    """A config value is wrong. The message names the field, the value and what is allowed."""

    def __init__(self, field: str, value, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"config field '{field}': got {value!r}; {allowed}")


class DumpWriteError(OSError):
    """Raised instead of warning when the config asks write failures to be fatal."""
