"""Step-time overhead of tsprobe (and msprobe, when installed) on a CPU GPT-2 training step.

Each mode runs in its own process (modes interleaved over rounds); the figures are the mean and
median *process CPU time* per measured step, since wall time is noisy on shared machines.
Ratios are against the no-tool run of the same invocation. Next to each tsprobe ratio the
*floor* of that mode, measured in the same worker: the no-tool step plus one bare pass over
the distinct bytes the mode summarised (statistics: a torch sum; md5: a torch sum and a CRC-32,
since md5 records the statistics beside the checksum; xor: a numpy
XOR reduction; structure: nothing), or plus the time to write the files the mode wrote, one
bare write per file (tensor; the same bytes as one file in brackets).

Every worker runs one ``gc.collect()`` after its warm-up steps: importing torch and
transformers and building the model leave CPython's oldest generation close to its trigger, so
the first full collection of the process (~0.2 s over ~450k objects) otherwise lands in the
measured steps of whichever run allocates first. The tool's steady-state collections are still
measured (``--startup-gc`` leaves that first one in).

The tool ``minimal`` (statistics L0, L1, mix and md5 L1) is benchmarks/minimal_recorder.py: the
least Python a recorder of the same L1 records pays, a lower bound for tsprobe's own work.

    python benchmarks/overhead.py [--steps 10] [--rounds 1] [--tools tsprobe,msprobe,minimal]
                                  [--sizes 4x256,4x512,4x1024,12x256]

``--device cuda`` times the GPU instead (issue 37's workload by default: GPT-2 124M, 12x768,
batch 8x512, fp32, AdamW, eager attention, deterministic algorithms): *wall clock* per step with
``torch.cuda.synchronize()`` before and after, each mode's steps right after a no-tool run of the
same steps in the same process (ratios against it), tsprobe's modes in one process (each closed
before the next), msprobe's one process per mode; every run starts from the same weights and seed,
and its final loss and parameters are compared bit for bit with the no-tool run's.

    python benchmarks/overhead.py --device cuda [--steps 10] [--sizes 12x768] [--batch 8x512]
                                  [--modes "statistics L0,statistics L1,statistics mix,md5 L1"]
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

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
    "tensor L1 packed": ("tensor", "L1", "statistics", {"tensor_format": "packed"}),
}
TSPROBE_ONLY = {"tensor L1 packed"}     # a tsprobe option: msprobe has no such layout
MINIMAL_MODES = {"statistics L0", "statistics L1", "statistics mix", "md5 L1"}    # what benchmarks/minimal_recorder.py writes
PHASES = ("start", "forward", "backward", "optimizer", "stop")
WARMUP = 2
FAR_STEP = 100000


def gpt2_workload(size: str = "4x256") -> tuple:
    """(model, AdamW optimizer, batch): the GPT-2 training step every speed figure here is of
    (`size`: layers x width; batch 4x64, vocabulary 8192, one thread, seed 0)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers, width = (int(x) for x in size.split("x"))
    cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=4, vocab_size=8192, n_positions=256,
                     bos_token_id=0, eos_token_id=0, loss_type="ForCausalLMLoss")
    model = GPT2LMHeadModel(cfg)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4), torch.randint(0, 8192, (4, 64))


