"""Step-time overhead of monitor mode while nothing is wrong, on the speed benchmark's workload
(benchmarks/overhead.py: GPT-2 4x256, batch 4x64, AdamW, one thread, process CPU time).

On a shared, noisy machine two separate processes differ by more than the 5% being measured, so
each worker process trains two identical models (the same initial weights and batch) and
alternates their steps A B B A A B ...: A without the tool, B under
``PrecisionDebugger(monitor={})`` (start / stop / ``step(loss=loss)`` around every step). Load
changes hit both equally. Several worker processes (rounds) repeat this; the ratio of the mean
and of the median per-step CPU time B/A is printed per round and over all rounds.

    python benchmarks/monitor_overhead.py [--steps 30] [--rounds 3] [--monitor '{"keep_steps": 3}']
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

WARMUP = 3


def _worker(steps: int, monitor: dict, out: str) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    os.environ["TSPROBE_QUIET"] = "1"
    from ts_core import PrecisionDebugger

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=256,
                     bos_token_id=0, eos_token_id=0, loss_type="ForCausalLMLoss")
    model_a = GPT2LMHeadModel(cfg)
    model_b = copy.deepcopy(model_a)
    opt_a = torch.optim.AdamW(model_a.parameters(), lr=1e-4)
    opt_b = torch.optim.AdamW(model_b.parameters(), lr=1e-4)
    data = torch.randint(0, 8192, (4, 64))
    dump = tempfile.mkdtemp(prefix="tsmon_")
    debugger = PrecisionDebugger(dump_path=dump, monitor=monitor)

    def plain() -> float:
        t0 = time.process_time()
        loss = model_a(input_ids=data, labels=data).loss
        loss.backward()
        opt_a.step()
        opt_a.zero_grad()
        return time.process_time() - t0

    def monitored() -> float:
        t0 = time.process_time()
        debugger.start(model_b)
        loss = model_b(input_ids=data, labels=data).loss
        loss.backward()
        opt_b.step()
        opt_b.zero_grad()
        debugger.stop()
        debugger.step(loss=loss)
        return time.process_time() - t0

    for _ in range(WARMUP):
        plain()
        monitored()
    # A fresh process owes Python one full garbage collection for everything its imports made
    # (torch, transformers: ~450k objects); whichever step first triggers a collection pays it.
    # A long training run pays it once; settle it before measuring so that no step does.
    gc.collect()
    a, b = [], []
    for i in range(steps):
        if i % 2:
            a.append(plain())
            b.append(monitored())
        else:
            b.append(monitored())
            a.append(plain())
    captures = len(debugger.monitor.captures)
    debugger.close()
    with open(os.path.join(dump, "monitor.jsonl"), encoding="utf-8") as f:
        rows = sum(1 for _ in f)
    shutil.rmtree(dump, ignore_errors=True)
    with open(out, "w") as f:
        json.dump({"a": a, "b": b, "captures": captures, "jsonl_rows": rows}, f)


def run_round(steps: int, monitor: dict) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=root)
    subprocess.run([sys.executable, __file__, "--worker", str(steps), json.dumps(monitor), out],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    with open(out) as f:
        res = json.load(f)
    os.unlink(out)
    return res


def _ratios(a: list, b: list) -> tuple:
    return statistics.mean(b) / statistics.mean(a), statistics.median(b) / statistics.median(a)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30, help="measured steps per model per round")
    p.add_argument("--rounds", type=int, default=3, help="worker processes")
    p.add_argument("--monitor", default="{}", help="the monitor section, as JSON (default: {})")
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        steps, monitor, out = args.worker
        _worker(int(steps), json.loads(monitor), out)
        return
    monitor = json.loads(args.monitor)
    all_a, all_b = [], []
    for r in range(args.rounds):
        res = run_round(args.steps, monitor)
        assert res["captures"] == 0 and res["jsonl_rows"] == WARMUP + args.steps, res   # nothing was wrong
        mean_r, med_r = _ratios(res["a"], res["b"])
        print(f"  round {r + 1}: no tool {statistics.mean(res['a']) * 1e3:.1f} ms/step (median "
              f"{statistics.median(res['a']) * 1e3:.1f}), monitor {statistics.mean(res['b']) * 1e3:.1f} "
              f"(median {statistics.median(res['b']) * 1e3:.1f}): ratio of means {mean_r:.3f}x, "
              f"of medians {med_r:.3f}x", file=sys.stderr, flush=True)
        all_a += res["a"]
        all_b += res["b"]
    mean_r, med_r = _ratios(all_a, all_b)
    print(f"\nGPT-2 (4 layers, 256 wide, batch 4x64, AdamW, 1 thread), monitor={json.dumps(monitor)}, "
          f"{args.rounds} round(s) x {args.steps} interleaved steps per model, process CPU time per step:")
    print("| | no tool | monitor | ratio |")
    print("|---|---|---|---|")
    print(f"| mean | {statistics.mean(all_a) * 1e3:.1f} ms | {statistics.mean(all_b) * 1e3:.1f} ms | {mean_r:.3f}x |")
    print(f"| median | {statistics.median(all_a) * 1e3:.1f} ms | {statistics.median(all_b) * 1e3:.1f} ms | "
          f"{med_r:.3f}x |")


if __name__ == "__main__":
    main()
