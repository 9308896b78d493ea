"""Weight sync: did the trainer's last update reach the rollout engine, all of it?

A CRC-32 per parameter on both sides, compared under the *trainer's* (Hugging Face) names.
The engine's parameters are read inside its worker (``LLM.apply_model``, so it works with the
in-process engine and, with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``, with worker processes),
where fused parameters are cut back into the trainer's pieces along dim 0::

    qkv_proj.weight     = cat(q_proj.weight, k_proj.weight, v_proj.weight)
    gate_up_proj.weight = cat(gate_proj.weight, up_proj.weight)

The trainer's tensors are cast to the engine's dtype before their checksum (vLLM loads a
float32 checkpoint into a bfloat16 engine with the same round-to-nearest cast), so a bfloat16
engine holding the trainer's float32 weights still counts as synced; the dtypes are reported.
Checksums and statistics come from the dump core (``configcheck.collect.summarize_tensors``).
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Tuple

# fused engine parameter -> its trainer parts, concatenated along dim 0 in this order
FUSED: Dict[str, Tuple[str, ...]] = {"qkv_proj": ("q_proj", "k_proj", "v_proj"),
                                     "gate_up_proj": ("gate_proj", "up_proj")}


def split_plan(engine_names: Dict[str, List[int]], trainer_shapes: Dict[str, List[int]]
               ) -> Tuple[Dict[str, List[Tuple[str, int, int]]], List[str]]:
    """For each engine parameter, the trainer names it holds and their row ranges [a, b).

    Returns (plan, unmapped engine names). A fused name maps when all its parts exist on the
    trainer side and their rows add up to the engine's rows (a tensor-parallel shard does not)."""
    plan: Dict[str, List[Tuple[str, int, int]]] = {}
    unmapped: List[str] = []
    for name, shape in engine_names.items():
        if name in trainer_shapes:
            plan[name] = [(name, 0, shape[0] if shape else 0)]
            continue
        fused = next((f for f in FUSED if f".{f}." in f".{name}"), None)
        if fused is None:
            unmapped.append(name)
            continue
        parts = [name.replace(fused, p) for p in FUSED[fused]]
        if not all(p in trainer_shapes for p in parts):
            unmapped.append(name)
            continue
        rows, a = [], 0
        for p in parts:
            n = trainer_shapes[p][0]
            rows.append((p, a, a + n))
            a += n
        if shape and a != shape[0]:
            unmapped.append(name)
            continue
        plan[name] = rows
    return plan, unmapped


def _summaries(named: List[Tuple[str, Any]]) -> Dict[str, Dict[str, Any]]:
    from ts_core.backends.torch.tensors import TorchAdapter
    from ts_core.configcheck.collect import summarize_tensors

    return summarize_tensors(TorchAdapter(), named, crc=True)



def engine_summary(model: Any, trainer_shapes: Dict[str, List[int]]) -> Dict[str, Any]:
    """Runs inside the worker: a summary (CRC-32, statistics, dtype) per trainer name, cut out of
    the engine's (possibly fused) parameters; plus the names that could not be mapped."""
    import torch

    params = dict(model.named_parameters())
    packed = [n for n, p in params.items() if p.numel() == 0]     # vLLM CPU: packed at load, dropped
    plan, unmapped = split_plan({n: list(p.shape) for n, p in params.items() if p.numel()}, trainer_shapes)
    named = []
    with torch.no_grad():
        for ename, parts in plan.items():
            t = params[ename].detach()
            for tname, a, b in parts:
                named.append((tname, t[a:b].contiguous() if (a, b) != (0, t.shape[0]) else t))
    return {"summaries": _summaries(named), "unmapped": unmapped, "packed": packed,
            "dtype": str(next(iter(params.values())).dtype).replace("torch.", "") if params else None}


def read_engine(llm: Any, trainer_shapes: Dict[str, List[int]]) -> Dict[str, Any]:
    """The engine's summaries, read inside its (first) worker through ``LLM.apply_model``."""
    return llm.apply_model(functools.partial(engine_summary, trainer_shapes=trainer_shapes))[0]


def trainer_named(model: Any) -> List[Tuple[str, Any]]:
    """The trainer's parameters by name (FSDP/DDP wrappers' prefixes removed)."""
    out = []
    for name, p in model.named_parameters():
        for prefix in ("_fsdp_wrapped_module.", "_orig_mod.", "module."):
            name = name.replace(prefix, "")
        out.append((name, p))
    return out


def check_weights(model: Any, llm: Any) -> Dict[str, Any]:
    """Compare the trainer's parameters with the engine's: which differ, which one side lacks.

    Returns ``{"synced", "checked", "differ": [{"name", "trainer", "engine"}], "trainer_only",
    "engine_unmapped", "packed", "trainer_dtype", "engine_dtype"}`` (``trainer``/``engine``: the
    summaries with ``crc32`` and ``Norm``; ``packed``: engine parameters left empty because vLLM's
    CPU build packed them into its GEMM kernels at load time -- unreadable, and a later
    ``load_weights`` fails on them: see ``ts_integrations.vllm_rl.live_weights``)."""
    import torch

    named = trainer_named(model)
    shapes = {n: list(p.shape) for n, p in named}
    eng = read_engine(llm, shapes)
    esum: Dict[str, Dict[str, Any]] = eng["summaries"]
    edtype = eng["dtype"]
    cast = getattr(torch, edtype) if edtype else None
    with torch.no_grad():
        mine = _summaries([(n, p.detach().to(cast) if cast is not None and p.dtype != cast else p.detach())
                           for n, p in named if n in esum])
    differ = []
    for name, s in mine.items():
        e = esum[name]
        if s.get("crc32") != e.get("crc32") or s.get("shape") != e.get("shape"):
            differ.append({"name": name, "trainer": _brief(s), "engine": _brief(e)})
    tdtypes = sorted({str(p.dtype).replace("torch.", "") for _, p in named})
    packed = eng.get("packed", [])
    return {"synced": not differ and not packed, "checked": len(mine), "differ": differ, "packed": packed,
            "trainer_only": sorted(n for n, _ in named if n not in esum and not _tied(n, model)
                                   and not any(_holds(p, n) for p in packed)),
            "engine_unmapped": eng["unmapped"], "trainer_dtype": ",".join(tdtypes), "engine_dtype": edtype}


def _holds(engine_name: str, trainer_name: str) -> bool:
    """Does the (possibly fused) engine parameter hold the trainer's parameter?"""
    if engine_name == trainer_name:
        return True
    return any(trainer_name in {engine_name.replace(f, p) for p in parts} for f, parts in FUSED.items()
               if f".{f}." in f".{engine_name}")


def _tied(name: str, model: Any) -> bool:
    """lm_head.weight of a model with tied embeddings (the engine keeps one copy)."""
    cfg = getattr(model, "config", None)
    return name == "lm_head.weight" and bool(getattr(cfg, "tie_word_embeddings", False))


def _brief(s: Dict[str, Any]) -> Dict[str, Any]:
    return {k: s.get(k) for k in ("dtype", "shape", "crc32", "Norm")}


def layer_of(name: str) -> Optional[int]:
    """The decoder layer a parameter name belongs to (``model.layers.3.mlp...`` -> 3), else None."""
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None
