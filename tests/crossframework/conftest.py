"""Cross-framework tests need torch and MindSpore installed; without them they are not
collected. The dumps are written in one child process (see dumpgen.py), so MindSpore is never
imported into the pytest process."""
import importlib.util

if importlib.util.find_spec("mindspore") is None or importlib.util.find_spec("torch") is None:
    collect_ignore_glob = ["test_*.py"]
