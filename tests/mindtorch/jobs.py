"""The runs of the mindtorch tests: which model, level, task and bug each side runs (run_side.py
executes them; conftest.py starts both sides)."""
from __future__ import annotations

from typing import List

TOY_RUNS = [(level, task) for task in ("statistics", "tensor") for level in ("L0", "L1", "mix")]
STEPS = 2


def toy_id(level: str, task: str) -> str:
    return f"toy_{level}_{task}"


def both_sides_jobs() -> List[dict]:
    jobs = [{"id": toy_id(level, task), "model": "toy", "level": level, "task": task, "steps": STEPS}
            for level, task in TOY_RUNS]
    jobs += [{"id": f"{m}_mix", "model": m, "level": "mix", "steps": 1} for m in ("embed", "gpt2", "llama")]
    return jobs


def mindtorch_only_jobs() -> List[dict]:
    return [
        {"id": "detect", "kind": "detect"},
        {"id": "seed002", "kind": "seed002"},
        {"id": "accumulate", "kind": "accumulate"},
        {"id": "toy_debug", "model": "toy", "level": "debug", "task": "tensor", "steps": STEPS},
        {"id": "toy_none", "model": "toy", "steps": STEPS},              # no debugger: the reference bits
        {"id": "gpt2_none", "model": "gpt2", "steps": 1},
        {"id": "toy_bug", "model": "toy", "level": "mix", "bug": "gelu_tanh", "steps": 1},
        # forward only: the bug shows there, and the transformers runs cost less without backward taps
        {"id": "gpt2_bug", "model": "gpt2", "level": "mix", "bug": "tanh_scaled", "steps": 1, "data_mode": ["forward"]},
        {"id": "llama_bug", "model": "llama", "level": "mix", "bug": "rsqrt_scaled", "steps": 1,
         "data_mode": ["forward"]},
    ]
