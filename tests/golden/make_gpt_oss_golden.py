#!/usr/bin/env python3
"""Golden outputs of transformers' GptOssForCausalLM for the C++ `hf` backend.

Run where transformers is installed (the GPU machine):
    python3 tests/golden/make_gpt_oss_golden.py tests/fixtures/golden

Two random-weight cases, in make_llama_golden.py's format (model directory
<out>/<case>/ and fp32 eager outputs in <out>/<case>.safetensors):
  rand_gpt_oss        bf16 checkpoint as save_pretrained writes it
                      (experts as gate_up_proj [E, H, 2I] with gate and up
                      interleaved in its columns, down_proj [E, I, H]);
  rand_gpt_oss_mxfp4  the same architecture with the experts in MXFP4 as the
                      official checkpoints ship them: *_blocks (uint8, two
                      e2m1 values a byte) and *_scales (uint8 E8M0), and
                      config.json's quantization_config. The reference
                      forward runs on transformers' own dequantization of
                      those blocks (integrations/mxfp4.py
                      convert_moe_packed_tensors), and layer 0's dequantized
                      experts are stored (ref.layer0.*), so the C++
                      dequantizer is checked against transformers', not
                      against this script.
Both have a sliding window of 8 under samples of 37, 9 and 24 tokens, so
sliding layers really drop keys; the second case's layer_types do not
alternate. Expert weights are drawn large enough that the SwiGLU clamp
(limit 7) bites on a few percent of values (meta: clamp_fraction).
"""
import json
import os
import shutil
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_llama_golden import randomise, write_case  # noqa: E402

import transformers  # noqa: E402
from transformers import GptOssConfig, GptOssForCausalLM  # noqa: E402
from transformers.integrations.mxfp4 import convert_moe_packed_tensors  # noqa: E402

# The e2m1 code table (OCP MX spec): codes 0-7 positive, 8-15 negated.
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]

torch.backends.cuda.matmul.allow_tf32 = False

AUX_IDS = [0, 2, 3]
VOCAB = 128
EXPERT_PARAMS = ("gate_up_proj", "down_proj")


def quantize_mxfp4(w):
    """w [E, out, in] (nn.Linear layout), in % 32 == 0 -> (blocks [E, out,
    in/32, 16] uint8, scales [E, out, in/32] uint8). Each block of 32 gets the
    smallest power of two 2^e with max|x| / 2^e <= 6 and each value the
    nearest e2m1 code; element 2j of a block goes in byte j's low nibble,
    element 2j+1 in its high nibble."""
    E, R, C = w.shape
    blocks = w.float().reshape(E, R, C // 32, 32)
    amax = blocks.abs().amax(-1).clamp(min=2.0 ** -126)
    e = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127).to(torch.int32)
    scaled = blocks / torch.pow(2.0, e.float())[..., None]
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    code = (scaled[..., None] - lut).abs().argmin(-1)
    packed = (code[..., 0::2] | (code[..., 1::2] << 4)).to(torch.uint8)
    return packed.contiguous(), (e + 127).to(torch.uint8).contiguous()


def hf_dequantize(blocks, scales):
    """transformers' dequantization: [E, out, in/32, 16] -> [E, in, out]."""
    return convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).float().cpu()


def linear_layout(param, E, out_features, in_features):
    """An expert parameter as [E, out, in]; transformers 5 keeps GPT-OSS's
    [E, in, out] (x @ W), which this also accepts the other way round."""
    if tuple(param.shape) == (E, in_features, out_features):
        return param.transpose(1, 2), True
    assert tuple(param.shape) == (E, out_features, in_features), param.shape
    return param, False


def make_model(cfg, seed):
    torch.manual_seed(seed)
    model = GptOssForCausalLM(cfg)
    randomise(model)
    with torch.no_grad():
        for layer in model.model.layers:
            # Sinks of either sign and order 1, so that they take a visible
            # share of the softmax; gate/up large enough to reach the clamp.
            layer.self_attn.sinks.normal_(0.0, 1.0)
            layer.mlp.experts.gate_up_proj.normal_(0.0, 0.5)
    return model


