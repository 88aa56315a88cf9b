#!/usr/bin/env python3
"""Golden outputs of HF transformers for the DeepSeek family: multi-head
latent attention (MLA) and DeepSeekMoE, in three small random models:

  rand_deepseek_v3      DeepseekV3ForCausalLM: q_lora, sigmoid routing with
                        e_score_correction_bias, 4 expert groups of which 2
                        are kept, a shared expert, one dense first layer,
                        YaRN (mscale = mscale_all_dim), interleaved rope;
                        bf16 weights with the bias in fp32, as the Hub ships.
  rand_deepseek_v2_lite DeepseekV2ForCausalLM: no q_lora (plain q_proj),
                        softmax greedy routing, two shared experts, YaRN
                        with mscale 0.707 as V2-Lite has; fp32 weights.
  rand_deepseek_v3_fp8  DeepseekV3ForCausalLM with every projection in
                        float8_e4m3fn plus weight_scale_inv (one fp32 scale
                        per block) and quantization_config, the layout of
                        the official FP8 checkpoints; one group (Kimi-K2
                        style). Blocks of 16 x 32 instead of 128 x 128, so
                        that these small weights span several blocks, some
                        of them partial.
  rand_deepseek_v2_glg  DeepseekV2ForCausalLM with q_lora and DeepSeek-V2's
                        own routing: softmax scores, group_limited_greedy
                        over 4 groups of which 2 are kept (each group
                        ranked by its best expert), routed scaling 16 and
                        no renormalisation, as the full V2 ships; bf16.

Run where transformers is installed (the GPU machine):
    python3 tests/golden/make_deepseek_golden.py tests/fixtures/golden [SOURCES_DUMP] [--only=CASE,...]

--only writes the named cases alone (each case's weights and samples come
from its own seed and its own place in the sample draw, so the other
fixtures stay as they are).

The weights on disk are written here from the model's state dict (routed
experts one tensor per expert, the Hub layout, whatever layout the model
holds them in), and the model is then given exactly what is on disk
(bf16-rounded, or FP8-dequantized) before the fp32 eager reference runs, so
the C++ side loads the very weights the reference used. The outputs go to
<out>/<case>.safetensors in make_llama_golden.py's format; the metadata also
records the attention's softmax scale and the rotary attention factor that
transformers computed, so the tests can check the C++ config arithmetic.
"""
import json
import math
import os
import sys
import traceback

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_llama_golden import randomise, write_case  # noqa: E402

import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, DeepseekV2Config, DeepseekV3Config  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False

FP8_MAX = 448.0  # largest finite float8_e4m3fn
QUANTIZED = ("q_proj.weight", "q_a_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight",
             "kv_b_proj.weight", "o_proj.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight")


def hub_state_dict(model):
    """The model's tensors under the Hub's names: fused expert tensors
    (gate_up_proj [E, 2I, H], down_proj [E, H, I]) split one per expert."""
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().float().contiguous()
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[f"{prefix}{e}.up_proj.weight"] = t[e, inter:].clone()
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e].clone()
        else:
            out[name] = t
    return out


def load_hub_state_dict(model, hub):
    """Gives the model exactly `hub`'s values (the inverse of hub_state_dict);
    strict, so a tensor the model has and `hub` lacks is an error."""
    state = {}
    for name, t in model.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            state[name] = torch.stack([torch.cat([hub[f"{prefix}{e}.gate_proj.weight"],
                                                  hub[f"{prefix}{e}.up_proj.weight"]]) for e in range(t.shape[0])])
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            state[name] = torch.stack([hub[f"{prefix}{e}.down_proj.weight"] for e in range(t.shape[0])])
        else:
            state[name] = hub[name]
    model.load_state_dict(state, strict=True)


def quantize_blocks(w, block):
    """float8_e4m3fn values and one fp32 scale per block (the official
    checkpoints' weight_scale_inv: dequantized = fp8 * scale)."""
    rows, cols = w.shape
    br, bc = block
    nr, nc = math.ceil(rows / br), math.ceil(cols / bc)
    padded = torch.zeros(nr * br, nc * bc)
    padded[:rows, :cols] = w
    blocks = padded.view(nr, br, nc, bc)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale = (amax / FP8_MAX).float()
    q = (blocks / scale[:, None, :, None]).view(nr * br, nc * bc)[:rows, :cols].to(torch.float8_e4m3fn)
    return q.contiguous(), scale.contiguous()


def dequantize_blocks(q, scale, block):
    expanded = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return q.float() * expanded[: q.shape[0], : q.shape[1]]


