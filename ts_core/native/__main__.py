"""``python -m ts_core.native``: build the native statistics kernel now (make runs this)."""
import sys

from .build import build

if build(verbose=True) is None:
    print("[tsprobe] no native statistics kernel (no C compiler): the pure-framework path is used",
          file=sys.stderr)
