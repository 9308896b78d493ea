"""Cost of the config-check fingerprint (config key ``fingerprint``) per dumped step.

A CPU GPT-2 (4 layers, n_embd 256: 5.3 M parameters, 20 MB, so the parameters also get a
CRC-32) trains with a statistics L1 dump, once with ``fingerprint: false`` and once with
``true``, interleaved in one process. Two figures: a run's first dumped step (a new debugger
each time: the weights are read), and its later dumped steps (one debugger over several steps:
the weights are read only with ``fingerprint: every_step``, measured too); each the median
process CPU time per step, its ratio to ``false``, and the median wall time. The first
fingerprint of a process also reads the installed packages (once); it is reported apart.

    python benchmarks/fingerprint.py [--steps 8] [--layers 4] [--embd 256]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--embd", type=int, default=256)
    args = p.parse_args()

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    os.environ.setdefault("TSPROBE_QUIET", "1")
    from ts_core import PrecisionDebugger
    from ts_core.configcheck import collect

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=4, vocab_size=8192, n_positions=256,
                     bos_token_id=0, eos_token_id=0, loss_type="ForCausalLMLoss")
    model = GPT2LMHeadModel(cfg)
    data = torch.randint(0, 8192, (4, 64))
    n_params = sum(p.numel() for p in model.parameters())
    t0 = time.process_time()
    collect._static()
    first_read = time.process_time() - t0

    times = {False: [], True: []}
    walls = {False: [], True: []}
    for i in range(args.steps + 1):
        for fp in (False, True):
            dump = tempfile.mkdtemp(prefix="tsfp_")
            dbg = PrecisionDebugger(dump_path=dump, level="L1", step=[0], fingerprint=fp)
            t0, w0 = time.process_time(), time.perf_counter()
            dbg.start(model)
            model(data, labels=data).loss.backward()
            dbg.stop()
            dbg.step()
            spent, wall = time.process_time() - t0, time.perf_counter() - w0
            dbg.close()
            model.zero_grad()
            shutil.rmtree(dump, ignore_errors=True)
            if i:                      # the first round warms up
                times[fp].append(spent)
                walls[fp].append(wall)
    later = {False: [], True: [], "every_step": []}
    for _ in range(3):                 # later steps: one debugger per run, runs interleaved
        for fp in later:
            dump = tempfile.mkdtemp(prefix="tsfp_")
            dbg = PrecisionDebugger(dump_path=dump, level="L1", step=list(range(args.steps + 1)), fingerprint=fp)
            for i in range(args.steps + 1):
                t0 = time.process_time()
                dbg.start(model)
                model(data, labels=data).loss.backward()
                dbg.stop()
                dbg.step()
                if i:
                    later[fp].append(time.process_time() - t0)
                model.zero_grad()
            dbg.close()
            shutil.rmtree(dump, ignore_errors=True)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"GPT-2 {args.layers}x{args.embd}: {n_params / 1e6:.1f} M parameters, {n_params * 4 / 2**20:.0f} MB "
          f"(CRC-32 {'on' if n_params * 4 <= collect.CRC_LIMIT else 'off'})")
    print(f"dumped step (statistics L1), median CPU s: fingerprint off {off:.3f}, on {on:.3f}, "
          f"ratio {on / off:.3f} (+{(on - off) * 1000:.0f} ms)")
    woff, won = statistics.median(walls[False]), statistics.median(walls[True])
    print(f"dumped step, median wall s: fingerprint off {woff:.3f}, on {won:.3f}, ratio {won / woff:.3f} "
          f"(+{(won - woff) * 1000:.0f} ms)")
    base = statistics.median(later[False])
    for fp in (True, "every_step"):
        m = statistics.median(later[fp])
        print(f"later dumped steps, median CPU s: fingerprint off {base:.3f}, {fp!s:<10} {m:.3f}, ratio "
              f"{m / base:.3f} (+{(m - base) * 1000:.1f} ms)")
    print(f"reading the installed packages, once per process: {first_read * 1000:.0f} ms")


if __name__ == "__main__":
    main()
