//! Tensor-op benchmarks: host cost per call on tiny tensors, and device throughput on a
//! ResNet-sized activation `[32, 256, 56, 56]`.
//!
//! Every timed closure ends with `stream.synchronize()`, so a sample is enqueue + run + wait.
//! Without a GPU (no driver, no device, no cuDNN) it prints `no GPU: <why>` and exits cleanly.
mod common;

use std::hint::black_box;
use std::sync::Arc;

use common::{enqueue_loop, setup_or_skip};
use criterion::{Criterion, Throughput};
use cudnn_safe::cudarc::driver::CudaStream;
use cudnn_safe::half::f16;
use cudnn_safe::{Cudnn, TensorDesc};

/// Non-zero, non-constant input values.
fn pattern(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i % 251) as f32 - 125.0) / 64.0).collect()
}

/// Per-call host cost: checks, descriptor use and launch on tensors too small to matter on the
/// device.
fn host_cost(c: &mut Criterion, stream: &Arc<CudaStream>, cudnn: &Cudnn) {
    let bias_d = TensorDesc::<f32>::nchw(1, 8, 1, 1).unwrap();
    let y_d = TensorDesc::<f32>::nchw(1, 8, 4, 4).unwrap();
    let y_nhwc_d = TensorDesc::<f32>::nhwc(1, 8, 4, 4).unwrap();
    let bias = stream.clone_htod(&pattern(bias_d.span())).unwrap();
    let x = stream.clone_htod(&pattern(y_d.span())).unwrap();
    let mut y = stream.alloc_zeros::<f32>(y_d.span()).unwrap();
    let mut y_nhwc = stream.alloc_zeros::<f32>(y_nhwc_d.span()).unwrap();

    let mut g = c.benchmark_group("host_cost");
    g.bench_function("add_tensor bias [1,8,1,1] + [1,8,4,4]", |b| {
        b.iter(|| {
            cudnn
                .add_tensor(black_box(1.0), &bias_d, &bias, black_box(1.0), &y_d, &mut y)
                .unwrap();
            stream.synchronize().unwrap();
        })
    });
    g.bench_function("transform_tensor [1,8,4,4] NCHW->NHWC f32", |b| {
        b.iter(|| {
            cudnn
                .transform_tensor(
                    black_box(1.0),
                    &y_d,
                    &x,
                    black_box(0.0),
                    &y_nhwc_d,
                    &mut y_nhwc,
                )
                .unwrap();
            stream.synchronize().unwrap();
        })
    });
    g.finish();
}

/// Device throughput on `[32, 256, 56, 56]` (25.7 M elements); bytes are those read plus
/// written (`beta = 0`, so the output is not read).
fn throughput(c: &mut Criterion, stream: &Arc<CudaStream>, cudnn: &Cudnn) {
    let (n, ch, h, w) = (32, 256, 56, 56);
    let x_d = TensorDesc::<f32>::nchw(n, ch, h, w).unwrap();
    let y_d = TensorDesc::<f32>::nhwc(n, ch, h, w).unwrap();
    let y16_d = TensorDesc::<f16>::nhwc(n, ch, h, w).unwrap();
    let elems = x_d.span();
    let x = stream.clone_htod(&pattern(elems)).unwrap();
    let mut y = stream.alloc_zeros::<f32>(elems).unwrap();
    let mut y16 = stream.alloc_zeros::<f16>(elems).unwrap();
    let (f32_bytes, f16_bytes) = (elems as u64 * 4, elems as u64 * 2);

    let mut g = c.benchmark_group("throughput [32,256,56,56]");
    g.throughput(Throughput::Bytes(2 * f32_bytes));
    g.bench_function("transform NCHW->NHWC f32", |b| {
        b.iter(|| {
            cudnn
                .transform_tensor(1.0, &x_d, &x, 0.0, &y_d, &mut y)
                .unwrap();
            stream.synchronize().unwrap();
        })
    });
    g.throughput(Throughput::Bytes(f32_bytes + f16_bytes));
    g.bench_function("transform NCHW f32->NHWC f16", |b| {
        b.iter(|| {
            cudnn
                .transform_tensor(1.0, &x_d, &x, 0.0, &y16_d, &mut y16)
                .unwrap();
            stream.synchronize().unwrap();
        })
    });
    g.throughput(Throughput::Bytes(f32_bytes));
    g.bench_function("set_tensor f32", |b| {
        b.iter(|| {
            cudnn.set_tensor(&x_d, &mut y, black_box(0.5f32)).unwrap();
            stream.synchronize().unwrap();
        })
    });
    g.finish();
}

/// The wrapper's checks against the raw C call on the same handle, descriptors and buffers:
/// `iters` calls are enqueued back to back, then the stream is synchronized once, so the figure
/// is the host cost of enqueueing one call.
fn wrapper_vs_raw(c: &mut Criterion, stream: &Arc<CudaStream>, cudnn: &Cudnn) {
    use cudnn_safe::cudarc::driver::{DevicePtr, DevicePtrMut};
    use std::ffi::c_void;

    let bias_d = TensorDesc::<f32>::nchw(1, 8, 1, 1).unwrap();
    let y_d = TensorDesc::<f32>::nchw(1, 8, 4, 4).unwrap();
    let bias = stream.clone_htod(&pattern(bias_d.span())).unwrap();
    let mut y = stream.alloc_zeros::<f32>(y_d.span()).unwrap();

    let mut g = c.benchmark_group("enqueue add_tensor [1,8,4,4]");
    g.bench_function("cudnn-safe", |b| {
        b.iter_custom(|iters| {
            enqueue_loop(stream, iters, 0, || {
                cudnn
                    .add_tensor(black_box(1.0), &bias_d, &bias, black_box(1.0), &y_d, &mut y)
                    .unwrap();
            })
        })
    });
    let lib = cudnn_safe::sys::library().unwrap();
    let add = cudnn_safe::sys::sym!(lib, cudnnAddTensor).unwrap();
    g.bench_function("raw C cudnnAddTensor", |b| {
        let (bp, _gb) = bias.device_ptr(stream);
        let (yp, _gy) = y.device_ptr_mut(stream);
        let (one_a, one_b) = (1.0f32, 1.0f32);
        b.iter_custom(|iters| {
            enqueue_loop(stream, iters, 0, || {
                // SAFETY: same handle, descriptors and buffers as the checked call above, whose
                // checks passed; the guards keep both buffers alive for the whole loop.
                let s = unsafe {
                    add(
                        cudnn.as_raw(),
                        (&one_a as *const f32).cast::<c_void>(),
                        bias_d.as_raw(),
                        bp as *const c_void,
                        (&one_b as *const f32).cast::<c_void>(),
                        y_d.as_raw(),
                        yp as *mut c_void,
                    )
                };
                assert_eq!(s.0, 0);
            })
        })
    });
    g.finish();
}

fn main() {
    let Some((stream, cudnn)) = setup_or_skip() else {
        return;
    };
    let mut c = Criterion::default().configure_from_args();
    host_cost(&mut c, &stream, &cudnn);
    wrapper_vs_raw(&mut c, &stream, &cudnn);
    throughput(&mut c, &stream, &cudnn);
    c.final_summary();
    common::print_libraries();
}
