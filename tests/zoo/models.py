"""Tiny transformers models of every family people train, built from configs (random weights, no hub).

``ARCHS`` maps a name to ``(family, build)``; ``build()`` returns ``(model, batch)`` where
``model(**batch).loss`` is the training loss. Sizes are as small as each architecture allows
(hidden 32, 2 layers, vocabulary 97, 8 tokens or 32x32 images) so that one training step of
every model, with and without the tool, fits in the test suite.
"""
from __future__ import annotations

from typing import Callable, Dict, Tuple

import torch

VOCAB = 97
SEQ = 8
BATCH = 2

# Decoder-style sizes shared by the Llama-like families.
_LM = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def _lm(model) -> Tuple[torch.nn.Module, dict]:
    ids = _ids()
    return model, {"input_ids": ids, "labels": ids}


def _seq2seq(model) -> Tuple[torch.nn.Module, dict]:
    return model, {"input_ids": _ids(1), "labels": _ids(2)}


def _image(model) -> Tuple[torch.nn.Module, dict]:
    g = torch.Generator().manual_seed(1)
    return model, {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=g),
                   "labels": torch.randint(0, 5, (BATCH,), generator=g)}


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    return _lm(LlamaForCausalLM(LlamaConfig(**_LM)))


def _mistral():
    from transformers import MistralConfig, MistralForCausalLM
    return _lm(MistralForCausalLM(MistralConfig(**_LM)))


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    return _lm(Qwen2ForCausalLM(Qwen2Config(**_LM)))


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return _lm(Qwen3ForCausalLM(Qwen3Config(head_dim=8, **_LM)))


def _gemma():
    from transformers import GemmaConfig, GemmaForCausalLM
    return _lm(GemmaForCausalLM(GemmaConfig(head_dim=8, **_LM)))


def _phi3():
    from transformers import Phi3Config, Phi3ForCausalLM
    return _lm(Phi3ForCausalLM(Phi3Config(pad_token_id=0, bos_token_id=1, eos_token_id=2, **_LM)))


def _mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM
    return _lm(MixtralForCausalLM(MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **_LM)))


def _qwen2_moe():
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
    return _lm(Qwen2MoeForCausalLM(Qwen2MoeConfig(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, **_LM)))


def _mamba():
    from transformers import MambaConfig, MambaForCausalLM
    return _lm(MambaForCausalLM(MambaConfig(vocab_size=VOCAB, hidden_size=32, state_size=8,
                                            num_hidden_layers=2, expand=2, conv_kernel=4)))


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    return _lm(GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                          n_positions=64, bos_token_id=0, eos_token_id=0)))


def _gpt_neox():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    return _lm(GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=4, intermediate_size=64,
                                                max_position_embeddings=64)))


def _falcon():
    from transformers import FalconConfig, FalconForCausalLM
    return _lm(FalconForCausalLM(FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=4)))


def _opt():
    from transformers import OPTConfig, OPTForCausalLM
    return _lm(OPTForCausalLM(OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, ffn_dim=64, max_position_embeddings=64,
                                        word_embed_proj_dim=32)))


def _bloom():
    from transformers import BloomConfig, BloomForCausalLM
    return _lm(BloomForCausalLM(BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)))


_ENC = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64)


def _bert():
    from transformers import BertConfig, BertForMaskedLM
    return _lm(BertForMaskedLM(BertConfig(**_ENC)))


def _roberta():
    from transformers import RobertaConfig, RobertaForMaskedLM
    return _lm(RobertaForMaskedLM(RobertaConfig(**{**_ENC, "max_position_embeddings": 72})))


def _distilbert():
    from transformers import DistilBertConfig, DistilBertForMaskedLM
    return _lm(DistilBertForMaskedLM(DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4,
                                                      hidden_dim=64, max_position_embeddings=64)))


def _deberta_v2():
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM
    return _lm(DebertaV2ForMaskedLM(DebertaV2Config(relative_attention=True, pos_att_type=["p2c", "c2p"],
                                                    position_buckets=8, **_ENC)))


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration
    return _seq2seq(T5ForConditionalGeneration(T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)))


def _bart():
    from transformers import BartConfig, BartForConditionalGeneration
    return _seq2seq(BartForConditionalGeneration(BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)))


def _vit():
    from transformers import ViTConfig, ViTForImageClassification
    return _image(ViTForImageClassification(ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=5)))


def _convnext():
    from transformers import ConvNextConfig, ConvNextForImageClassification
    return _image(ConvNextForImageClassification(ConvNextConfig(
        hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=5)))


def _resnet():
    from transformers import ResNetConfig, ResNetForImageClassification
    return _image(ResNetForImageClassification(ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=5)))


def _swin():
    from transformers import SwinConfig, SwinForImageClassification
    return _image(SwinForImageClassification(SwinConfig(
        image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[2, 2], window_size=4,
        num_labels=5)))


ARCHS: Dict[str, Tuple[str, Callable[[], Tuple[torch.nn.Module, dict]]]] = {
    "llama": ("decoder", _llama), "mistral": ("decoder", _mistral), "qwen2": ("decoder", _qwen2),
    "qwen3": ("decoder", _qwen3), "gemma": ("decoder", _gemma), "phi3": ("decoder", _phi3),
    "mixtral": ("decoder-moe", _mixtral), "qwen2_moe": ("decoder-moe", _qwen2_moe),
    "mamba": ("state-space", _mamba), "gpt2": ("decoder", _gpt2), "gpt_neox": ("decoder", _gpt_neox),
    "falcon": ("decoder", _falcon), "opt": ("decoder", _opt), "bloom": ("decoder", _bloom),
    "bert": ("encoder", _bert), "roberta": ("encoder", _roberta), "distilbert": ("encoder", _distilbert),
    "deberta_v2": ("encoder", _deberta_v2), "t5": ("encoder-decoder", _t5),
    "bart": ("encoder-decoder", _bart), "vit": ("vision", _vit), "convnext": ("vision", _convnext),
    "resnet": ("vision", _resnet), "swin": ("vision", _swin),
}


def build(name: str, seed: int = 0) -> Tuple[torch.nn.Module, dict]:
    """A fresh model with seeded random weights, in training mode, and its batch."""
    torch.manual_seed(seed)
    model, batch = ARCHS[name][1]()
    model.train()
    return model, batch
