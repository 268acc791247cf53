"""PyTorch eager timing of the bf16 transformer block that `cargo run --release --example
transformer_block` runs (batch 8, sequence 2048, model 2048, 16 heads of 128, MLP 8192, causal
attention through the cuDNN backend), stage by stage, in the same output format:
`transformer_block <stage> <ms> ms`.

Run with PyTorch's own environment: `python3 benches/pytorch/transformer_block.py`. Timing: CUDA
events around batches of calls, median of 7 batches, after warm-up.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402  (sits next to this script)
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

dev = "cuda"
B, S, D, H, FF = 8, 2048, 2048, 16, 8192
HD = D // H
torch.backends.cuda.matmul.allow_tf32 = False
print(f"# torch {torch.__version__} cudnn {torch.backends.cudnn.version()} "
      f"{torch.cuda.get_device_name()}")


def bench(fn, reps=20, warm=5, batches=7):
    return timing.bench(fn, reps, warm, batches)


bf = torch.bfloat16
with torch.no_grad():
    x = torch.randn(B * S, D, device=dev, dtype=bf)
    ln1 = (torch.ones(D, device=dev, dtype=bf), torch.zeros(D, device=dev, dtype=bf))
    ln2 = (torch.ones(D, device=dev, dtype=bf), torch.zeros(D, device=dev, dtype=bf))
    # nn.Linear layout: weight [out, in].
    wqkv = torch.randn(3 * D, D, device=dev, dtype=bf) / D ** 0.5
    bqkv = torch.randn(3 * D, device=dev, dtype=bf) * 0.1
    wo = torch.randn(D, D, device=dev, dtype=bf) / D ** 0.5
    bo = torch.randn(D, device=dev, dtype=bf) * 0.1
    w1 = torch.randn(FF, D, device=dev, dtype=bf) / D ** 0.5
    b1 = torch.randn(FF, device=dev, dtype=bf) * 0.1
    w2 = torch.randn(D, FF, device=dev, dtype=bf) / FF ** 0.5
    b2 = torch.randn(D, device=dev, dtype=bf) * 0.1

    def ln_1():
        return F.layer_norm(x, (D,), *ln1, eps=1e-5)

    y1 = ln_1()

    def qkv_proj():
        return F.linear(y1, wqkv, bqkv)

    qkv = qkv_proj()
    q, k, v = qkv.view(B, S, 3, H, HD).permute(2, 0, 3, 1, 4).unbind(0)

    def attention():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    o = attention().transpose(1, 2).reshape(B * S, D)

    def proj():
        return x + F.linear(o, wo, bo)

    h1 = proj()

    def ln_2():
        return F.layer_norm(h1, (D,), *ln2, eps=1e-5)

    y2 = ln_2()

    def mlp_up():
        return F.gelu(F.linear(y2, w1, b1))

    u = mlp_up()

    def mlp_down():
        return h1 + F.linear(u, w2, b2)

    def block():
        y1_ = F.layer_norm(x, (D,), *ln1, eps=1e-5)
        q_, k_, v_ = F.linear(y1_, wqkv, bqkv).view(B, S, 3, H, HD).permute(2, 0, 3, 1, 4).unbind(0)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o_ = F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)
        h1_ = x + F.linear(o_.transpose(1, 2).reshape(B * S, D), wo, bo)
        y2_ = F.layer_norm(h1_, (D,), *ln2, eps=1e-5)
        return h1_ + F.linear(F.gelu(F.linear(y2_, w1, b1)), w2, b2)

    for name, fn in [("ln1", ln_1), ("qkv", qkv_proj), ("attention", attention),
                     ("proj", proj), ("ln2", ln_2), ("mlp_up", mlp_up),
                     ("mlp_down", mlp_down), ("block", block)]:
        print(f"transformer_block {name} {bench(fn):.4f} ms", flush=True)
