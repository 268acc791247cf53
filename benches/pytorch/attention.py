"""PyTorch timings of scaled dot-product attention with the cuDNN backend forced, on the shapes of
cudnn-safe's `attention` bench (benches/attention.rs), so the two can be compared on one machine.

Run with PyTorch's own environment: `python3 benches/pytorch/attention.py`. Prints the same lines as
the Rust bench:
    attention fwd bf16 b8 h16 s4096 d128 causal: X ms, Y TFLOP/s
and `fwd+bwd` (forward then backward through autograd). FLOPs as FlashAttention counts them:
causal forward 4*b*h*s^2*d/2, backward 2.5 times that. q, k, v are [b, h, s, d] views of
[b, s, h, d] storage, as the Rust bench lays them out. Timing: `timing.bench_like_rust` (batches
of about 25 ms, median of 5, after warm-up), as the Rust bench times its lines.

`ATTENTION_BENCH_KV_HEADS` (dividing 16) gives k and v fewer heads (grouped-query attention,
`enable_gqa=True`; lines read `h16 hkv4`); if the cuDNN backend refuses that, the line is timed
with PyTorch's default backend choice and says so.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402  (sits next to this script)

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

dev = "cuda"
B, H, D = 8, 16, 128
S = int(os.environ.get("ATTENTION_BENCH_SEQ", "4096"))
H_KV = int(os.environ.get("ATTENTION_BENCH_KV_HEADS", str(H)))
assert H_KV >= 1 and H % H_KV == 0, f"ATTENTION_BENCH_KV_HEADS={H_KV} does not divide {H}"
GQA = H_KV != H
print(json.dumps({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                  "gpu": torch.cuda.get_device_name(), "impl": "pytorch"}))


def bench(fn, warm=3):
    # Warm-up, then the Rust bench's own batch rule (about 25 ms per batch, median of 5).
    for _ in range(warm):
        fn()
    return timing.bench_like_rust(fn)


def report(what, ms, flops, note=""):
    kv = f" hkv{H_KV}" if GQA else ""
    print(f"attention {what} bf16 b{B} h{H}{kv} s{S} d{D} causal: {ms:.4f} ms, "
          f"{flops / (ms * 1e-3) / 1e12:.1f} TFLOP/s{note}", flush=True)


def bshd(heads=H, requires_grad=False):
    # [b, s, h, d] storage viewed as [b, h, s, d].
    t = (torch.randn(B, S, heads, D, device=dev, dtype=torch.bfloat16) * 0.5).transpose(1, 2)
    return t.detach().requires_grad_(requires_grad)


def attend(q, k, v):
    if GQA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


fwd_flops = 4.0 * B * H * S * S * D / 2.0


def run_all(note):
    with torch.no_grad():
        q, k, v = bshd(), bshd(H_KV), bshd(H_KV)
        report("fwd", bench(lambda: attend(q, k, v)), fwd_flops, note)

    q, k, v = bshd(H, True), bshd(H_KV, True), bshd(H_KV, True)
    d_o = bshd()

    def fwd_bwd():
        o = attend(q, k, v)
        o.backward(d_o)

    report("fwd+bwd", bench(fwd_bwd), 3.5 * fwd_flops, note)


try:
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        run_all("")
except RuntimeError as e:
    if not GQA:
        raise
    print(f"# cuDNN backend refused grouped heads ({str(e).splitlines()[0]}); "
          "timing PyTorch's default backend", flush=True)
    run_all(" (PyTorch default backend)")
