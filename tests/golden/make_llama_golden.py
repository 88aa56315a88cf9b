#!/usr/bin/env python3
"""Golden outputs of HF transformers' Llama for the C++ `hf` backend tests.

Run on a machine with transformers (the GPU machine; CUDA is optional and
only adds the bf16 reference):
    python3 tests/golden/make_llama_golden.py examples/tiny-code-llama \
        examples/data/train_conversations.jsonl tests/fixtures/golden

For each case it writes <out>/<case>.safetensors holding the packed inputs
(input_ids, cu_seqlens) and the fp32 eager outputs: aux_hidden [T, k*H]
(outputs of the aux decoder layers, captured with forward hooks, in aux id
order), last_hidden [T, H] (after the final norm), target_argmax [T] and
the logits of a few rows. Random-weight cases also write their model
directory <out>/<case>/ so the C++ side loads exactly these weights.
With CUDA, bf16 sdpa outputs of HF are stored too (hf_bf16.*) for the GPU
test's tolerance.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def run_hf(model, samples, aux_ids, device, dtype):
    """Runs each sample alone (no padding); returns packed outputs."""
    model = model.to(device=device, dtype=dtype).eval()
    captured = {}
    hooks = []
    for i in aux_ids:
        def hook(_m, _inp, out, i=i):
            captured[i] = (out[0] if isinstance(out, tuple) else out).detach()
        hooks.append(model.model.layers[i].register_forward_hook(hook))
    aux, last, logits = [], [], []
    with torch.no_grad():
        for ids in samples:
            x = torch.tensor([ids], device=device)
            out = model(input_ids=x, output_hidden_states=False, use_cache=False)
            base = model.model(input_ids=x, use_cache=False)
            aux.append(torch.cat([captured[i][0] for i in aux_ids], dim=-1).float().cpu())
            last.append(base.last_hidden_state[0].float().cpu())
            logits.append(out.logits[0].float().cpu())
    for h in hooks:
        h.remove()
    return torch.cat(aux), torch.cat(last), torch.cat(logits)


def write_case(out_dir, name, model, samples, aux_ids, meta):
    ids = [i for s in samples for i in s]
    cu = [0]
    for s in samples:
        cu.append(cu[-1] + len(s))
    aux, last, logits = run_hf(model, samples, aux_ids, "cpu", torch.float32)
    T = len(ids)
    # A few logits rows: the first, last and a spread of middle tokens.
    rows = sorted(set([0, T - 1] + list(range(1, T - 1, max(1, T // 14)))))[:16]
    tensors = {
        "input_ids": torch.tensor(ids, dtype=torch.int32),
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
        "aux_hidden": aux.contiguous(),
        "last_hidden": last.contiguous(),
        "target_argmax": logits.argmax(-1).to(torch.int32),
        "logits_rows": logits[rows].contiguous(),
        "logits_row_index": torch.tensor(rows, dtype=torch.int64),
    }
    meta = dict(meta)
    meta["aux_layer_ids"] = aux_ids
    if torch.cuda.is_available():
        b_aux, b_last, b_logits = run_hf(model, samples, aux_ids, "cuda", torch.bfloat16)
        model.to("cpu", torch.float32)
        tensors["hf_bf16.aux_hidden"] = b_aux.to(torch.bfloat16)
        tensors["hf_bf16.last_hidden"] = b_last.to(torch.bfloat16)
        tensors["hf_bf16.target_argmax"] = b_logits.argmax(-1).to(torch.int32)

        def rel(a, b):
            return float((a - b).abs().max() / b.abs().max())
        meta["hf_bf16_vs_fp32_rel_inf"] = {
            "aux_hidden": rel(b_aux, aux), "last_hidden": rel(b_last, last),
            "argmax_agreement": float((b_logits.argmax(-1) == logits.argmax(-1)).float().mean()),
        }
    save_file(tensors, os.path.join(out_dir, name + ".safetensors"),
              metadata={"case": name, "meta": json.dumps(meta)})
    print(name, "T =", T, "meta =", json.dumps(meta))


def randomise(model):
    """Norm weights near 1, everything else N(0, 0.08): large enough that
    every layer changes the residual stream visibly."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.08)


def random_model(out_dir, name, cfg_kwargs, save_dtype, shard, old_style_rope, seed):
    torch.manual_seed(seed)
    cfg = LlamaConfig(**cfg_kwargs)
    model = LlamaForCausalLM(cfg)
    randomise(model)
    model_dir = os.path.join(out_dir, name)
    model.to(save_dtype).save_pretrained(
        model_dir, safe_serialization=True, max_shard_size="200KB" if shard else "1GB")
    cfg_path = os.path.join(model_dir, "config.json")
    c = json.load(open(cfg_path))
    if old_style_rope:
        # transformers 4.x layout: rope_theta + rope_scaling.
        rp = c.pop("rope_parameters")
        c["rope_theta"] = rp.pop("rope_theta")
        if rp.get("rope_type", "default") != "default":
            c["rope_scaling"] = rp
        json.dump(c, open(cfg_path, "w"), indent=2)
    # Reload exactly what is on disk, in fp32, for the reference run.
    return LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")


def main():
    model_dir, data_path, out_dir = sys.argv[1:4]
    os.makedirs(out_dir, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(model_dir)
    convs = [json.loads(l)["conversations"] for l in open(data_path)]

    def chat_ids(i, n):
        ids = tok.apply_chat_template(convs[i], tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return list(ids)[:n]

    tiny = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    L = tiny.config.num_hidden_layers
    write_case(out_dir, "tiny_code_llama", tiny,
               [chat_ids(0, 96), chat_ids(7, 64), chat_ids(21, 40)],
               [1, L // 2 - 1, L - 4], {"model_dir": "examples/tiny-code-llama"})

    g = torch.Generator().manual_seed(1234)

    def rand_ids(n, vocab):
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                rms_norm_eps=1e-5, max_position_embeddings=512, tie_word_embeddings=False,
                attention_bias=False, bos_token_id=0, eos_token_id=1, pad_token_id=None)
    cases = [
        ("rand_llama3_gqa",
         dict(base, num_attention_heads=8, num_key_value_heads=2,
              rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                   low_freq_factor=1.0, high_freq_factor=4.0,
                                   original_max_position_embeddings=64)),
         torch.float16, True, True),
        ("rand_yarn_mqa",
         dict(base, num_attention_heads=4, num_key_value_heads=1,
              rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                   original_max_position_embeddings=64, beta_fast=32.0,
                                   beta_slow=1.0)),
         torch.float32, False, False),
        ("rand_linear_headdim",
         dict(base, hidden_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
              tie_word_embeddings=True,
              rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)),
         torch.bfloat16, False, True),
        ("rand_default_mha",
         dict(base, num_attention_heads=4, num_key_value_heads=4,
              rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
         torch.float32, False, False),
    ]
    for seed, (name, kw, dt, shard, old_style) in enumerate(cases):
        m = random_model(out_dir, name, kw, dt, shard, old_style, seed)
        samples = [rand_ids(300, 256), rand_ids(17, 256), rand_ids(120, 256)]
        write_case(out_dir, name, m, samples, [0, 2, 4],
                   {"model_dir": f"tests/fixtures/golden/{name}", "weights_dtype": str(dt)})


if __name__ == "__main__":
    main()
