//! Memory-bound layer benchmarks on ResNet-sized activations, with the same operation names and
//! shapes as `benches/pytorch/nn_ops.py`, so the two can be read side by side
//! (docs/BENCHMARKS.md).
//!
//! On `32×256×56×56` f32 NCHW (25.7 M elements, 102.8 MB):
//! * `copy_fp32_32x256x56x56`: a device-to-device copy (`cuMemcpyDtoDAsync` through cudarc),
//!   the bandwidth yardstick;
//! * `relu_…`, `sigmoid_…`: [`Cudnn::activation_forward`];
//! * `maxpool3x3s2p1_…`: 3×3 max pooling, stride 2, padding 1; `avgpool2x2_…`: 2×2 average
//!   pooling, stride 2 ([`Cudnn::pooling_forward`]);
//! * `bn_infer_…`: batch norm with running statistics; `bn_train_fwd_…`: the training forward,
//!   updating the running statistics (momentum 0.1) — spatial mode, PyTorch's for NCHW;
//! * `softmax_channel_…`: softmax over `C` at every `(n, h, w)` (PyTorch's `softmax(dim=1)`);
//! * `groupnorm32_…`: group normalization in 32 groups (`γ = 1`, `β = 0`: PyTorch's
//!   `group_norm(x, 32)` has no affine parameters, this crate's always applies them);
//! * `relu_fwd_bwd_…`, `bn_train_fwd_bwd_…`: forward then backward (PyTorch's autograd times
//!   the same pair);
//! * `<act>_<dtype>_…` and `<act>_fwd_bwd_<dtype>_…` for `act` in sigmoid, tanh, silu (swish with
//!   β = 1), elu (α = 1), gelu and gelu_tanh, `dtype` fp32 and bf16: the activations the crate's
//!   generated kernels run, forward (`2 × nb` bytes) and forward then backward (`5 × nb`: the
//!   backward reads `y` or `x` and `dy` and writes `dx`; PyTorch's side times
//!   `torch.autograd.grad`, which does not accumulate into `x.grad`);
//!
//! and `layernorm_fp32_32768x1024`: layer normalization over the last dimension.
//!
//! The group `nn/relu_shape/<name>` times ReLU forward on the same 32×256×56×56 f32 data
//! described to cuDNN in several packed shapes (JSON op `relu_shape_<name>`), calling
//! `cudnnActivationForward` directly (the wrapper runs the crate's own kernel for packed f32
//! ReLU). On the H200 every description ran at the same 2.87 TB/s, which is why the wrapper does
//! not use cuDNN there. `relu_fp32_…` above is the wrapper itself.
//!
//! Bytes moved are counted as the PyTorch script counts them (each input read once, each output
//! written once: `2 × 102.8 MB` for the element-wise ops and the normalizations); the two
//! forward+backward pairs have no byte count there and none here.
//!
//! Before each benchmark a JSON line in the PyTorch script's format gives the per-call device
//! time from CUDA events (median of 5 batches of about 25 ms, after a warm-up call) and the
//! bandwidth, e.g. `{"op": "relu_fp32_32x256x56x56", "ms": 0.0823, "TB/s": 2.498,
//! "impl": "cudnn-safe"}`; a table of all of them closes the run. Criterion then measures the
//! same calls with CUDA events (`iter_custom`) and reports throughput in bytes.
//!
//! A filter argument selects benchmarks as criterion does (ids `nn/<op>`); data are only set up
//! for operations the filter can select, and `--list` sets up nothing. Without a GPU (no
//! driver, no device, no cuDNN) it prints `no GPU: <why>` and exits cleanly.
mod common;

use std::sync::Arc;

use std::ffi::c_void;

use common::{
    exit_on_error, list_only, median_ms, normal_values, print_header, print_op_error,
    print_op_line, print_summary, sample_size, setup_or_skip, timed_iters, values, Args, BoxResult,
    Summary,
};
use criterion::{Criterion, Throughput};
use cudnn_safe::activation::{ActivationDesc, ActivationMode, GeluApproximation};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cudnn_safe::half::bf16;
use cudnn_safe::norm::{
    BatchNorm, BatchNormMode, BatchNormOps, GroupNorm, LayerNorm, RunningStats,
};
use cudnn_safe::pooling::{PoolingDesc, PoolingMode};
use cudnn_safe::softmax::{SoftmaxAlgorithm, SoftmaxMode};
use cudnn_safe::{Cudnn, TensorDesc, Workspace};
use cudnn_safe::{DataType, Scalar};

