#!/usr/bin/env python3
"""Feasibility probe (issue 6): is an FP8 candidate search for the lm_head's
target argmax worth building? Times, on the lm_head shapes of the Llama 1B
and 8B benches (8192 rows, vocab 128256), the bf16 logits GEMM against an
FP8 (e4m3) GEMM writing bf16 scores, a read pass over those scores (the
floor of a top-k kernel) and torch.topk, and counts the rows whose exact
bf16 argmax is missing from the FP8 scores' top k.
"""
import torch

torch.manual_seed(0)
E4M3_MAX = 448.0


def timed(fn, reps=20):
    fn(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / reps


def quant_rows(x):
    amax = x.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12)
    return (x.float() * (E4M3_MAX / amax)).to(torch.float8_e4m3fn)


for name, H in (("1B", 2048), ("8B", 4096)):
    M, V = 8192, 128256
    h = torch.randn(M, H, device="cuda").to(torch.bfloat16)
    w = (torch.randn(V, H, device="cuda") * 0.02).to(torch.bfloat16)
    amax_w = w.float().abs().amax()
    w8 = (w.float() * (E4M3_MAX / amax_w)).to(torch.float8_e4m3fn)
    h8 = quant_rows(h)
    one = torch.ones((), device="cuda")
    t_bf16 = timed(lambda: h @ w.t())
    t_q = timed(lambda: quant_rows(h))
    res = {}
    for fast in (False, True):
        res[fast] = timed(lambda: torch._scaled_mm(h8, w8.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=fast))
    d = torch._scaled_mm(h8, w8.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True)
    t_read = timed(lambda: d.amax(dim=1))
    t_topk = timed(lambda: torch.topk(d, 8, dim=1), reps=5)
    logits = h @ w.t()
    exact = logits.argmax(dim=1)
    for k in (1, 2, 4, 8, 16):
        top = torch.topk(d, k, dim=1).indices
        miss = (top != exact[:, None]).all(dim=1).sum().item()
        print(f"{name}: exact argmax outside the FP8 top-{k}: {miss} of {M} rows")
    print(f"{name}: bf16 logits GEMM {t_bf16:.3f} ms; FP8 GEMM {res[False]:.3f} ms (fast accum {res[True]:.3f}); "
          f"row quantization (torch, unfused) {t_q:.3f} ms; score read pass {t_read:.3f} ms; torch.topk(8) {t_topk:.3f} ms")
    del h, w, w8, h8, d, logits
    torch.cuda.empty_cache()