def quantize_experts(model, cfg):
    """Replaces every expert weight by transformers' dequantization of its
    MXFP4 form; returns {tensor name: blocks or scales} for the checkpoint."""
    E, H, I = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
    packed = {}
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for name, out_f, in_f in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
                param = getattr(layer.mlp.experts, name)
                w, transposed = linear_layout(param.data, E, out_f, in_f)
                blocks, scales = quantize_mxfp4(w)
                deq = hf_dequantize(blocks, scales)  # [E, in, out]
                param.copy_(deq if transposed else deq.transpose(1, 2))
                prefix = f"model.layers.{i}.mlp.experts.{name}"
                packed[prefix + "_blocks"] = blocks
                packed[prefix + "_scales"] = scales
    return packed


def clamp_fraction(model, samples, cfg):
    """Share of gate/up values past the clamp, over every expert and token."""
    E, H, I = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
    limit = getattr(cfg, "swiglu_limit", 7.0)
    seen = []

    def hook(module, args, kwargs, _out):
        x = args[0] if args else kwargs["hidden_states"]
        w, _ = linear_layout(module.gate_up_proj, E, 2 * I, H)  # [E, 2I, H]
        gate_up = x.reshape(-1, H) @ w.transpose(1, 2) + module.gate_up_proj_bias[:, None, :]
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        seen.append(((gate > limit).sum() + (up.abs() > limit).sum()).item() / (2 * gate.numel()))

    hooks = [layer.mlp.experts.register_forward_hook(hook, with_kwargs=True) for layer in model.model.layers]
    try:
        with torch.no_grad():
            for s in samples:
                model(input_ids=torch.tensor([s]), use_cache=False)
        return sum(seen) / len(seen)
    except Exception as e:  # a statistic for the record, not part of the reference
        return f"not measured: {type(e).__name__}: {e}"[:200]
    finally:
        for h in hooks:
            h.remove()


def describe_checkpoint(path):
    with safe_open(path, "pt") as f:
        out = []
        for n in sorted(f.keys()):
            if n.startswith("model.layers.0."):
                t = f.get_tensor(n)
                out.append((n, list(t.shape), str(t.dtype)))
        return out


def save_plain(model, model_dir, dtype):
    model.to(dtype).save_pretrained(model_dir, safe_serialization=True)
    model.to(torch.float32)
    return GptOssForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")


def save_mxfp4(model, cfg, model_dir, dtype):
    """The checkpoint as the official ones are laid out: non-expert weights
    in `dtype`, experts as blocks and scales, biases in `dtype`."""
    packed = quantize_experts(model, cfg)
    with tempfile.TemporaryDirectory() as tmp:
        ref = save_plain(model, tmp, dtype)
        tensors = load_file(os.path.join(tmp, "model.safetensors"))
        for name in list(tensors):
            if name.rsplit(".", 1)[-1] in EXPERT_PARAMS and ".mlp.experts." in name:
                del tensors[name]
        tensors.update(packed)
        os.makedirs(model_dir, exist_ok=True)
        save_file(tensors, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})
        for f in os.listdir(tmp):
            if f.endswith(".json") and f != "model.safetensors.index.json":
                shutil.copy(os.path.join(tmp, f), model_dir)
    cfg_path = os.path.join(model_dir, "config.json")
    c = json.load(open(cfg_path))
    c["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
    }
    json.dump(c, open(cfg_path, "w"), indent=2)
    # The reference must run on exactly the dequantized experts (bf16 holds
    # every e2m1 x 2^k value exactly).
    for i, layer in enumerate(ref.model.layers):
        for name in EXPERT_PARAMS:
            a, b = getattr(layer.mlp.experts, name), getattr(model.model.layers[i].mlp.experts, name)
            assert torch.equal(a.float(), b.float()), (i, name)
    return ref


def try_hf_mxfp4_load(model_dir, ref, samples):
    """transformers' own loader on the MXFP4 directory, dequantizing: same
    outputs as the reference, if it reads the names and layout we wrote."""
    try:
        from transformers import Mxfp4Config
        m = GptOssForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager",
                                              quantization_config=Mxfp4Config(dequantize=True), device_map="cpu")
        m = m.float().eval()
        worst = 0.0
        with torch.no_grad():
            for s in samples:
                x = torch.tensor([s])
                a = m(input_ids=x, use_cache=False).logits.float()
                b = ref(input_ids=x, use_cache=False).logits.float()
                worst = max(worst, float((a - b).abs().max() / b.abs().max()))
        return {"ok": True, "logits_rel_inf_vs_reference": worst}
    except Exception as e:  # recorded, not fatal: the reference does not depend on it
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}


