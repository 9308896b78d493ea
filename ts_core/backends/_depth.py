"""Per-thread nesting depth, shared by every backend: a call made inside a wrapped call (or
inside tsprobe's own work, such as statistics computed with framework ops) is not recorded
again."""
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
