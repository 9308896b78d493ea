"""Which trainer module is which engine module: the mapping table of a Llama-family decoder.

vLLM's modules are not Hugging Face's. The names mostly match (``model.layers.3.mlp``), but the
outputs do not always mean the same thing: vLLM flattens rows to ``[num_tokens, H]`` and carries
the residual beside the hidden states, fusing the residual add into the next RMSNorm. A vLLM
decoder layer returns ``(hidden, residual)`` whose sum is Hugging Face's layer output; its
``input_layernorm`` (from layer 1 on) and ``post_attention_layernorm`` return
``(normed, residual)``; the final norm likewise. The logits come out of vLLM's
``logits_processor`` for the sampled rows only (HF: ``lm_head`` for every row).

Each :class:`Stage` names the module on both sides and how to read its output into a
``[rows, features]`` array; the stages are listed in data-flow order, so the first stage beyond
the noise band is where the two forwards part.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import numpy as np

# op -> what a divergence that starts there points at
OP_CAUSE = {"embed": "embedding (weights or dtype)",
            "input_layernorm": "RMSNorm (rms_norm_eps or the norm weight)",
            "self_attn": "attention (rotary: rope_theta / rope scaling, or the q/k/v/o weights)",
            "post_attention_layernorm": "RMSNorm (rms_norm_eps or the norm weight)",
            "mlp": "MLP (gate/up/down weights or the activation)",
            "output": "the layer's residual sum",
            "final_norm": "final RMSNorm (rms_norm_eps or its weight)",
            "logits": "lm_head / logits processor (weights, soft-capping or scaling)"}


@dataclass(frozen=True)
class Stage:
    name: str                  # the trainer's module path, e.g. "model.layers.0.self_attn"
    op: str                    # a key of OP_CAUSE
    layer: Optional[int]       # decoder layer, None outside the layers
    engine: str                # vLLM's module path
    engine_read: str = "out0"  # "out0": first output; "sum01": out0 + out1 (hidden + residual)


def llama_stages(num_layers: int) -> List[Stage]:
    """The stages of a Llama-family model (Llama, Mistral, Qwen2 name their modules alike)."""
    out = [Stage("model.embed_tokens", "embed", None, "model.embed_tokens")]
    for i in range(num_layers):
        p = f"model.layers.{i}"
        out += [Stage(f"{p}.input_layernorm", "input_layernorm", i, f"{p}.input_layernorm"),
                Stage(f"{p}.self_attn", "self_attn", i, f"{p}.self_attn"),
                Stage(f"{p}.post_attention_layernorm", "post_attention_layernorm", i, f"{p}.post_attention_layernorm"),
                Stage(f"{p}.mlp", "mlp", i, f"{p}.mlp"),
                Stage(p, "output", i, p, "sum01")]
    out += [Stage("model.norm", "final_norm", None, "model.norm"), Stage("lm_head", "logits", None, "logits_processor")]
    return out


def num_layers_of(model: Any) -> int:
    cfg = getattr(model, "config", None)
    n = getattr(cfg, "num_hidden_layers", None)
    if not isinstance(n, int):
        raise ValueError(f"rl-check localises Llama-family decoders: {type(model).__name__}.config has no "
                         f"num_hidden_layers")
    return n


def rows(value: Any) -> np.ndarray:
    """A tensor or array as float64 ``[rows, features]`` (batch and sequence dims flattened)."""
    if hasattr(value, "detach"):
        value = value.detach().float().cpu().numpy() if str(value.dtype) == "torch.bfloat16" \
            else value.detach().cpu().numpy()
    a = np.asarray(value, dtype=np.float64)
    return a.reshape(-1, a.shape[-1]) if a.ndim >= 1 else a.reshape(1, 1)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / ||b|| over the rows both hold (the trailing rows: vLLM's logits are the last row only)."""
    n = min(a.shape[0], b.shape[0])
    a, b = a[-n:], b[-n:]
    if a.shape != b.shape:
        return float("inf")
    den = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / (den if den > 0 else 1.0)
