"""PyTorch benchmark-mode convolution on the seven configurations of cudnn-safe's `graph` bench
(`union` lines), so the two can be compared on one machine in one device call.

Run with PyTorch's own environment: `python3 benches/pytorch/conv.py [fp16,bf16,tf32,fp32]`.
Prints one JSON line per case: {"mode", "cfg" (as the Rust ops name it), "ms"}. Modes: fp16 and
bf16 in channels-last, tf32 (`allow_tf32 = True`) and fp32 (`allow_tf32 = False`) in NCHW;
`torch.backends.cudnn.benchmark = True`; inputs `randn`, weights `nn.Conv2d`'s own initialization,
no bias, padding r // 2. Timing: `timing.bench_like_rust` (the Rust bench's batch rule) after the
first call (which runs PyTorch's search) and 10 warm-up calls.

`python3 benches/pytorch/conv.py --backward [fp16,bf16,tf32,fp32]` times the backward of the same
cases instead, the counterpart of the Rust `union_conv_bwd_<mode>_<cfg>` ops: `y = conv(x)` once
with `x.requires_grad_()`, then one `torch.autograd.grad(y, (x, conv.weight), dy,
retain_graph=True)` per call (dx and dw; `dy` standard normal, shaped, typed and laid out like
`y`), timed with `timing.bench_like_rust` after 11 warm-up calls (the first runs PyTorch's
search). Prints one JSON line per case: {"mode", "cfg", "ms", "direction": "bwd"}.

`python3 benches/pytorch/conv.py --serve` is the worker of the graph bench's paired comparison
(`GRAPH_BENCH_PYTORCH`): it reads commands on stdin, one per line, and answers each on stdout:
* `case NAME MODE N C H W K R S`: builds that case as above and runs its first call and warm-up
  (PyTorch's search); answers `OK`.
* `time NAME`: times the case with `timing.bench_like_rust` (with its mode's TF32 setting, which
  is part of PyTorch's plan-cache key); answers `MS <milliseconds per call>`.
* `graph NAME`: the case's call captured once (at its first `graph`, after warm-up calls on a
  side stream) into a `torch.cuda.CUDAGraph`, timed by replaying it with
  `timing.bench_like_rust`; answers `MS <milliseconds per replay>`. The counterpart of the graph
  bench's `paired_graph_conv_fwd_<mode>_<cfg>` sides (`GRAPH_BENCH_PAIRED_CUDA_GRAPHS=1`).
* `quit` (or end of input): exits.
An unknown mode or name is answered `ERR <why>`. Other lines it prints (the header) start with `{`.
"""
import json
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402

CONFIGS = [(32, 64, 56, 56, 128, 3, 1), (16, 256, 28, 28, 512, 3, 1), (1, 3, 224, 224, 64, 7, 2),
           (8, 512, 14, 14, 1024, 3, 2), (32, 256, 56, 56, 256, 3, 1), (64, 64, 56, 56, 64, 1, 1),
           (32, 128, 28, 28, 128, 5, 1)]
MODES = {
    "fp16": (torch.float16, torch.channels_last, True),
    "bf16": (torch.bfloat16, torch.channels_last, True),
    "tf32": (torch.float32, torch.contiguous_format, True),
    "fp32": (torch.float32, torch.contiguous_format, False),
}