def _worker(tool: str, mode: str, steps: int, size: str, out: str) -> None:
    model, opt, data = gpt2_workload(size)
    spec = MODES[mode]
    total = WARMUP + steps
    dump = tempfile.mkdtemp(prefix="tsbench_")
    debugger = None
    if spec is not None:
        task, level, summary, *extra = spec
        # "not collecting": hooks installed at step 0 (warm-up), measured steps lie outside
        # the configured ones, so every wrapper takes its fast path.
        collect = [0, FAR_STEP] if mode == "not collecting" else list(range(total))
        path = _config(dump, mode, collect)
        if tool == "minimal":
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from minimal_recorder import MinimalRecorder
            PrecisionDebugger = lambda config_path: MinimalRecorder(dump, md5=summary == "md5", level=level)  # noqa: E731
        elif tool == "msprobe":
            from msprobe.pytorch import PrecisionDebugger
        else:
            os.environ["TSPROBE_QUIET"] = "1"
            from ts_core import PrecisionDebugger
        debugger = PrecisionDebugger(config_path=path)
    times, phases = [], []
    clock = time.process_time
    for i in range(total):
        if i == WARMUP and os.environ.get("TSBENCH_STARTUP_GC") != "1":
            gc.collect()                # the collection start-up owes (module docstring)
        t = [clock()]
        if debugger is not None:
            debugger.start(model)
        t.append(clock())
        loss = model(input_ids=data, labels=data).loss
        t.append(clock())
        loss.backward()
        t.append(clock())
        opt.step()
        opt.zero_grad()
        t.append(clock())
        if debugger is not None:
            debugger.stop()
            debugger.step()
        t.append(clock())
        times.append(t[-1] - t[0])
        phases.append([b - a for a, b in zip(t, t[1:])])
    inodes = {}                         # hard-linked tensor files count once: bytes on disk
    for r, _, fs in os.walk(dump):
        for f in fs:
            if f != "config.json":
                st = os.stat(os.path.join(r, f))
                inodes[(st.st_dev, st.st_ino)] = st.st_size
    size = sum(inodes.values())
    measured = times[WARMUP:]
    measures_work = tool == "tsprobe" and spec is not None and mode != "not collecting"
    floor = _floor(dump, spec) if measures_work else 0.0
    shutil.rmtree(dump, ignore_errors=True)
    per_phase = {p: statistics.mean(x[j] for x in phases[WARMUP:]) for j, p in enumerate(PHASES)}
    with open(out, "w") as f:
        json.dump({"median": statistics.median(measured), "mean": statistics.mean(measured),
                   "bytes_per_step": size / total, "floor": floor, "phases": per_phase}, f)




CUDA_MODES = ("statistics L0", "statistics L1", "statistics mix", "md5 L1")


def _config(dump: str, mode: str, steps: list) -> str:
    """A config.json (msprobe's format, which tsprobe reads too) for `mode`; returns its path."""
    task, level, summary, *extra = MODES[mode]
    cfg_json = {"task": task, "dump_path": dump, "rank": [], "step": steps, "level": level,
                task: {"scope": [], "list": [], "data_mode": ["all"]}}
    if task == "statistics":
        cfg_json[task]["summary_mode"] = summary
    for more in extra:
        cfg_json.update(more)
    path = os.path.join(dump, "config.json")
    with open(path, "w") as f:
        json.dump(cfg_json, f)
    return path


def _cuda_worker(tool: str, modes: list, steps: int, size: str, batch: str, out: str) -> None:
    """Wall-clock seconds per step on CUDA: for each mode, a no-tool run then the tool's run of
    the same steps, both from the same weights and seed; the tool's final loss and parameters
    against the no-tool run's, bit for bit."""
    import copy

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    device = os.environ.get("TSBENCH_DEVICE", "cuda")      # cpu: a dry run of this code path
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device here")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    layers, width = (int(x) for x in size.split("x"))
    rows, cols = (int(x) for x in batch.split("x"))
    cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=max(1, width // 64), n_positions=max(1024, cols),
                     bos_token_id=0, eos_token_id=0, loss_type="ForCausalLMLoss", attn_implementation="eager")
    model = GPT2LMHeadModel(cfg).to(device)
    start = copy.deepcopy(model.state_dict())
    data = torch.randint(0, cfg.vocab_size, (rows, cols), generator=torch.Generator().manual_seed(0)).to(device)

    def run(debugger):
        model.load_state_dict(start)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        torch.manual_seed(0)
        times = []
        for _ in range(WARMUP + steps):
            sync()
            t0 = time.perf_counter()
            if debugger is not None:
                debugger.start(model)
            loss = model(input_ids=data, labels=data).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            if debugger is not None:
                debugger.stop()
                debugger.step()
            sync()
            times.append(time.perf_counter() - t0)
        return times[WARMUP:], [loss.detach().clone()] + [p.detach().clone() for p in model.parameters()]

    results = {}
    for mode in modes:
        base, want = run(None)
        dump = tempfile.mkdtemp(prefix="tsbench_cuda_")
        path = _config(dump, mode, list(range(WARMUP + steps)))
        if tool == "msprobe":
            from msprobe.pytorch import PrecisionDebugger
        else:
            os.environ["TSPROBE_QUIET"] = "1"
            from ts_core import PrecisionDebugger
        debugger = PrecisionDebugger(config_path=path)
        timed, got = run(debugger)
        if hasattr(debugger, "close"):
            debugger.close()
        shutil.rmtree(dump, ignore_errors=True)
        results[mode] = {"base": statistics.median(base), "tool": statistics.median(timed),
                         "identical": all(torch.equal(a, b) for a, b in zip(want, got))}
        del want, got
    with open(out, "w") as f:
        json.dump(results, f)


