"""Fixtures for the integration tests (shared helpers live in tests/conftest.py)."""
from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """accelerate keeps one process-wide state (mixed precision, accumulation); every HF
    Trainer and Accelerator in these tests starts from a clean one, as in a new process."""
    if importlib.util.find_spec("accelerate") is None:
        yield
        return
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
