"""The model zoo needs transformers; without it these tests are not collected."""
import importlib.util

if importlib.util.find_spec("transformers") is None:
    collect_ignore_glob = ["test_*.py"]
