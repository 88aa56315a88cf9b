#!/usr/bin/env python3
"""Whether a gate-up GEMM with SiLU-and-multiply in its epilogue can beat
cuBLAS's GEMM plus the separate SiLU-mul kernel (GPU machine, Triton).

The gate-up weight is interleaved by rows (gate 0, up 0, gate 1, up 1,
...), so each output tile holds matching gate and up columns and the
epilogue writes silu(gate) * up with transformers' roundings: half the
output bytes and no second pass over the [T, 2I] product.

    python3 bench/probes/swiglu_gemm_probe.py
"""
import time

import torch
import triton
import triton.language as tl


@triton.jit
def swiglu_gemm(x_ptr, w_ptr, out_ptr, M, N2, K,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                STAGES: tl.constexpr, NUM_SMS: tl.constexpr, USE_TMA: tl.constexpr):
    # out[M, N2 / 2] = silu(x @ Wg^T) * (x @ Wu^T); w: [N2, K] interleaved.
    pid0 = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N2, BN)
    tiles = num_m * num_n
    if USE_TMA:
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N2, K], strides=[K, 1], block_shape=[BN, BK])
    for tile in tl.range(pid0, tiles, NUM_SMS, flatten=False):
        group = tile // (GROUP * num_n)
        first_m = group * GROUP
        size_m = min(num_m - first_m, GROUP)
        pid_m = first_m + (tile % size_m)
        pid_n = (tile % (GROUP * num_n)) // size_m
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, BK)
        for k in tl.range(0, tl.cdiv(K, BK), num_stages=STAGES):
            if USE_TMA:
                a = x_desc.load([pid_m * BM, k * BK])
                b = w_desc.load([pid_n * BN, k * BK])
            else:
                a = tl.load(x_ptr + offs_m[:, None] * K + (k * BK + offs_k)[None, :], mask=offs_m[:, None] < M,
                            other=0.0)
                b = tl.load(w_ptr + offs_n[:, None] * K + (k * BK + offs_k)[None, :], mask=offs_n[:, None] < N2,
                            other=0.0)
            acc = tl.dot(a, b.T, acc)
        g, u = tl.split(tl.reshape(acc, (BM, BN // 2, 2)))
        g = g.to(tl.bfloat16).to(tl.float32)
        u = u.to(tl.bfloat16).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(tl.bfloat16).to(tl.float32)
        y = (s * u).to(tl.bfloat16)
        om = pid_m * BM + tl.arange(0, BM)
        on = pid_n * (BN // 2) + tl.arange(0, BN // 2)
        tl.store(out_ptr + om[:, None] * (N2 // 2) + on[None, :], y, mask=om[:, None] < M)


def timed(fn, n=20):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


def main():
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    for name, M, K, I in (("1B", 8192, 2048, 8192), ("8B", 8192, 4096, 14336), ("1B ragged", 7770, 2048, 8192)):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        wg = torch.randn(I, K, device="cuda", dtype=torch.bfloat16) * 0.02
        wu = torch.randn(I, K, device="cuda", dtype=torch.bfloat16) * 0.02
        w_gu = torch.cat([wg, wu])
        w_int = torch.stack([wg, wu], 1).reshape(2 * I, K).contiguous()
        flops = 2 * M * K * 2 * I
        t_mm = timed(lambda: x @ w_gu.T)
        gu = x @ w_gu.T
        t_act = timed(lambda: torch.nn.functional.silu(gu[:, :I]) * gu[:, I:])
        ref = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
        print(f"{name}: cuBLAS gate-up {t_mm:.3f} ms ({flops / t_mm / 1e9:.0f} TF); torch silu*up {t_act:.3f} ms")
        for use_tma in (False, True):
            for (BM, BN, BK, STAGES, warps, persistent) in ((128, 256, 64, 3, 8, True), (128, 256, 64, 4, 8, True),
                                                           (128, 128, 64, 4, 4, True), (128, 256, 64, 3, 8, False)):
                out = torch.empty(M, I, device="cuda", dtype=torch.bfloat16)
                tiles = triton.cdiv(M, BM) * triton.cdiv(2 * I, BN)
                progs = min(sms, tiles) if persistent else tiles
                try:
                    fn = lambda: swiglu_gemm[(progs,)](x, w_int, out, M, 2 * I, K, BM=BM, BN=BN, BK=BK, GROUP=8,
                                                       STAGES=STAGES, NUM_SMS=progs, USE_TMA=use_tma,
                                                       num_warps=warps)
                    t = timed(fn)
                    diff = (out.float() - ref.float()).abs()
                    exact = (out == ref).float().mean().item()
                    print(f"  triton tma={use_tma} {BM}x{BN}x{BK} s{STAGES} w{warps} persistent={persistent}: "
                          f"{t:.3f} ms ({flops / t / 1e9:.0f} TF) vs cuBLAS+act {t_mm + t_act:.3f}; "
                          f"max diff {diff.max().item():.3g}, equal {100 * exact:.2f}%")
                except Exception as e:  # a config this Triton cannot build
                    print(f"  triton tma={use_tma} {BM}x{BN}x{BK} failed: {str(e)[:200]}")


if __name__ == "__main__":
    main()
