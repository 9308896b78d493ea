"""From the measurements to a verdict: PASS within the noise band, or the cause, named.

Findings come in the order a user fixes them: tokenisation (the two sides do not even see the
same tokens), weights (the engine holds other numbers), precision (another dtype), config (the
same weights through another formula: rotary, norm epsilon), then the numeric divergence that
the first three explain -- or, when none does, the op where it starts.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from .weights import layer_of

# config fields that change a forward's numbers (nested dicts such as rope_parameters are flattened)
CONFIG_KEYS = ("rope_theta", "rope_parameters", "rope_scaling", "rms_norm_eps", "layer_norm_eps", "hidden_act",
               "head_dim", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "num_hidden_layers", "vocab_size", "tie_word_embeddings", "max_position_embeddings",
               "partial_rotary_factor", "attention_bias", "mlp_bias", "sliding_window",
               "final_logit_softcapping", "attn_logit_softcapping")


def _flat(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(trainer_cfg: Any, engine_cfg: Any) -> List[Dict[str, Any]]:
    """The forward-relevant config fields whose values differ between the two sides."""
    def doc(c: Any) -> Dict[str, Any]:
        d = c.to_dict() if hasattr(c, "to_dict") else dict(vars(c)) if c is not None else {}
        return _flat({k: d[k] for k in CONFIG_KEYS if k in d})
    a, b = doc(trainer_cfg), doc(engine_cfg)
    return [{"key": k, "trainer": a.get(k), "engine": b.get(k)} for k in sorted(set(a) | set(b))
            if k in a and k in b and a[k] != b[k]]


def _layers_text(names: List[str]) -> str:
    layers = sorted({layer_of(n) for n in names if layer_of(n) is not None})
    other = [n for n in names if layer_of(n) is None]
    parts = ([f"layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))}"] if layers else []) + other
    return "; ".join(parts)


def findings(tok: List[Dict[str, Any]], weights: Dict[str, Any], cfg: List[Dict[str, Any]],
             mismatch: Dict[str, Any], logp_band: float, loc: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Every cause found, each ``{"kind", "message", ...}`` (empty: consistent within the band)."""
    out: List[Dict[str, Any]] = []
    if tok:
        t = tok[0]
        out.append({"kind": "tokenisation", "requests": [x["request"] for x in tok],
                    "message": f"the trainer's tokenizer encodes {len(tok)} prompt(s) differently from the engine's "
                               f"(request {t['request']} {t['text']!r}: from token {t['first_diff']} on, engine "
                               f"{t['engine_piece']!r} vs trainer {t['trainer_piece']!r}; {len(t['engine_ids'])} vs "
                               f"{len(t['trainer_ids'])} tokens). Not a numeric divergence: the trainer would score "
                               f"other tokens than the engine sampled from. Use one tokenizer (or the rollout's ids)."})
    if weights.get("differ"):
        names = [d["name"] for d in weights["differ"]]
        whole = len(names) == weights["checked"]
        out.append({"kind": "weights", "params": names,
                    "message": (f"all {len(names)} parameters differ between trainer and engine: the last update "
                                f"did not reach the engine" if whole else
                                f"{len(names)} of {weights['checked']} parameters differ ({_layers_text(names)}): "
                                f"{', '.join(names[:8])}{' ...' if len(names) > 8 else ''}")})
    if weights.get("packed"):
        out.append({"kind": "weights", "params": list(weights["packed"]), "unreadable": True,
                    "message": f"{len(weights['packed'])} engine parameters cannot be read back: vLLM's CPU build "
                               f"packed them into its GEMM kernels at load time and dropped them (a later load_weights "
                               f"fails on them half-way, and lm_head computes from its packed copy whatever is "
                               f"pushed). Build the LLM inside ts_integrations.vllm_rl.live_weights() to keep "
                               f"them live"})
    tdt, edt = weights.get("trainer_dtype"), weights.get("engine_dtype")
    if tdt and edt and edt not in tdt.split(","):
        out.append({"kind": "precision", "trainer_dtype": tdt, "engine_dtype": edt,
                    "message": f"precision: the engine computes in {edt}, the trainer in {tdt}: the mismatch is "
                               f"rounding of {edt}, from the first op on"})
    if cfg:
        out.append({"kind": "config", "keys": [c["key"] for c in cfg],
                    "message": "configs differ: " + ", ".join(f"{c['key']} trainer={c['trainer']!r} "
                                                              f"engine={c['engine']!r}" for c in cfg)})
    first = (loc or {}).get("first")
    above = mismatch.get("max_abs", 0.0) > logp_band
    if first is not None or above:
        where = (f"first divergence at {first['stage']} (rel {first['rel']:.3g}, {first['ratio']:.3g}x its band): "
                 f"points at {first['points_at']}" if first else "no stage localised")
        out.append({"kind": "numeric", "stage": first["stage"] if first else None,
                    "layer": first["layer"] if first else None, "op": first["op"] if first else None,
                    "message": f"log-prob mismatch max {mismatch.get('max_abs', 0.0):.3g} (band {logp_band:.3g}); "
                               f"{where}"})
    return out


def verdict(found: List[Dict[str, Any]]) -> Dict[str, Any]:
    """PASS, or FAIL with the cause that explains the divergence and where it starts."""
    if not found:
        return {"status": "PASS", "cause": None, "message": "consistent within the noise band"}
    kinds = {f["kind"]: f for f in found}
    numeric = kinds.get("numeric")
    where = f" (starts at {numeric['stage']})" if numeric and numeric.get("stage") else ""
    for kind in ("tokenisation", "weights", "precision", "config"):
        if kind in kinds:
            cause = kind
            if kind == "config" and numeric and numeric.get("op"):
                cause = {"self_attn": "config: rotary", "input_layernorm": "config: norm",
                         "post_attention_layernorm": "config: norm", "final_norm": "config: norm"}.get(
                    numeric["op"], "config")
            return {"status": "FAIL", "cause": cause, "message": kinds[kind]["message"] + where}
    return {"status": "FAIL", "cause": "numeric", "message": numeric["message"]}
