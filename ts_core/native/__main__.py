"""``python -m ts_core.native``: say whether the native kernels are in use (make runs this after
installing; the extension itself is built by ``pip install``, see setup.py)."""
from . import describe

print(f"[tsprobe] {describe()}")
