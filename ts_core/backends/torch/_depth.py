"""Per-thread nesting depth: an API called inside a wrapped API (or inside tsprobe itself)
is not recorded again."""
import threading
from contextlib import contextmanager


class _Depth(threading.local):
    value = 0


DEPTH = _Depth()


@contextmanager
def internal():
    DEPTH.value += 1
    try:
        yield
    finally:
        DEPTH.value -= 1
