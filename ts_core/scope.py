"""The single place that decides whether a call is dumped.

- ``list``: an entry selects a call when it equals the call's key (either direction), its name
  without direction, or is a substring of it. At mix level a selected module selects every
  call made inside it.
- ``scope`` [first, last]: every call from the start of ``first`` to the end of ``last``, in
  execution order (names compared without direction).
- A backward record is kept exactly when its forward call was selected.
"""
from __future__ import annotations

from typing import Sequence

from .dumpfmt import without_direction


class Scope:
    def __init__(self, entries: Sequence[str] = (), scope: Sequence[str] = ()):
        self.entries = [e.strip() for e in entries]
        self._names = {without_direction(e) for e in self.entries}
        self.first, self.last = (without_direction(s) for s in scope) if scope else (None, None)
        self.in_range = False
        self.range_done = False
        self.everything = not self.entries and self.first is None

    def reset(self) -> None:
        """A new step: the range can open again."""
        self.in_range = False
        self.range_done = False

    def begin(self, name: str, fwd_key: str, parent_selected: bool) -> bool:
        """Decide for a call starting now. `name` is its key without direction."""
        if self.everything:
            return True
        if self.first is not None:
            if not self.in_range and not self.range_done and name == self.first:
                self.in_range = True
            return self.in_range
        if parent_selected:
            return True
        return name in self._names or any(e in fwd_key for e in self.entries)

    def mentions(self, key: str) -> bool:
        """Does a ``list`` entry name (part of) `key`? Used for records without a call."""
        return any(e in key for e in self.entries) or without_direction(key) in self._names

    def end(self, name: str) -> None:
        """A call finished; closes the range after `last`."""
        if self.in_range and name == self.last:
            self.in_range = False
            self.range_done = True
