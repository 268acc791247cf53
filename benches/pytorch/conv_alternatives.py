"""Whether a convolution of the graph bench's seven configurations could run faster outside
cuDNN's convolution engines, measured with PyTorch on the GPU (no cudnn-safe code involved).

Run with PyTorch's own environment: `python3 benches/pytorch/conv_alternatives.py`.
Two questions, one JSON line per configuration and mode:
* `"gemm"` (modes fp16, tf32, fp32): the convolution (benchmark mode, channels-last) against the
  matrix product it amounts to, `[N·P·Q, C·R·S] × [C·R·S, K]` through cuBLAS, plus a copy of the
  left matrix's size as a lower bound of building it (im2col; none for 1×1). A `gain` above 1
  means the GEMM route could beat the convolution engines.
* `"layout"` (mode tf32, whose bench cases are NCHW): the NCHW convolution against the
  channels-last one plus the three layout copies that route needs per call (x and w in, y out).
Timing: `timing.bench_like_rust`, after the first call and 10 warm-ups.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402
from conv import CONFIGS  # noqa: E402

torch.backends.cudnn.benchmark = True
DTYPES = {"fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}


def measure(fn):
    for _ in range(11):
        fn()
    torch.cuda.synchronize()
    return timing.bench_like_rust(fn)


def name(cfg):
    (n, c, h, w, k, r, s) = cfg
    return f"{n}x{c}x{h}x{w}_k{k}_r{r}_s{s}"


def inputs(cfg, dtype, layout):
    (n, c, h, w, k, r, s) = cfg
    x = torch.randn(n, c, h, w, device="cuda", dtype=dtype).to(memory_format=layout)
    bound = (c * r * r) ** -0.5
    wt = ((torch.rand(k, c, r, r, device="cuda", dtype=dtype) * 2 - 1) * bound).to(memory_format=layout)
    return x, wt


def gemm_line(mode, cfg):
    (n, c, h, w, k, r, s) = cfg
    x, wt = inputs(cfg, DTYPES[mode], torch.channels_last)
    conv_ms = measure(lambda: F.conv2d(x, wt, stride=s, padding=r // 2))
    p = (h + 2 * (r // 2) - r) // s + 1
    q = (w + 2 * (r // 2) - r) // s + 1
    a = torch.randn(n * p * q, c * r * r, device="cuda", dtype=x.dtype)
    b = torch.randn(k, c * r * r, device="cuda", dtype=x.dtype)
    gemm_ms = measure(lambda: a @ b.t())
    col = torch.empty_like(a)
    im2col_ms = measure(lambda: col.copy_(a)) if r > 1 else 0.0
    return {"kind": "gemm", "mode": mode, "cfg": name(cfg), "conv_ms": round(conv_ms, 5),
            "gemm_ms": round(gemm_ms, 5), "im2col_copy_ms": round(im2col_ms, 5),
            "gain": round(conv_ms / (gemm_ms + im2col_ms), 3)}


def layout_line(cfg):
    (n, c, h, w, k, r, s) = cfg
    x, wt = inputs(cfg, torch.float32, torch.contiguous_format)
    xl = x.contiguous(memory_format=torch.channels_last)
    wl = wt.contiguous(memory_format=torch.channels_last)
    nchw_ms = measure(lambda: F.conv2d(x, wt, stride=s, padding=r // 2))
    nhwc_ms = measure(lambda: F.conv2d(xl, wl, stride=s, padding=r // 2))
    yl = F.conv2d(xl, wl, stride=s, padding=r // 2)
    bx, bw = torch.empty_like(xl), torch.empty_like(wl)
    by = torch.empty_like(yl, memory_format=torch.contiguous_format)
    copies = [measure(lambda: bx.copy_(x)), measure(lambda: bw.copy_(wt)), measure(lambda: by.copy_(yl))]
    return {"kind": "layout", "mode": "tf32", "cfg": name(cfg), "nchw_ms": round(nchw_ms, 5),
            "nhwc_ms": round(nhwc_ms, 5), "copies_ms": [round(t, 5) for t in copies],
            "gain": round(nchw_ms / (nhwc_ms + sum(copies)), 3)}


def main():
    print(json.dumps({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                      "gpu": torch.cuda.get_device_name()}), flush=True)
    for mode in ["fp16", "tf32", "fp32"]:
        torch.backends.cudnn.allow_tf32 = mode == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        for cfg in CONFIGS:
            print(json.dumps(gemm_line(mode, cfg)), flush=True)
    torch.backends.cudnn.allow_tf32 = True
    for cfg in CONFIGS:
        print(json.dumps(layout_line(cfg)), flush=True)


if __name__ == "__main__":
    main()
