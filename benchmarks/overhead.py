"""Step-time overhead of tsprobe (and msprobe, when installed) on a CPU GPT-2 training step.

Each mode runs in its own process (modes interleaved over rounds); the figure is the median
*process CPU time* per measured step, since wall time is noisy on shared machines. Ratios are
against the no-tool run of the same invocation.

    python benchmarks/overhead.py [--steps 10] [--rounds 1] [--tools tsprobe,msprobe]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

MODES = {           # name: (task, level, summary_mode[, extra top-level keys]); None = no tool
    "no tool": None,
    "not collecting": ("statistics", "L1", "statistics"),
    "statistics L0": ("statistics", "L0", "statistics"),
    "statistics L1": ("statistics", "L1", "statistics"),
    "statistics mix": ("statistics", "mix", "statistics"),
    "md5 L1": ("statistics", "L1", "md5"),
    "xor L1": ("statistics", "L1", "xor"),
    "structure mix": ("structure", "mix", None),
    "async stats mix": ("statistics", "mix", "statistics", {"async_dump": True}),
    "tensor L1": ("tensor", "L1", "statistics"),
}
WARMUP = 2
FAR_STEP = 100000


def _worker(tool: str, mode: str, steps: int, out: str) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=256,
                     bos_token_id=0, eos_token_id=0, loss_type="ForCausalLMLoss")
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(0, 8192, (4, 64))
    spec = MODES[mode]
    total = WARMUP + steps
    dump = tempfile.mkdtemp(prefix="tsbench_")
    debugger = None
    if spec is not None:
        task, level, summary, *extra = spec
        # "not collecting": hooks installed at step 0 (warm-up), measured steps lie outside
        # the configured ones, so every wrapper takes its fast path.
        collect = [0, FAR_STEP] if mode == "not collecting" else list(range(total))
        cfg_json = {"task": task, "dump_path": dump, "rank": [], "step": collect, "level": level,
                    task: {"scope": [], "list": [], "data_mode": ["all"]}}
        if task == "statistics":
            cfg_json[task]["summary_mode"] = summary
        for more in extra:
            cfg_json.update(more)
        path = os.path.join(dump, "config.json")
        with open(path, "w") as f:
            json.dump(cfg_json, f)
        if tool == "msprobe":
            from msprobe.pytorch import PrecisionDebugger
        else:
            os.environ["TSPROBE_QUIET"] = "1"
            from ts_core import PrecisionDebugger
        debugger = PrecisionDebugger(config_path=path)
    times = []
    for i in range(total):
        t0 = time.process_time()
        if debugger is not None:
            debugger.start(model)
        loss = model(input_ids=data, labels=data).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if debugger is not None:
            debugger.stop()
            debugger.step()
        times.append(time.process_time() - t0)
    inodes = {}                         # hard-linked tensor files count once: bytes on disk
    for r, _, fs in os.walk(dump):
        for f in fs:
            if f != "config.json":
                st = os.stat(os.path.join(r, f))
                inodes[(st.st_dev, st.st_ino)] = st.st_size
    size = sum(inodes.values())
    measured = times[WARMUP:]
    shutil.rmtree(dump, ignore_errors=True)
    with open(out, "w") as f:
        json.dump({"median": statistics.median(measured), "bytes_per_step": size / total}, f)


def run(tool: str, mode: str, steps: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, __file__, "--worker", tool, mode, str(steps), out],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--tools", default="tsprobe,msprobe")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        tool, mode, steps, out = args.worker
        _worker(tool, mode, int(steps), out)
        return
    tools = [t for t in args.tools.split(",") if t != "msprobe" or importlib.util.find_spec("msprobe")]
    modes = args.modes.split(",")
    results: dict = {}
    for r in range(args.rounds):
        for mode in modes:                     # interleaved: every tool runs each mode in turn
            for tool in (tools if MODES[mode] else ["-"]):
                res = run(tool if tool != "-" else "tsprobe", mode, args.steps)
                results.setdefault((tool, mode), []).append(res)
                print(f"  round {r + 1}: {mode:15s} {tool:8s} {res['median'] * 1e3:8.1f} ms/step",
                      file=sys.stderr, flush=True)
    base = statistics.median(x["median"] for x in results[("-", "no tool")])

    def cell(tool, mode):
        xs = results.get((tool, mode))
        if not xs:
            return None, None, None
        ms = statistics.median(x["median"] for x in xs)
        return ms * 1e3, ms / base, statistics.median(x["bytes_per_step"] for x in xs)

    print(f"\nGPT-2 (4 layers, 256 wide, batch 4x64, AdamW, 1 thread), median CPU time of "
          f"{args.steps} steps x {args.rounds} round(s); no tool = {base * 1e3:.1f} ms/step\n")
    head = f"| mode | tsprobe ms/step | tsprobe ratio | tsprobe bytes/step |"
    if "msprobe" in tools:
        head += " msprobe ms/step | msprobe ratio | msprobe bytes/step |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for mode in modes:
        if not MODES[mode]:
            continue
        row = f"| {mode} |"
        for tool in tools:
            ms, ratio, size = cell(tool, mode)
            row += f" {ms:.1f} | {ratio:.2f}x | {size / 1e6:.2f} MB |" if ms is not None else " - | - | - |"
        print(row)


if __name__ == "__main__":
    main()