/// Criterion group of every benchmark here.
const GROUP: &str = "nn";
/// The activation every `…_32x256x56x56` operation reads.
const DIMS: [i64; 4] = [32, 256, 56, 56];
/// Layer-norm input: rows × features.
const LN_ROWS: i64 = 32768;
const LN_FEATURES: i64 = 1024;
const GN_GROUPS: i64 = 32;
const EPS: f64 = 1e-5;
const MOMENTUM: f64 = 0.1;

const COPY: &str = "copy_fp32_32x256x56x56";
const RELU: &str = "relu_fp32_32x256x56x56";
const SIGMOID: &str = "sigmoid_fp32_32x256x56x56";
const MAXPOOL: &str = "maxpool3x3s2p1_fp32_32x256x56x56";
const AVGPOOL: &str = "avgpool2x2_fp32_32x256x56x56";
const BN_INFER: &str = "bn_infer_fp32_32x256x56x56";
const BN_TRAIN: &str = "bn_train_fwd_fp32_32x256x56x56";
/// The same training forward through cuDNN's extended call (`OPS_BN`, with a workspace): not in
/// the PyTorch script (PyTorch's cuDNN batch norm uses the extended call itself), compared with
/// `bn_train_fwd_…` to pick which call the crate's training forward should use.
const BN_TRAIN_EX: &str = "bn_train_fwd_ex_fp32_32x256x56x56";
const SOFTMAX: &str = "softmax_channel_fp32_32x256x56x56";
const LAYERNORM: &str = "layernorm_fp32_32768x1024";
const GROUPNORM: &str = "groupnorm32_fp32_32x256x56x56";
const RELU_FB: &str = "relu_fwd_bwd_fp32_32x256x56x56";
const BN_FB: &str = "bn_train_fwd_bwd_fp32_32x256x56x56";

/// Every operation, in the order they run (the PyTorch script's order).
const OPS: [&str; 13] = [
    COPY,
    RELU,
    SIGMOID,
    MAXPOOL,
    AVGPOOL,
    BN_INFER,
    BN_TRAIN,
    BN_TRAIN_EX,
    SOFTMAX,
    LAYERNORM,
    GROUPNORM,
    RELU_FB,
    BN_FB,
];

/// The activations of the `<act>_<dtype>_…` and `<act>_fwd_bwd_<dtype>_…` rows (the PyTorch
/// script's `ACTIVATIONS`).
const ACTIVATIONS: [(&str, ActivationMode); 6] = [
    ("sigmoid", ActivationMode::Sigmoid),
    ("tanh", ActivationMode::Tanh),
    ("silu", ActivationMode::Swish { beta: 1.0 }),
    ("elu", ActivationMode::Elu { alpha: 1.0 }),
    (
        "gelu",
        ActivationMode::Gelu {
            approximate: GeluApproximation::Exact,
        },
    ),
    (
        "gelu_tanh",
        ActivationMode::Gelu {
            approximate: GeluApproximation::Tanh,
        },
    ),
];

/// Criterion group of the ReLU-by-description benchmarks.
const SHAPE_GROUP: &str = "nn/relu_shape";
/// Elements of the activation (25,690,112 = 2¹⁹·49).
const TOTAL: i64 = DIMS[0] * DIMS[1] * DIMS[2] * DIMS[3];

/// A packed description of the activation's elements for `nn/relu_shape/<name>`.
struct Shape {
    /// Criterion function name.
    name: &'static str,
    /// The JSON op (`relu_shape_<name>`).
    op: &'static str,
    /// Logical `[N, C, H, W]`.
    dims: [i64; 4],
    /// Channels-last (NHWC) instead of channels-first.
    nhwc: bool,
}

