"""One rank of a real parallel training job, run twice in one process: without tsprobe, then with
it at each asked level/task. Launched by ``torch.distributed.run`` (gloo, CPU); rank 0 writes a
JSON report: did every tool-on run give bit-identical losses, gradients and updated parameters
(full tensors, gathered from their shards), and where is its dump.

    python -m torch.distributed.run --nproc_per_node 2 stack_worker.py --stack fsdp2 \
        --runs L0:statistics,mix:md5 --dump-root DIR --report OUT.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

HIDDEN, FFN, VOCAB, SEQ, BATCH, STEPS = 16, 32, 24, 8, 4, 2
DEVICE = "cpu"


class Block(nn.Module):
    def __init__(self, hidden: int = HIDDEN, ffn: int = FFN) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, ffn)
        self.act = nn.GELU()
        self.down = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


class TinyLM(nn.Module):
    def __init__(self, hidden: int = HIDDEN, ffn: int = FFN, vocab: int = VOCAB, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList([Block(hidden, ffn) for _ in range(layers)])
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.checkpoint: Optional[bool] = None     # activation checkpointing: use_reentrant, or off

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            if self.checkpoint is None:
                x = block(x)
            else:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.checkpoint)
        return self.head(self.norm(x))


def batch(step: int, rank: int, same_data: bool) -> tuple:
    g = torch.Generator().manual_seed(1000 + step * 97 + (0 if same_data else rank))
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return tokens, torch.roll(tokens, -1, dims=1)


def single_batch(step: int, ranks: int) -> tuple:
    """The single-device twin of a data-parallel job over `ranks` ranks that each saw their own
    batch: the ranks' batches concatenated (``ranks`` 1: the batch every rank saw)."""
    if ranks == 1:
        return batch(step, 0, True)
    parts = [batch(step, r, False) for r in range(ranks)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def global_batch(step: int, chunks: int, dp_rank: int, dp_size: int) -> tuple:
    """One global batch of `chunks` x BATCH rows per step, split evenly over the data-parallel
    ranks: so jobs with different data-parallel sizes (DDP on 2 and on 4 ranks, TP) and the
    single run see the same samples, and their dumps compare N ranks against M."""
    tokens, labels = single_batch(step, chunks)
    rows = tokens.shape[0] // dp_size
    return tokens[dp_rank * rows:(dp_rank + 1) * rows], labels[dp_rank * rows:(dp_rank + 1) * rows]


def data_parallel(stack: str, world: int, rank: int) -> tuple:
    """(this rank's data-parallel coordinate, the data-parallel size) of a stack."""
    if stack in ("single", "tp", "tp-sp"):
        return 0, 1
    if stack == "2d":                     # (dp, tp) mesh: contiguous TP groups
        return rank // (world // 2), 2
    if stack == "2d-tpouter":             # (tp, dp) mesh: TP peers are ranks dp and dp + world/2
        return rank % (world // 2), world // 2
    return rank, world


def build(stack: str, world: int, model: Optional[TinyLM] = None):
    """The model (default: a tiny one) as the stack wraps it, and whether every rank sees the
    same batch (TP: yes)."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    model = model if model is not None else TinyLM(vocab=VOCAB)
    if stack == "single":         # one process, no process group: the twin of the parallel runs
        return model, True
    if stack == "ddp":
        return nn.parallel.DistributedDataParallel(model), False
    if stack == "ddp-ckpt-autocast":      # reentrant checkpointing needs DDP's static graph
        model.checkpoint = True
        return nn.parallel.DistributedDataParallel(model, static_graph=True), False
    if stack == "fsdp1":         # FullyShardedDataParallel refuses CPU: a GPU machine only
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel(model.cuda(), device_id=torch.cuda.current_device(),
                                        use_orig_params=True), False
    if stack.startswith("fsdp2"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh("cpu", (world,))
        kw = {"reshard_after_forward": stack != "fsdp2-noreshard"}
        if stack == "fsdp2-ckpt":
            model.checkpoint = False
        if stack == "fsdp2-bf16":
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, **kw)
        fully_shard(model, mesh=mesh, **kw)
        return model, False
    if stack in ("tp", "tp-sp"):
        tp_plan(model, init_device_mesh("cpu", (world,)), sequence=stack == "tp-sp")
        return model, True
    if stack == "2d":
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        tp_plan(model, mesh["tp"], sequence=False)
        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        return model, False
    if stack == "2d-tpouter":     # TP on the outer mesh dim (groups {r, r + world/2}), data parallel inner by hand
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("tp", "dp"))
        tp_plan(model, mesh["tp"], sequence=False)
        model.dp_group = mesh["dp"].get_group()
        return model, False
    raise SystemExit(f"unknown stack {stack}")


def tp_plan(model: TinyLM, mesh, sequence: bool) -> None:
    """Megatron-style: up column-wise, down row-wise; with `sequence`, norms sequence-parallel
    and the head's output kept sharded over the vocabulary for loss parallel."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    for block in model.blocks:
        plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
        if sequence:
            plan = {"norm": SequenceParallel(),
                    "up": ColwiseParallel(input_layouts=Shard(1)),
                    "down": RowwiseParallel(output_layouts=Shard(1))}
        parallelize_module(block, mesh, plan)
    if sequence:
        parallelize_module(model, mesh, {
            "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "head": ColwiseParallel(input_layouts=Shard(1), use_local_output=False),
        })


def average_grads(model: nn.Module) -> None:
    """Data parallelism by hand (2d-tpouter): each gradient's local tensor averaged over the
    data-parallel group, into a new gradient. (Not in place: a collective writing into a
    gradient already summarised in backward does not move its version counter, and tsprobe
    would keep the backward-time summary -- see docs/compare.md.)"""
    from torch.distributed.tensor import DTensor

    group = getattr(model, "dp_group", None)
    if group is None:
        return
    size = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is None:
            continue
        g = p.grad
        buf = (g.to_local() if isinstance(g, DTensor) else g).clone()
        dist.all_reduce(buf, group=group)
        buf.div_(size)
        p.grad = DTensor.from_local(buf, g.device_mesh, g.placements, run_check=False,
                                    shape=g.shape, stride=g.stride()) if isinstance(g, DTensor) else buf


def full(t):
    if t is None:
        return None
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    return t.detach().clone()


def perturb(model: nn.Module, name: str) -> None:
    """A planted bug on this rank only: its (local shard of the) parameter `name` scaled by 1.01."""
    params = dict(model.named_parameters())
    p = params.get(name, params.get("module." + name))      # DDP's wrapper adds "module."
    with torch.no_grad():
        (p.to_local() if hasattr(p, "to_local") else p).mul_(1.01)


def train(stack: str, world: int, rank: int, debugger=None, same_data: Optional[bool] = None,
          single_of: int = 1, bug: Optional[str] = None, chunks: int = 0) -> dict:
    model, stack_same = build(stack, world)
    same_data = stack_same if same_data is None else same_data
    if bug:
        perturb(model, bug)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads = [], {}
    for step in range(STEPS):
        # 2-D: the tensor-parallel peers of one data-parallel group see the same batch
        data_rank = data_parallel(stack, world, rank)[0]
        if chunks:          # --global-batch: every stack sees the same samples, split over its dp ranks
            data = global_batch(step, chunks, *data_parallel(stack, world, rank))
        else:
            data = single_batch(step, single_of) if stack == "single" else batch(step, data_rank, same_data)
        tokens, labels = (t.to(DEVICE) for t in data)
        if debugger is not None:
            debugger.start(model)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=stack.endswith("autocast")):
            logits = model(tokens)
        if stack == "tp-sp":
            from torch.distributed.tensor.parallel import loss_parallel

            with loss_parallel():
                loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
                loss.backward()
        else:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            loss.backward()
        average_grads(model)
        if debugger is not None:
            debugger.record_param_grads()     # .grad as the optimizer sees it: reduced across ranks
            debugger.stop()
        grads = {n: full(p.grad) for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        if debugger is not None:
            debugger.step()
        losses.append(full(loss))
    params = {n: full(p) for n, p in model.named_parameters()}
    return {"loss": losses, "grads": grads, "params": params}


def differences(a: dict, b: dict) -> list:
    out = []
    for i, (x, y) in enumerate(zip(a["loss"], b["loss"])):
        if not torch.equal(x, y):
            out.append(f"loss step {i}: {x.item()!r} vs {y.item()!r}")
    for part in ("grads", "params"):
        for n, x in a[part].items():
            y = b[part].get(n)
            if (x is None) != (y is None) or (x is not None and not torch.equal(x, y)):
                out.append(f"{part} {n}")
    return out


def main() -> None:
    global DEVICE, VOCAB
    ap = argparse.ArgumentParser()
    ap.add_argument("--stack", required=True)
    ap.add_argument("--runs", required=True,
                    help="comma-separated LEVEL:SUMMARY (summary: statistics, md5, tensor, async)")
    ap.add_argument("--dump-root", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--same-data", action="store_true", help="every rank sees the same batch (DDP)")
    ap.add_argument("--single-of", type=int, default=1,
                    help="stack single: the twin of a data-parallel job over N ranks with their own batches")
    ap.add_argument("--vocab", type=int, default=VOCAB,
                    help="vocabulary size (one not divisible by the TP size: uneven embedding/head shards)")
    ap.add_argument("--global-batch", type=int, default=0,
                    help="K: every stack sees one global batch of K x 4 rows per step, split over its "
                         "data-parallel ranks (jobs of different sizes compare N ranks against M)")
    ap.add_argument("--bug", default="", help="RANK:PARAM: perturb PARAM's local shard on RANK only")
    args = ap.parse_args()

    VOCAB = args.vocab
    if args.stack == "fsdp1":
        DEVICE = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(DEVICE)
    single = args.stack == "single"
    if not single:
        dist.init_process_group("nccl" if args.stack == "fsdp1" else "gloo")
    rank, world = (0, 1) if single else (dist.get_rank(), dist.get_world_size())
    torch.set_num_threads(1)
    from ts_core import PrecisionDebugger

    bug_rank, _, bug = args.bug.partition(":")
    kw = {"same_data": True if args.same_data else None, "single_of": args.single_of,
          "bug": bug if bug and int(bug_rank) == rank else None, "chunks": args.global_batch}
    report = {"stack": args.stack, "world": world, "runs": {}}
    baseline = train(args.stack, world, rank, **kw)
    for run in filter(None, args.runs.split(",")):
        level, summary = run.split(":")
        task = "tensor" if summary == "tensor" else "statistics"
        extra = {"md5": {"summary_mode": "md5"}, "async": {"async_dump": True}}.get(summary, {})
        dump = os.path.join(args.dump_root, f"{level}-{summary}")
        entry = {"dump": dump}
        try:
            debugger = PrecisionDebugger(dump_path=dump, task=task, level=level, step=list(range(STEPS)), **extra)
            with contextlib.closing(debugger):
                result = train(args.stack, world, rank, debugger, **kw)
            entry["differences"] = differences(baseline, result)
            if rank == 0:       # the last step's full gradients: the reference for merged shard statistics
                np.savez(dump + ".grads.npz", **{n: g.float().cpu().numpy() for n, g in result["grads"].items()
                                                  if g is not None})
        except Exception:
            entry["error"] = traceback.format_exc()
        report["runs"][run] = entry
        if not single:
            dist.barrier()
    if single:
        with open(args.report, "w") as f:
            json.dump([report], f, indent=1)
        sys.stdout.flush()
        os._exit(0)
    gathered = [None] * world
    dist.all_gather_object(gathered, report)
    if rank == 0:
        with open(args.report, "w") as f:
            json.dump(gathered, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is written: skip interpreter teardown, where gloo's threads have been seen to
    # abort a loaded machine's process ("terminate called without an active exception").
    os._exit(0)




if __name__ == "__main__":
    sys.exit(main())
