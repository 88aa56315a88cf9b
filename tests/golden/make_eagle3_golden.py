#!/usr/bin/env python3
"""Golden tensors for the C++ EAGLE-3 draft and its training-time test (TTT).

An independent, plain-PyTorch statement of the TTT semantics in
shared/DESIGN.md "Numerics" (SpecForge v0.2: specforge/core/eagle3.py,
specforge/modeling/draft/llama3_eagle.py), written from the description,
not from the C++ code. Where the C++ loops over samples and adds diagonal
dot products, this script builds one dense mask over the keys of all steps;
where the C++ gathers target rows by index inside a custom autograd
function, this script shifts tensors segment by segment and lets autograd
differentiate log_softmax.

Run (CPU only, deterministic; needs torch, nothing else: Debian's
python3-torch will do):
    python3 tests/golden/make_eagle3_golden.py tests/fixtures/eagle3

Writes four cases, <out>/golden.safetensors (weights tuned so that draft
and target often agree: non-trivial acc and tau),
<out>/golden_no_agreement.safetensors (plain random weights: acc ~0, but
some trained target argmaxes fall outside the draft vocab) and
<out>/golden_fixed_positions.safetensors (golden's case with every TTT step
at the step-0 positions, SpecForge v0.2) and <out>/golden_eagle31.safetensors
(golden's case as EAGLE-3.1: an RMSNorm per aux state before fc, weights
fc_norm.<k>.weight, and norm(h), the state lm_head reads, fed to the next
step instead of h; the semantics of vLLM's and SGLang's fc_norm and
norm_output), each holding
  - the draft weights under their export names (F32), the frozen tensors
    (embed_tokens, the full target lm_head as target_lm_head, d2t, t2d);
  - the packed inputs: input_ids (I32), cu_seqlens (I32), loss_mask (U8),
    aux_hidden, last_hidden (F32), target_argmax (I32: full-vocab argmax);
  - fp64 reference outputs: ref.logits [L, T, N], ref.ploss [L],
    ref.acc [L], ref.loss [1], ref.tau [1], ref.loss_mask / ref.position_mask
    [L, T] (U8) and ref.grad.<weight name> for every trained weight.
The config is in the metadata entry "meta" (JSON).
"""
import json
import math
import os
import struct
import sys

import torch

# Small but complete: GQA (4 query heads over 2 kv heads), several packed
# samples including a length-1 one, a draft vocab smaller than the target's.
CONFIG = dict(
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=256,
    draft_vocab_size=96,
    num_aux=3,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    ttt_length=7,
    step_weight=0.8,
    # TTT step j rotates at positions t + j ("advancing", as at inference),
    # or at t at every step ("fixed", SpecForge v0.2).
    ttt_positions="advancing",
    lengths=[40, 23, 1, 11],
    seed=20240917,
)

WEIGHT_NAMES = [
    "fc.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    "norm.weight",
    "lm_head.weight",
]


