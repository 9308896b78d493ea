"""Workarounds for bugs of mindtorch itself (mindnlp 0.5.1 on CPU), applied by this test
harness before the model runs. They fix the dependency, not tsprobe, and are not mocks: the
real mindtorch code runs, minus the one defect. docs/mindtorch.md shows users the same fix.

``Tensor._move_to(device)`` rebuilds the tensor from ``asnumpy()`` whenever the target device
is the CPU, even when the tensor already is on the CPU. The rebuilt tensor is a new leaf, so
the autodiff graph is cut there: mindtorch's binary ops call ``.to(device)`` on both operands
when their recorded devices compare unequal (e.g. ``cpu`` and ``cpu:0``), and everything
before such an op (``a - b``, ``F.mse_loss``) then gets zero gradients. Returning the tensor
itself when it is already on the CPU removes the defect; moves between devices are untouched.
"""
from __future__ import annotations


def fix_move_to_cpu() -> None:
    import mindtorch

    tensor_cls = mindtorch.Tensor
    orig = tensor_cls._move_to
    if getattr(orig, "__tsprobe_test_fix__", False):
        return

    def _move_to(self, device, non_blocking=False):
        if device.type == "cpu" and self.device.type == "cpu":
            return self
        return orig(self, device, non_blocking)

    _move_to.__tsprobe_test_fix__ = True
    tensor_cls._move_to = _move_to
