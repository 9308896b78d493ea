"""Exceptions users see: each names what to change."""
from __future__ import annotations

import functools
import os
import sys
import warnings
from typing import Iterable, Optional, Tuple, Type


class ConfigError(ValueError):
    """A config value is wrong. The message names the field, the value and what is allowed, and
    the config file when the value came from one (``source``)."""

    def __init__(self, field: str, value, allowed: str, source: Optional[str] = None):
        self.field, self.value, self.allowed, self.source = field, value, allowed, source
        super().__init__(self._text())

    def _text(self) -> str:
        where = f"{self.source}: " if self.source else ""
        return f"{where}config field '{self.field}': got {self.value!r}; {self.allowed}"

    def in_file(self, path: str) -> "ConfigError":
        """The same error, naming the config file the field was read from."""
        self.source = path
        self.args = (self._text(),)
        return self


class UnknownKeyError(ConfigError):
    """A config key nobody reads: the closest known key when there is one, else the known keys."""

    def _text(self) -> str:
        where = f"{self.source}: " if self.source else ""
        return f"{where}config field '{self.field}': unknown key; {self.allowed}"


def unknown_key(name: str, known: Iterable[str]) -> ConfigError:
    """The error for a config key nobody reads: "did you mean 'level'?" when a known key is close,
    the list of known keys only when none is."""
    import difflib

    near = difflib.get_close_matches(name, sorted(known), n=1)
    hint = f"did you mean '{near[0]}'?" if near else f"known keys: {', '.join(sorted(known))}"
    return UnknownKeyError(name, "(unknown key)", hint)


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


@functools.lru_cache(maxsize=None)
def _library_dirs() -> Tuple[str, ...]:
    """Where code that is not the user's lives: tsprobe's own packages, the standard library and
    installed packages (torch's hook machinery, a Trainer calling a callback). Found on the first
    warning, not at import: ``sysconfig`` costs every ``tsprobe`` start ~3 ms."""
    import sysconfig

    here = os.path.dirname(os.path.abspath(__file__))
    paths = sysconfig.get_paths()
    dirs = [here, os.path.join(os.path.dirname(here), "ts_integrations")]
    dirs += [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)]
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs) + tuple(os.path.join(d, "") for d in dirs)


def warn_user(message: str, category: Type[Warning] = UserWarning) -> None:
    """``warnings.warn`` whose location is the user's line: the first frame above the warning
    code that is outside tsprobe and the installed libraries (``model(x)``, ``trainer.train()``,
    ``PrecisionDebugger(...)``), not an internal one; the warning code's own line when every
    frame is library code."""
    f = sys._getframe(1)            # the code that warns: stacklevel 2
    level = 2
    while f is not None and f.f_code.co_filename.startswith(_library_dirs()):
        f, level = f.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if f is not None else 2)
