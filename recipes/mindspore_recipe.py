"""MindSpore ``Model.train`` recipe: ``MsprobeStep`` dumps the configured steps, ``MsprobeInitStep``
keeps the true step numbers of a resumed run. Runs on CPU (PyNative) in well under a minute.

    python recipes/mindspore_recipe.py [--dump-path DIR]

A tiny CNN trains 2 epochs of 4 steps with configs/statistics_mix.yaml (steps 0 and 1, level
mix: Cells, APIs and the Primitives inside the Cells). Then the run is "resumed" from epoch 2
with ``initial_epoch=2``: with ``MsprobeInitStep`` its steps are dumped as step8 and step9
(global step numbers), not step0 and step1 again.

The lines a user adds are marked (1) (2) (3).
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Model
from ts_core.backends.mindspore.numpy_init import init_numpy_quietly                           # recipes/: quiet NumPy-2 notice

from ts_core import PrecisionDebugger, seed_all                           # (1)
from ts_integrations.mindspore import MsprobeInitStep, MsprobeStep

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, os.pardir, "configs", "statistics_mix.yaml")


class TinyCNN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.head = nn.Dense(4 * 8 * 8, 5)

    def construct(self, x):
        return self.head(self.flatten(self.relu(self.bn(self.conv(x)))))


def dataset(n_batches: int = 4, batch: int = 4):
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((n_batches * batch, 3, 8, 8)).astype(np.float32)
    # one-hot float labels: a dataset column of numpy scalars fails under numpy 2 (MindSpore 2.10)
    ys = np.eye(5, dtype=np.float32)[rng.integers(0, 5, n_batches * batch)]
    return ds.NumpySlicesDataset({"x": xs, "y": ys}, shuffle=False).batch(batch)


def describe(dump_path: str) -> None:
    for step in sorted(os.listdir(dump_path), key=lambda s: int(s[4:])):
        for rank in sorted(os.listdir(os.path.join(dump_path, step))):
            with open(os.path.join(dump_path, step, rank, "dump.json"), encoding="utf-8") as f:
                data = json.load(f)["data"]
            kinds = {p: sum(k.startswith(p + ".") for k in data) for p in ("Cell", "Primitive", "Functional", "Tensor")}
            grads = sum("parameters_grad" in k for k in data)
            print(f"  {step}/{rank}: {len(data)} records {kinds}, {grads} parameters_grad")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dump-path", default=os.path.join("recipe_output", "mindspore"))
    args = p.parse_args(argv)
    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    init_numpy_quietly()           # MindSpore's NumPy-1.x message under NumPy 2 (harmless here)
    seed_all(0, rm_dropout=True)

    net = TinyCNN()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=False, reduction="mean")
    model = Model(net, loss, nn.Momentum(net.trainable_params(), 0.05, 0.9))

    first = os.path.join(args.dump_path, "run")
    debugger = PrecisionDebugger(config_path=CONFIG, dump_path=first)      # (2)
    model.train(2, dataset(), callbacks=[MsprobeStep(debugger)],           # (3)
                dataset_sink_mode=False)
    debugger.close()
    print(f"first run -> {first}")
    describe(first)

    resumed = os.path.join(args.dump_path, "resumed")
    debugger = PrecisionDebugger(config_path=CONFIG, dump_path=resumed, step=[8, 9])
    model.train(3, dataset(), callbacks=[MsprobeInitStep(), MsprobeStep(debugger)],
                dataset_sink_mode=False, initial_epoch=2)
    debugger.close()
    print(f"resumed from epoch 2 -> {resumed}")
    describe(resumed)


if __name__ == "__main__":
    main()
