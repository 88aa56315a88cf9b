#!/usr/bin/env python3
"""Golden outputs of transformers' Qwen3-Next and Qwen3.5 text models (the
hybrid Gated DeltaNet / gated attention decoders) for the C++ teacher.

Run where transformers is installed (the GPU machine; CUDA adds the bf16
reference):
    python3 tests/golden/make_qwen3_next_golden.py tests/fixtures/golden

Cases, in make_llama_golden.py's format (model directory <out>/<case>/ and
fp32 eager outputs in <out>/<case>.safetensors):
  rand_qwen3_next      Qwen3NextForCausalLM: layers 0-2 linear attention,
                       3 full attention, 4 linear, 5 full; MoE with a shared
                       expert on every layer but layer 1 (mlp_only_layers);
                       two value heads per key head; fused in_proj_qkvz /
                       in_proj_ba as the Hub checkpoints hold them.
  rand_qwen3_5         the Qwen3.5 dense text model in the released
                       checkpoints' layout: config.json nests text_config
                       under a Qwen3_5Config, tensors are named
                       model.language_model.*, split in_proj_qkv / z / b / a.
  rand_qwen3_5_moe     the Qwen3.5 MoE text model, the same layout.
Every case also stores, for its first linear-attention layer and its first
full-attention layer, the token mixer's input and output on the first
sample (ref.linear_attn.in/out, ref.self_attn.in/out), so the C++ layers
are held to transformers' own modules before the whole model is.
Zero-centred norms (output * (1 + w)) get weights near 0; the gated norm
inside the linear attention (a plain weight) near 1; A_log is log U(1, 16)
and dt_bias near 1, as the models initialise them.
"""
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_llama_golden import write_case  # noqa: E402

import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config, Qwen3_5TextConfig  # noqa: E402
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import (  # noqa: E402
    Qwen3_5MoeConfig, Qwen3_5MoeTextConfig)
from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False

LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention",
               "linear_attention", "full_attention"]
AUX_IDS = [0, 2, 3]
VOCAB = 256
ZERO_CENTRED = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight")


def randomise(model):
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(ZERO_CENTRED) or n in ("model.norm.weight", "model.language_model.norm.weight"):
                p.copy_(0.2 * torch.randn_like(p))
            elif n.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif n.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(1.0, 16.0)))
            elif n.endswith("dt_bias"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.08)


def common_text(**extra):
    return dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=len(LAYER_TYPES), layer_types=LAYER_TYPES,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=512,
                tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=None,
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0, partial_rotary_factor=0.25),
                **extra)


def mixer_refs(model, sample):
    """Input and output of the first linear- and full-attention mixers on one sample."""
    layers = model.model.layers if hasattr(model.model, "layers") else model.model.language_model.layers
    refs, hooks = {}, []
    for kind in ("linear_attn", "self_attn"):
        idx = next(i for i, t in enumerate(LAYER_TYPES) if (t == "linear_attention") == (kind == "linear_attn"))

        def hook(_m, args, kwargs, out, kind=kind, idx=idx):
            x = args[0] if args else kwargs["hidden_states"]
            y = out[0] if isinstance(out, tuple) else out
            refs[f"ref.{kind}.in"] = x[0].detach().float().cpu().contiguous()
            refs[f"ref.{kind}.out"] = y[0].detach().float().cpu().contiguous()
            refs[f"ref.{kind}.layer"] = torch.tensor([idx], dtype=torch.int32)
        hooks.append(getattr(layers[idx], kind).register_forward_hook(hook, with_kwargs=True))
    with torch.no_grad():
        model(input_ids=torch.tensor([sample]), use_cache=False)
    for h in hooks:
        h.remove()
    return refs


def save_case(out_dir, name, model, samples, nested_config):
    """save_pretrained, then (for Qwen3.5) the released layout: a nested
    config and model.language_model.* tensor names."""
    model_dir = os.path.join(out_dir, name)
    model.save_pretrained(model_dir, safe_serialization=True)
    if nested_config is not None:
        path = os.path.join(model_dir, "model.safetensors")
        tensors = load_file(path)
        renamed = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
                   for k, v in tensors.items()}
        save_file(renamed, path, metadata={"format": "pt"})
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(nested_config.to_dict(), f, indent=2)
    reloaded = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    refs = mixer_refs(reloaded, samples[0])
    meta = {"model_dir": f"tests/fixtures/golden/{name}", "transformers": transformers.__version__,
            "layer_types": LAYER_TYPES}
    write_case(out_dir, name, reloaded, samples, AUX_IDS, meta)
    path = os.path.join(out_dir, name + ".safetensors")
    tensors = load_file(path)
    tensors.update(refs)
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    save_file(tensors, path, metadata=metadata)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator().manual_seed(2468)
    samples = [torch.randint(2, VOCAB, (n,), generator=g).tolist() for n in (70, 9, 33)]

    torch.manual_seed(11)
    next_cfg = Qwen3NextConfig(**common_text(intermediate_size=96, num_experts=4, num_experts_per_tok=2,
                                             moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                             norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1]))
    model = AutoModelForCausalLM.from_config(next_cfg)
    randomise(model)
    save_case(out_dir, "rand_qwen3_next", model, samples, None)

    for name, text_cls, outer_cls, extra in (
            ("rand_qwen3_5", Qwen3_5TextConfig, Qwen3_5Config, dict(intermediate_size=96)),
            ("rand_qwen3_5_moe", Qwen3_5MoeTextConfig, Qwen3_5MoeConfig,
             dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                  shared_expert_intermediate_size=48))):
        torch.manual_seed(12)
        text_cfg = text_cls(**common_text(**extra))
        model = AutoModelForCausalLM.from_config(text_cfg)
        randomise(model)
        outer = outer_cls(text_config=text_cfg.to_dict(), tie_word_embeddings=False)
        save_case(out_dir, name, model, samples, outer)


if __name__ == "__main__":
    main()