def make_case(cfg, agreement):
    g = torch.Generator().manual_seed(cfg["seed"])
    H, nh, nkv, d = cfg["hidden_size"], cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    I, V, N = cfg["intermediate_size"], cfg["vocab_size"], cfg["draft_vocab_size"]
    T = sum(cfg["lengths"])

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float32) * std

    # Draft vocab: N distinct target ids, ascending (draft id order).
    draft_ids = torch.randperm(V, generator=g)[:N].sort().values
    d2t = draft_ids - torch.arange(N)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[draft_ids] = True

    # Scales keep every activation O(1), so that attention is far from
    # uniform and logits far from ties.
    w = {
        "fc.weight": randn(H, 3 * H, std=1 / math.sqrt(3 * H)),
        "midlayer.self_attn.q_proj.weight": randn(nh * d, 2 * H, std=1.5 / math.sqrt(2 * H)),
        "midlayer.self_attn.k_proj.weight": randn(nkv * d, 2 * H, std=1.5 / math.sqrt(2 * H)),
        "midlayer.self_attn.v_proj.weight": randn(nkv * d, 2 * H, std=1 / math.sqrt(2 * H)),
        "midlayer.self_attn.o_proj.weight": randn(H, nh * d, std=1 / math.sqrt(nh * d)),
        "midlayer.mlp.gate_proj.weight": randn(I, H, std=1 / math.sqrt(H)),
        "midlayer.mlp.up_proj.weight": randn(I, H, std=1 / math.sqrt(H)),
        "midlayer.mlp.down_proj.weight": randn(H, I, std=1 / math.sqrt(I)),
        "midlayer.input_layernorm.weight": 1 + randn(H, std=0.1),
        "midlayer.hidden_norm.weight": 1 + randn(H, std=0.1),
        "midlayer.post_attention_layernorm.weight": 1 + randn(H, std=0.1),
        "norm.weight": 1 + randn(H, std=0.1),
        "lm_head.weight": randn(N, H, std=2 / math.sqrt(H)),
    }
    embed = randn(V, H)
    target_lm_head = randn(V, H, std=2 / math.sqrt(H))
    # Favour draft-vocab tokens a little so that a good share of the target
    # argmaxes fall in the draft vocab (the position mask has both values).
    target_lm_head[t2d] *= 1.4

    input_ids = torch.randint(0, V, (T,), generator=g)
    aux_hidden = randn(T, 3 * H)
    last_hidden = randn(T, H)
    # Random weights alone give acc = 0 at every step, which would leave
    # the accuracy metric untested. A shared direction in the aux states
    # (hence in the draft's hidden states) and in last_hidden, matched by
    # one draft token's rows in both heads, makes draft and target agree on
    # that token at a share of positions that `agreement` sets.
    # agreement=None draws nothing here: the plain random case.
    if agreement is not None:
        aux_dir = randn(3 * H)
        last_dir = randn(H)
        token = int(torch.randint(0, N, (1,), generator=g))
        aux_hidden += agreement * aux_dir
        last_hidden += agreement * last_dir
        u = w["fc.weight"] @ aux_dir
        w["lm_head.weight"][token] += u / u.norm()
        target_lm_head[draft_ids[token]] += 1.5 * last_dir / last_dir.norm()
    target_argmax = (last_hidden.double() @ target_lm_head.double().T).argmax(-1)
    # Loss mask: a prompt of zeros at the start of each sample, answer ones
    # to the end (so each sample's last position has mask 1 and must be
    # dropped by the shift), and a few random holes.
    loss_mask = torch.zeros(T, dtype=torch.uint8)
    start = 0
    for n in cfg["lengths"]:
        prompt = n // 4
        loss_mask[start + prompt : start + n] = 1
        start += n
    holes = torch.rand(T, generator=g) < 0.1
    loss_mask[holes] = 0
    cu = [0]
    for n in cfg["lengths"]:
        cu.append(cu[-1] + n)
    inputs = dict(
        input_ids=input_ids,
        cu_seqlens=torch.tensor(cu),
        loss_mask=loss_mask,
        aux_hidden=aux_hidden,
        last_hidden=last_hidden,
        target_argmax=target_argmax,
    )
    if cfg.get("eagle31"):
        # Drawn last, so that the other tensors equal golden's.
        for k in range(cfg["num_aux"]):
            w[f"fc_norm.{k}.weight"] = 1 + randn(H, std=0.1)
    frozen = dict(embed_tokens=embed, target_lm_head=target_lm_head, d2t=d2t, t2d=t2d)
    return w, frozen, inputs


# --- the reference -----------------------------------------------------------


def rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def spans(lengths):
    start = 0
    for n in lengths:
        yield start, n
        start += n


def shift_left(x, lengths, fill=0.0):
    """SpecForge's padding(x, left=False) applied to every sample alone:
    drop the sample's first row, append one `fill` row at its end."""
    parts = []
    for a, n in spans(lengths):
        seg = x[a : a + n]
        pad = torch.full_like(seg[:1], fill)
        parts.append(torch.cat([seg[1:], pad]) if n > 0 else seg)
    return torch.cat(parts)