/// The descriptions compared: the caller's NCHW and NHWC, one huge row (`C = 1`, large `W`),
/// one huge channel axis, rows of 1024 as `C` with 1×1 planes, `N·C` planes of `H·W`, 2×2
/// planes, and `rows1024` — 1024-element planes.
const SHAPES: [Shape; 8] = [
    Shape {
        name: "nchw",
        op: "relu_shape_nchw",
        dims: DIMS,
        nhwc: false,
    },
    Shape {
        name: "nhwc",
        op: "relu_shape_nhwc",
        dims: DIMS,
        nhwc: true,
    },
    Shape {
        name: "w_flat",
        op: "relu_shape_w_flat",
        dims: [1, 1, 1, TOTAL],
        nhwc: false,
    },
    Shape {
        name: "c_flat",
        op: "relu_shape_c_flat",
        dims: [1, TOTAL, 1, 1],
        nhwc: false,
    },
    Shape {
        name: "n_c1024",
        op: "relu_shape_n_c1024",
        dims: [TOTAL / 1024, 1024, 1, 1],
        nhwc: false,
    },
    Shape {
        name: "nc_hw",
        op: "relu_shape_nc_hw",
        dims: [DIMS[0] * DIMS[1], DIMS[2] * DIMS[3], 1, 1],
        nhwc: false,
    },
    Shape {
        name: "quads",
        op: "relu_shape_quads",
        dims: [1, TOTAL / 4, 2, 2],
        nhwc: false,
    },
    Shape {
        name: "rows1024",
        op: "relu_shape_rows1024",
        dims: [1, TOTAL / 1024, 1, 1024],
        nhwc: false,
    },
];

/// Runs one selected operation: a checked first call, the JSON line, then criterion. An
/// operation whose first call fails prints a JSON line with the error instead.
#[allow(clippy::too_many_arguments)] // the measurement's context, spelled out
fn bench_op(
    c: &mut Criterion,
    args: &Args,
    stream: &CudaStream,
    summary: &mut Vec<Summary>,
    group: &str,
    id: &str,
    op: &'static str,
    bytes: Option<f64>,
    call: &mut dyn FnMut() -> BoxResult<()>,
) {
    let ms = match call().and_then(|()| median_ms(stream, args.test, &mut *call)) {
        Ok(ms) => ms,
        Err(e) => {
            // Not registered with criterion: a stand-in would be measured and reported as if it
            // were the operation.
            print_op_error(op, &e);
            return;
        }
    };
    print_op_line(op, ms, bytes, None);
    summary.push(Summary {
        op: op.to_string(),
        ms,
        bytes,
    });
    let mut g = c.benchmark_group(group);
    g.sample_size(sample_size(ms));
    if let Some(b) = bytes {
        g.throughput(Throughput::Bytes(b as u64));
    }
    g.bench_function(id, |b| {
        b.iter_custom(|iters| timed_iters(stream, iters, &mut *call))
    });
    g.finish();
}

/// Inputs, outputs and parameters of every operation.
struct Data {
    x_d: TensorDesc<f32>,
    x: CudaSlice<f32>,
    y: CudaSlice<f32>,
    /// Incoming gradient of the forward+backward pairs.
    dy: CudaSlice<f32>,
    dx: CudaSlice<f32>,
    /// Batch-norm parameters, running statistics and parameter gradients (`C` each).
    weight: CudaSlice<f32>,
    bias: CudaSlice<f32>,
    running_mean: CudaSlice<f32>,
    running_var: CudaSlice<f32>,
    dweight: CudaSlice<f32>,
    dbias: CudaSlice<f32>,
}

impl Data {
    fn new(stream: &Arc<CudaStream>) -> BoxResult<Data> {
        let [n, c, h, w] = DIMS;
        let x_d = TensorDesc::<f32>::nchw(n, c, h, w)?;
        let len = x_d.span();
        let channels = c as usize;
        // PyTorch's parameters: weight in [0.5, 1.5], bias around 0, mean 0, variance 1.
        let weight: Vec<f32> = values::<f32>(channels, 0.5)
            .iter()
            .map(|v| v + 1.0)
            .collect();
        Ok(Data {
            x: stream.clone_htod(&values::<f32>(len, 2.0))?,
            y: stream.alloc_zeros::<f32>(len)?,
            dy: stream.clone_htod(&values::<f32>(len, 1.0))?,
            dx: stream.alloc_zeros::<f32>(len)?,
            weight: stream.clone_htod(&weight)?,
            bias: stream.clone_htod(&values::<f32>(channels, 1.0))?,
            running_mean: stream.alloc_zeros::<f32>(channels)?,
            running_var: stream.clone_htod(&vec![1.0f32; channels])?,
            dweight: stream.alloc_zeros::<f32>(channels)?,
            dbias: stream.alloc_zeros::<f32>(channels)?,
            x_d,
        })
    }

