"""Build the native kernels (stats.c, compare.c, frames.c) into one shared library next to this file.

Run at install time by ``make`` (``python -m ts_core.native``); ``ts_core.native.load``
also builds it on first use when a C compiler is present. Without a compiler (or with
``TSPROBE_NATIVE=0``) tsprobe uses its pure-framework statistics: slower, same values up to
float rounding.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = [os.path.join(HERE, name) for name in ("stats.c", "compare.c", "frames.c")]
ABI = 3
LIB_NAME = f"libtsprobe_native_v{ABI}.so"
_FLAG_SETS = (["-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno"],
              ["-O3", "-fopenmp-simd", "-fno-math-errno"])


def library_dirs() -> List[str]:
    """Where the library is looked for and built: this package folder, else a user cache."""
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tsprobe")
    return [os.path.join(HERE, "_build"), cache]


def compiler() -> Optional[str]:
    for cand in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"):
        if cand and shutil.which(cand.split()[0]):
            return cand.split()[0]
    return None


def build(verbose: bool = False) -> Optional[str]:
    """Compile the kernels; returns the library path, or None when no folder or compiler works."""
    cc = compiler()
    if cc is None:
        return None
    for folder in library_dirs():
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError:
            continue
        target = os.path.join(folder, LIB_NAME)
        for flags in _FLAG_SETS:
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
            os.close(fd)
            cmd = [cc, *flags, "-shared", "-fPIC", "-o", tmp, *SOURCES]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode == 0:
                os.replace(tmp, target)          # atomic: concurrent builders never see half a file
                if verbose:
                    print(f"[tsprobe] built {target} ({' '.join(flags)})")
                return target
            os.unlink(tmp)
            if verbose:
                print(f"[tsprobe] {' '.join(cmd)} failed:\n{proc.stderr}", file=sys.stderr)
    return None
