"""The model zoo needs transformers; without it these tests are not collected."""
import importlib.util

import pytest

if importlib.util.find_spec("transformers") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(autouse=True)
def _real_dropouts():
    """The zoo trains with dropout on (its masks must match too): a test that left
    seed_all(rm_dropout=True) in force would quietly take that part out."""
    import torch.nn.functional as F

    assert not getattr(F.dropout, "__tsprobe_no_dropout__", False), "an earlier test left dropout removed"
    yield
