"""Explain: the call that introduced an error, which rank diverged first, replica consistency,
and why the first divergence diverged (diagnosis)."""
