"""ResNet-18/50 (torchvision's architecture) for the cudnn-safe `resnet` example: the weights it
runs, the logits it is checked against, and PyTorch's own times for the same networks.

    python3 benches/pytorch/resnet.py weights DIR     # writes DIR/resnet18.safetensors, resnet50...
    python3 benches/pytorch/resnet.py time [CASES]    # JSON lines: PyTorch eager and CUDA graph
    python3 benches/pytorch/resnet.py grads DIR [NETS] # DIR/resnet18_train.safetensors, resnet50...
    python3 benches/pytorch/resnet.py train [CASES]   # JSON lines: training step, eager and graph

`weights`: each model is built with `torch.manual_seed(0)`; its batch-norm running statistics are
then set by 20 forward passes in training mode over random batches (cumulative average,
`momentum=None`), so that an eval-mode forward keeps activations of unit scale the way a
trained network does. The file holds every `state_dict` tensor as float32 under its PyTorch
name, plus `input` (8 images, `[8, 3, 224, 224]` float32, seed 1), `logits` (`[8, 1000]`, the
eval-mode float32 forward on them, TF32 off) and `torch_rel_err_fp16` / `torch_rel_err_bf16`
(`[1]`: the relative L2 error of PyTorch's own channels-last forward in that type against those
logits, the floor any half-precision forward of these weights is read against). The safetensors format is written directly (an
8-byte little-endian header length, a JSON header of dtype/shape/offsets, the raw data), so the
`safetensors` package is not needed.

`grads` (for the `resnet_train` example): each model as torchvision builds it with
`torch.manual_seed(0)` (training mode), a batch of 16 images (`input`, seed 2) and labels
(`labels`, as float32), then one forward and backward with cross-entropy: under
`torch.autocast("cuda", dtype=torch.bfloat16)` on a channels-last copy (`grad.<name>` per
parameter, `loss`) and in float32 with TF32 off (`grad32.<name>`, `loss32`). The state_dict
tensors are the weights before the step.

`train`: the training step the example times, for `resnet50_b128`-style cases (default
`resnet50_b128,resnet18_b128`): channels-last, `cudnn.benchmark = True`, autocast bfloat16,
cross-entropy, `torch.optim.SGD(lr=1e-3, momentum=0.9)`; eager (median of 5 batches of 10 steps),
and the whole step (forward, backward, update) captured as one CUDA graph and replayed.

`time`: channels-last, `cudnn.benchmark = True`, the same rule as the anchors
(`timing.bench`: median of 7 batches of 30 calls after warm-up), for each case
`resnet50_fp16_b32`-style name given (default: the cases of the example): eager, and a CUDA graph
of one forward replayed. One JSON line per figure: {"op", "ms", "ips"}.
"""
import copy
import json
import os
import struct
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402

DEFAULT_CASES = ["resnet50_fp16_b32", "resnet50_bf16_b32", "resnet18_fp16_b32",
                 "resnet50_fp16_b1", "resnet50_fp16_b256"]


def calibrated(name):
    torch.manual_seed(0)
    m = getattr(torchvision.models, name)().cuda()
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.reset_running_stats()
            mod.momentum = None
    m.train()
    with torch.no_grad():
        for _ in range(20):
            m(torch.randn(16, 3, 224, 224, device="cuda"))
    return m.eval()


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        data = t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def weights(out_dir):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(1)
    x = torch.randn(8, 3, 224, 224, device="cuda")
    for name in ["resnet18", "resnet50"]:
        m = calibrated(name)
        with torch.no_grad():
            logits = m(x)
        tensors = {k: v for k, v in m.state_dict().items() if v.dtype.is_floating_point}
        tensors["input"] = x
        tensors["logits"] = logits
        # PyTorch's own error in each half type (channels-last, batch norm not folded): the
        # floor the example's error is read against.
        errors = {}
        for tag, dt in [("fp16", torch.float16), ("bf16", torch.bfloat16)]:
            mh = copy.deepcopy(m).to(dtype=dt, memory_format=torch.channels_last)
            with torch.no_grad():
                lh = mh(x.to(dt).contiguous(memory_format=torch.channels_last)).float()
            errors[tag] = ((lh - logits).norm() / logits.norm()).item()
            tensors[f"torch_rel_err_{tag}"] = torch.tensor([errors[tag]])
            del mh
        path = os.path.join(out_dir, f"{name}.safetensors")
        write_safetensors(path, tensors)
        print(json.dumps({"wrote": path, "tensors": len(tensors),
                          "top1": logits.argmax(1).tolist(), "torch_rel_err": errors}), flush=True)


