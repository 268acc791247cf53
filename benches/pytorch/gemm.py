"""PyTorch timings of the cuBLASLt cases of cudnn-safe's `blas` bench (benches/blas.rs), so the two
can be compared on one machine (docs/BENCHMARKS.md).

Run with PyTorch's own environment: `python3 benches/pytorch/gemm.py`. Prints one JSON object per
line: {"op", "ms" (median per call), ...}:
* `gemm_bf16_8192`: `a @ w.T`, bf16, 8192³ (the bench's `lt_gemm_bf16/8192`), with its TFLOP/s;
* `bias_gelu_bf16_8192x4096x1024-fused`: `torch._addmm_activation(b, a, w.T, use_gelu=True)`,
  PyTorch's fused cuBLASLt GEMM + bias + GELU(tanh) (the bench's `lt_fused_bias_gelu`);
* `bias_gelu_bf16_8192x4096x1024-unfused`: `gelu(a @ w.T + b, approximate="tanh")` in eager.
* `fp8_e4m3_gemm_<n>` for n = 4096 and 8192: `torch._scaled_mm(a, b.t(), scale_a=1, scale_b=1,
  out_dtype=torch.bfloat16)`, `a`, `b` standard normal rounded to E4M3 (the bench's
  `lt_fp8_e4m3/<n>`), with its TFLOP/s.
`python3 benches/pytorch/gemm.py fp8` (or `bf16`) runs only those lines.
Timing: `timing.bench_like_rust` (the Rust bench's `median_ms` rule: batches of about 25 ms, run
for `BENCH_HEAT_MS` first, median of 5), after 5 warm-up calls.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402  (sits next to this script)
import torch
import torch.nn.functional as F

dev = "cuda"
bf = torch.bfloat16
print(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                  "impl": "pytorch"}))


def bench(fn):
    for _ in range(5):
        fn()
    return timing.bench_like_rust(fn)


def report(op, ms, **extra):
    row = {"op": op, "ms": round(ms, 5)}
    row.update(extra)
    print(json.dumps(row), flush=True)


which = sys.argv[1:] or ["bf16", "fp8"]
with torch.no_grad():
    if "fp8" in which:
        for n in (4096, 8192):
            a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
            b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
            one = torch.tensor(1.0, device=dev)
            ms = bench(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one,
                                                out_dtype=bf))
            report(f"fp8_e4m3_gemm_{n}", ms, TFLOPs=round(2 * n ** 3 / ms / 1e9, 1))
            del a, b
    if "bf16" not in which:
        sys.exit(0)
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=bf)
    w = torch.randn(n, n, device=dev, dtype=bf)
    ms = bench(lambda: a @ w.T)
    report("gemm_bf16_8192", ms, TFLOPs=round(2 * n ** 3 / ms / 1e9, 1))
    del a, w

    m, n, k = 8192, 4096, 1024
    a = torch.randn(m, k, device=dev, dtype=bf)
    w = torch.randn(n, k, device=dev, dtype=bf)
    b = torch.randn(n, device=dev, dtype=bf)
    name = f"bias_gelu_bf16_{m}x{n}x{k}"
    report(f"{name}-fused", bench(lambda: torch._addmm_activation(b, a, w.T, use_gelu=True)))
    report(f"{name}-unfused", bench(lambda: F.gelu(a @ w.T + b, approximate="tanh")))
