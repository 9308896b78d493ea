"""Two CPU processes with the gloo backend: Lightning DDP, accelerate launch, HF Trainer under
torchrun. Each run is a subprocess (the launchers re-execute the script) with a timeout; its
whole process group is killed when it ends."""
from __future__ import annotations

import os
import shutil

import pytest

from ..conftest import require
from ._helpers import RECIPES, free_port, python, records, run, step_dirs

pytestmark = pytest.mark.slow


def assert_two_ranks(dump_root: str, steps=(0, 1)) -> None:
    assert step_dirs(dump_root) == [f"step{s}" for s in steps]
    for s in steps:
        folder = os.path.join(dump_root, f"step{s}")
        assert sorted(os.listdir(folder)) == ["rank0", "rank1"]
        for rank in ("rank0", "rank1"):       # both complete: JSON written, journal gone
            files = os.listdir(os.path.join(folder, rank))
            assert {"dump.json", "stack.json", "construct.json"} <= set(files) and "journal.jsonl" not in files
        r0, r1 = records(dump_root, s, "rank0"), records(dump_root, s, "rank1")
        assert list(r0) == list(r1)           # the same calls on both ranks
        grads = [k for k in r0 if ".parameters_grad." in k]
        assert grads and all(r0[k] == r1[k] for k in grads), "parameters_grad must be the all-reduced gradient"
        first = next(k for k in r0 if k.startswith("Module.") and ".forward." in k)
        assert r0[first]["input_args"][0] != r1[first]["input_args"][0], "each rank sees its own data shard"


def assert_rank0_alone_prints(stderr: str, dump_root: str, steps=(0, 1)) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("[tsprobe] step")]
    expected = [f"[tsprobe] step {s} dumped to {os.path.join(dump_root, f'step{s}', 'rank0')}" for s in steps]
    assert lines == expected, stderr[-3000:]


@require("lightning")
def test_lightning_ddp_two_cpu_processes(tmp_path):
    dump_root = str(tmp_path / "dump")
    p = run([python(), os.path.join(RECIPES, "lightning_recipe.py"), "--dump-path", dump_root, "--devices", "2"],
            timeout=150, cwd=str(tmp_path), quiet=False)
    assert "4 optimizer steps" in p.stdout
    assert_two_ranks(dump_root)
    assert_rank0_alone_prints(p.stderr, dump_root)
    r0 = records(dump_root, 1, "rank0")
    assert len([k for k in r0 if k.startswith("Module.fc1.Linear.forward.")]) == 2     # accumulation 2


@require("accelerate")
def test_accelerate_launch_two_cpu_processes(tmp_path):
    launcher = shutil.which("accelerate", path=os.path.dirname(python())) or "accelerate"
    dump_root = str(tmp_path / "dump")
    # `--num_processes 2 --cpu` starts one process in accelerate 1.15 (multi-CPU goes through MPI
    # there); on a machine without GPUs `--multi_gpu` runs torchrun with 2 CPU processes (gloo)
    p = run([launcher, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
             "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
             os.path.join(RECIPES, "accelerate_recipe.py"), "--dump-path", dump_root],
            timeout=150, cwd=str(tmp_path), quiet=False)
    assert "on 2 process(es) (gloo)" in p.stdout
    assert_two_ranks(dump_root)
    assert_rank0_alone_prints(p.stderr, dump_root)


@require("transformers")
def test_hf_trainer_under_torchrun_two_cpu_processes(tmp_path):
    dump_root = str(tmp_path / "dump")
    p = run([python(), "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
             os.path.join(RECIPES, "hf_trainer_recipe.py"), "--dump-path", dump_root],
            timeout=150, cwd=str(tmp_path), quiet=False)
    assert "4 optimizer steps" in p.stdout
    assert_two_ranks(dump_root)
    assert_rank0_alone_prints(p.stderr, dump_root)