def time_cases(cases):
    torch.backends.cudnn.benchmark = True
    print(json.dumps({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}), flush=True)
    for case in cases:
        name, dt, b = case.split("_")
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
        b = int(b[1:])
        m = getattr(torchvision.models, name)().cuda().eval().to(dtype=dtype, memory_format=torch.channels_last)
        x = torch.randn(b, 3, 224, 224, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
        with torch.no_grad():
            t = timing.bench(lambda: m(x), reps=30, warm=10)
            print(json.dumps({"op": f"{case}_eager", "ms": t, "ips": b / t * 1e3}), flush=True)
            g, _ = timing.cuda_graph(lambda: m(x))
            t = timing.bench(g.replay, reps=30, warm=10)
            print(json.dumps({"op": f"{case}_cudagraph", "ms": t, "ips": b / t * 1e3}), flush=True)
        del m
        torch.cuda.empty_cache()


def grads(out_dir, names, batch=16):
    import torch.nn.functional as F
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(out_dir, exist_ok=True)
    for name in names:
        torch.manual_seed(0)
        m = getattr(torchvision.models, name)().cuda().train()
        tensors = {k: v.clone() for k, v in m.state_dict().items() if v.dtype.is_floating_point}
        torch.manual_seed(2)
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        labels = torch.randint(0, 1000, (batch,), device="cuda")
        tensors["input"] = x
        tensors["labels"] = labels.float()
        m32 = copy.deepcopy(m)
        loss32 = F.cross_entropy(m32(x), labels)
        loss32.backward()
        # The truth: float64 without cuDNN (PyTorch's own GEMM-based convolutions).
        m64 = copy.deepcopy(m).double()
        with torch.backends.cudnn.flags(enabled=False):
            loss64 = F.cross_entropy(m64(x.double()), labels)
            loss64.backward()
        mb = copy.deepcopy(m).to(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(mb(x.contiguous(memory_format=torch.channels_last)), labels)
        loss.backward()
        own, own32 = {}, {}
        params = zip(mb.named_parameters(), m32.named_parameters(), m64.named_parameters())
        for (k, p), (_, p32), (_, p64) in params:
            tensors[f"grad.{k}"] = p.grad
            tensors[f"grad32.{k}"] = p32.grad
            tensors[f"grad64.{k}"] = p64.grad.float()
            own[k] = ((p.grad.double() - p64.grad).norm() / p64.grad.norm()).item()
            own32[k] = ((p32.grad.double() - p64.grad).norm() / p64.grad.norm()).item()
        tensors["loss"] = loss.detach().float().reshape(1)
        tensors["loss32"] = loss32.detach().reshape(1)
        tensors["loss64"] = loss64.detach().float().reshape(1)
        path = os.path.join(out_dir, f"{name}_train.safetensors")
        write_safetensors(path, tensors)
        worst = max(own, key=own.get)
        worst32 = max(own32, key=own32.get)
        print(json.dumps({"wrote": path, "tensors": len(tensors), "loss": loss.item(),
                          "loss32": loss32.item(), "loss64": loss64.item(),
                          "torch_autocast_vs_f64_worst": [worst, own[worst]],
                          "torch_f32_cudnn_vs_f64_worst": [worst32, own32[worst32]]}),
              flush=True)


def train_cases(cases):
    import torch.nn.functional as F
    torch.backends.cudnn.benchmark = True
    print(json.dumps({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}), flush=True)
    for case in cases:
        name, b = case.split("_")
        b = int(b[1:])
        m = getattr(torchvision.models, name)().cuda().train().to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
        x = torch.randn(b, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (b,), device="cuda")

        def step(cache=True):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=cache):
                loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()

        t = timing.bench(step, reps=10, warm=5, batches=5)
        print(json.dumps({"op": f"{name}_bf16_train_b{b}_eager", "ms": t, "ips": b / t * 1e3}), flush=True)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step(cache=False)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
        t = timing.bench(g.replay, reps=10, warm=5, batches=5)
        print(json.dumps({"op": f"{name}_bf16_train_b{b}_cudagraph", "ms": t, "ips": b / t * 1e3}), flush=True)
        del m, opt, g
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "weights":
        weights(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "grads":
        grads(sys.argv[2], sys.argv[3].split(",") if len(sys.argv) > 3 else ["resnet18", "resnet50"])
    elif len(sys.argv) >= 2 and sys.argv[1] == "train":
        train_cases(sys.argv[2].split(",") if len(sys.argv) > 2 else ["resnet50_b128", "resnet18_b128"])
    elif len(sys.argv) >= 2 and sys.argv[1] == "time":
        time_cases(sys.argv[2].split(",") if len(sys.argv) > 2 else DEFAULT_CASES)
    else:
        sys.exit(__doc__)
