"""The C kernels as an optional extension (everything else is in pyproject.toml).

``ts_core.native._kernels`` is compiled here, at install time (``pip install .``, ``pip install
-e .``, ``python -m build``), against this interpreter's headers, with portable flags: the
AVX2/F16C/AVX-512 loops are chosen at import by the CPU's flags (stats.c), never
``-march=native``, so one build serves every CPU sharing the install. ``optional=True``: with no
C compiler the install still succeeds and tsprobe uses its pure numpy/framework paths
(``tsprobe --version`` says which).
"""
import sys

from setuptools import Extension, setup

if sys.platform == "win32":      # MSVC: no per-function targets, the baseline loops
    FLAGS = ["/O2"]
else:
    # -ffp-contract=off: no FMA contraction, so every build adds in the same order and gives the
    # same bits; -fno-math-errno: sqrt/isfinite inline
    FLAGS = ["-O3", "-std=c99", "-fno-math-errno", "-ffp-contract=off", "-fvisibility=hidden"]

setup(
    ext_modules=[
        Extension(
            "ts_core.native._kernels",
            sources=["ts_core/native/module.c", "ts_core/native/stats.c", "ts_core/native/compare.c"],
            depends=["ts_core/native/kernels.h"],
            extra_compile_args=FLAGS,
            optional=True,
        )
    ],
)