def _cuda_table(tools: list, modes: list, steps: int, size: str, batch: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
               CUBLAS_WORKSPACE_CONFIG=os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8"))
    results: dict = {}
    for tool in tools:
        for group in ([modes] if tool == "tsprobe" else [[m] for m in modes]):   # msprobe: a process per mode
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                out = f.name
            try:
                proc = subprocess.run([sys.executable, __file__, "--cuda-worker", tool, ",".join(group), str(steps),
                                       size, batch, out], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True)
                if proc.returncode:
                    print(f"  {tool} {group}: failed\n{proc.stderr[-2000:]}", file=sys.stderr, flush=True)
                    continue
                with open(out) as f:
                    for mode, res in json.load(f).items():
                        results[(tool, mode)] = res
                        print(f"  {mode:15s} {tool:8s} {res['tool'] * 1e3:8.1f} ms/step (no tool "
                              f"{res['base'] * 1e3:.1f}), bit-identical: {res['identical']}", file=sys.stderr, flush=True)
            finally:
                os.unlink(out)
    layers, width = size.split("x")
    print(f"\nGPT-2 ({layers} layers, {width} wide, batch {batch}, AdamW, fp32, deterministic) on CUDA: wall "
          f"clock per step with synchronize, median of {steps} steps; ratio = tool / no tool in the same process\n")
    head = "| mode |" + "".join(f" {t} ms/step | {t} ratio | {t} bit-identical |" for t in tools)
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for mode in modes:
        row = f"| {mode} |"
        for tool in tools:
            res = results.get((tool, mode))
            row += " - | - | - |" if res is None else \
                f" {res['tool'] * 1e3:.1f} | {res['tool'] / res['base']:.2f}x | {'yes' if res['identical'] else 'NO'} |"
        print(row, flush=True)


def _last_step(dump: str) -> str:
    """The folder of the last recorded step."""
    steps = (d for d in os.listdir(dump) if d.startswith("step"))
    return os.path.join(dump, max(steps, key=lambda d: int(d[4:])))


def _summarised_bytes(dump: str) -> int:
    """Distinct bytes the tool summarised in one recorded step: every tensor summary of the
    last step's dump.json, tensors with equal shape, dtype and statistics counted once."""
    seen = set()
    for root, _, files in os.walk(_last_step(dump)):
        if "dump.json" in files:
            with open(os.path.join(root, "dump.json")) as f:
                stack = [json.load(f)["data"]]
            while stack:
                v = stack.pop()
                if isinstance(v, dict):
                    if "shape" in v and "Max" in v:
                        seen.add((v.get("dtype"), tuple(v["shape"]), v["Max"], v["Min"], v["Mean"], v["Norm"]))
                    else:
                        stack.extend(v.values())
                elif isinstance(v, list):
                    stack.extend(v)
    total = 0
    for dtype, shape, *_ in seen:
        n = 1
        for d in shape:
            n *= d
        total += n * _itemsize(str(dtype).split(".")[-1])
    return total


def _floor(dump: str, spec: tuple) -> "float | dict":
    """CPU seconds the mode cannot avoid per step (see the module docstring)."""
    import torch

    from ts_core import native
    task, _, summary, *_ = spec
    if task == "tensor":
        return _write_floor(dump)
    n = _summarised_bytes(dump)
    buf = torch.ones(max(1, n // 4), dtype=torch.float32)
    t0 = time.process_time()
    if summary == "md5":                        # md5 records the statistics too (as msprobe)
        buf.sum()
        native.crc32_hex(buf.numpy())           # the CRC the tool itself uses
    elif summary == "xor":
        np.bitwise_xor.reduce(buf.numpy().view(np.uint32))
    else:
        buf.sum()
    return time.process_time() - t0


def _write_floor(dump: str) -> dict:
    """CPU seconds to write the last recorded step's tensor files again, bare: a file of each
    size the tool wrote (one buffered write each), a hard link for each name it linked; and,
    apart, the same bytes as one file. The format keeps one file per tensor, and on some file
    systems creating a file costs more than its bytes (about 0.7 ms here)."""
    sizes, links = {}, 0
    for root, _, files in os.walk(_last_step(dump)):
        for f in files:
            if f.endswith(".tar"):          # the packed layout: its bytes are the floor, as one file
                sizes[f] = os.path.getsize(os.path.join(root, f))
            if f.endswith(".npy"):
                st = os.stat(os.path.join(root, f))
                links += (st.st_dev, st.st_ino) in sizes
                sizes[(st.st_dev, st.st_ino)] = st.st_size
    buf = np.zeros(max(sizes.values(), default=1), np.uint8) + 1
    view = memoryview(buf)
    out = os.path.join(dump, "floor")
    os.mkdir(out)
    t0 = time.process_time()
    for i, size in enumerate(sizes.values()):
        with open(os.path.join(out, f"{i}.npy"), "wb") as f:
            f.write(view[:size])
    for i in range(links):
        os.link(os.path.join(out, "0.npy"), os.path.join(out, f"link{i}.npy"))
    files = time.process_time() - t0
    one = np.zeros(sum(sizes.values()), np.uint8) + 1
    t0 = time.process_time()
    one.tofile(os.path.join(dump, "floor.bin"))
    return {"files": files, "one file": time.process_time() - t0}


def _itemsize(dtype: str) -> int:
    if dtype == "bfloat16":                 # numpy has no bfloat16
        return 2
    try:
        return np.dtype(dtype).itemsize
    except TypeError:                       # float8 kinds and other torch-only dtypes
        return 1


def run(tool: str, mode: str, steps: int, size: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        subprocess.run([sys.executable, __file__, "--worker", tool, mode, str(steps), size, out],
                       check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)
    finally:
        os.unlink(out)          # one file per run: ~30 an invocation, left in /tmp before


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--tools", default="tsprobe,msprobe")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--sizes", default="4x256", help="GPT-2 layers x width, comma-separated")
    p.add_argument("--startup-gc", action="store_true",
                   help="no gc.collect() after warm-up: start-up's first full collection may land in a measured step")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cuda: wall clock on the GPU with synchronize (module docstring)")
    p.add_argument("--batch", default="8x512", help="--device cuda: batch rows x sequence length")
    p.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    p.add_argument("--cuda-worker", nargs=6, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.cuda_worker:
        tool, modes, steps, size, batch, out = args.cuda_worker
        _cuda_worker(tool, modes.split(","), int(steps), size, batch, out)
        return
    if args.startup_gc:
        os.environ["TSBENCH_STARTUP_GC"] = "1"      # read by the workers
    if args.worker:
        tool, mode, steps, size, out = args.worker
        _worker(tool, mode, int(steps), size, out)
        return
    tools = [t for t in args.tools.split(",") if t != "msprobe" or importlib.util.find_spec("msprobe")]
    tools.sort(key=lambda t: t != "tsprobe")        # tsprobe's columns first
    if args.device == "cuda":
        modes = CUDA_MODES if args.modes == ",".join(MODES) else tuple(args.modes.split(","))
        sizes = "12x768" if args.sizes == "4x256" else args.sizes
        for size in sizes.split(","):
            _cuda_table([t for t in tools if t != "minimal"], [m for m in modes if MODES.get(m)], args.steps,
                        size, args.batch)
        return
    modes = args.modes.split(",")
    if "no tool" not in modes:
        modes.insert(0, "no tool")
    for size in args.sizes.split(","):
        _table(size, tools, modes, args.steps, args.rounds)


def _table(size: str, tools: list, modes: list, steps: int, rounds: int) -> None:
    results: dict = {}
    for r in range(rounds):
        for mode in modes:                     # interleaved: every tool runs each mode in turn
            for tool in (tools if MODES[mode] else ["-"]):
                if (tool != "tsprobe" and mode in TSPROBE_ONLY) or (tool == "minimal" and mode not in MINIMAL_MODES):
                    continue
                res = run(tool if tool != "-" else "tsprobe", mode, steps, size)
                results.setdefault((tool, mode), []).append(res)
                print(f"  {size} round {r + 1}: {mode:15s} {tool:8s} {res['mean'] * 1e3:8.1f} ms/step",
                      file=sys.stderr, flush=True)

    def agg(tool: str, mode: str, field: str) -> float:
        return statistics.median(x[field] for x in results[(tool, mode)])

    base_mean, base_median = agg("-", "no tool", "mean"), agg("-", "no tool", "median")
    layers, width = size.split("x")
    print(f"\nGPT-2 ({layers} layers, {width} wide, batch 4x64, AdamW, 1 thread), process CPU time "
          f"of {steps} steps x {rounds} round(s); no tool = {base_mean * 1e3:.1f} ms/step mean, "
          f"{base_median * 1e3:.1f} median\n")
    head = "| mode | tsprobe ms/step (mean) | tsprobe ratio mean / median | floor | tsprobe bytes/step |"
    for tool in (t for t in tools if t != "tsprobe"):
        head += f" {tool} ratio mean / median | {tool} bytes/step |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for mode in modes:
        if not MODES[mode]:
            continue
        row = f"| {mode} |"
        for tool in tools:
            if (tool, mode) not in results:
                row += " - | - | - | - |" if tool == "tsprobe" else " - | - |"
                continue
            mean, median = agg(tool, mode, "mean"), agg(tool, mode, "median")
            ratios = f"{mean / base_mean:.2f}x / {median / base_median:.2f}x"
            size_mb = agg(tool, mode, "bytes_per_step") / 1e6
            if tool == "tsprobe":
                floors = [x["floor"] for x in results[(tool, mode)]]
                if isinstance(floors[0], dict):     # tensor: the files, and the bytes as one file
                    files, one = (statistics.median(f[k] for f in floors) for k in ("files", "one file"))
                    floor = f"{(base_mean + files) / base_mean:.2f}x ({(base_mean + one) / base_mean:.2f}x as one file)"
                else:
                    floor = f"{(base_mean + statistics.median(floors)) / base_mean:.2f}x"
                row += f" {mean * 1e3:.1f} | {ratios} | {floor} | {size_mb:.2f} MB |"
            else:
                row += f" {ratios} | {size_mb:.2f} MB |"
        print(row, flush=True)
    print("\nWhere the time goes: process CPU time of each phase, tool minus no tool, ms/step (median of runs)\n")
    print("| mode | tool | " + " | ".join(PHASES) + " | total |")
    print("|" + "---|" * (len(PHASES) + 3))
    base = {p: statistics.median(x["phases"][p] for x in results[("-", "no tool")]) for p in PHASES}
    for (tool, mode), runs in results.items():
        if tool == "-":
            continue
        extra = [statistics.median(x["phases"][p] for x in runs) - base[p] for p in PHASES]
        print(f"| {mode} | {tool} | " + " | ".join(f"{e * 1e3:+.1f}" for e in extra) + f" | {sum(extra) * 1e3:+.1f} |")


if __name__ == "__main__":
    main()
