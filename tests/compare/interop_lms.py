"""Tiny Hugging Face LMs (GPT-2, Llama, BERT) for one training step with labels (the loss is
``F.cross_entropy``), dumped by tsprobe here and by msprobe 26.2 in a fresh process
(``python interop_lms.py ARCH CONFIG``): issue 40's same-run pairs."""
import sys

import torch

ARCHS = ("gpt2", "llama", "bert")


def build(arch: str):
    """The model (random weights, seed 0, eval: no dropout) and its token ids."""
    import transformers as tf

    torch.manual_seed(0)
    if arch == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32))
    elif arch == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                                   num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                                                   max_position_embeddings=32))
    else:
        model = tf.BertForMaskedLM(tf.BertConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                                 num_attention_heads=2, vocab_size=64, max_position_embeddings=32))
    model.eval()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    return model, ids


def one_step(debugger, arch: str, scale_head: float = 1.0) -> None:
    """Forward with labels, backward, an SGD step, between start and stop. ``scale_head``: a
    planted bug (the output projection's weight scaled)."""
    model, ids = build(arch)
    if scale_head != 1.0:
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(scale_head)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger.start(model)
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
    debugger.stop()
    debugger.step()


if __name__ == "__main__":
    from msprobe.pytorch import PrecisionDebugger

    one_step(PrecisionDebugger(config_path=sys.argv[2]), sys.argv[1])