    /// Bytes of the activation (`nb` in the PyTorch script).
    fn bytes(&self) -> f64 {
        (self.x_d.span() * std::mem::size_of::<f32>()) as f64
    }
}

/// Whether criterion will run `op`; if not, registers it (for `--list` and filters) and says no.
fn selected(c: &mut Criterion, args: &Args, op: &'static str) -> bool {
    if args.runs(&format!("{GROUP}/{op}")) {
        true
    } else {
        list_only(c, GROUP, &[op]);
        false
    }
}

/// The shared data if criterion will run `op` (registering `op` only, otherwise). The data
/// exist whenever an operation on the activation is selected.
fn pick<'d>(
    c: &mut Criterion,
    args: &Args,
    op: &'static str,
    data: &'d mut Option<Data>,
) -> Option<&'d mut Data> {
    if selected(c, args, op) {
        data.as_mut()
    } else {
        None
    }
}

/// Sets up and runs every selected operation in order; the measurements for the closing table.
fn run(
    c: &mut Criterion,
    args: &Args,
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    s: &mut Vec<Summary>,
) -> BoxResult<()> {
    let st: &CudaStream = stream;
    let uses_activation = OPS
        .iter()
        .any(|&op| op != LAYERNORM && args.runs(&format!("{GROUP}/{op}")))
        || SHAPES
            .iter()
            .any(|sh| args.runs(&format!("{SHAPE_GROUP}/{}", sh.name)));
    let mut data = if uses_activation {
        Some(Data::new(stream)?)
    } else {
        None
    };
    let relu = ActivationDesc::new(ActivationMode::Relu)?;
    let sigmoid = ActivationDesc::new(ActivationMode::Sigmoid)?;

    for op in [COPY, RELU, SIGMOID] {
        let Some(d) = pick(c, args, op, &mut data) else {
            continue;
        };
        let (xd, nb) = (&d.x_d, d.bytes());
        let mut call: Box<dyn FnMut() -> BoxResult<()> + '_> = match op {
            COPY => Box::new(|| Ok(stream.memcpy_dtod(&d.x, &mut d.y)?)),
            RELU => {
                Box::new(|| Ok(cudnn.activation_forward(&relu, 1.0, xd, &d.x, 0.0, xd, &mut d.y)?))
            }
            _ => Box::new(|| {
                Ok(cudnn.activation_forward(&sigmoid, 1.0, xd, &d.x, 0.0, xd, &mut d.y)?)
            }),
        };
        bench_op(c, args, st, s, GROUP, op, op, Some(2.0 * nb), &mut *call);
    }

    relu_shapes(c, args, stream, cudnn, &relu, data.as_mut(), s)?;

    for (op, mode, window, pads, strides) in [
        (MAXPOOL, PoolingMode::Max, [3, 3], [1, 1], [2, 2]),
        (
            AVGPOOL,
            PoolingMode::AvgIncludePadding,
            [2, 2],
            [0, 0],
            [2, 2],
        ),
    ] {
        let Some(d) = pick(c, args, op, &mut data) else {
            continue;
        };
        let pool = PoolingDesc::builder(mode, &window)
            .pads(&pads)
            .strides(&strides)
            .build()?;
        let y_d = TensorDesc::<f32>::nchw_nd(&pool.output_dims(&DIMS)?)?;
        let mut y = stream.alloc_zeros::<f32>(y_d.span())?;
        let bytes = d.bytes() + (y_d.span() * std::mem::size_of::<f32>()) as f64;
        let xd = &d.x_d;
        bench_op(c, args, st, s, GROUP, op, op, Some(bytes), &mut || {
            Ok(cudnn.pooling_forward(&pool, 1.0, xd, &d.x, 0.0, &y_d, &mut y)?)
        });
    }

    let bn = match &data {
        Some(d) => Some(
            BatchNorm::builder()
                .mode(BatchNormMode::Spatial)
                .epsilon(EPS)
                .build::<f32>(d.x_d.layout())?,
        ),
        None => None,
    };
    if let (Some(d), Some(bn)) = (pick(c, args, BN_INFER, &mut data), &bn) {
        let nb = d.bytes();
        bench_op(
            c,
            args,
            st,
            s,
            GROUP,
            BN_INFER,
            BN_INFER,
            Some(2.0 * nb),
            &mut || {
                Ok(cudnn.batch_norm_forward_inference(
                    bn,
                    1.0,
                    0.0,
                    &d.x,
                    &mut d.y,
                    &d.weight,
                    &d.bias,
                    &d.running_mean,
                    &d.running_var,
                )?)
            },
        );
    }
    if let (Some(d), Some(bn)) = (pick(c, args, BN_TRAIN, &mut data), &bn) {
        let nb = d.bytes();
        bench_op(
            c,
            args,
            st,
            s,
            GROUP,
            BN_TRAIN,
            BN_TRAIN,
            Some(2.0 * nb),
            &mut || {
                let running = RunningStats::new(&mut d.running_mean, &mut d.running_var, MOMENTUM);
                cudnn.batch_norm_forward_training(
                    bn,
                    1.0,
                    0.0,
                    &d.x,
                    &mut d.y,
                    &d.weight,
                    &d.bias,
                    Some(running),
                )?;
                Ok(())
            },
        );
    }

    if let (Some(d), Some(bn)) = (pick(c, args, BN_TRAIN_EX, &mut data), &bn) {
        let nb = d.bytes();
        let mut ws = Workspace::new(stream.clone());
        bench_op(
            c,
            args,
            st,
            s,
            GROUP,
            BN_TRAIN_EX,
            BN_TRAIN_EX,
            Some(2.0 * nb),
            &mut || {
                let running = RunningStats::new(&mut d.running_mean, &mut d.running_var, MOMENTUM);
                cudnn.batch_norm_forward_training_ex(
                    bn,
                    BatchNormOps::Bn,
                    1.0,
                    0.0,
                    &d.x,
                    None,
                    &mut d.y,
                    &d.weight,
                    &d.bias,
                    Some(running),
                    &mut ws,
                )?;
                Ok(())
            },
        );
    }

    if let Some(d) = pick(c, args, SOFTMAX, &mut data) {
        let (xd, nb) = (&d.x_d, d.bytes());
        bench_op(
            c,
            args,
            st,
            s,
            GROUP,
            SOFTMAX,
            SOFTMAX,
            Some(2.0 * nb),
            &mut || {
                Ok(cudnn.softmax_forward(
                    SoftmaxAlgorithm::Accurate,
                    SoftmaxMode::Channel,
                    1.0,
                    xd,
                    &d.x,
                    0.0,
                    xd,
                    &mut d.y,
                )?)
            },
        );
    }

    if selected(c, args, LAYERNORM) {
        let ln = LayerNorm::<f32>::new(
            &cudnn_safe::Layout::nchw_nd(&[LN_ROWS, LN_FEATURES])?,
            1,
            EPS,
        )?;
        let x = stream.clone_htod(&values::<f32>(ln.len(), 2.0))?;
        let mut y = stream.alloc_zeros::<f32>(ln.len())?;
        let gamma = stream.clone_htod(&values::<f32>(ln.features(), 1.0))?;
        let beta = stream.clone_htod(&values::<f32>(ln.features(), 1.0))?;
        let bytes = (2 * ln.len() * std::mem::size_of::<f32>()) as f64;
        bench_op(
            c,
            args,
            st,
            s,
            GROUP,
            LAYERNORM,
            LAYERNORM,
            Some(bytes),
            &mut || Ok(cudnn.layer_norm_forward(&ln, &x, &gamma, &beta, &mut y)?),
        );
    }

    if let Some(d) = pick(c, args, GROUPNORM, &mut data) {
        let gn = GroupNorm::<f32>::new(&cudnn_safe::Layout::nchw_nd(&DIMS)?, GN_GROUPS, EPS)?;
        let gamma = stream.clone_htod(&vec![1.0f32; gn.channels()])?;
        let beta = stream.alloc_zeros::<f32>(gn.channels())?;
        let nb = d.bytes();
        bench_op(
            c,
            args,
            st,
            s,
            GROUP,
            GROUPNORM,
            GROUPNORM,
            Some(2.0 * nb),
            &mut || Ok(cudnn.group_norm_forward(&gn, &d.x, &gamma, &beta, &mut d.y)?),
        );
    }

    if let Some(d) = pick(c, args, RELU_FB, &mut data) {
        let xd = &d.x_d;
        bench_op(c, args, st, s, GROUP, RELU_FB, RELU_FB, None, &mut || {
            cudnn.activation_forward(&relu, 1.0, xd, &d.x, 0.0, xd, &mut d.y)?;
            cudnn.activation_backward(
                &relu, 1.0, xd, &d.y, xd, &d.dy, xd, &d.x, 0.0, xd, &mut d.dx,
            )?;
            Ok(())
        });
    }
    activations::<f32>(c, args, stream, cudnn, "fp32", s)?;
    activations::<bf16>(c, args, stream, cudnn, "bf16", s)?;
    if let (Some(d), Some(bn)) = (pick(c, args, BN_FB, &mut data), &bn) {
        bench_op(c, args, st, s, GROUP, BN_FB, BN_FB, None, &mut || {
            let running = RunningStats::new(&mut d.running_mean, &mut d.running_var, MOMENTUM);
            let saved = cudnn.batch_norm_forward_training(
                bn,
                1.0,
                0.0,
                &d.x,
                &mut d.y,
                &d.weight,
                &d.bias,
                Some(running),
            )?;
            cudnn.batch_norm_backward(
                bn,
                &saved,
                1.0,
                0.0,
                1.0,
                0.0,
                &d.x,
                &d.dy,
                &mut d.dx,
                &d.weight,
                &mut d.dweight,
                &mut d.dbias,
            )?;
            Ok(())
        });
    }
    Ok(())
}

