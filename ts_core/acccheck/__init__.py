"""API precision without a golden run: ``tsprobe acc-check DUMP -o OUT``.

Every API call recorded in a tensor dump (level L1 or mix) is replayed on CPU from its saved
inputs, in float64 (the reference) and in the recorded dtypes (the peer: a standard kernel of
the same precision), and the recorded outputs and input gradients are graded against the
reference with msprobe's dtype-aware standards (``standards.py``). Calls that cannot be replayed
are listed with the reason. Importing this package needs only numpy and pyyaml; the framework
is imported when a dump of it is checked.
"""
from .check import acc_check
from .result import AccCheckResult, CallResult, DetailRow
from .standards import load_standards

__all__ = ["acc_check", "AccCheckResult", "CallResult", "DetailRow", "load_standards"]
