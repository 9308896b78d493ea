"""vLLM as an RL rollout engine: live weights on the CPU build, weight pushes, ``rl-check``.

::

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"     # before LLM(): in-process engine
    with live_weights():                                    # CPU build only; a no-op elsewhere
        llm = LLM(model=..., enforce_eager=True)
    ...
    optimizer.step()
    push_weights(llm, policy)                               # the trainer's weights into the engine
    report = ts_core.rl.check(policy, llm, prompts, out="rl_report")

Why :func:`live_weights`: vLLM's CPU build packs every linear layer's weight into its GEMM
kernel (oneDNN / sgl) once, at load time, and replaces the parameter by an empty tensor
(``dispatch_cpu_unquantized_gemm(remove_weight=True)``; ``lm_head`` keeps its parameter but
computes with the packed copy). A later ``load_weights`` then fails half-way (AttributeError: the
stand-in parameters have no ``weight_loader``; what came before the first packed layer is already
loaded), a push of ``lm_head`` alone is silently ignored, and the weights cannot be read back for
the sync check (tests/rl: ``test_vllm_cpu_packed_weights_...``).
Inside ``live_weights()`` the layers take vLLM's own unpacked path (``torch.nn.functional.linear``
on the live parameter, the path vLLM keeps for MLA's ``kv_b_proj``), as on GPU. It patches the
two ``process_weights_after_loading`` methods of this process only while the block runs: an
engine in worker processes is not reached (use the in-process engine on CPU).

Nothing here imports vllm at module import time.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterable, Iterator, Tuple

__all__ = ["live_weights", "push_weights"]


def _live_linear(self: Any, layer: Any) -> None:
    import torch.nn.functional as F

    layer.cpu_linear = F.linear         # reads layer.weight at every call: pushes take effect


@contextlib.contextmanager
def live_weights() -> Iterator[None]:
    """Build vLLM engines in this block to keep their CPU linear weights live (see the module doc)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        yield
        return
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    saved = [(cls, cls.__dict__["process_weights_after_loading"])
             for cls in (UnquantizedLinearMethod, UnquantizedEmbeddingMethod)]
    for cls, _ in saved:
        cls.process_weights_after_loading = _live_linear
    try:
        yield
    finally:
        for cls, fn in saved:
            cls.process_weights_after_loading = fn


def _load(model: Any, weights: Iterable[Tuple[str, Any]]) -> int:
    loaded = model.load_weights(list(weights))
    return len(loaded) if loaded is not None else -1


def push_weights(llm: Any, policy_or_weights: Any, only: Any = None) -> int:
    """Load the trainer's weights into the engine (``model.load_weights`` inside the worker, which
    fuses q/k/v and gate/up itself). `policy_or_weights`: a model or (name, tensor) pairs;
    `only`: a predicate on names (a partial push). The prefix cache is reset afterwards: its blocks
    hold keys and values computed with the old weights. Returns the number of engine tensors loaded."""
    import torch

    named = policy_or_weights.named_parameters() if hasattr(policy_or_weights, "named_parameters") \
        else policy_or_weights
    with torch.no_grad():
        weights = [(n, p.detach().clone()) for n, p in named if only is None or only(n)]
    n = llm.apply_model(functools.partial(_load, weights=weights))[0]
    llm.reset_prefix_cache()
    return n
