"""What the attention probes share: wall-clock timing of a CUDA callable
and the [T, heads, D] -> [1, heads, T, D] view the fused kernels take."""
import time

import torch


def timed(fn, n=5):
    """Seconds per call of fn, over n calls after one warm-up call."""
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n


def bhsd(x):
    """[T, heads, D] -> [1, heads, T, D] (a view)."""
    return x.unsqueeze(0).transpose(1, 2)
