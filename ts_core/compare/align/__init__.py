"""Align: which calls and which values of two dumps pair (names, data flow, across frameworks, rank layouts)."""
