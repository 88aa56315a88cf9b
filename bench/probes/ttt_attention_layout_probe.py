#!/usr/bin/env python3
"""Does cuDNN's fused attention backward pick a faster kernel for another
layout of the same causal block? The TTT step hands cuDNN views of one
packed [T, 48, 128] projection (32 query heads, 8 KV heads: GQA) and its
backward runs a 64x64-tile kernel at about 475 TFLOP/s inside the 16k step.
Each variant below computes the same gradients; printed: ms and TFLOP/s of
forward and backward, the kernels cuDNN ran, and the gradients' distance
to the step's form.

    python3 bench/probes/ttt_attention_layout_probe.py [T ...]
"""
import sys, torch

from attention_probe_util import bhsd, timed

H, KV, D = 32, 8, 128
G = H // KV
SCALE = D ** -0.5


def kernels(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        fn(); torch.cuda.synchronize()
    names = {}
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            names[e.name[:90]] = names.get(e.name[:90], 0) + e.device_time_total
    return sorted(names.items(), key=lambda kv: -kv[1])[:3]


def fwd(q, k, v):
    return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False, scale=SCALE)


def bwd(do, q, k, v, r):
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        do, q, k, v, r[0], r[1], r[6], r[7], None, r[2], r[3], r[4], r[5], 0.0, True, scale=SCALE)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def variants(T):
    torch.manual_seed(0)
    qkv = torch.randn(T, H + 2 * KV, D, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv[:, :H], qkv[:, H:H + KV], qkv[:, H + KV:]
    do = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
    rep = lambda x: x.repeat_interleave(G, dim=1)
    yield "step form: packed views, GQA", bhsd(q), bhsd(k), bhsd(v), bhsd(do), 1
    yield "BSHD contiguous, GQA", bhsd(q.contiguous()), bhsd(k.contiguous()), bhsd(v.contiguous()), bhsd(do), 1
    yield "BHSD contiguous, GQA", *(bhsd(x).contiguous() for x in (q, k, v, do)), 1
    yield "BSHD, K/V repeated (MHA)", bhsd(q.contiguous()), bhsd(rep(k)), bhsd(rep(v)), bhsd(do), G
    yield "BHSD, K/V repeated (MHA)", *(bhsd(x).contiguous() for x in (q, rep(k), rep(v), do)), G


def main():
    print(torch.__version__, "cudnn", torch.backends.cudnn.version())
    for T in [int(x) for x in sys.argv[1:]] or [16384]:
        flops = 4 * T * (T + 1) / 2 * H * D
        ref = None
        for name, q, k, v, do, group in variants(T):
            try:
                r = fwd(q, k, v)
                grads = bwd(do, q, k, v, r)
                dk, dv = grads[1], grads[2]
                if group > 1:  # back to the KV heads: sum each group
                    dk = dk.reshape(1, KV, group, T, D).sum(2)
                    dv = dv.reshape(1, KV, group, T, D).sum(2)
                g = (grads[0], dk, dv)
                if ref is None:
                    ref = g
                err = max(rel(a, b) for a, b in zip(g, ref))
                tf = timed(lambda: fwd(q, k, v))
                tb = timed(lambda: bwd(do, q, k, v, r))
                print(f"T={T} {name}: fwd {tf*1e3:.2f} ms ({flops/tf/1e12:.0f} TFLOP/s), "
                      f"bwd {tb*1e3:.2f} ms ({2.5*flops/tb/1e12:.0f}), grads rel {err:.1e}")
                for kname, us in kernels(lambda: bwd(do, q, k, v, r)):
                    print(f"    bwd kernel {us/1e3:7.2f} ms  {kname}")
            except Exception as e:  # a layout cuDNN refuses
                print(f"T={T} {name}: failed: {str(e)[:300]}")


if __name__ == "__main__":
    main()