def reference(cfg, weights, frozen, inputs):
    H, nh, nkv, d = cfg["hidden_size"], cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    N, eps, L = cfg["draft_vocab_size"], cfg["rms_norm_eps"], cfg["ttt_length"]
    lengths = cfg["lengths"]
    T = sum(lengths)
    dt = torch.float64
    w = {k: v.to(dt).requires_grad_(True) for k, v in weights.items()}
    embed = frozen["embed_tokens"].to(dt)
    t2d = frozen["t2d"]
    draft_to_target = torch.arange(N) + frozen["d2t"]
    head_rows = frozen["target_lm_head"].to(dt)[draft_to_target]

    # Rope: HF's LlamaRotaryEmbedding (default type) computes inv_freq and
    # the angles in fp32; positions restart at 0 in every sample, and step j
    # adds j to them when they advance.
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))

    def rope_tables(offset):
        pos = torch.cat([torch.arange(n) + offset for n in lengths]).float()
        ang = pos[:, None] * inv_freq[None, :]
        emb = torch.cat((ang, ang), dim=-1)
        return emb.cos().to(dt)[:, None, :], emb.sin().to(dt)[:, None, :]

    sample_of = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    idx = torch.arange(T)
    same_sample = sample_of[:, None] == sample_of[None, :]
    causal_block = same_sample & (idx[None, :] <= idx[:, None])  # [query t, key s]
    eye = torch.eye(T, dtype=torch.bool)

    # Step-0 data: ids and target distribution shifted by one within each
    # sample; the loss mask is not shifted (SpecForge), but a sample's last
    # position has no next token and is dropped.
    ids = shift_left(inputs["input_ids"], lengths, 0)
    target_p = torch.softmax(inputs["last_hidden"].to(dt) @ head_rows.T, dim=-1)
    p = shift_left(target_p, lengths, 1.0 / N)
    last_pos = torch.zeros(T, dtype=torch.bool)
    for a, n in spans(lengths):
        last_pos[a + n - 1] = True
    loss_mask = inputs["loss_mask"].bool() & ~last_pos
    next_argmax = shift_left(inputs["target_argmax"], lengths, 0)
    position_mask = loss_mask & t2d[next_argmax] & ~last_pos

    aux = inputs["aux_hidden"].to(dt)
    if cfg.get("eagle31"):
        aux = torch.cat([rms_norm(part, w[f"fc_norm.{k}.weight"], eps)
                         for k, part in enumerate(aux.chunk(cfg["num_aux"], dim=-1))], dim=-1)
    h = aux @ w["fc.weight"].T
    keys, values = [], []
    logits_all, plosses, accs, lmasks, pmasks = [], [], [], [], []
    total = 0.0
    for j in range(L):
        x = torch.cat(
            [rms_norm(embed[ids], w["midlayer.input_layernorm.weight"], eps),
             rms_norm(h, w["midlayer.hidden_norm.weight"], eps)],
            dim=-1,
        )
        cos, sin = rope_tables(j if cfg["ttt_positions"] == "advancing" else 0)
        q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(T, nh, d)
        k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(T, nkv, d)
        v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(T, nkv, d)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        keys.append(k.repeat_interleave(nh // nkv, dim=1))
        values.append(v.repeat_interleave(nh // nkv, dim=1))
        # One dense score matrix over the keys of all steps so far:
        # step 0 block-causal within samples, later steps only at s == t.
        all_k = torch.cat(keys, dim=0)  # [(j+1)T, nh, d]
        all_v = torch.cat(values, dim=0)
        allowed = torch.cat([causal_block] + [eye] * j, dim=1)  # [T, (j+1)T]
        scores = torch.einsum("thd,shd->hts", q, all_k) / math.sqrt(d)
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        attn = torch.einsum("hts,shd->thd", probs, all_v).reshape(T, nh * d)
        h = h + attn @ w["midlayer.self_attn.o_proj.weight"].T
        y = rms_norm(h, w["midlayer.post_attention_layernorm.weight"], eps)
        mlp = (torch.nn.functional.silu(y @ w["midlayer.mlp.gate_proj.weight"].T)
               * (y @ w["midlayer.mlp.up_proj.weight"].T)) @ w["midlayer.mlp.down_proj.weight"].T
        h = h + mlp
        normed = rms_norm(h, w["norm.weight"], eps)
        logits = normed @ w["lm_head.weight"].T
        if cfg.get("eagle31"):
            h = normed

        logp = torch.log_softmax(logits, dim=-1)
        ploss = -(position_mask[:, None].to(dt) * p * logp).sum() / T  # mean over all T
        hit = (logits.argmax(-1) == p.argmax(-1)) & position_mask
        acc = hit.sum().item() / max(loss_mask.sum().item(), 1e-6)
        total = total + cfg["step_weight"] ** j * ploss
        logits_all.append(logits.detach())
        plosses.append(ploss.item())
        accs.append(acc)
        lmasks.append(loss_mask.clone())
        pmasks.append(position_mask.clone())

        ids = shift_left(ids, lengths, 0)
        p = shift_left(p, lengths, 1.0 / N)
        loss_mask = shift_left(loss_mask, lengths, False)
        position_mask = shift_left(position_mask, lengths, False)

    total.backward()
    tau, prod = 1.0, 1.0
    for a in accs:
        prod *= a
        tau += prod
    out = {
        "ref.logits": torch.stack(logits_all),
        "ref.ploss": torch.tensor(plosses, dtype=dt),
        "ref.acc": torch.tensor(accs, dtype=dt),
        "ref.loss": total.detach().reshape(1),
        "ref.tau": torch.tensor([tau], dtype=dt),
        "ref.loss_mask": torch.stack(lmasks).to(torch.uint8),
        "ref.position_mask": torch.stack(pmasks).to(torch.uint8),
    }
    for name in w:
        out["ref.grad." + name] = w[name].grad.detach()
    return out


# --- a dependency-free safetensors writer --------------------------------------

_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def save_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        raw = bytes(t.flatten().view(torch.uint8).tolist()) if t.numel() else b""
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)


def write_case(out_dir, file_name, cfg, weights, frozen, inputs, ref):
    tensors = dict(weights)
    tensors["embed_tokens"] = frozen["embed_tokens"]
    tensors["target_lm_head"] = frozen["target_lm_head"]
    tensors["d2t"] = frozen["d2t"].to(torch.int64)
    tensors["t2d"] = frozen["t2d"]
    tensors["input_ids"] = inputs["input_ids"].to(torch.int32)
    tensors["cu_seqlens"] = inputs["cu_seqlens"].to(torch.int32)
    tensors["loss_mask"] = inputs["loss_mask"]
    tensors["aux_hidden"] = inputs["aux_hidden"]
    tensors["last_hidden"] = inputs["last_hidden"]
    tensors["target_argmax"] = inputs["target_argmax"].to(torch.int32)
    tensors.update(ref)
    meta = dict(cfg)
    meta["torch_version"] = torch.__version__
    path = os.path.join(out_dir, file_name)
    save_safetensors(path, tensors, {"meta": json.dumps(meta)})
    print(f"wrote {path}")
    print("  ploss", [round(x, 6) for x in ref["ref.ploss"].tolist()])
    print("  acc  ", [round(x, 4) for x in ref["ref.acc"].tolist()])
    print("  loss ", ref["ref.loss"].item(), "tau", ref["ref.tau"].item())
    print("  position tokens", ref["ref.position_mask"].sum(1).tolist(),
          "loss tokens", ref["ref.loss_mask"].sum(1).tolist())


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/eagle3"
    os.makedirs(out_dir, exist_ok=True)
    torch.use_deterministic_algorithms(True)

    # golden_no_agreement: plain random weights. About one trained target
    # argmax in seven falls outside the draft vocab, which exercises the
    # position mask; acc is ~0.
    torch.manual_seed(CONFIG["seed"])
    cfg = dict(CONFIG, agreement=None)
    weights, frozen, inputs = make_case(cfg, None)
    write_case(out_dir, "golden_no_agreement.safetensors", cfg, weights, frozen, inputs,
               reference(cfg, weights, frozen, inputs))

    # golden: the first agreement strength whose accuracies are neither ~0
    # nor ~1 and whose position mask drops some trained positions, else the
    # one with mean acc closest to 0.5 (deterministic: every candidate is
    # built from the same seed). This exercises acc and tau.
    torch.manual_seed(CONFIG["seed"])
    best = None
    for agreement in [0.0, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0]:
        weights, frozen, inputs = make_case(CONFIG, agreement)
        ref = reference(CONFIG, weights, frozen, inputs)
        mean_acc = ref["ref.acc"].mean().item()
        pm0 = ref["ref.position_mask"][0].sum().item()
        lm0 = ref["ref.loss_mask"][0].sum().item()
        print(f"agreement {agreement}: mean acc {mean_acc:.3f}, position/loss tokens {pm0}/{lm0}")
        score = abs(mean_acc - 0.5)
        if best is None or score < best[0]:
            best = (score, agreement, weights, frozen, inputs, ref)
        if 0.25 <= mean_acc <= 0.75 and pm0 < lm0:
            break
    _, agreement, weights, frozen, inputs, ref = best
    write_case(out_dir, "golden.safetensors", dict(CONFIG, agreement=agreement), weights, frozen, inputs, ref)

    # golden_fixed_positions: the same case with SpecForge v0.2's positions.
    fixed = dict(CONFIG, agreement=agreement, ttt_positions="fixed")
    write_case(out_dir, "golden_fixed_positions.safetensors", fixed, weights, frozen, inputs,
               reference(fixed, weights, frozen, inputs))

    # golden_eagle31: golden's case with EAGLE-3.1's fc_norm and norm_output.
    torch.manual_seed(CONFIG["seed"])
    eagle31 = dict(CONFIG, agreement=agreement, eagle31=True)
    weights, frozen, inputs = make_case(eagle31, agreement)
    write_case(out_dir, "golden_eagle31.safetensors", eagle31, weights, frozen, inputs,
               reference(eagle31, weights, frozen, inputs))


if __name__ == "__main__":
    main()
