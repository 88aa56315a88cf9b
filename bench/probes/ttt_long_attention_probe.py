#!/usr/bin/env python3
"""Times the causal step-0 block of the TTT attention at long sequences
(GPU machine): varlen flash attention (what the fast step runs) against
cuDNN's fused attention, forward with the log-sum-exp and backward given an
output and log-sum-exp that are not the kernel's own (the TTT step hands
the backward its merged ones). 8B shape: 32 query heads, 8 KV heads, head
dim 128, q/k/v as views of one packed [T, 48, 128] projection, as the step
keeps them. Also checks that cuDNN's log-sum-exp and gradients agree with
flash's, and times cuDNN's first call at a new length (its graph build).

    python3 bench/probes/ttt_long_attention_probe.py [T ...]
"""
import sys, time, torch

from attention_probe_util import bhsd, timed

H, KV, D = 32, 8, 128
SCALE = D ** -0.5
print(torch.__version__, "cudnn", torch.backends.cudnn.version())
for name in ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
             "_flash_attention_backward"):
    print(name, getattr(torch.ops.aten, name).default._schema)


def views(T):
    qkv = torch.randn(T, H + 2 * KV, D, device="cuda", dtype=torch.bfloat16)
    return qkv, qkv[:, :H], qkv[:, H:H + KV], qkv[:, H + KV:]


def flash_fwd(q, k, v, cu, T):
    r = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, T, T, 0.0, True, False, scale=SCALE)
    return r[0], r[1], r[2], r[3]


def flash_bwd(do, q, k, v, out, lse, cu, T, rng, unused):
    return torch.ops.aten._flash_attention_backward(do, q, k, v, out, lse, cu, cu, T, T, 0.0, True, rng, unused,
                                                    scale=SCALE)


def cudnn_fwd(q, k, v):
    r = torch.ops.aten._scaled_dot_product_cudnn_attention(bhsd(q), bhsd(k), bhsd(v), None, True, 0.0, True, False,
                                                           scale=SCALE)
    return r


def cudnn_bwd(do, q, k, v, out, lse, r):
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        bhsd(do), bhsd(q), bhsd(k), bhsd(v), out, lse, r[6], r[7], None, r[2], r[3], r[4],
        r[5], 0.0, True, scale=SCALE)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


for T in [int(x) for x in sys.argv[1:]] or [8192, 16384]:
    torch.manual_seed(0)
    qkv, q, k, v = views(T)
    cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
    flops_fwd = 4 * T * (T + 1) / 2 * H * D
    f_out, f_lse, rng, unused = flash_fwd(q, k, v, cu, T)
    do = torch.randn_like(f_out)
    # A merged output and log-sum-exp as the TTT step makes them: one extra
    # (diagonal) key with a random score merged in.
    extra = torch.randn(H, T, device="cuda")
    m_lse = torch.logaddexp(f_lse, extra)
    m_out = (f_out.float() * (f_lse - m_lse).exp().t().unsqueeze(-1) +
             torch.randn_like(f_out, dtype=torch.float) * (extra - m_lse).exp().t().unsqueeze(-1)).to(f_out.dtype)
    res = {}
    res["flash fwd"] = timed(lambda: flash_fwd(q, k, v, cu, T))
    res["flash bwd"] = timed(lambda: flash_bwd(do, q, k, v, m_out, m_lse, cu, T, rng, unused))
    fg = flash_bwd(do, q, k, v, m_out, m_lse, cu, T, rng, unused)
    try:
        torch.cuda.synchronize(); t0 = time.perf_counter()
        r = cudnn_fwd(q, k, v)
        torch.cuda.synchronize(); first = time.perf_counter() - t0
        print(f"T={T} cudnn out {tuple(r[0].shape)} stride {r[0].stride()} lse {tuple(r[1].shape)} "
              f"stride {r[1].stride()} first call {first*1e3:.1f} ms")
        c_out = r[0].transpose(1, 2)[0]  # [T, H, D]
        c_lse = r[1].reshape(H, T)
        print(f"  fwd agreement: out rel {rel(c_out, f_out):.2e}, lse max |d| {(c_lse - f_lse).abs().max().item():.2e}")
        res["cudnn fwd"] = timed(lambda: cudnn_fwd(q, k, v))
        m_out_c = bhsd(m_out)
        m_lse_c = m_lse.reshape(r[1].shape)
        res["cudnn bwd"] = timed(lambda: cudnn_bwd(do, q, k, v, m_out_c, m_lse_c, r))
        cg = cudnn_bwd(do, q, k, v, m_out_c, m_lse_c, r)
        for name, a, b in zip(("dq", "dk", "dv"), cg, fg):
            print(f"  bwd {name}: cudnn {tuple(a.shape)} vs flash {tuple(b.shape)}, rel {rel(a.transpose(1, 2)[0], b):.2e}")
        torch.cuda.synchronize(); t0 = time.perf_counter()
        qkv2, q2, k2, v2 = views(T + 128)
        r2 = cudnn_fwd(q2, k2, v2)
        cudnn_bwd(torch.randn_like(q2), q2, k2, v2, r2[0], r2[1], r2)
        torch.cuda.synchronize()
        print(f"  cudnn first fwd+bwd at T+128: {(time.perf_counter() - t0)*1e3:.1f} ms")
    except Exception as e:
        print("cudnn failed:", str(e)[:600])
    print(f"T={T}: " + ", ".join(
        f"{k} {v*1e3:.2f} ms ({(flops_fwd * (2.5 if 'bwd' in k else 1))/v/1e12:.0f} TFLOPS)" for k, v in res.items()))