def save_case_model(model, model_dir, weights, fp8_block=None):
    """Writes config.json and model.safetensors. `weights` is "float32" or
    "bfloat16" (e_score_correction_bias stays fp32, as the Hub ships it);
    fp8_block quantizes every projection. Returns the values written, as
    fp32 under the Hub's names."""
    os.makedirs(model_dir, exist_ok=True)
    hub = hub_state_dict(model)
    disk, values = {}, {}
    for name, t in sorted(hub.items()):
        if fp8_block is not None and name.startswith("model.layers.") and name.endswith(QUANTIZED):
            q, scale = quantize_blocks(t, fp8_block)
            disk[name] = q
            disk[name.replace(".weight", ".weight_scale_inv")] = scale
            values[name] = dequantize_blocks(q, scale, fp8_block)
        elif weights == "bfloat16" and not name.endswith("e_score_correction_bias"):
            disk[name] = t.to(torch.bfloat16)
            values[name] = disk[name].float()
        else:
            disk[name] = t
            values[name] = t
    save_file(disk, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(model_dir)
    cfg_path = os.path.join(model_dir, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["architectures"] = [type(model).__name__]  # config.save_pretrained alone leaves it unset
    cfg["dtype"] = weights
    if fp8_block is not None:
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                      "weight_block_size": list(fp8_block)}
    json.dump(cfg, open(cfg_path, "w"), indent=2, sort_keys=True)
    layer1 = [(n, str(disk[n].dtype), list(disk[n].shape)) for n in sorted(disk) if n.startswith("model.layers.1.")]
    print(model_dir, "transformers", transformers.__version__, "layer 1 tensors:", json.dumps(layer1))
    return values


def build(name, cfg, weights, seed, out_dir, fp8_block=None):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    randomise(model)
    with torch.no_grad():
        for buf_name, buf in model.named_buffers():
            if buf_name.endswith("e_score_correction_bias"):
                buf.normal_(0.0, 0.1)
    values = save_case_model(model, os.path.join(out_dir, name), weights, fp8_block)
    load_hub_state_dict(model, values)
    model = model.float().eval()
    attn = model.model.layers[1].self_attn
    facts = {"hf_softmax_scale": float(attn.scaling),
             "hf_rope_attention_scaling": float(model.model.rotary_emb.attention_scaling),
             "hf_mlp_types": [type(layer.mlp).__name__ for layer in model.model.layers]}
    print(name, "facts", json.dumps(facts))
    return model, facts


def dump_sources(path):
    """The transformers code these goldens come from, for reading beside
    the C++ (optional second argument)."""
    import inspect
    from transformers.modeling_rope_utils import _compute_yarn_parameters
    from transformers.models.deepseek_v2 import modeling_deepseek_v2
    from transformers.models.deepseek_v3 import modeling_deepseek_v3
    with open(path, "w") as f:
        for src in (modeling_deepseek_v3, modeling_deepseek_v2, _compute_yarn_parameters):
            f.write(inspect.getsource(src) + "\n\n")


def main():
    only = [a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--only=")]
    only = only[0] if only else None
    args = [a for a in sys.argv[1:] if not a.startswith("--only=")]
    out_dir = args[0]
    if len(args) > 1:
        try:
            dump_sources(args[1])
        except Exception:  # the sources are for reading only
            traceback.print_exc()
    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator().manual_seed(8642)

    def rand_ids(n, vocab):
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    base = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                num_attention_heads=4, rms_norm_eps=1e-6, max_position_embeddings=2048,
                tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=None)
    # num_key_value_heads: MLA reads it only for its repeat_kv, where it
    # must equal the head count (the V3 config's default, 128, would not).
    mla = dict(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24, num_key_value_heads=4)
    v3_yarn = dict(rope_type="yarn", rope_theta=10000.0, factor=8.0, original_max_position_embeddings=256,
                   beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
    v2_yarn = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=128,
                   beta_fast=32.0, beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707)
    cases = [
        ("rand_deepseek_v3",
         DeepseekV3Config(**base, **mla, q_lora_rank=48, n_routed_experts=8, num_experts_per_tok=3,
                          n_shared_experts=1, moe_intermediate_size=16, n_group=4, topk_group=2,
                          norm_topk_prob=True, routed_scaling_factor=2.5, first_k_dense_replace=1,
                          rope_interleave=True, rope_parameters=v3_yarn),
         "bfloat16", None),
        ("rand_deepseek_v2_lite",
         DeepseekV2Config(**dict(base, max_position_embeddings=512), **mla, q_lora_rank=None, n_routed_experts=8,
                          num_experts_per_tok=2, n_shared_experts=2, moe_intermediate_size=16,
                          topk_method="greedy", n_group=1, topk_group=1, norm_topk_prob=False,
                          routed_scaling_factor=1.0, first_k_dense_replace=1,
                          rope_parameters=v2_yarn),
         "float32", None),
        ("rand_deepseek_v3_fp8",
         DeepseekV3Config(**base, **mla, q_lora_rank=48, n_routed_experts=4, num_experts_per_tok=2,
                          n_shared_experts=1, moe_intermediate_size=32, n_group=1, topk_group=1,
                          norm_topk_prob=True, routed_scaling_factor=1.5, first_k_dense_replace=1,
                          rope_interleave=True, rope_parameters=v3_yarn),
         "bfloat16", (16, 32)),
        ("rand_deepseek_v2_glg",
         DeepseekV2Config(**dict(base, max_position_embeddings=512), **mla, q_lora_rank=48, n_routed_experts=8,
                          num_experts_per_tok=3, n_shared_experts=1, moe_intermediate_size=16,
                          topk_method="group_limited_greedy", n_group=4, topk_group=2, norm_topk_prob=False,
                          routed_scaling_factor=16.0, first_k_dense_replace=1,
                          rope_parameters=v2_yarn),
         "bfloat16", None),
    ]
    failed = []
    for seed, (name, cfg, weights, block) in enumerate(cases):
        samples = [rand_ids(100, 256), rand_ids(13, 256), rand_ids(60, 256)]
        if only is not None and name not in only:
            continue
        try:
            model, facts = build(name, cfg, weights, 300 + seed, out_dir, block)
            meta = {"model_dir": f"tests/fixtures/golden/{name}", "weights_dtype": weights,
                    "fp8_block": list(block) if block else None, "transformers": transformers.__version__}
            meta.update(facts)
            write_case(out_dir, name, model, samples, [0, 1, 2], meta)
        except Exception:  # report every case, not only the first failure
            traceback.print_exc()
            failed.append(name)
    if failed:
        sys.exit(f"failed: {failed}")


if __name__ == "__main__":
    main()
