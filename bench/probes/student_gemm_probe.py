#!/usr/bin/env python3
"""The fast TTT step's GEMMs one by one, as LibTorch runs them in the step
(ops/linear.cc: addmm with the residual as C, mm, addmm_ into the weight
gradient; the q/k/v and gate/up weights are column or row blocks of fused
flat buffers), against variants of the same product, to find the ones
running below the board's rate. Question: is the 16k-token step's GEMM time
(about 360 ms for about 250 TFLOP on nvidia-h200) lost in particular shapes,
layouts or the residual epilogue?

    python3 bench/probes/student_gemm_probe.py --tokens=16384

Prints one row per GEMM: ms and TFLOP/s for the step's form and each
variant (mm then add_, contiguous weight copies).
"""
import argparse

import torch


def timed(fn, iters=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--q_heads", type=int, default=32)
    p.add_argument("--kv_heads", type=int, default=8)
    p.add_argument("--mlp", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--head_rows", type=int, default=8192)
    a = p.parse_args()
    dev, bf = "cuda", torch.bfloat16
    T, H, F, V = a.tokens, a.hidden, a.mlp, a.vocab
    D = H // a.q_heads
    qkv_out = (a.q_heads + 2 * a.kv_heads) * D

    def rnd(*shape):
        return torch.randn(*shape, device=dev, dtype=bf) * 0.02

    # The flat parameters: q/k/v rows over [embed | hidden] inputs, gate/up rows.
    qkv = rnd(qkv_out, 2 * H)
    w = {
        "qkv_hidden": qkv[:, H:],  # a column block: leading dimension 2H
        "o": rnd(H, a.q_heads * D),
        "gate_up": rnd(2 * F, H),
        "down": rnd(H, F),
    }
    grads = {k: torch.zeros_like(v.contiguous()) for k, v in w.items()}
    qkv_grad = torch.zeros(qkv_out, 2 * H, device=dev, dtype=bf)
    grads["qkv_hidden"] = qkv_grad[:, H:]
    residual_of = {"qkv_hidden": True, "o": True, "gate_up": False, "down": True}

    print(f"| GEMM | M x N x K | step's form ms (TFLOP/s) | mm + add_ | contiguous weight | |")
    print("|---|---|---|---|---|---|")

    def report(name, m, n, k, forms):
        flop = 2.0 * m * n * k
        cells = []
        for label, fn in forms:
            ms = timed(fn)
            cells.append(f"{label} {ms:.3f} ({flop / ms / 1e9:.0f})")
        print(f"| {name} | {m} x {n} x {k} | " + " | ".join(cells) + " |")

    for name, weight in w.items():
        out, inp = weight.shape
        x = rnd(T, inp)
        res = rnd(T, out)
        wc = weight.contiguous()
        dy = rnd(T, out)
        g = grads[name]
        gc = torch.zeros_like(wc)
        if residual_of[name]:
            fwd = [("addmm", lambda: torch.addmm(res, x, weight.t())),
                   ("mm+add", lambda: torch.mm(x, weight.t()).add_(res)),
                   ("addmm contiguous", lambda: torch.addmm(res, x, wc.t()))]
        else:
            fwd = [("mm", lambda: torch.mm(x, weight.t())), ("mm contiguous", lambda: torch.mm(x, wc.t()))]
        report(f"{name} forward", T, out, inp, fwd)
        report(f"{name} dx", T, inp, out, [("mm", lambda: torch.mm(dy, weight)),
                                           ("mm contiguous", lambda: torch.mm(dy, wc))])
        report(f"{name} dW", out, inp, T, [("addmm_", lambda: g.addmm_(dy.t(), x)),
                                           ("addmm_ contiguous grad", lambda: gc.addmm_(dy.t(), x)),
                                           ("mm + add_", lambda: gc.add_(torch.mm(dy.t(), x)))])

    R = a.head_rows
    xh, head, dl = rnd(R, H), rnd(V, H), rnd(R, V)
    hg = torch.zeros_like(head)
    report("lm_head logits", R, V, H, [("mm", lambda: torch.mm(xh, head.t()))])
    report("lm_head dx", R, H, V, [("mm", lambda: torch.mm(dl, head))])
    report("lm_head dW", V, H, R, [("addmm_", lambda: hg.addmm_(dl.t(), xh))])
    # Once per batch: fc over the teacher's three aux states (no input
    # gradient), and the embedding half of q/k/v over every position plus
    # one padding row per step and sample (M = T + 7 for one sample:
    # odd), against the same products over T rows.
    fc, fcg = rnd(H, 3 * H), torch.zeros(H, 3 * H, device=dev, dtype=bf)
    aux, dfc = rnd(T, 3 * H), rnd(T, H)
    report("fc forward", T, H, 3 * H, [("mm", lambda: torch.mm(aux, fc.t()))])
    report("fc dW", H, 3 * H, T, [("addmm_", lambda: fcg.addmm_(dfc.t(), aux))])
    qkv_embed, qkv_embed_grad = qkv[:, :H], qkv_grad[:, :H]
    for rows in (T + 7, T):
        e, de = rnd(rows, H), rnd(rows, qkv_out)
        report(f"q/k/v embedding half forward, {rows} rows", rows, qkv_out, H,
               [("mm", lambda: torch.mm(e, qkv_embed.t())),
                ("mm contiguous", lambda: torch.mm(e, qkv_embed.contiguous().t()))])
        report(f"q/k/v embedding half dW, {rows} rows", qkv_out, H, rows,
               [("addmm_", lambda: qkv_embed_grad.addmm_(de.t(), e))])
        report(f"q/k/v embedding half dx, {rows} rows", rows, H, qkv_out,
               [("mm", lambda: torch.mm(de, qkv_embed))])
    last = rnd(T, H)
    target = rnd(V, H).float()
    report("target logits", T, V, H, [
        ("tf32 fp32 inputs", lambda: torch.mm(last.float(), target.t())),
        ("bf16 inputs, bf16 out", lambda: torch.mm(last, target.to(bf).t())),
    ])


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = True
    main()
