#!/usr/bin/env python3
"""Is FlashAttention-3 on this machine, and if so, is its backward faster
than cuDNN's for the TTT step's 16k causal block (32 query heads, 8 KV
heads, head dim 128, bf16)? FlashAttention-3's paper puts its backward
1.09x above the cuDNN of 2024 at this length; the 16k bound would need an
attention backward faster than cuDNN's (bench/README.md section 3).
Printed: which attention modules import, the implementations PyTorch
lists for its flash attention, and the forward and backward of each
kernel found, in ms and TFLOP/s (causal FLOPs), two rounds.

    python3 bench/probes/flash_attention3_probe.py [T]
"""
import importlib
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention_probe_util import bhsd, timed

T = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
H, KV, D = 32, 8, 128
FWD_FLOP = 2 * T * T * D * H  # the causal half of 4 T^2 D H
BWD_FLOP = 2.5 * FWD_FLOP


def report_environment():
    print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
    print(torch.cuda.get_device_name(0))
    found = {}
    for name in ["flash_attn_interface", "flash_attn_3", "flash_attn", "triton"]:
        try:
            found[name] = importlib.import_module(name)
            print("import", name, "OK", getattr(found[name], "__version__", ""))
        except ImportError as e:
            print("import", name, "failed:", e)
    attention = torch.nn.attention
    if hasattr(attention, "list_flash_attention_impls"):
        print("PyTorch's flash attention implementations:", attention.list_flash_attention_impls())
        try:
            attention.activate_flash_attention_impl("FA3")
            print("FA3 activated")
            attention.restore_flash_attention_impl()
        except Exception as e:  # the hook raises what its module import raised
            print("activating FA3 failed:", type(e).__name__, e)
    return found


def bench(name, attn):
    """Times attn over [T, heads, D] rows; returns its [T, H, D] output."""
    torch.manual_seed(0)
    q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(T, KV, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(T, KV, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = attn(q, k, v)
    dout = torch.randn_like(out)
    fwd_ms = 1e3 * timed(lambda: attn(q, k, v))
    both_ms = 1e3 * timed(lambda: torch.autograd.grad(attn(q, k, v), (q, k, v), dout))
    bwd_ms = both_ms - fwd_ms
    print(f"{name}: forward {fwd_ms:.2f} ms ({FWD_FLOP / fwd_ms / 1e9:.0f} TFLOP/s), "
          f"backward {bwd_ms:.2f} ms ({BWD_FLOP / bwd_ms / 1e9:.0f} TFLOP/s)")
    return out.detach()


def cudnn_attention(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(bhsd(q), bhsd(k), bhsd(v), is_causal=True, enable_gqa=True)
    return out.squeeze(0).transpose(0, 1)


def flash3_attention(module):
    def attn(q, k, v):  # FlashAttention-3 takes [batch, T, heads, D]
        out = module.flash_attn_func(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), causal=True)
        return (out[0] if isinstance(out, tuple) else out).squeeze(0)
    return attn


def main():
    found = report_environment()
    for round_ in range(2):
        reference = bench(f"cuDNN SDPA, round {round_}", cudnn_attention)
        for name in ["flash_attn_interface", "flash_attn_3"]:
            if name in found and hasattr(found[name], "flash_attn_func"):
                out = bench(f"{name}, round {round_}", flash3_attention(found[name]))
                print("  max |out - cuDNN's|", (out.float() - reference.float()).abs().max().item())


if __name__ == "__main__":
    main()
