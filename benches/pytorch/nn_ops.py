"""PyTorch eager timings for the operations cudnn-safe's `nn` and `rnn` benches measure, on the same
shapes, so the two can be compared in one run on one machine (docs/BENCHMARKS.md).

Run with PyTorch's own environment: `python3 benches/pytorch/nn_ops.py`. Prints one JSON object per
line: {"op": name, "ms": median per call, ...}. Timing: CUDA events around batches of calls, median
of 7 batches, after warm-up (the same method as the Rust benches' batch median).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402  (sits next to this script)
import torch
import torch.nn as nn
import torch.nn.functional as F

dev = "cuda"
torch.backends.cudnn.benchmark = True
print(json.dumps({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                  "gpu": torch.cuda.get_device_name()}))


def bench(fn, reps=50, warm=5, batches=7):
    return timing.bench(fn, reps, warm, batches)


def report(op, ms, bytes_moved=None, **extra):
    row = {"op": op, "ms": round(ms, 5)}
    if bytes_moved:
        row["TB/s"] = round(bytes_moved / ms / 1e9, 3)
    row.update(extra)
    print(json.dumps(row), flush=True)


with torch.no_grad():
    x = torch.randn(32, 256, 56, 56, device=dev)
    y = torch.empty_like(x)
    nb = x.numel() * 4
    report("copy_fp32_32x256x56x56", bench(lambda: y.copy_(x)), 2 * nb)
    report("relu_fp32_32x256x56x56", bench(lambda: F.relu(x)), 2 * nb)
    report("sigmoid_fp32_32x256x56x56", bench(lambda: torch.sigmoid(x)), 2 * nb)
    yp = F.max_pool2d(x, 3, 2, 1)
    report("maxpool3x3s2p1_fp32_32x256x56x56", bench(lambda: F.max_pool2d(x, 3, 2, 1)),
           nb + yp.numel() * 4)
    report("avgpool2x2_fp32_32x256x56x56", bench(lambda: F.avg_pool2d(x, 2)), nb + nb // 4)
    rm, rv = torch.zeros(256, device=dev), torch.ones(256, device=dev)
    w, b = torch.rand(256, device=dev) + 0.5, torch.randn(256, device=dev)
    report("bn_infer_fp32_32x256x56x56",
           bench(lambda: F.batch_norm(x, rm, rv, w, b, training=False)), 2 * nb)
    report("bn_train_fwd_fp32_32x256x56x56",
           bench(lambda: F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)), 2 * nb)
    report("softmax_channel_fp32_32x256x56x56", bench(lambda: F.softmax(x, dim=1)), 2 * nb)
    xl = torch.randn(32768, 1024, device=dev)
    gl, bl = torch.randn(1024, device=dev), torch.randn(1024, device=dev)
    report("layernorm_fp32_32768x1024", bench(lambda: F.layer_norm(xl, (1024,), gl, bl)),
           2 * xl.numel() * 4)
    xg = torch.randn(32, 256, 56, 56, device=dev)
    report("groupnorm32_fp32_32x256x56x56", bench(lambda: F.group_norm(xg, 32)), 2 * nb)

# Activations on the crate's generated kernels (cudnn-safe's `nn` bench, same op names and byte
# counts): forward `<op>_<dtype>_32x256x56x56` (x read, y written: 2 × nb) and forward+backward
# `<op>_fwd_bwd_<dtype>_32x256x56x56` through `torch.autograd.grad`, which returns dx without
# accumulating it into x.grad (forward 2 × nb, backward reads y or x and dy, writes dx: 3 × nb).
# Timed as the Rust bench times them (`bench_like_rust`). SiLU is swish with β = 1.
ACTIVATIONS = [
    ("sigmoid", torch.sigmoid),
    ("tanh", torch.tanh),
    ("silu", F.silu),
    ("elu", F.elu),
    ("gelu", F.gelu),
    ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh")),
]
for dt, dname in [(torch.float32, "fp32"), (torch.bfloat16, "bf16")]:
    xa = torch.randn(32, 256, 56, 56, device=dev, dtype=dt)
    ga = torch.randn(32, 256, 56, 56, device=dev, dtype=dt)
    nba = xa.numel() * xa.element_size()
    xr = xa.clone().requires_grad_(True)
    for name, fn in ACTIVATIONS:
        with torch.no_grad():
            if not (name == "sigmoid" and dname == "fp32"):  # reported above
                report(f"{name}_{dname}_32x256x56x56",
                       timing.bench_like_rust(lambda: fn(xa)), 2 * nba)
        report(f"{name}_fwd_bwd_{dname}_32x256x56x56",
               timing.bench_like_rust(lambda: torch.autograd.grad(fn(xr), xr, ga)), 5 * nba)

# Layer norm training: the forward that saves the statistics and the backward, each alone (the
# aten calls autograd makes), and both through autograd (cudnn-safe's `norm` bench:
# `ln_fp32_32768x1024-train-graph`, `-bwd-graph`, `-train_bwd-graph`).
with torch.no_grad():
    xl = torch.randn(32768, 1024, device=dev) * 2
    gl, bl = torch.rand(1024, device=dev) + 0.5, torch.randn(1024, device=dev)
    dyl = torch.randn(32768, 1024, device=dev)
    nbl = xl.numel() * 4
    _, ml, rl = torch.native_layer_norm(xl, (1024,), gl, bl, 1e-5)
    report("layernorm_train_fwd_fp32_32768x1024",
           bench(lambda: torch.native_layer_norm(xl, (1024,), gl, bl, 1e-5)), 2 * nbl)
    report("layernorm_bwd_fp32_32768x1024",
           bench(lambda: torch.ops.aten.native_layer_norm_backward(
               dyl, xl, (1024,), ml, rl, gl, bl, [True, True, True])), 3 * nbl)
xla = xl.clone().requires_grad_(True)
gla, bla = gl.clone().requires_grad_(True), bl.clone().requires_grad_(True)
def ln_fb():
    F.layer_norm(xla, (1024,), gla, bla, 1e-5).backward(dyl)
report("layernorm_train_fwd_bwd_fp32_32768x1024", bench(ln_fb, reps=20))

# Backward passes (autograd; the forward is excluded by timing only .backward on a saved graph is
# not possible in eager mode, so forward+backward is reported).
x = torch.randn(32, 256, 56, 56, device=dev, requires_grad=True)
g = torch.randn(32, 256, 56, 56, device=dev)
def relu_fb():
    F.relu(x).backward(g)
report("relu_fwd_bwd_fp32_32x256x56x56", bench(relu_fb, reps=20))
bn = nn.BatchNorm2d(256).to(dev)
def bn_fb():
    bn(x).backward(g)
report("bn_train_fwd_bwd_fp32_32x256x56x56", bench(bn_fb, reps=20))

# Conv + BN + ReLU block, inference (eager: three kernels) and with BN folded (one conv + bias + relu).
for dt, fmt in [(torch.float32, torch.contiguous_format), (torch.float16, torch.channels_last)]:
    conv = nn.Conv2d(64, 64, 3, padding=1, bias=False).to(dev, dt).to(memory_format=fmt).eval()
    bnm = nn.BatchNorm2d(64).to(dev, dt).eval()
    xi = torch.randn(32, 64, 56, 56, device=dev, dtype=dt).to(memory_format=fmt)
    with torch.no_grad():
        report(f"conv_bn_relu_infer_{str(dt)[6:]}_32x64x56x56",
               bench(lambda: F.relu(bnm(conv(xi)))))
        fused = torch.nn.utils.fusion.fuse_conv_bn_eval(conv, bnm)
        report(f"conv_bn_relu_folded_{str(dt)[6:]}_32x64x56x56",
               bench(lambda: F.relu(fused(xi))))

# LSTM 2x512, T=100, B=64, fp32 (cuDNN RNN underneath).
lstm = nn.LSTM(512, 512, num_layers=2).to(dev)
xs = torch.randn(100, 64, 512, device=dev)
with torch.no_grad():
    report("lstm_2x512_T100_B64_fp32_fwd", bench(lambda: lstm(xs), reps=10))
xs.requires_grad_(True)
def lstm_fb():
    out, (h, c) = lstm(xs)
    out.sum().backward()
report("lstm_2x512_T100_B64_fp32_fwd_bwd", bench(lstm_fb, reps=10))