def prepare(name, cfg):
    """Input and convolution of one case, after its first call (the search) and 10 warm-ups."""
    dtype, layout, tf32 = MODES[name]
    torch.backends.cudnn.allow_tf32 = tf32
    (n, c, h, w, k, r, s) = cfg
    x = torch.randn(n, c, h, w, device="cuda", dtype=dtype).to(memory_format=layout)
    conv = nn.Conv2d(c, k, r, stride=s, padding=r // 2, bias=False)
    conv = conv.to("cuda", dtype).to(memory_format=layout)
    with torch.no_grad():
        for _ in range(11):
            conv(x)
    torch.cuda.synchronize()
    return x, conv, tf32


def time_case(case):
    x, conv, tf32 = case
    torch.backends.cudnn.allow_tf32 = tf32
    with torch.no_grad():
        return timing.bench_like_rust(lambda: conv(x))


def capture_case(case):
    """The case's call captured into a CUDA graph (same input, same module, same TF32 setting,
    so PyTorch's plan cache gives the plan its search picked), after three warm-up calls on a
    side stream as PyTorch's CUDA-graph notes ask."""
    x, conv, tf32 = case
    torch.backends.cudnn.allow_tf32 = tf32
    with torch.no_grad():
        return timing.cuda_graph(lambda: conv(x))


def prepare_backward(name, cfg):
    """The backward of one case (dx and dw from dy), after 11 warm-up calls (the first runs
    PyTorch's search): the call to time and its TF32 setting."""
    dtype, layout, tf32 = MODES[name]
    torch.backends.cudnn.allow_tf32 = tf32
    (n, c, h, w, k, r, s) = cfg
    x = torch.randn(n, c, h, w, device="cuda", dtype=dtype).to(memory_format=layout)
    x.requires_grad_()
    conv = nn.Conv2d(c, k, r, stride=s, padding=r // 2, bias=False)
    conv = conv.to("cuda", dtype).to(memory_format=layout)
    y = conv(x)
    dy = torch.randn_like(y).to(memory_format=layout)

    def step():
        return torch.autograd.grad(y, (x, conv.weight), dy, retain_graph=True)

    for _ in range(11):
        step()
    torch.cuda.synchronize()
    return step, tf32


def time_backward(case):
    step, tf32 = case
    torch.backends.cudnn.allow_tf32 = tf32
    return timing.bench_like_rust(step)


def serve():
    cases = {}
    graphs = {}
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        try:
            if words[0] == "case" and len(words) == 10:
                if words[2] not in MODES:
                    raise ValueError(f"unknown mode {words[2]}")
                cases[words[1]] = prepare(words[2], tuple(int(v) for v in words[3:]))
                print("OK", flush=True)
            elif words[0] == "time" and len(words) == 2:
                if words[1] not in cases:
                    raise ValueError(f"no case named {words[1]}")
                print(f"MS {time_case(cases[words[1]]):.6f}", flush=True)
            elif words[0] == "graph" and len(words) == 2:
                if words[1] not in cases:
                    raise ValueError(f"no case named {words[1]}")
                if words[1] not in graphs:
                    graphs[words[1]] = capture_case(cases[words[1]])
                torch.backends.cudnn.allow_tf32 = cases[words[1]][2]
                replay = graphs[words[1]][0].replay
                print(f"MS {timing.bench_like_rust(replay):.6f}", flush=True)
            else:
                raise ValueError(f"unknown command {line.strip()!r}")
        except Exception as e:  # answered, so the bench reports it instead of waiting
            print(f"ERR {e}".replace("\n", " "), flush=True)


def main():
    print(json.dumps({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                      "gpu": torch.cuda.get_device_name(), "impl": "pytorch"}), flush=True)
    torch.backends.cudnn.benchmark = True
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve()
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--backward":
        for name in (sys.argv[2].split(",") if len(sys.argv) > 2 else list(MODES)):
            for cfg in CONFIGS:
                (n, c, h, w, k, r, s) = cfg
                ms = time_backward(prepare_backward(name, cfg))
                print(json.dumps({"mode": name, "cfg": f"{n}x{c}x{h}x{w}_k{k}_r{r}_s{s}",
                                  "ms": ms, "direction": "bwd"}), flush=True)
        return
    for name in (sys.argv[1].split(",") if len(sys.argv) > 1 else list(MODES)):
        for cfg in CONFIGS:
            (n, c, h, w, k, r, s) = cfg
            ms = time_case(prepare(name, cfg))
            print(json.dumps({"mode": name, "cfg": f"{n}x{c}x{h}x{w}_k{k}_r{r}_s{s}", "ms": ms}),
                  flush=True)


if __name__ == "__main__":
    main()