/// The `<act>_<dtype>_32x256x56x56` and `<act>_fwd_bwd_<dtype>_32x256x56x56` rows for `T`
/// (`dtype` its name in op names): [`ACTIVATIONS`] forward, and forward then backward, on
/// standard-normal data as PyTorch's `randn` gives (set up only when one of them is selected).
/// `sigmoid_fp32_…` is timed with the other f32 rows above.
fn activations<T: DataType>(
    c: &mut Criterion,
    args: &Args,
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    dtype: &str,
    s: &mut Vec<Summary>,
) -> BoxResult<()> {
    let st: &CudaStream = stream;
    // Criterion ids and JSON ops live for the whole run.
    let name = |act: &str, fb: &str| -> &'static str {
        Box::leak(format!("{act}{fb}_{dtype}_32x256x56x56").into_boxed_str())
    };
    let mut rows = Vec::new();
    for (act, mode) in ACTIVATIONS {
        let fwd = name(act, "");
        if fwd != SIGMOID {
            rows.push((fwd, mode, false));
        }
        rows.push((name(act, "_fwd_bwd"), mode, true));
    }
    let mut data = None;
    for (op, mode, backward) in rows {
        if !selected(c, args, op) {
            continue;
        }
        let [n, ch, h, w] = DIMS;
        let (d, x, y, dy, dx) = match &mut data {
            Some(v) => v,
            None => {
                let d = TensorDesc::<T>::nchw(n, ch, h, w)?;
                let len = d.span();
                let x = stream.clone_htod(&normal_values::<T>(len))?;
                let dy = stream.clone_htod(
                    &normal_values::<T>(len)
                        .into_iter()
                        .rev()
                        .collect::<Vec<_>>(),
                )?;
                let y = stream.alloc_zeros::<T>(len)?;
                let dx = stream.alloc_zeros::<T>(len)?;
                data.insert((d, x, y, dy, dx))
            }
        };
        let nb = (d.span() * std::mem::size_of::<T>()) as f64;
        let act = ActivationDesc::new(mode)?;
        let (one, zero) = (
            <T::Scalar as Scalar>::from_f64(1.0),
            <T::Scalar as Scalar>::from_f64(0.0),
        );
        let bytes = if backward { 5.0 * nb } else { 2.0 * nb };
        bench_op(c, args, st, s, GROUP, op, op, Some(bytes), &mut || {
            cudnn.activation_forward(&act, one, d, &*x, zero, d, &mut *y)?;
            if backward {
                cudnn.activation_backward(&act, one, d, &*y, d, &*dy, d, &*x, zero, d, &mut *dx)?;
            }
            Ok(())
        });
    }
    Ok(())
}

