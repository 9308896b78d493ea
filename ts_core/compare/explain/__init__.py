"""Explain: the call that introduced an error, which rank diverged first, replica consistency."""
