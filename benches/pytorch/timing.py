"""Timing shared by the PyTorch comparison scripts in this folder (attention.py, conv.py, gemm.py,
nn_ops.py, rms_norm.py, transformer_block.py): CUDA events around batches of calls, median of the
batches, after warm-up. The scripts import it from the folder they sit in.

`bench_like_rust` is exactly the Rust benches' `median_ms` (benches/common/mod.rs): one timed call
sizes batches of about 25 ms (3 to 500 calls), such batches run untimed for `BENCH_HEAT_MS` (default
500 ms) of wall clock, then the median of 5. Use it where a line is compared with a Rust bench line:
on an H200 a long compute-bound kernel runs up to 17 % faster in the first ~0.2 s of load than once
the clocks have settled, so both sides must time the same state.

Importing it also registers a footer: at exit the script prints one JSON line naming the cuDNN and
cuBLAS library files the process mapped (`{"libraries": [...], "impl": "pytorch"}`), as the Rust
benches do when they end, so a comparison shows which files each side ran.
"""
import atexit
import json
import os
import time

import torch


def library_files():
    """The cuDNN and cuBLAS files this process has mapped (from /proc/self/maps; [] elsewhere)."""
    files = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split()
                if len(parts) >= 6:
                    name = os.path.basename(parts[5])
                    if name.startswith(("libcudnn", "libcublas")):
                        files.add(parts[5])
    except OSError:
        pass
    return sorted(files)


@atexit.register
def _print_libraries():
    print(json.dumps({"libraries": library_files(), "impl": "pytorch"}), flush=True)


def _per_call_ms(fn, calls):
    """Milliseconds per call of `calls` back-to-back calls of `fn`, between two CUDA events."""
    s = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(calls):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / calls


def _median(fn, calls, batches):
    ts = sorted(_per_call_ms(fn, calls) for _ in range(batches))
    return ts[len(ts) // 2]


def bench(fn, reps, warm, batches=7):
    """Median over `batches` batches of the milliseconds per call of `fn`, each batch timing `reps`
    calls between two CUDA events, after `warm` untimed calls."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    return _median(fn, reps, batches)


def cuda_graph(fn, warm=3):
    """`fn`'s work captured into a `torch.cuda.CUDAGraph` after `warm` calls on a side stream
    (PyTorch's CUDA-graph recipe): the graph, to time with `graph.replay`, and what the captured
    call returned (the tensors each replay writes)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warm):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


# The Rust benches' batch rule (benches/common/mod.rs: BATCH_MS, BATCHES).
BATCH_MS = 25.0
BATCHES = 5
HEAT_MS = float(os.environ.get("BENCH_HEAT_MS", "500"))


def bench_like_rust(fn):
    """Median over 5 batches of the milliseconds per call of `fn`, each batch sized to about 25 ms
    by one timed call first (3 to 500 calls), after `HEAT_MS` of such batches untimed, as the Rust
    benches' `median_ms` does."""
    torch.cuda.synchronize()
    once = _per_call_ms(fn, 1)
    calls = min(500, max(3, int(BATCH_MS / max(once, 1e-3))))
    start = time.perf_counter()
    while (time.perf_counter() - start) * 1e3 < HEAT_MS:
        _per_call_ms(fn, calls)
    return _median(fn, calls, BATCHES)
