#!/usr/bin/env python3
"""Baseline for the student step benchmark: one EAGLE-3 training step in
PyTorch eager, the algorithm of SpecForge v0.2 (specforge/core/eagle3.py,
specforge/modeling/draft/llama3_eagle.py), written out here so it runs with
no SpecForge install: fp32 parameters under bf16 autocast, TTT unrolled
`ttt_length` steps over one packed sequence, attention over the step-0
keys (causal) plus each earlier step's key at the same position, soft
cross-entropy against the target head's distribution over the draft vocab,
backward, grad clipping at 0.5, AdamW. Prints one JSON line (median ms).
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

SHAPES = {
    "llama-1b": dict(H=2048, I=8192, nh=32, nkv=8, d=64),
    "llama-8b": dict(H=4096, I=14336, nh=32, nkv=8, d=128),
}


class Draft(torch.nn.Module):
    def __init__(self, H, I, nh, nkv, d, N):
        super().__init__()
        self.nh, self.nkv, self.d = nh, nkv, d
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)
        self.fc = lin(3 * H, H)
        self.q, self.k, self.v, self.o = lin(2 * H, nh * d), lin(2 * H, nkv * d), lin(2 * H, nkv * d), lin(nh * d, H)
        self.gate, self.up, self.down = lin(H, I), lin(H, I), lin(I, H)
        self.w_in, self.w_hid, self.w_post, self.w_norm = (torch.nn.Parameter(torch.ones(H)) for _ in range(4))
        self.lm_head = lin(H, N)

    @staticmethod
    def norm(x, w):
        xf = x.float()
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


def step_loss(m, embed, head_rows, ids, aux, last, L):
    T = ids.shape[0]
    nh, nkv, d = m.nh, m.nkv, m.d
    pos = torch.arange(T, device=ids.device, dtype=torch.float32)
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=ids.device).float() / d))

    def rope_tables(offset):  # step j rotates at positions t + j, as the student's default
        ang = torch.cat([(pos + offset)[:, None] * inv] * 2, -1)
        return ang.cos()[:, None, :].to(torch.bfloat16), ang.sin()[:, None, :].to(torch.bfloat16)
    with torch.no_grad():
        p = torch.softmax((last.float() @ head_rows.float().T), -1)
    p = torch.cat([p[1:], torch.full_like(p[:1], 1.0 / p.shape[1])])
    ids = torch.cat([ids[1:], ids[:1] * 0])
    mask = torch.ones(T, device=ids.device)
    mask[-1] = 0
    causal = torch.full((T, T), float("-inf"), device=ids.device).triu(1)
    h = m.fc(aux)
    ks, vs = [], []
    total = 0.0
    for j in range(L):
        cos, sin = rope_tables(j)
        x = torch.cat([m.norm(embed[ids], m.w_in), m.norm(h, m.w_hid)], -1)
        q = rope(m.q(x).view(T, nh, d), cos, sin)
        k = rope(m.k(x).view(T, nkv, d), cos, sin).repeat_interleave(nh // nkv, 1)
        v = m.v(x).view(T, nkv, d).repeat_interleave(nh // nkv, 1)
        ks.append(k)
        vs.append(v)
        qh = q.transpose(0, 1)  # [nh, T, d]
        w0 = qh @ ks[0].transpose(0, 1).transpose(1, 2) / math.sqrt(d) + causal  # [nh, T, T]
        diag = [(q * ks[i]).sum(-1).transpose(0, 1)[..., None] / math.sqrt(d) for i in range(1, j + 1)]
        w = torch.softmax(torch.cat([w0] + diag, -1).float(), -1).to(q.dtype)
        out = w[..., :T] @ vs[0].transpose(0, 1)
        for i in range(1, j + 1):
            out = out + w[..., T + i - 1 : T + i] * vs[i].transpose(0, 1)
        h = h + m.o(out.transpose(0, 1).reshape(T, nh * d))
        y = m.norm(h, m.w_post)
        h = h + m.down(F.silu(m.gate(y)) * m.up(y))
        logits = m.lm_head(m.norm(h, m.w_norm)).float()
        ploss = -(mask[:, None] * p * torch.log_softmax(logits, -1)).sum() / T
        total = total + 0.8**j * ploss
        ids = torch.cat([ids[1:], ids[:1] * 0])
        p = torch.cat([p[1:], torch.full_like(p[:1], 1.0 / p.shape[1])])
        mask = torch.cat([mask[1:], mask[:1] * 0])
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-8b")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--ttt_length", type=int, default=7)
    ap.add_argument("--draft_vocab", type=int, default=32000)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--profile_steps", type=int, default=0, help="profile this many steps; print top GPU kernels")
    args = ap.parse_args()
    s = SHAPES[args.shape]
    dev = "cuda"
    torch.manual_seed(0)
    m = Draft(s["H"], s["I"], s["nh"], s["nkv"], s["d"], args.draft_vocab).to(dev)
    embed = (torch.randn(128256, s["H"], device=dev) * 0.02).to(torch.bfloat16)
    head_rows = torch.randn(args.draft_vocab, s["H"], device=dev) * 0.02
    T = args.tokens
    ids = torch.randint(0, 128256, (T,), device=dev)
    aux = torch.randn(T, 3 * s["H"], device=dev, dtype=torch.bfloat16)
    last = torch.randn(T, s["H"], device=dev, dtype=torch.bfloat16)
    # The trainer's settings: AdamW betas (0.9, 0.999), no weight decay.
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.9, 0.999), weight_decay=0.0)

    def one():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_loss(m, embed, head_rows, ids, aux, last, args.ttt_length)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
        opt.step()
        torch.cuda.synchronize()

    for _ in range(args.warmup):
        one()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        one()
        times.append(time.perf_counter() - t0)
    times.sort()
    ms = 1e3 * times[len(times) // 2]
    if args.profile_steps > 0:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.profile_steps):
                one()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30), flush=True)
    print(json.dumps({"bench": "pytorch_eagle3_step", "shape": args.shape, "tokens": T, "ttt_length": args.ttt_length,
                      "draft_vocab": args.draft_vocab, "ms_per_step": ms, "tok_per_s": T / ms * 1e3,
                      "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
