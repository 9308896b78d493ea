"""Naming of keys, tensor summaries and the in-memory record of one call."""
