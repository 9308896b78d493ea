"""How the core summarises mindtorch tensors: they are MindSpore tensors, so MindSpore's
adapter does the work (statistics on the device, one sync per flush; ``"type":
"mindspore.Tensor"`` and MindSpore's dtype names in tensor summaries, as msprobe writes in the
MSAdapter scenario). What differs is mindtorch's torch surface: ``Tensor.size`` is torch's
``size()`` method (not MindSpore's element count), and arguments are torch-style ``dtype``,
``device`` and ``Size`` values, recorded as a PyTorch dump records them (``{"type":
"torch.dtype", "value": "torch.float32"}``) so the two dumps' arguments compare equal."""
from __future__ import annotations

from typing import Any, Optional

import mindspore as ms
import mindtorch

from ..mindspore.tensors import MindSporeAdapter


class MindtorchAdapter(MindSporeAdapter):
    framework = "mindtorch"

    def stats(self, t: Any):
        if 0 in tuple(t.shape):        # empty: MindSpore's adapter reads t.size, a method here
            return None
        return super().stats(t)

    def describe_other(self, value: Any) -> Optional[dict]:
        if isinstance(value, ms.dtype.Type):          # torch.float32 is MindSpore's float32 here
            return {"type": "torch.dtype", "value": "torch." + str(value).rsplit(".", 1)[-1]}
        if isinstance(value, mindtorch.Size):
            return {"type": "torch.Size", "value": [int(d) for d in value]}
        if isinstance(value, mindtorch.device):
            where = value.type if value.index is None else f"{value.type}:{value.index}"
            return {"type": "torch.device", "value": where}
        return super().describe_other(value)