def write(out_dir, name, model, samples, meta):
    try:
        write_case(out_dir, name, model, samples, AUX_IDS, meta)
    except Exception as e:  # the bf16 CUDA pass is optional: retry on the CPU only
        print(name, "write_case failed with CUDA, retrying on the CPU:", repr(e)[:300])
        model.to("cpu", torch.float32)
        available = torch.cuda.is_available
        torch.cuda.is_available = lambda: False
        try:
            write_case(out_dir, name, model, samples, AUX_IDS, dict(meta, bf16_reference_error=repr(e)[:300]))
        finally:
            torch.cuda.is_available = available


def add_tensors(path, extra):
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        tensors = {n: f.get_tensor(n) for n in f.keys()}
    tensors.update(extra)
    save_file(tensors, path, metadata=meta)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator().manual_seed(2468)

    def rand_ids(n):
        return torch.randint(0, VOCAB, (n,), generator=g).tolist()

    # hidden 96 against 2I = 64 and I = 32: no expert tensor is square, so
    # its layout is never ambiguous; all are whole MXFP4 blocks of 32.
    base = dict(vocab_size=VOCAB, hidden_size=96, intermediate_size=32, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                num_experts_per_tok=2, sliding_window=8, max_position_embeddings=2048, rms_norm_eps=1e-5,
                tie_word_embeddings=False, attention_bias=True, bos_token_id=0, eos_token_id=1,
                pad_token_id=None,
                rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                                     beta_slow=1.0, truncate=False, original_max_position_embeddings=64))
    common_meta = {"transformers": transformers.__version__, "sliding_window": 8}

    # Case 1: bf16 checkpoint, the default alternating layer types.
    cfg = GptOssConfig(**base)
    name = "rand_gpt_oss"
    model_dir = os.path.join(out_dir, name)
    ref = save_plain(make_model(cfg, 300), model_dir, torch.bfloat16)
    print(name, "layer_types", cfg.layer_types, "layer 0 tensors:",
          json.dumps(describe_checkpoint(os.path.join(model_dir, "model.safetensors"))))
    samples = [rand_ids(37), rand_ids(9), rand_ids(24)]
    write(out_dir, name, ref, samples,
          dict(common_meta, model_dir=f"tests/fixtures/golden/{name}", weights_dtype="torch.bfloat16",
               layer_types=cfg.layer_types, clamp_fraction=clamp_fraction(ref, samples, cfg)))

    # Case 2: MXFP4 experts, other weights bf16; layer types that do not alternate.
    cfg = GptOssConfig(**dict(base, layer_types=["full_attention", "sliding_attention", "sliding_attention",
                                                 "full_attention"]))
    name = "rand_gpt_oss_mxfp4"
    model_dir = os.path.join(out_dir, name)
    ref = save_mxfp4(make_model(cfg, 301), cfg, model_dir, torch.bfloat16)
    print(name, "layer 0 tensors:", json.dumps(describe_checkpoint(os.path.join(model_dir, "model.safetensors"))))
    samples = [rand_ids(37), rand_ids(9), rand_ids(24)]
    hf_load = try_hf_mxfp4_load(model_dir, ref, samples)
    print(name, "transformers' own MXFP4 load:", json.dumps(hf_load))
    write(out_dir, name, ref, samples,
          dict(common_meta, model_dir=f"tests/fixtures/golden/{name}", weights_dtype="mxfp4 experts, bf16 rest",
               layer_types=cfg.layer_types, clamp_fraction=clamp_fraction(ref, samples, cfg),
               hf_mxfp4_load=hf_load))
    # transformers' dequantization of layer 0's experts, in its own layout
    # ([E, in, out]); bf16 holds them exactly.
    experts = ref.model.layers[0].mlp.experts
    add_tensors(os.path.join(out_dir, name + ".safetensors"),
                {f"ref.layer0.{p}": getattr(experts, p).detach().to(torch.bfloat16).contiguous()
                 for p in EXPERT_PARAMS})


if __name__ == "__main__":
    main()