/// `nn/relu_shape/*`: ReLU forward on the activation's data under each description of
/// [`SHAPES`], through the raw `cudnnActivationForward` (the wrapper would take its own kernel).
fn relu_shapes(
    c: &mut Criterion,
    args: &Args,
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    relu: &ActivationDesc,
    mut data: Option<&mut Data>,
    s: &mut Vec<Summary>,
) -> BoxResult<()> {
    let st: &CudaStream = stream;
    let lib = cudnn_safe::sys::library()?;
    let forward = cudnn_safe::sys::sym!(lib, cudnnActivationForward)?;
    for sh in &SHAPES {
        let Some(d) = data.as_deref_mut().filter(|_| {
            let id = format!("{SHAPE_GROUP}/{}", sh.name);
            args.runs(&id)
        }) else {
            list_only(c, SHAPE_GROUP, &[sh.name]);
            continue;
        };
        let desc = if sh.nhwc {
            TensorDesc::<f32>::nhwc_nd(&sh.dims)
        } else {
            TensorDesc::<f32>::nchw_nd(&sh.dims)
        };
        let desc = match desc {
            Ok(desc) => desc,
            Err(e) => {
                print_op_error(sh.op, &e);
                continue;
            }
        };
        // Every description is packed over exactly the activation's elements, so the raw call
        // reads and writes the same bytes as a checked one would.
        let len = d.x.len();
        if desc.span() != len || desc.layout().element_count() != len || d.y.len() != len {
            return Err(format!(
                "{}: {:?} does not describe {len} elements",
                sh.name, sh.dims
            )
            .into());
        }
        let nb = d.bytes();
        let (alpha, beta) = (1.0f32, 0.0f32);
        bench_op(
            c,
            args,
            st,
            s,
            SHAPE_GROUP,
            sh.name,
            sh.op,
            Some(2.0 * nb),
            &mut || {
                let (xp, _gx) = d.x.device_ptr(st);
                let (yp, _gy) = d.y.device_ptr_mut(st);
                // SAFETY: live handle, activation and tensor descriptors; `desc` is f32, packed,
                // and spans exactly the `len` elements that `x` and `y` (f32, on the handle's
                // context, distinct allocations) hold, checked above; alpha/beta are f32, the type
                // cuDNN reads for f32 tensors; the guards keep both buffers alive and ordered until
                // the call is enqueued.
                let status = unsafe {
                    forward(
                        cudnn.as_raw(),
                        relu.as_raw(),
                        (&alpha as *const f32).cast::<c_void>(),
                        desc.as_raw(),
                        xp as *const c_void,
                        (&beta as *const f32).cast::<c_void>(),
                        desc.as_raw(),
                        yp as *mut c_void,
                    )
                };
                if status.0 != 0 {
                    return Err(format!("cudnnActivationForward: status {}", status.0).into());
                }
                Ok(())
            },
        );
    }
    Ok(())
}

fn main() {
    let _ = env_logger::try_init();
    let Some((stream, cudnn)) = setup_or_skip() else {
        return;
    };
    print_header(&stream, &cudnn);
    let args = Args::parse();
    let mut c = Criterion::default().configure_from_args();
    let mut summary = Vec::new();
    let outcome = run(&mut c, &args, &stream, &cudnn, &mut summary);
    print_summary(&summary, 36);
    c.final_summary();
    exit_on_error("nn", outcome);
}
