"""Exceptions users see: each names what to change."""
from __future__ import annotations

import difflib
from typing import Iterable


class ConfigError(ValueError):
    """A config value is wrong. The message names the field, the value and what is allowed."""

    def __init__(self, field: str, value, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"config field '{field}': got {value!r}; {allowed}")


def unknown_key(name: str, known: Iterable[str]) -> ConfigError:
    """The error for a config key nobody reads, with the closest known key as a hint."""
    near = difflib.get_close_matches(name, sorted(known), n=1)
    hint = f"did you mean '{near[0]}'? " if near else ""
    return ConfigError(name, "(unknown key)", f"{hint}known keys: {', '.join(sorted(known))}")


class DumpWriteError(OSError):
    """Raised instead of warning when the config asks write failures to be fatal."""


class AnomalyError(RuntimeError):
    """Raised by ``debugger.step()`` after a monitor capture when ``monitor.on_trigger`` is
    ``raise`` (the dumps are on disk by then). ``capture`` holds what was found."""

    def __init__(self, capture: dict):
        self.capture = capture
        first = capture.get("first") or {}
        where = f"; first NaN/Inf: {first.get('tensor')}" if first else ""
        super().__init__(f"tsprobe monitor: anomaly at step {capture.get('step')} "
                         f"({', '.join(capture.get('reasons', []))}){where}; dumps: {capture.get('dumps')}")
