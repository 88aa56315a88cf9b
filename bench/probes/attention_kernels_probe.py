#!/usr/bin/env python3
"""Times LibTorch's fused attention kernels on the teacher's shapes (GPU
machine): varlen flash and memory-efficient over a packed batch, and the
batched flash / cuDNN kernels through SDPA for equal-length samples, with
32 query and 8 KV heads, head dims 64 and 128, 8 x 1024 tokens and the
chat mix. It chose the sgl backend's attention (bench/README.md section 8).

    python3 bench/probes/attention_kernels_probe.py
"""
import time, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
print(torch.__version__, torch.backends.cudnn.version())
for name in ("_cudnn_attention_forward", "_flash_attention_forward", "_efficient_attention_forward"):
    try:
        print(name, getattr(torch.ops.aten, name).default._schema)
    except Exception as e:
        print(name, "missing", e)
def timed(fn, n=20):
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n
for (H, KV, D) in ((32, 8, 64), (32, 8, 128)):
    for lengths in ([1024] * 8, [200, 2048, 512, 1400, 320, 900, 1750, 640]):
        T = sum(lengths)
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")
        q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(T, KV, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(T, KV, D, device="cuda", dtype=torch.bfloat16)
        flops = sum(4 * n * (n + 1) / 2 * H * D for n in lengths)
        res = {}
        res["flash_varlen"] = timed(lambda: torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max(lengths), max(lengths), 0.0, True, False))
        try:
            res["efficient_varlen"] = timed(lambda: torch.ops.aten._efficient_attention_forward(q.unsqueeze(0), k.repeat_interleave(H // KV, 1).unsqueeze(0), v.repeat_interleave(H // KV, 1).unsqueeze(0), None, cu, cu, max(lengths), max(lengths), 0.0, 1, False))
        except Exception as e:
            print("efficient varlen failed", str(e)[:200])
        if len(set(lengths)) == 1:
            B, S = len(lengths), lengths[0]
            qb = q.view(B, S, H, D).transpose(1, 2); kb = k.view(B, S, KV, D).transpose(1, 2); vb = v.view(B, S, KV, D).transpose(1, 2)
            for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
                try:
                    with sdpa_kernel(be):
                        res[f"sdpa_{be.name}_gqa"] = timed(lambda: F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=True))
                except Exception as e:
                    print(be.name, "gqa failed", str(e)[:150])
                try:
                    kr = kb.repeat_interleave(H // KV, 1); vr = vb.repeat_interleave(H // KV, 1)
                    with sdpa_kernel(be):
                        res[f"sdpa_{be.name}_rep"] = timed(lambda: F.scaled_dot_product_attention(qb, kr, vr, is_causal=True))
                except Exception as e:
                    print(be.name, "rep failed", str(e)[:150])
        try:
            res["cudnn_varlen"] = timed(lambda: torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, max(lengths), max(lengths), False, 0.0, True, False))
        except Exception as e:
            print("cudnn varlen failed:", str(e)[:300])
        print(f"H={H} KV={KV} D={D} lengths={'8x1024' if len(set(lengths))==1 else 'chat mix'}: " +
              ", ".join(f"{k} {v*1e3:.3f} ms ({flops/v/1e12:.0f} TFLOPS)" for k, v in res.items()))
