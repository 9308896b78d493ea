"""mindtorch backend: PyTorch code running on MindSpore through mindnlp's ``mindtorch``
(msprobe's "MSAdapter scenario"). Records torch-style keys (``Module.fc.Linear.forward.0``,
``Functional.linear.0.forward``, ``Tensor.__add__.0.forward``) with ``"framework":
"mindtorch"``, so a dump pairs name for name with a real PyTorch dump of the same script.

The surface is torch's: models are ``mindtorch.nn.Module`` (hooked like torch modules: forward
pre/post hooks with kwargs), the API list is torch's (api_hooks.py). The runtime underneath is
MindSpore PyNative, so what is MindSpore's is inherited from the MindSpore backend: tensor
statistics (tensors.py subclasses its adapter), "is a gradient being recorded", the GRAPH_MODE
warning, the rank. Backward is captured while MindSpore records a gradient
(``torch.autograd.value_and_grad``, which wraps ``mindspore.value_and_grad``; mindtorch's
``loss.backward()`` computes nothing on CPU), with torch's meaning (grad_capture.py). Parameter
gradients come from a hook on each parameter (the gradient of that backward) and can be re-read
from ``.grad``, which ``value_and_grad`` sets (``record_param_grads``).
"""
from __future__ import annotations

import os
from typing import Any, Optional

import mindtorch  # before mindspore: whoever runs mindtorch code has loaded it already
import mindspore as ms

from ..mindspore import MindSporeBackend
from .api_hooks import RETURNS_SELF, ApiPatcher
from .access import MindtorchAccess
from .grad_capture import GradCapture, Sequencer, flat_tensors
from .tensors import MindtorchAdapter

__all__ = ["MindtorchBackend", "MindtorchAdapter"]


class MindtorchBackend(MindSporeBackend):
    """Records ``mindtorch.nn.Module`` models and the torch APIs of torch's api_list.yaml."""

    adapter_class = MindtorchAdapter
    access_class = MindtorchAccess
    skip_dirs = (os.path.dirname(mindtorch.__file__), os.path.dirname(ms.__file__))
    api_patcher_class = ApiPatcher
    module_prefix = "Module"
    module_grads_from_uses = False      # its own captures (grad_capture.py), not MindSpore's Cell-use taps

    def __init__(self, cfg: Any, collector: Any, switch: Any):
        super().__init__(cfg, collector, switch)
        # completes captures in backward order (MindSpore's Pending, flushed and cleared alike)
        self.pending: Optional[Sequencer] = Sequencer() if self.want_backward else None
        if ms.get_context("device_target") == "CPU":
            # mindtorch's views are copies on CPU (writing into one never reaches its base), so
            # view-like calls (view, transpose, split) are tapped like every other call and their
            # records get the gradients of their inputs, as torch's do.
            self._aliasing = RETURNS_SELF

    def _wrap_model_calls_impl(self, model: Any) -> None:
        """Nothing: mindtorch modules call functions (recorded at L1), not Primitive attributes."""

    def _grad_capture_impl(self, emit) -> GradCapture:
        return GradCapture(emit, self.pending)

    def _watch_api_outputs_impl(self, capture: GradCapture, out: Any, args: tuple, kwargs: dict,
                                inplace: bool) -> None:
        # An output that is a tapped input returned as-is (dropout with p=0) carries this call's
        # gradient, as torch's new tensor would; an untapped input returned as-is carries none.
        skip = () if inplace or capture.tapped else {id(t) for t in flat_tensors((args, kwargs), [])}
        capture.watch_outputs(out, skip)

