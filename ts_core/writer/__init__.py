"""Durable output: journal -> dump.json, stack.json, construct.json, and .npy files."""
from .dump_dir import DumpDir, recover

__all__ = ["DumpDir", "recover"]
