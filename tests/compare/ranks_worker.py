"""The dumps of tests/compare/test_ranks.py: recipes/many_ranks_recipe.py's run (WORLD gloo CPU
processes; with BAD >= 0 that rank's F.linear is 1% off), without its compare and merge.

    python tests/compare/ranks_worker.py DUMP WORLD BAD
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "recipes"))

from many_ranks_recipe import run  # noqa: E402

if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
