"""Timing shared by the PyTorch comparison scripts in this folder (attention.py, nn_ops.py,
transformer_block.py): CUDA events around batches of calls, median of the batches, after warm-up —
the same method as the Rust benches' batch median. The scripts import it from the folder they sit in.
"""
import torch


def bench(fn, reps, warm, batches=7):
    """Median over `batches` batches of the milliseconds per call of `fn`, each batch timing `reps`
    calls between two CUDA events, after `warm` untimed calls."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    s = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(batches):
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / reps)
    ts.sort()
    return ts[len(ts) // 2]
