"""Statistics first: decide a tensor value from its recorded summary when the summaries say it
is unchanged, and read the tensor files only where they differ.

At cluster scale the tensor files are the cost (terabytes); the summaries are already in
dump.json. Two summaries of one dtype and shape whose checksums (crc32 or xor, one kind on both
sides) are equal hold the same bytes: reading them would only confirm it. Without a checksum,
bit-equal Max/Min/Mean/Norm are taken as unchanged too, which a permutation of the same values
(a transposed weight) also gives: dump with ``summary_mode: md5`` for an exact skip.
"""
from __future__ import annotations

from typing import Mapping

from ...dumpfmt import STAT_FIELDS, checksum_kind

NOT_READ = "statistics first: {why}, tensor files not read"


def unchanged(golden: Mapping, target: Mapping) -> str:
    """Why the two tensor summaries need no tensor read ('' when they need one)."""
    if str(golden.get("dtype")) != str(target.get("dtype")) or golden.get("shape") != target.get("shape"):
        return ""
    gc, tc = golden.get("md5"), target.get("md5")
    kind = checksum_kind(gc)
    if gc is not None and tc is not None and kind == checksum_kind(tc):
        return NOT_READ.format(why=f"{kind or 'checksum'} equal") if str(gc) == str(tc) else ""
    stats = [(golden.get(k), target.get(k)) for k in STAT_FIELDS]
    if all(g is not None for g, _ in stats) and all(g == t for g, t in stats):
        return NOT_READ.format(why="Max/Min/Mean/Norm bit-equal")
    return ""


__all__ = ["unchanged"]
