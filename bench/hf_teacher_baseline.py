#!/usr/bin/env python3
"""Baseline for the teacher forward benchmark: HF transformers (sdpa, bf16)
on one GPU, random weights of a Llama shape, one batch of B x S tokens, or
with --lengths a ragged batch of samples of those lengths: transformers
pads them to the longest and masks the padding (right padding, an
attention mask), which is how it runs a batch of chat samples; tokens/s
counts the real tokens only.

Prints one JSON line with tokens/s for the forward with hidden states and
logits (like-for-like with a teacher that computes the lm_head) and for the
base model alone (hidden states, no lm_head). With --save_dir it also
writes the model there (config.json + safetensors), so the C++ teacher
benchmarks the very same weights.
"""
import argparse
import json
import time

import torch
import transformers

SHAPES = {
    # Llama-3.2-1B and Llama-3.1-8B dimensions.
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=64, tie_word_embeddings=True),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    # Qwen3-8B's dimensions (per-head q/k RMSNorm; 8.2B parameters).
    "qwen3-8b": dict(arch="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                     tie_word_embeddings=False, rope_theta=1000000.0, bos_token_id=151643, eos_token_id=151645),
    # Qwen3-30B-A3B's dimensions (128 experts, 8 per token) with 12 of its
    # 48 layers: 8.1B parameters, 16 GB in bf16.
    "qwen3-moe-a3b-12l": dict(arch="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                              num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, num_hidden_layers=12,
                              num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936,
                              tie_word_embeddings=False, rope_theta=1000000.0, bos_token_id=151643,
                              eos_token_id=151645),
    # DeepSeek-V2-Lite's dimensions (latent attention with kv_lora 512, no
    # q_lora; 64 routed experts of 1408, 6 per token, 2 shared; layer 0
    # dense) with 8 of its 27 layers: 4.1B parameters.
    "deepseek-v2-lite-8l": dict(arch="deepseek_v2", hidden_size=2048, intermediate_size=10944,
                                moe_intermediate_size=1408, num_hidden_layers=8, num_attention_heads=16,
                                num_key_value_heads=16, n_routed_experts=64, num_experts_per_tok=6,
                                n_shared_experts=2, first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=None,
                                qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, topk_method="greedy",
                                n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0,
                                vocab_size=102400, tie_word_embeddings=False, bos_token_id=100000,
                                eos_token_id=100001, max_position_embeddings=163840,
                                rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0,
                                                     original_max_position_embeddings=4096, beta_fast=32.0,
                                                     beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707)),
    # DeepSeek-V3's dimensions (q_lora 1536, kv_lora 512, 128 heads; 256
    # routed experts of 2048, 8 per token, sigmoid routing over 8 groups of
    # which 4 are kept, 1 shared; routed scaling 2.5; layers before
    # first_k_dense_replace dense) with 2 of its 61 layers, one dense and
    # one MoE: 13.8B parameters, 28 GB in bf16.
    "deepseek-v3-2l": dict(arch="deepseek_v3", hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                           num_hidden_layers=2, num_attention_heads=128, num_key_value_heads=128,
                           n_routed_experts=256, num_experts_per_tok=8, n_shared_experts=1, n_group=8, topk_group=4,
                           first_k_dense_replace=1, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                           qk_rope_head_dim=64, v_head_dim=128, routed_scaling_factor=2.5, norm_topk_prob=True,
                           vocab_size=129280, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
                           max_position_embeddings=163840,
                           rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0,
                                                original_max_position_embeddings=4096, beta_fast=32.0,
                                                beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)),
    # GPT-OSS-20B's dimensions (64 query / 8 KV heads of 64 with sinks,
    # sliding window 128 on alternate layers, 32 experts of 2880, 4 per
    # token) with 6 of its 24 layers: 5.2B parameters, experts in bf16.
    "gpt-oss-20b-6l": dict(arch="gpt_oss", hidden_size=2880, intermediate_size=2880, num_hidden_layers=6,
                           num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
                           num_experts_per_tok=4, sliding_window=128, vocab_size=201088,
                           tie_word_embeddings=False, max_position_embeddings=131072),
}


def timed(fn, repeats):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lengths", default="", help="ragged batch: sample lengths L1/L2/... (overrides --batch/--seq)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--save_dir", default="")
    args = ap.parse_args()

    shape = dict(SHAPES[args.shape])
    arch = shape.pop("arch", "llama")
    if arch == "deepseek_v2":
        cfg = transformers.DeepseekV2Config(rms_norm_eps=1e-6, attn_implementation="sdpa", torch_dtype="bfloat16",
                                            **shape)
        model_class = transformers.DeepseekV2ForCausalLM
    elif arch == "deepseek_v3":
        cfg = transformers.DeepseekV3Config(rms_norm_eps=1e-6, attn_implementation="sdpa", torch_dtype="bfloat16",
                                            **shape)
        model_class = transformers.DeepseekV3ForCausalLM
    elif arch == "gpt_oss":
        # GPT-OSS's sinks need transformers' eager attention (sdpa has no
        # sink term).
        cfg = transformers.GptOssConfig(rms_norm_eps=1e-5, attn_implementation="eager", torch_dtype="bfloat16",
                                        **shape)
        model_class = transformers.GptOssForCausalLM
    elif arch == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(max_position_embeddings=40960, rms_norm_eps=1e-6,
                                          attn_implementation="sdpa", torch_dtype="bfloat16", **shape)
        model_class = transformers.Qwen3MoeForCausalLM
    elif arch == "qwen3":
        cfg = transformers.Qwen3Config(max_position_embeddings=40960, rms_norm_eps=1e-6,
                                       attn_implementation="sdpa", torch_dtype="bfloat16", **shape)
        model_class = transformers.Qwen3ForCausalLM
    else:
        cfg = transformers.LlamaConfig(vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                                       rope_theta=500000.0, bos_token_id=128000, eos_token_id=128001,
                                       attn_implementation="sdpa", torch_dtype="bfloat16", **shape)
        model_class = transformers.LlamaForCausalLM
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = model_class(cfg).to(torch.bfloat16).eval()
    lengths = [int(n) for n in args.lengths.split("/")] if args.lengths else [args.seq] * args.batch
    longest = max(lengths)
    ids = torch.randint(0, cfg.vocab_size, (len(lengths), longest), device="cuda")
    mask = torch.zeros(len(lengths), longest, dtype=torch.long, device="cuda")
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    inputs = dict(input_ids=ids, output_hidden_states=True, use_cache=False)
    if args.lengths:
        inputs["attention_mask"] = mask
    tokens = sum(lengths)
    with torch.inference_mode():
        with_logits = timed(lambda: model(**inputs), args.repeats)
        no_logits = timed(lambda: model.model(**inputs), args.repeats)
    batch = args.lengths or f"{args.batch}x{args.seq}"
    print(json.dumps({"bench": "hf_teacher_forward", "shape": args.shape, "batch": batch, "tokens": tokens,
                      "padded_tokens": len(lengths) * longest,
                      "tok_per_s_logits": tokens / with_logits, "tok_per_s_no_logits": tokens / no_logits,
                      "transformers": transformers.__version__, "torch": torch.__version__,
                      "experts_implementation": getattr(model.config, "_experts_implementation", None),
                      "gpu": torch.cuda.get_device_name()}), flush=True)
    if args.save_dir:
        model.save_pretrained(args.save_dir, safe_serialization=True)


if __name__ == "__main__":
    main()
