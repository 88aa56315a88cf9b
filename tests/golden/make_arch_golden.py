#!/usr/bin/env python3
"""Golden outputs of HF transformers for the architectures beyond Llama:
Qwen2 (qkv bias), Qwen3 (q/k norm), Mixtral and Qwen3-MoE (top-k routing).

Run where transformers is installed (the GPU machine):
    python3 tests/golden/make_arch_golden.py tests/fixtures/golden

Each case is a random-weight small model saved with save_pretrained into
<out>/<case>/ and the fp32 eager outputs in <out>/<case>.safetensors, in the
format of make_llama_golden.py (the C++ tests read both with one loader).
It also prints the tensor names save_pretrained wrote: transformers 5.17
writes MoE experts one tensor per expert (Mixtral experts.j.w1/w2/w3,
Qwen3-MoE experts.j.gate_proj/up_proj/down_proj), as the Hub checkpoints do.
"""
import json
import os
import sys

import torch
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_llama_golden import randomise, write_case  # noqa: E402

import transformers  # noqa: E402
from transformers import (AutoModelForCausalLM, MixtralConfig, Qwen2Config, Qwen3Config,  # noqa: E402
                          Qwen3MoeConfig)

torch.backends.cuda.matmul.allow_tf32 = False


def save_random(out_dir, name, cfg, save_dtype, seed):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    randomise(model)
    model_dir = os.path.join(out_dir, name)
    model.to(save_dtype).save_pretrained(model_dir, safe_serialization=True)
    path = os.path.join(model_dir, "model.safetensors")
    with safe_open(path, "pt") as f:
        names = sorted(f.keys())
        layer0 = [(n, list(f.get_slice(n).get_shape())) for n in names if n.startswith("model.layers.0.")]
    print(name, "transformers", transformers.__version__, "layer 0 tensors:", json.dumps(layer0))
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator().manual_seed(4321)

    def rand_ids(n, vocab):
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                rms_norm_eps=1e-6, max_position_embeddings=512, tie_word_embeddings=False,
                bos_token_id=0, eos_token_id=1, pad_token_id=None)
    cases = [
        ("rand_qwen2", Qwen2Config(**dict(base, num_attention_heads=4, num_key_value_heads=2,
                                          rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
         torch.bfloat16),
        ("rand_qwen3", Qwen3Config(**dict(base, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                          attention_bias=False, tie_word_embeddings=True,
                                          rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
         torch.float32),
        ("rand_mixtral", MixtralConfig(**dict(base, num_attention_heads=4, num_key_value_heads=2,
                                              num_local_experts=4, num_experts_per_tok=2,
                                              rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
         torch.float32),
        ("rand_qwen3_moe", Qwen3MoeConfig(**dict(base, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                                 num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                                 norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                                                 rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
         torch.float32),
        ("rand_qwen3_moe_unnorm", Qwen3MoeConfig(**dict(base, num_attention_heads=4, num_key_value_heads=4,
                                                        num_experts=4, num_experts_per_tok=3,
                                                        moe_intermediate_size=48, norm_topk_prob=False,
                                                        decoder_sparse_step=2, mlp_only_layers=[],
                                                        rope_parameters=dict(rope_type="default",
                                                                             rope_theta=10000.0))),
         torch.float32),
    ]
    for seed, (name, cfg, dt) in enumerate(cases):
        m = save_random(out_dir, name, cfg, dt, 100 + seed)
        samples = [rand_ids(200, 256), rand_ids(13, 256), rand_ids(90, 256)]
        write_case(out_dir, name, m, samples, [0, 2, 4],
                   {"model_dir": f"tests/fixtures/golden/{name}", "weights_dtype": str(dt),
                    "transformers": transformers.__version__})


if __name__ == "__main__":
    main()
