"""Per-thread nesting depth, shared by every backend: a call made inside a wrapped call (or
inside tsprobe's own work, such as statistics computed with framework ops) is not recorded
again."""
import threading


class _Depth(threading.local):
    value = 0


DEPTH = _Depth()


class _Internal:
    """The context of ``internal()``: stateless (the depth is per thread), so one instance
    serves every ``with``; a class rather than ``@contextmanager``, whose generator costs ~5x
    as much on the recording hot path."""

    __slots__ = ()

    def __enter__(self) -> None:
        DEPTH.value += 1

    def __exit__(self, *exc: object) -> bool:
        DEPTH.value -= 1
        return False


_INTERNAL = _Internal()


def internal() -> _Internal:
    """``with internal():`` tsprobe's own work; nothing called inside is recorded."""
    return _INTERNAL
