"""PyTorch eager timings of RMS normalization on the shapes of cudnn-safe's `norm` bench
(`rms_fp32_32768x1024-*`, `rms_bf16_16384x4096-*`), so the two can be compared in one run on one
machine (docs/BENCHMARKS.md).

Run with PyTorch's own environment: `python3 benches/pytorch/rms_norm.py`. Prints one JSON object
per line: {"op": name, "ms": median per call, ...}: `-fwd` is `F.rms_norm` without autograd,
`-train_bwd` its forward and backward through autograd (`weight` and `x` require gradients).
Timing: CUDA events around batches of calls, median of 7 batches, after warm-up.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402  (sits next to this script)
import torch
import torch.nn.functional as F

dev = "cuda"
print(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}))

for name, rows, d, dt in [("rms_fp32_32768x1024", 32768, 1024, torch.float32),
                          ("rms_bf16_16384x4096", 16384, 4096, torch.bfloat16)]:
    x = (torch.rand(rows, d, device=dev) * 4 - 2).to(dt)
    w = (torch.rand(d, device=dev) + 0.5).to(dt)
    dy = (torch.rand(rows, d, device=dev) * 2 - 1).to(dt)
    nb = x.numel() * x.element_size()
    with torch.no_grad():
        ms = timing.bench(lambda: F.rms_norm(x, (d,), w, 1e-6), 50, 5)
    print(json.dumps({"op": f"{name}-fwd", "ms": round(ms, 5), "TB/s": round(2 * nb / ms / 1e9, 3)}),
          flush=True)
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)

    def fb():
        F.rms_norm(xg, (d,), wg, 1e-6).backward(dy)
    ms = timing.bench(fb, 20, 5)
    print(json.dumps({"op": f"{name}-train_bwd", "ms": round(ms, 5)}), flush=True)
