"""Explaining a comparison: why the first divergence diverged (diagnosis)."""
