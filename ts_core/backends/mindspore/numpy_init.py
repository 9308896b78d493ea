"""MindSpore 2.10 under NumPy 2: run its one-time numpy init quietly, before the recipe's work.

MindSpore's PyNative argument parser (``py_parse``) was compiled against NumPy 1.x. The first op
that parses an argument calls numpy's C-API import; under NumPy 2 numpy refuses it, prints "A
module that was compiled using NumPy 1.x cannot be run in NumPy 2.x" with a stack trace,
MindSpore logs ``Numpy init failed.``, and that op raises ``SystemError`` (later ops work). The
only lasting effect is that MindSpore ops then refuse NumPy *scalar* arguments
(``t * np.float32(2)`` raises TypeError); Python numbers, Tensors and arrays are unaffected, and
neither tsprobe nor its recipes pass NumPy scalars (see docs/mindspore.md). So tsprobe runs that
init once (``_runtime.warm_up``, before its first MindSpore op) with stderr captured and passes on
whatever else it printed: the user never sees a traceback pointing into tsprobe.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile

_NOISE = (
    re.compile(r"^A module that was compiled using NumPy 1\.x cannot be run in$"),
    re.compile(r"^NumPy [\w.]+ as it may crash\. To support both 1\.x and 2\.x$"),
    re.compile(r"^versions of NumPy, modules must be compiled with NumPy 2\.0\.$"),
    re.compile(r"^Some module may need to rebuild instead e\.g\. with 'pybind11>=2\.12'\.$"),
    re.compile(r"^If you are a user of the module, the easiest solution will be to$"),
    re.compile(r"^downgrade to 'numpy<2' or try to upgrade the affected module\.$"),
    re.compile(r"^We expect that some modules will need time to support NumPy 2\.$"),
    re.compile(r"^Traceback \(most recent call last\):"),
    re.compile(r"^  File \".*\", line \d+, in "),
    re.compile(r"^    "),                                       # a frame's source line
    re.compile(r"^ImportError: $"),
    re.compile(r"^\[WARNING\] .*py_parse\.cc:\d+\] .*Numpy init failed\.$"),
)


def without_numpy_init_noise(text: str) -> str:
    """`text` less the lines of the NumPy-1.x message, its stack traces and MindSpore's
    ``Numpy init failed.`` warning (and blank lines); every other line is kept."""
    kept = [ln for ln in text.splitlines() if ln.strip() and not any(p.match(ln) for p in _NOISE)]
    return "".join(ln + "\n" for ln in kept)


def init_numpy_quietly() -> None:
    """Trigger MindSpore's numpy init with one op, stderr (Python's and the C++ logger's, fd 2)
    captured; re-emit what is not that known message, absorb only the SystemError it leaves."""
    import numpy as np
    from mindspore import Tensor

    sys.stderr.flush()
    saved = os.dup(2)
    error = None
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            (Tensor(np.ones((1,), np.float32)) * 1.5).asnumpy()
        except SystemError as exc:
            error = exc
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        printed = capture.read().decode("utf-8", "replace")
    if error is not None and "Numpy init failed" not in printed:
        raise error                                   # some other failure: not ours to hide
    rest = without_numpy_init_noise(printed)
    if rest:
        sys.stderr.write(rest)
    if error is not None:       # the init failed once; the same op works now
        (Tensor(np.ones((1,), np.float32)) * 1.5).asnumpy()
