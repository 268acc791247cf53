//! A Conv(3×3)+BN+ReLU block and a ResNet basic block on cuDNN, unfused and fused: inference
//! with batch normalization folded into the convolution, and a training step (forward and
//! backward) of each block.
//!
//! ```text
//! cargo run --release -p cudnn-safe-tools --bin conv_bn_relu                    # fp32, tf32 and fp16, N = 32
//! cargo run --release -p cudnn-safe-tools --bin conv_bn_relu -- --modes fp16    # chosen modes only
//! cargo run --release -p cudnn-safe-tools --bin conv_bn_relu -- --batch 8       # a smaller batch
//! ```
//!
//! Both blocks work on `N×64×56×56` activations (ResNet-18/34's first stage), 64 filters of 3×3,
//! padding 1, no convolution bias:
//!
//! * **conv-bn-relu**: `a = relu(bn1(conv(x, w1)))`;
//! * **residual**: `y = relu(bn2(conv(relu(bn1(conv(x, w1))), w2)) + x)` (the identity skip).
//!
//! Modes: `fp32` (f32 NCHW, FMA math: strict fp32), `tf32` (f32 NCHW, default math: TF32
//! tensor cores allowed, PyTorch's default for convolutions) and `fp16` (f16 NHWC tensors, KRSC
//! filters, tensor-op math, f32 accumulation; batch-norm parameters in f32, cuDNN's rule).
//! Inputs, weights, and batch-norm scale, shift and running statistics are random (never zero,
//! the statistics near but not equal to the true ones), from a fixed seed.
//!
//! For each mode and block it times (CUDA events around back-to-back calls, median of 5
//! batches after warm-up):
//!
//! * **inference, unfused**: `cudnnConvolutionForward`, `cudnnBatchNormalizationForwardInference`
//!   and `cudnnActivationForward` (plus `cudnnAddTensor` for the skip), the convolution with the
//!   algorithm `cudnnFindConvolutionForwardAlgorithmEx` ranks fastest;
//! * **inference, fused**: batch normalization folded into the weights and a bias on the host in
//!   f64 (`w' = w·γ/√(var+ε)`, `b' = β − mean·γ/√(var+ε)`), then ONE
//!   `cudnnConvolutionBiasActivationForward` per convolution, `act(α1·conv(x, w') + α2·z + b')`
//!   with ReLU; the residual block's second one takes the skip as `z` (`α2 = 1`). Every forward
//!   algorithm cuDNN accepts is timed and the fastest kept;
//! * **training, fwd+bwd** (unfused: cuDNN's legacy API has no fused training path):
//!   convolution, batch-norm training forward (updating running statistics) and ReLU forward,
//!   then ReLU backward, batch-norm backward, convolution backward data and backward filter;
//!   in the residual block the skip's gradient is added to the input gradient. Batch norm uses
//!   the spatial mode, and for NHWC the persistent kernels as PyTorch does (falling back to the
//!   plain spatial mode if cuDNN refuses them).
//!
//! Checks: the fused output against the unfused one (max abs difference within the mode's
//! tolerance times the output's largest magnitude: fp32 1e-3, tf32 1e-2, fp16 2e-2, because
//! algorithms such as Winograd or FFT round differently and the folded weights are rounded to
//! the data type), both against an f64 CPU reference on 64 sampled output points per block,
//! and the training step's input and weight gradients are finite.
//!
//! Prints a table (unfused ms, fused ms, speedup, max abs diff, tolerance, CPU-reference error,
//! check) and writes to `$CUDNN_SAFE_OUT_DIR` (else the current directory):
//! * `conv_bn_relu.tsv`: one row per mode, block and phase: `mode block phase unfused_ms
//!   fused_ms speedup max_abs_diff tolerance ref_err ok algos`;
//! * `conv_bn_relu.svg`: one bar chart panel per mode, unfused and fused time per block and phase.
//!
//! Progress goes to stderr. Exit status: 0 when every check passed, 1 on a mismatch or a failed
//! mode (the other modes still run), 2 for bad arguments or without a GPU (after printing
//! `conv_bn_relu needs an NVIDIA GPU: <why>`).
//!
//! `cargo test -p cudnn-safe-tools --bin conv_bn_relu` checks the folding, the CPU reference and
//! the writers (no GPU needed).
#[path = "common/mod.rs"]
mod common;

use std::error::Error as StdError;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use common::{drv, Element, Mode, Rng, Timer};
use cudnn_safe::activation::{ActivationDesc, ActivationMode};
use cudnn_safe::conv::{
    ConvAlgorithm, ConvBwdDataAlgo, ConvBwdFilterAlgo, ConvDesc, ConvFwdAlgo, FusedActivation,
};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::half::f16;
use cudnn_safe::norm::{BatchNorm, BatchNormMode, NormType, RunningStats};
use cudnn_safe::{
    format_version, Cudnn, DataType, Error, FilterDesc, Layout, Result, TensorDesc, TensorFormat,
    Workspace,
};

const USAGE: &str = "usage: conv_bn_relu [--modes fp32,tf32,fp16] [--batch N]";

/// Channels in and out of every convolution (the skip needs them equal).
const CHANNELS: usize = 64;
/// Height and width of every activation.
const SIDE: usize = 56;
/// Default batch.
const BATCH: usize = 32;
/// Batch-norm epsilon (PyTorch's default).
const EPS: f64 = 1e-5;
/// Running-statistics factor of the training forward (PyTorch's `momentum`).
const MOMENTUM: f64 = 0.1;
/// Output points per block checked against the CPU reference.
const SAMPLES: usize = 64;
/// Workspace cap: far above what these convolutions need, well below the GPU's memory.
const WORKSPACE_LIMIT: usize = 4 << 30;
/// The modes run when `--modes` is not given.
const DEFAULT_MODES: [Mode; 3] = [Mode::Fp32, Mode::Tf32, Mode::Fp16];

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match common::options("conv_bn_relu", USAGE, &args, Options::parse) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let Some((stream, cudnn)) = common::open_gpu("conv_bn_relu") else {
        return ExitCode::from(2);
    };
    println!(
        "conv_bn_relu: {} on {}, cuDNN {}",
        opts.shape().label(),
        common::device_line(&stream),
        format_version(cudnn.version())
    );
    let mut rows = Vec::new();
    let mut failed = false;
    for &mode in &opts.modes {
        eprintln!("[{}] setting up", mode.name());
        let outcome = match mode {
            Mode::Fp16 => run_mode::<f16>(&cudnn, &stream, mode, opts.shape()),
            _ => run_mode::<f32>(&cudnn, &stream, mode, opts.shape()),
        };
        match outcome {
            Ok(mode_rows) => rows.extend(mode_rows),
            Err(e) => {
                eprintln!("[{}] failed: {}", mode.name(), common::chain(&e));
                println!("{}: FAILED: {e}", mode.name());
                failed = true;
            }
        }
    }
    print_table(&rows);
    println!();
    for line in pytorch_lines(&rows, &opts.shape()) {
        println!("{line}");
    }
    failed |= rows.iter().any(|r| !r.ok);
    match write_outputs(&rows, &opts.modes) {
        Ok(paths) => {
            for p in paths {
                println!("wrote {p}");
            }
        }
        Err(e) => {
            eprintln!("conv_bn_relu: writing the results: {e}");
            failed = true;
        }
    }
    if failed {
        println!("conv_bn_relu: FAILED (see above)");
        ExitCode::FAILURE
    } else {
        println!("conv_bn_relu: every check passed");
        ExitCode::SUCCESS
    }
}

/// Command-line options.
#[derive(Debug, Clone, PartialEq)]
struct Options {
    modes: Vec<Mode>,
    batch: usize,
}

impl Options {
    fn parse(args: &[String]) -> std::result::Result<Options, String> {
        let mut modes = None;
        let mut batch = BATCH;
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let (key, inline) = match arg.split_once('=') {
                Some((k, v)) if k.starts_with("--") => (k, Some(v.to_string())),
                _ => (arg.as_str(), None),
            };
            let mut value = |what: &str| {
                inline
                    .clone()
                    .or_else(|| it.next().cloned())
                    .ok_or_else(|| format!("{key} needs {what}"))
            };
            match key {
                "--modes" => modes = Some(parse_modes(&value("a list such as fp32,fp16")?)?),
                "--batch" => {
                    let v = value("a batch size")?;
                    batch = v
                        .parse()
                        .ok()
                        .filter(|&b| (2..=256).contains(&b))
                        .ok_or_else(|| format!("--batch takes 2 to 256, not `{v}`"))?;
                }
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        Ok(Options {
            modes: modes.unwrap_or_else(|| DEFAULT_MODES.to_vec()),
            batch,
        })
    }

    fn shape(&self) -> Shape {
        Shape {
            n: self.batch,
            c: CHANNELS,
            h: SIDE,
            w: SIDE,
        }
    }
}

/// `fp32,fp16` → modes, without repeats; bf16 is refused (cuDNN's fused convolution takes
/// float, half and int8 configurations only).
fn parse_modes(list: &str) -> std::result::Result<Vec<Mode>, String> {
    let mut modes = Vec::new();
    for key in list.split(',').filter(|s| !s.trim().is_empty()) {
        let mode = Mode::from_key(key)
            .filter(|m| DEFAULT_MODES.contains(m))
            .ok_or_else(|| format!("unknown mode `{key}` (fp32, tf32 or fp16)"))?;
        if !modes.contains(&mode) {
            modes.push(mode);
        }
    }
    if modes.is_empty() {
        return Err("--modes needs at least one mode".into());
    }
    Ok(modes)
}

/// Activation dimensions `N×C×H×W` (every activation of both blocks has them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
}

impl Shape {
    fn len(&self) -> usize {
        self.n * self.c * self.h * self.w
    }
    fn dims(&self) -> [i64; 4] {
        [self.n, self.c, self.h, self.w].map(|d| d as i64)
    }
    /// Logical (row-major NCHW) index.
    fn at(&self, n: usize, c: usize, h: usize, w: usize) -> usize {
        ((n * self.c + c) * self.h + h) * self.w + w
    }
    /// Filter elements `[C, C, 3, 3]`.
    fn filter_len(&self) -> usize {
        self.c * self.c * 9
    }
    fn label(&self) -> String {
        format!(
            "{}x{}x{}x{}, 3x3 convolutions {}->{}",
            self.n, self.c, self.h, self.w, self.c, self.c
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Host data, folding and the CPU reference (f64)
// ---------------------------------------------------------------------------------------------

/// Batch-norm parameters and running statistics of one layer, one value per channel, each
/// exactly representable in f32 (the parameter type cuDNN uses for f32 and f16 data).
#[derive(Debug, Clone, PartialEq)]
struct BnHost {
    gamma: Vec<f64>,
    beta: Vec<f64>,
    mean: Vec<f64>,
    var: Vec<f64>,
}

impl BnHost {
    /// Non-trivial parameters for activations of variance ≈ 1/3: γ in [0.5, 1.5], β in
    /// [−0.3, 0.3], running mean in [−0.1, 0.1], running variance in [0.25, 0.45].
    fn random(c: usize, rng: &mut Rng) -> BnHost {
        let mut draw = |lo: f64, hi: f64| -> Vec<f64> {
            (0..c)
                .map(|_| f64::from((lo + (hi - lo) * (rng.signed_unit() + 1.0) / 2.0) as f32))
                .collect()
        };
        BnHost {
            gamma: draw(0.5, 1.5),
            beta: draw(-0.3, 0.3),
            mean: draw(-0.1, 0.1),
            var: draw(0.25, 0.45),
        }
    }

    /// Per-channel `(scale, shift)` of inference: `bn(v) = scale·v + shift`.
    fn affine(&self, k: usize) -> (f64, f64) {
        let scale = self.gamma[k] / (self.var[k] + EPS).sqrt();
        (scale, self.beta[k] - self.mean[k] * scale)
    }
}

/// Everything both blocks read, on the host, in logical order (NCHW activations, KCRS filters),
/// every value exactly representable in the data type `T` it was drawn for.
#[derive(Debug, Clone)]
struct HostNet {
    shape: Shape,
    x: Vec<f64>,
    w1: Vec<f64>,
    w2: Vec<f64>,
    bn1: BnHost,
    bn2: BnHost,
}

impl HostNet {
    /// Inputs uniform in [−1, 1), weights uniform with variance 1/fan-in (so every activation
    /// stays of order 1 in f16), all rounded to `T`.
    fn random<T: DataType>(shape: Shape, seed: u64) -> HostNet {
        let mut rng = Rng::new(seed);
        let mut values = |n: usize, amplitude: f64| -> Vec<f64> {
            (0..n)
                .map(|_| T::from_f64(amplitude * rng.signed_unit()).to_f64())
                .collect()
        };
        let x = values(shape.len(), 1.0);
        let amplitude = (3.0 / (shape.c * 9) as f64).sqrt();
        let w1 = values(shape.filter_len(), amplitude);
        let w2 = values(shape.filter_len(), amplitude);
        let bn1 = BnHost::random(shape.c, &mut rng);
        let bn2 = BnHost::random(shape.c, &mut rng);
        HostNet {
            shape,
            x,
            w1,
            w2,
            bn1,
            bn2,
        }
    }
}

/// Folds inference batch normalization into a bias-free convolution: `w'[k] = w[k]·s_k` and
/// `b'_k = β_k − mean_k·s_k` with `s_k = γ_k/√(var_k + ε)`, so that
/// `conv(x, w') + b' = bn(conv(x, w))`. `w` is `[K, C, R, S]` (KCRS).
fn fold_bn(w: &[f64], bn: &BnHost) -> (Vec<f64>, Vec<f64>) {
    let k_count = bn.gamma.len();
    let per_filter = w.len() / k_count;
    let mut folded = Vec::with_capacity(w.len());
    let mut bias = Vec::with_capacity(k_count);
    for k in 0..k_count {
        let (scale, shift) = bn.affine(k);
        folded.extend(
            w[k * per_filter..(k + 1) * per_filter]
                .iter()
                .map(|v| v * scale),
        );
        bias.push(shift);
    }
    (folded, bias)
}

/// `conv(input, w)[n, k, i, j]` for a 3×3 cross-correlation with padding 1, where `input(c, p, q)`
/// gives the input of image `n` (zero outside the image is handled here).
fn conv3x3_at(
    shape: &Shape,
    w: &[f64],
    k: usize,
    i: usize,
    j: usize,
    mut input: impl FnMut(usize, usize, usize) -> f64,
) -> f64 {
    let mut acc = 0.0;
    for c in 0..shape.c {
        for r in 0..3 {
            let Some(p) = (i + r).checked_sub(1).filter(|&p| p < shape.h) else {
                continue;
            };
            for s in 0..3 {
                let Some(q) = (j + s).checked_sub(1).filter(|&q| q < shape.w) else {
                    continue;
                };
                acc += w[((k * shape.c + c) * 3 + r) * 3 + s] * input(c, p, q);
            }
        }
    }
    acc
}

impl HostNet {
    /// `relu(bn1(conv(x, w1)))[n, k, i, j]`: the conv-bn-relu block (and the residual block's
    /// first half).
    fn block_at(&self, n: usize, k: usize, i: usize, j: usize) -> f64 {
        let s = &self.shape;
        let t = conv3x3_at(s, &self.w1, k, i, j, |c, p, q| self.x[s.at(n, c, p, q)]);
        let (scale, shift) = self.bn1.affine(k);
        (scale * t + shift).max(0.0)
    }

    /// `relu(bn2(conv(block(x), w2)) + x)[n, k, i, j]`: the residual block.
    fn residual_at(&self, n: usize, k: usize, i: usize, j: usize) -> f64 {
        let s = &self.shape;
        let t = conv3x3_at(s, &self.w2, k, i, j, |c, p, q| self.block_at(n, c, p, q));
        let (scale, shift) = self.bn2.affine(k);
        (scale * t + shift + self.x[s.at(n, k, i, j)]).max(0.0)
    }
}

/// Output points checked against the CPU reference: the four corners of the first and last
/// image (where padding matters) and random points, as `(n, k, i, j)`.
fn sample_points(shape: &Shape, count: usize, seed: u64) -> Vec<[usize; 4]> {
    let (last_n, last_h, last_w) = (shape.n - 1, shape.h - 1, shape.w - 1);
    let mut points = vec![
        [0, 0, 0, 0],
        [0, shape.c - 1, 0, last_w],
        [last_n, 1, last_h, 0],
        [last_n, shape.c / 2, last_h, last_w],
    ];
    let mut rng = Rng::new(seed);
    let mut pick = |m: usize| (((rng.signed_unit() + 1.0) / 2.0 * m as f64) as usize).min(m - 1);
    while points.len() < count {
        points.push([pick(shape.n), pick(shape.c), pick(shape.h), pick(shape.w)]);
    }
    points
}

/// Largest `|got − want|` over the sampled points of a logical NCHW array (`want` holds the
/// reference value of each point), and the largest `|want|` (the scale the tolerance is
/// relative to).
fn sample_error(shape: &Shape, got: &[f64], points: &[[usize; 4]], want: &[f64]) -> (f64, f64) {
    points
        .iter()
        .zip(want)
        .fold((0.0f64, 0.0f64), |(err, scale), (&[n, k, i, j], &w)| {
            let g = got[shape.at(n, k, i, j)];
            // A NaN output must fail the check, so it becomes an infinite error.
            let e = if g.is_nan() {
                f64::INFINITY
            } else {
                (g - w).abs()
            };
            (err.max(e), scale.max(w.abs()))
        })
}

/// Largest absolute difference of two equally long arrays (NaN anywhere counts as infinite),
/// and the largest magnitude of `reference`.
fn max_abs_diff(a: &[f64], reference: &[f64]) -> (f64, f64) {
    a.iter()
        .zip(reference)
        .fold((0.0f64, 0.0f64), |(diff, scale), (&x, &r)| {
            let d = if x.is_nan() || r.is_nan() {
                f64::INFINITY
            } else {
                (x - r).abs()
            };
            (diff.max(d), scale.max(r.abs()))
        })
}

// ---------------------------------------------------------------------------------------------
// Device data
// ---------------------------------------------------------------------------------------------

/// Calls `f(logical index, memory offset)` for every element of a 4-D layout, in logical
/// (row-major) order.
fn for_each_offset(layout: &Layout, mut f: impl FnMut(usize, usize)) {
    let (d, s) = (layout.dims(), layout.strides());
    assert_eq!(d.len(), 4, "the blocks only use 4-D layouts");
    let mut i = 0;
    for a in 0..d[0] {
        for b in 0..d[1] {
            for c in 0..d[2] {
                for e in 0..d[3] {
                    f(i, (a * s[0] + b * s[1] + c * s[2] + e * s[3]) as usize);
                    i += 1;
                }
            }
        }
    }
}

/// Logical-order host values → a device buffer in `layout`'s memory order.
fn upload<T: DataType>(
    stream: &Arc<CudaStream>,
    layout: &Layout,
    logical: &[f64],
) -> Result<CudaSlice<T>> {
    let mut host = vec![T::default(); layout.span()];
    for_each_offset(layout, |i, off| host[off] = T::from_f64(logical[i]));
    stream.clone_htod(&host).map_err(drv("uploading inputs"))
}

/// A device buffer in `layout`'s memory order → logical-order f64 values.
fn download<T: DataType>(
    stream: &Arc<CudaStream>,
    layout: &Layout,
    buf: &CudaSlice<T>,
) -> Result<Vec<f64>> {
    let host = stream.clone_dtoh(buf).map_err(drv("downloading results"))?;
    let mut out = vec![0.0; layout.element_count()];
    for_each_offset(layout, |i, off| out[i] = host[off].to_f64());
    Ok(out)
}

/// Fills a device buffer with NaN, so that elements a call fails to write show in the checks.
fn poison<T: Element>(stream: &Arc<CudaStream>, buf: &mut CudaSlice<T>) -> Result<()> {
    let nan = vec![T::nan(); buf.len()];
    stream
        .memcpy_htod(&nan, buf)
        .map_err(drv("poisoning an output"))
}

fn upload_f32(stream: &Arc<CudaStream>, v: &[f64]) -> Result<CudaSlice<f32>> {
    let host: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    stream
        .clone_htod(&host)
        .map_err(drv("uploading batch-norm parameters"))
}

/// One batch-norm layer's parameters on the device (`[1, C, 1, 1]` f32, cuDNN's parameter
/// layout for f32 and f16 data).
struct BnDev {
    gamma: CudaSlice<f32>,
    beta: CudaSlice<f32>,
    mean: CudaSlice<f32>,
    var: CudaSlice<f32>,
}

impl BnDev {
    fn new(stream: &Arc<CudaStream>, bn: &BnHost) -> Result<BnDev> {
        Ok(BnDev {
            gamma: upload_f32(stream, &bn.gamma)?,
            beta: upload_f32(stream, &bn.beta)?,
            mean: upload_f32(stream, &bn.mean)?,
            var: upload_f32(stream, &bn.var)?,
        })
    }
}

/// Descriptors, weights (as given and folded) and batch-norm parameters of both blocks.
struct Net<T: NormType<Param = f32>> {
    /// Every activation and gradient: `[N, C, H, W]` in the mode's layout.
    act_d: TensorDesc<T>,
    w_d: FilterDesc<T>,
    /// The folded bias, `[1, C, 1, 1]`.
    bias_d: TensorDesc<T>,
    conv: ConvDesc,
    bn_infer: BatchNorm<T>,
    bn_train: BatchNorm<T>,
    relu: ActivationDesc,
    x: CudaSlice<T>,
    w1: CudaSlice<T>,
    w2: CudaSlice<T>,
    w1f: CudaSlice<T>,
    w2f: CudaSlice<T>,
    b1f: CudaSlice<T>,
    b2f: CudaSlice<T>,
    bn1: BnDev,
    bn2: BnDev,
}

fn batch_norm<T: NormType>(mode: BatchNormMode, layout: &Layout) -> Result<BatchNorm<T>> {
    BatchNorm::builder()
        .mode(mode)
        .epsilon(EPS)
        .build::<T>(layout)
}

impl<T: Element + NormType<Param = f32>> Net<T> {
    fn new(stream: &Arc<CudaStream>, mode: Mode, host: &HostNet) -> Result<Net<T>> {
        let [n, c, h, w] = host.shape.dims();
        let format = mode.format();
        let act_d = match format {
            TensorFormat::Nhwc => TensorDesc::<T>::nhwc(n, c, h, w)?,
            _ => TensorDesc::<T>::nchw(n, c, h, w)?,
        };
        let w_d = FilterDesc::<T>::new(&[c, c, 3, 3], format)?;
        let bias_d = TensorDesc::<T>::nchw(1, c, 1, 1)?;
        let conv = ConvDesc::builder(2)
            .pads(&[1, 1])
            .math(mode.math())
            .build::<T>()?;
        // PyTorch's choice: persistent kernels for channels-last training, plain spatial
        // otherwise (the persistent NCHW kernels may overflow on large inputs).
        let train_mode = match format {
            TensorFormat::Nhwc => BatchNormMode::SpatialPersistent,
            _ => BatchNormMode::Spatial,
        };
        let bn_infer = batch_norm::<T>(BatchNormMode::Spatial, act_d.layout())?;
        let bn_train = batch_norm::<T>(train_mode, act_d.layout())?;
        let (w1f, b1f) = fold_bn(&host.w1, &host.bn1);
        let (w2f, b2f) = fold_bn(&host.w2, &host.bn2);
        Ok(Net {
            x: upload(stream, act_d.layout(), &host.x)?,
            w1: upload(stream, w_d.layout(), &host.w1)?,
            w2: upload(stream, w_d.layout(), &host.w2)?,
            w1f: upload(stream, w_d.layout(), &w1f)?,
            w2f: upload(stream, w_d.layout(), &w2f)?,
            b1f: upload(stream, bias_d.layout(), &b1f)?,
            b2f: upload(stream, bias_d.layout(), &b2f)?,
            bn1: BnDev::new(stream, &host.bn1)?,
            bn2: BnDev::new(stream, &host.bn2)?,
            relu: ActivationDesc::new(ActivationMode::Relu)?,
            act_d,
            w_d,
            bias_d,
            conv,
            bn_infer,
            bn_train,
        })
    }
}

/// Intermediate activations, outputs and gradients (named after the forward pass:
/// `t = conv`, `u = bn(t)`, `h = relu(u1)`, `y = relu(u2 + x)`; `d*` their gradients).
struct Bufs<T: DataType> {
    t1: CudaSlice<T>,
    u1: CudaSlice<T>,
    h: CudaSlice<T>,
    t2: CudaSlice<T>,
    u2: CudaSlice<T>,
    y: CudaSlice<T>,
    /// Fused outputs: the block's (the residual's intermediate) and the residual block's.
    hf: CudaSlice<T>,
    yf: CudaSlice<T>,
    /// The incoming gradient of the training step (random).
    dy: CudaSlice<T>,
    ds: CudaSlice<T>,
    dt2: CudaSlice<T>,
    dh: CudaSlice<T>,
    du1: CudaSlice<T>,
    dt1: CudaSlice<T>,
    dx: CudaSlice<T>,
    dw1: CudaSlice<T>,
    dw2: CudaSlice<T>,
    dgamma1: CudaSlice<f32>,
    dbeta1: CudaSlice<f32>,
    dgamma2: CudaSlice<f32>,
    dbeta2: CudaSlice<f32>,
    /// Running statistics the training forward updates (copies: inference keeps its own).
    run_mean1: CudaSlice<f32>,
    run_var1: CudaSlice<f32>,
    run_mean2: CudaSlice<f32>,
    run_var2: CudaSlice<f32>,
}

impl<T: Element + NormType<Param = f32>> Bufs<T> {
    fn new(stream: &Arc<CudaStream>, net: &Net<T>, host: &HostNet, seed: u64) -> Result<Self> {
        let act = net.act_d.span();
        let filt = net.w_d.span();
        let c = host.shape.c;
        let zeros = |n: usize| {
            stream
                .alloc_zeros::<T>(n)
                .map_err(drv("allocating activations"))
        };
        let params = |n: usize| {
            stream
                .alloc_zeros::<f32>(n)
                .map_err(drv("allocating parameter gradients"))
        };
        let dy = Rng::new(seed).values::<T>(act);
        Ok(Bufs {
            t1: zeros(act)?,
            u1: zeros(act)?,
            h: zeros(act)?,
            t2: zeros(act)?,
            u2: zeros(act)?,
            y: zeros(act)?,
            hf: zeros(act)?,
            yf: zeros(act)?,
            dy: stream.clone_htod(&dy).map_err(drv("uploading dy"))?,
            ds: zeros(act)?,
            dt2: zeros(act)?,
            dh: zeros(act)?,
            du1: zeros(act)?,
            dt1: zeros(act)?,
            dx: zeros(act)?,
            dw1: zeros(filt)?,
            dw2: zeros(filt)?,
            dgamma1: params(c)?,
            dbeta1: params(c)?,
            dgamma2: params(c)?,
            dbeta2: params(c)?,
            run_mean1: upload_f32(stream, &host.bn1.mean)?,
            run_var1: upload_f32(stream, &host.bn1.var)?,
            run_mean2: upload_f32(stream, &host.bn2.mean)?,
            run_var2: upload_f32(stream, &host.bn2.var)?,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The passes
// ---------------------------------------------------------------------------------------------

/// Algorithms of the unfused passes (the fastest `cudnnFind*` measured) and of the fused calls
/// (the fastest this program timed).
#[derive(Debug, Clone, Copy)]
struct Algos {
    fwd: ConvFwdAlgo,
    bwd_data: ConvBwdDataAlgo,
    bwd_filter: ConvBwdFilterAlgo,
}

/// The fastest supported entry of a `cudnnFind*` result.
fn fastest<A: ConvAlgorithm>(
    op: &'static str,
    perf: &[cudnn_safe::conv::AlgoPerf<A>],
) -> Result<A> {
    perf.iter()
        .filter(|p| p.is_supported())
        .min_by(|a, b| a.time_ms.total_cmp(&b.time_ms))
        .map(|p| p.algo)
        .ok_or_else(|| Error::NoAlgorithm {
            op,
            detail: format!(
                "cudnnFind reported no supported algorithm ({} tried)",
                perf.len()
            ),
        })
}

impl<T: Element + NormType<Param = f32>> Net<T> {
    /// Benchmarks every algorithm of the three convolution directions (all convolutions here
    /// have the same shapes) on scratch outputs.
    fn find_algos(&self, cudnn: &Cudnn, ws: &mut Workspace, b: &mut Bufs<T>) -> Result<Algos> {
        let (a, w) = (&self.act_d, &self.w_d);
        let fwd = cudnn.conv_forward_find(a, &self.x, w, &self.w1, &self.conv, a, &mut b.t1, ws)?;
        let data =
            cudnn.conv_backward_data_find(w, &self.w1, a, &b.dy, &self.conv, a, &mut b.dx, ws)?;
        let filter =
            cudnn.conv_backward_filter_find(a, &self.x, a, &b.dy, &self.conv, w, &mut b.dw1, ws)?;
        Ok(Algos {
            fwd: fastest("convolution forward", &fwd)?,
            bwd_data: fastest("convolution backward data", &data)?,
            bwd_filter: fastest("convolution backward filter", &filter)?,
        })
    }

    /// `out = relu(bn(conv(input, w)))` with inference statistics; `t` and `u` are scratch.
    #[allow(clippy::too_many_arguments)] // the buffers of one layer
    fn conv_bn_relu(
        &self,
        cudnn: &Cudnn,
        algo: ConvFwdAlgo,
        ws: &mut Workspace,
        input: &CudaSlice<T>,
        w: &CudaSlice<T>,
        bn: &BnDev,
        t: &mut CudaSlice<T>,
        u: &mut CudaSlice<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<()> {
        let a = &self.act_d;
        cudnn.conv_forward(1.0, a, input, &self.w_d, w, &self.conv, algo, ws, 0.0, a, t)?;
        cudnn.batch_norm_forward_inference(
            &self.bn_infer,
            1.0,
            0.0,
            t,
            u,
            &bn.gamma,
            &bn.beta,
            &bn.mean,
            &bn.var,
        )?;
        cudnn.activation_forward(&self.relu, 1.0, a, u, 0.0, a, out)
    }

    /// Inference, unfused: `h = relu(bn1(conv(x, w1)))`.
    fn block_unfused(
        &self,
        cudnn: &Cudnn,
        algos: &Algos,
        ws: &mut Workspace,
        b: &mut Bufs<T>,
    ) -> Result<()> {
        self.conv_bn_relu(
            cudnn, algos.fwd, ws, &self.x, &self.w1, &self.bn1, &mut b.t1, &mut b.u1, &mut b.h,
        )
    }

    /// Inference, unfused: `y = relu(bn2(conv(h, w2)) + x)` after [`Self::block_unfused`].
    fn residual_unfused(
        &self,
        cudnn: &Cudnn,
        algos: &Algos,
        ws: &mut Workspace,
        b: &mut Bufs<T>,
    ) -> Result<()> {
        self.block_unfused(cudnn, algos, ws, b)?;
        let a = &self.act_d;
        cudnn.conv_forward(
            1.0, a, &b.h, &self.w_d, &self.w2, &self.conv, algos.fwd, ws, 0.0, a, &mut b.t2,
        )?;
        cudnn.batch_norm_forward_inference(
            &self.bn_infer,
            1.0,
            0.0,
            &b.t2,
            &mut b.u2,
            &self.bn2.gamma,
            &self.bn2.beta,
            &self.bn2.mean,
            &self.bn2.var,
        )?;
        cudnn.add_tensor(1.0, a, &self.x, 1.0, a, &mut b.u2)?;
        cudnn.activation_forward(&self.relu, 1.0, a, &b.u2, 0.0, a, &mut b.y)
    }

    /// Inference, fused: `hf = relu(conv(x, w1') + b1')`, one cuDNN call.
    fn block_fused(
        &self,
        cudnn: &Cudnn,
        algo: ConvFwdAlgo,
        ws: &mut Workspace,
        b: &mut Bufs<T>,
    ) -> Result<()> {
        let a = &self.act_d;
        cudnn.conv_bias_activation_forward(
            1.0,
            a,
            &self.x,
            &self.w_d,
            &self.w1f,
            &self.conv,
            algo,
            ws,
            0.0,
            None,
            &self.bias_d,
            &self.b1f,
            FusedActivation::Relu,
            a,
            &mut b.hf,
        )
    }

    /// The residual block's second fused call: `yf = relu(conv(hf, w2') + 1·x + b2')`, the
    /// skip entering as cuDNN's `z`.
    fn residual_second_fused(
        &self,
        cudnn: &Cudnn,
        algo: ConvFwdAlgo,
        ws: &mut Workspace,
        b: &mut Bufs<T>,
    ) -> Result<()> {
        let a = &self.act_d;
        cudnn.conv_bias_activation_forward(
            1.0,
            a,
            &b.hf,
            &self.w_d,
            &self.w2f,
            &self.conv,
            algo,
            ws,
            1.0,
            Some(self.x.as_view()),
            &self.bias_d,
            &self.b2f,
            FusedActivation::Relu,
            a,
            &mut b.yf,
        )
    }

    /// One training step of the conv-bn-relu block: forward with batch statistics (updating
    /// the running ones), then the gradients of x, w1, γ1 and β1 for the incoming `dy`.
    fn train_block(
        &self,
        cudnn: &Cudnn,
        algos: &Algos,
        ws: &mut Workspace,
        b: &mut Bufs<T>,
    ) -> Result<()> {
        let (a, w_d, conv) = (&self.act_d, &self.w_d, &self.conv);
        cudnn.conv_forward(
            1.0, a, &self.x, w_d, &self.w1, conv, algos.fwd, ws, 0.0, a, &mut b.t1,
        )?;
        let saved = cudnn.batch_norm_forward_training(
            &self.bn_train,
            1.0,
            0.0,
            &b.t1,
            &mut b.u1,
            &self.bn1.gamma,
            &self.bn1.beta,
            Some(RunningStats::new(
                &mut b.run_mean1,
                &mut b.run_var1,
                MOMENTUM,
            )),
        )?;
        cudnn.activation_forward(&self.relu, 1.0, a, &b.u1, 0.0, a, &mut b.h)?;

        cudnn.activation_backward(
            &self.relu, 1.0, a, &b.h, a, &b.dy, a, &b.u1, 0.0, a, &mut b.du1,
        )?;
        cudnn.batch_norm_backward(
            &self.bn_train,
            &saved,
            1.0,
            0.0,
            1.0,
            0.0,
            &b.t1,
            &b.du1,
            &mut b.dt1,
            &self.bn1.gamma,
            &mut b.dgamma1,
            &mut b.dbeta1,
        )?;
        let (bd, bf) = (algos.bwd_data, algos.bwd_filter);
        cudnn.conv_backward_data(
            1.0, w_d, &self.w1, a, &b.dt1, conv, bd, ws, 0.0, a, &mut b.dx,
        )?;
        cudnn.conv_backward_filter(
            1.0, a, &self.x, a, &b.dt1, conv, bf, ws, 0.0, w_d, &mut b.dw1,
        )
    }

    /// One training step of the residual block: forward through both layers and the skip,
    /// backward through both, the skip's gradient added to the input gradient.
    fn train_residual(
        &self,
        cudnn: &Cudnn,
        algos: &Algos,
        ws: &mut Workspace,
        b: &mut Bufs<T>,
    ) -> Result<()> {
        let (a, w_d, conv) = (&self.act_d, &self.w_d, &self.conv);
        let (fwd, bd, bf) = (algos.fwd, algos.bwd_data, algos.bwd_filter);
        cudnn.conv_forward(
            1.0, a, &self.x, w_d, &self.w1, conv, fwd, ws, 0.0, a, &mut b.t1,
        )?;
        let saved1 = cudnn.batch_norm_forward_training(
            &self.bn_train,
            1.0,
            0.0,
            &b.t1,
            &mut b.u1,
            &self.bn1.gamma,
            &self.bn1.beta,
            Some(RunningStats::new(
                &mut b.run_mean1,
                &mut b.run_var1,
                MOMENTUM,
            )),
        )?;
        cudnn.activation_forward(&self.relu, 1.0, a, &b.u1, 0.0, a, &mut b.h)?;
        cudnn.conv_forward(
            1.0, a, &b.h, w_d, &self.w2, conv, fwd, ws, 0.0, a, &mut b.t2,
        )?;
        let saved2 = cudnn.batch_norm_forward_training(
            &self.bn_train,
            1.0,
            0.0,
            &b.t2,
            &mut b.u2,
            &self.bn2.gamma,
            &self.bn2.beta,
            Some(RunningStats::new(
                &mut b.run_mean2,
                &mut b.run_var2,
                MOMENTUM,
            )),
        )?;
        cudnn.add_tensor(1.0, a, &self.x, 1.0, a, &mut b.u2)?;
        cudnn.activation_forward(&self.relu, 1.0, a, &b.u2, 0.0, a, &mut b.y)?;

        // ds = dL/d(bn2 + x): flows into bn2 and, unchanged, into the skip.
        cudnn.activation_backward(
            &self.relu, 1.0, a, &b.y, a, &b.dy, a, &b.u2, 0.0, a, &mut b.ds,
        )?;
        cudnn.batch_norm_backward(
            &self.bn_train,
            &saved2,
            1.0,
            0.0,
            1.0,
            0.0,
            &b.t2,
            &b.ds,
            &mut b.dt2,
            &self.bn2.gamma,
            &mut b.dgamma2,
            &mut b.dbeta2,
        )?;
        cudnn.conv_backward_data(
            1.0, w_d, &self.w2, a, &b.dt2, conv, bd, ws, 0.0, a, &mut b.dh,
        )?;
        cudnn.conv_backward_filter(1.0, a, &b.h, a, &b.dt2, conv, bf, ws, 0.0, w_d, &mut b.dw2)?;
        cudnn.activation_backward(
            &self.relu, 1.0, a, &b.h, a, &b.dh, a, &b.u1, 0.0, a, &mut b.du1,
        )?;
        cudnn.batch_norm_backward(
            &self.bn_train,
            &saved1,
            1.0,
            0.0,
            1.0,
            0.0,
            &b.t1,
            &b.du1,
            &mut b.dt1,
            &self.bn1.gamma,
            &mut b.dgamma1,
            &mut b.dbeta1,
        )?;
        cudnn.conv_backward_data(
            1.0, w_d, &self.w1, a, &b.dt1, conv, bd, ws, 0.0, a, &mut b.dx,
        )?;
        cudnn.conv_backward_filter(
            1.0, a, &self.x, a, &b.dt1, conv, bf, ws, 0.0, w_d, &mut b.dw1,
        )?;
        cudnn.add_tensor(1.0, a, &b.ds, 1.0, a, &mut b.dx)
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring one mode
// ---------------------------------------------------------------------------------------------

/// Which block a row is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    ConvBnRelu,
    Residual,
}

impl Block {
    fn name(self) -> &'static str {
        match self {
            Block::ConvBnRelu => "conv-bn-relu",
            Block::Residual => "residual",
        }
    }
}

/// Inference (unfused vs fused) or a training step (unfused only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Inference,
    Training,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Inference => "inference",
            Phase::Training => "train-fwd-bwd",
        }
    }
}

/// One line of the results.
#[derive(Debug, Clone)]
struct Row {
    mode: Mode,
    block: Block,
    phase: Phase,
    unfused_ms: f64,
    fused_ms: Option<f64>,
    /// Fused against unfused output: the largest absolute difference and the largest magnitude
    /// of the unfused output (the tolerance is relative to it).
    diff: Option<(f64, f64)>,
    /// Inference: largest error of either output against the f64 CPU reference on the sampled
    /// points; training: largest error of the shift gradient `dβ` against the sum of the
    /// gradient reaching batch norm. Both relative to the reference's largest magnitude.
    ref_err: f64,
    /// Relative tolerance of the mode.
    tol: f64,
    ok: bool,
    /// Algorithms used (and the batch-norm mode of training).
    algos: String,
    /// Why the row failed its checks (empty when it passed).
    problem: String,
}

impl Row {
    fn speedup(&self) -> Option<f64> {
        self.fused_ms.map(|f| self.unfused_ms / f)
    }
}

/// Times `run` with every forward algorithm cuDNN accepts for the fused call; the fastest and
/// its time per call. Each accepted algorithm is timed in two rounds and keeps its better time:
/// a single round let the first timed kernel of a mode read 50 % slow on the H200 (lazy
/// loading and clock ramp-up), enough to flip the fused-vs-unfused comparison.
fn pick_fused(
    timer: &Timer,
    what: &str,
    run: &mut dyn FnMut(ConvFwdAlgo) -> Result<()>,
) -> Result<(ConvFwdAlgo, f64)> {
    let mut accepted: Vec<(ConvFwdAlgo, f64)> = Vec::new();
    let mut refused = Vec::new();
    for &algo in ConvFwdAlgo::ALL {
        match run(algo).and_then(|()| timer.per_call_ms(&mut || run(algo))) {
            Ok(ms) => accepted.push((algo, ms)),
            Err(e) => {
                let why = common::refusal(&e);
                eprintln!("    {what} with {algo}: refused ({why})");
                refused.push(format!("{algo}: {why}"));
            }
        }
    }
    let mut best: Option<(ConvFwdAlgo, f64)> = None;
    for (algo, first) in accepted {
        let ms = first.min(timer.per_call_ms(&mut || run(algo))?);
        eprintln!("    {what} with {algo}: {ms:.4} ms");
        if !matches!(best, Some((_, b)) if b <= ms) {
            best = Some((algo, ms));
        }
    }
    best.ok_or_else(|| Error::NoAlgorithm {
        op: "fused convolution",
        detail: refused.join("; "),
    })
}

/// The checks of an inference row: fused against unfused, both against the CPU reference.
#[allow(clippy::too_many_arguments)] // one row's measurements
fn inference_row(
    mode: Mode,
    block: Block,
    (unfused_ms, fused_ms): (f64, f64),
    shape: &Shape,
    unfused: &[f64],
    fused: &[f64],
    points: &[[usize; 4]],
    want: &[f64],
    algos: String,
) -> Row {
    let tol = mode.tolerance();
    let (diff, scale) = max_abs_diff(fused, unfused);
    let (e_unfused, ref_scale) = sample_error(shape, unfused, points, want);
    let (e_fused, _) = sample_error(shape, fused, points, want);
    let ref_err = e_unfused.max(e_fused) / ref_scale.max(f64::MIN_POSITIVE);
    let mut problems = Vec::new();
    if !within(diff, tol * scale) {
        problems.push(format!(
            "fused differs from unfused by {diff:.3e} > {tol:.0e} x {scale:.3}"
        ));
    }
    if !within(ref_err, tol) {
        problems.push(format!(
            "CPU reference error {ref_err:.3e} > {tol:.0e} (unfused {e_unfused:.3e}, fused \
             {e_fused:.3e})"
        ));
    }
    Row {
        mode,
        block,
        phase: Phase::Inference,
        unfused_ms,
        fused_ms: Some(fused_ms),
        diff: Some((diff, scale)),
        ref_err,
        tol,
        ok: problems.is_empty(),
        algos,
        problem: problems.join("; "),
    }
}

/// Largest `|dβ_k − Σ du_k|` relative to the largest `Σ |du_k|`: batch norm's shift gradient is
/// the per-channel sum of the gradient reaching it. `du` is logical NCHW.
fn dbeta_error(shape: &Shape, du: &[f64], dbeta: &[f32]) -> f64 {
    let mut err = 0.0f64;
    let mut scale = 0.0f64;
    for (k, &db) in dbeta.iter().enumerate() {
        let (mut sum, mut abs) = (0.0, 0.0);
        for n in 0..shape.n {
            let start = shape.at(n, k, 0, 0);
            for &v in &du[start..start + shape.h * shape.w] {
                sum += v;
                abs += v.abs();
            }
        }
        let e = if db.is_nan() {
            f64::INFINITY
        } else {
            (f64::from(db) - sum).abs()
        };
        err = err.max(e);
        scale = scale.max(abs);
    }
    err / scale.max(f64::MIN_POSITIVE)
}

/// `value <= limit`, false when `value` is NaN (a NaN result must fail its check).
fn within(value: f64, limit: f64) -> bool {
    value <= limit
}

/// Whether every value is finite and at least one is not zero (a gradient that was written).
fn finite_nonzero(v: &[f64]) -> bool {
    v.iter().all(|x| x.is_finite()) && v.iter().any(|&x| x != 0.0)
}

/// The checks of a training row: the input and weight gradients are finite and written, and
/// `dβ` matches the sum of the gradient reaching batch norm.
#[allow(clippy::too_many_arguments)] // one row's measurements
fn training_row(
    mode: Mode,
    block: Block,
    ms: f64,
    shape: &Shape,
    grads: &[(&str, &[f64])],
    du: &[f64],
    dbeta: &[f32],
    algos: String,
) -> Row {
    let tol = mode.tolerance();
    let ref_err = dbeta_error(shape, du, dbeta);
    let mut problems: Vec<String> = grads
        .iter()
        .filter(|(_, g)| !finite_nonzero(g))
        .map(|(name, _)| format!("{name} is not finite or all zero"))
        .collect();
    if !within(ref_err, tol) {
        problems.push(format!("dbeta error {ref_err:.3e} > {tol:.0e}"));
    }
    Row {
        mode,
        block,
        phase: Phase::Training,
        unfused_ms: ms,
        fused_ms: None,
        diff: None,
        ref_err,
        tol,
        ok: problems.is_empty(),
        algos,
        problem: problems.join("; "),
    }
}

/// Measures one training step of `block`: poisons the gradients it checks, runs `step` once,
/// downloads them (`dx`, `dw1`, and `dw2` for the residual block, with the gradient reaching
/// the last batch norm and its `dβ`), times `step` and builds the row.
fn training_step<T: Element>(
    (stream, timer): (&Arc<CudaStream>, &Timer),
    mode: Mode,
    block: Block,
    (shape, act, filt): (&Shape, &Layout, &Layout),
    b: &mut Bufs<T>,
    step: &mut dyn FnMut(&mut Bufs<T>) -> Result<()>,
    algos: String,
) -> Result<Row> {
    let residual = block == Block::Residual;
    poison(stream, &mut b.dx)?;
    poison(stream, &mut b.dw1)?;
    if residual {
        poison(stream, &mut b.dw2)?;
    }
    step(b)?;
    let mut grads = vec![
        ("dx", download(stream, act, &b.dx)?),
        ("dw1", download(stream, filt, &b.dw1)?),
    ];
    if residual {
        grads.push(("dw2", download(stream, filt, &b.dw2)?));
    }
    let (du, dbeta) = if residual {
        (&b.ds, &b.dbeta2)
    } else {
        (&b.du1, &b.dbeta1)
    };
    let du = download(stream, act, du)?;
    let dbeta = stream.clone_dtoh(dbeta).map_err(drv("downloading dbeta"))?;
    let ms = timer.per_call_ms(&mut || step(b))?;
    let grads: Vec<(&str, &[f64])> = grads.iter().map(|(n, g)| (*n, g.as_slice())).collect();
    Ok(training_row(
        mode, block, ms, shape, &grads, &du, &dbeta, algos,
    ))
}

/// Sets up one mode, runs and checks every pass, and returns its four rows.
fn run_mode<T: Element + NormType<Param = f32>>(
    cudnn: &Cudnn,
    stream: &Arc<CudaStream>,
    mode: Mode,
    shape: Shape,
) -> Result<Vec<Row>> {
    let name = mode.name();
    let host = HostNet::random::<T>(shape, 0x5EED_C0B1);
    let mut net = Net::<T>::new(stream, mode, &host)?;
    let mut b = Bufs::new(stream, &net, &host, 0xD0D0)?;
    let mut ws = Workspace::new(stream.clone()).with_limit(WORKSPACE_LIMIT);
    let timer = Timer::new(stream)?;
    let act = net.act_d.layout().clone();
    let filt = net.w_d.layout().clone();
    let points = sample_points(&shape, SAMPLES, 0x5A3);
    let mut rows = Vec::new();

    eprintln!("[{name}] benchmarking the convolution algorithms (cudnnFind*)");
    let algos = net.find_algos(cudnn, &mut ws, &mut b)?;
    eprintln!(
        "[{name}] fastest: forward {}, backward data {}, backward filter {}",
        algos.fwd, algos.bwd_data, algos.bwd_filter
    );

    // conv-bn-relu, inference.
    eprintln!("[{name}] conv-bn-relu inference, unfused");
    poison(stream, &mut b.h)?;
    net.block_unfused(cudnn, &algos, &mut ws, &mut b)?;
    let unfused = download(stream, &act, &b.h)?;
    let unfused_ms =
        timer.per_call_ms(&mut || net.block_unfused(cudnn, &algos, &mut ws, &mut b))?;
    eprintln!("[{name}] conv-bn-relu inference, fused: every forward algorithm");
    let (fused1, fused_ms) = pick_fused(&timer, "fused conv+bias+relu", &mut |algo| {
        net.block_fused(cudnn, algo, &mut ws, &mut b)
    })?;
    poison(stream, &mut b.hf)?;
    net.block_fused(cudnn, fused1, &mut ws, &mut b)?;
    let fused = download(stream, &act, &b.hf)?;
    eprintln!("[{name}] conv-bn-relu inference: CPU reference");
    let want: Vec<f64> = points
        .iter()
        .map(|&[n, k, i, j]| host.block_at(n, k, i, j))
        .collect();
    rows.push(inference_row(
        mode,
        Block::ConvBnRelu,
        (unfused_ms, fused_ms),
        &shape,
        &unfused,
        &fused,
        &points,
        &want,
        format!("conv {}; fused {fused1}", algos.fwd),
    ));

    // Residual block, inference.
    eprintln!("[{name}] residual inference, unfused");
    poison(stream, &mut b.y)?;
    net.residual_unfused(cudnn, &algos, &mut ws, &mut b)?;
    let unfused = download(stream, &act, &b.y)?;
    let unfused_ms =
        timer.per_call_ms(&mut || net.residual_unfused(cudnn, &algos, &mut ws, &mut b))?;
    eprintln!("[{name}] residual inference, fused second convolution (z = skip): every algorithm");
    let (fused2, _) = pick_fused(&timer, "fused conv+z+bias+relu", &mut |algo| {
        net.residual_second_fused(cudnn, algo, &mut ws, &mut b)
    })?;
    let residual_fused = |ws: &mut Workspace, b: &mut Bufs<T>| {
        net.block_fused(cudnn, fused1, ws, b)?;
        net.residual_second_fused(cudnn, fused2, ws, b)
    };
    poison(stream, &mut b.hf)?;
    poison(stream, &mut b.yf)?;
    residual_fused(&mut ws, &mut b)?;
    let fused = download(stream, &act, &b.yf)?;
    let fused_ms = timer.per_call_ms(&mut || residual_fused(&mut ws, &mut b))?;
    eprintln!("[{name}] residual inference: CPU reference");
    let want: Vec<f64> = points
        .iter()
        .map(|&[n, k, i, j]| host.residual_at(n, k, i, j))
        .collect();
    rows.push(inference_row(
        mode,
        Block::Residual,
        (unfused_ms, fused_ms),
        &shape,
        &unfused,
        &fused,
        &points,
        &want,
        format!("conv {}; fused {fused1} + {fused2}", algos.fwd),
    ));

    // Training steps. The first one also decides the batch-norm mode.
    eprintln!("[{name}] conv-bn-relu training step");
    if let Err(e) = net.train_block(cudnn, &algos, &mut ws, &mut b) {
        if net.bn_train.mode() != BatchNormMode::SpatialPersistent {
            return Err(e);
        }
        eprintln!(
            "[{name}] persistent batch norm refused ({}); using the spatial mode",
            common::refusal(&e)
        );
        net.bn_train = batch_norm::<T>(BatchNormMode::Spatial, &act)?;
    }
    let train_algos = format!(
        "fwd {}; bwd-data {}; bwd-filter {}; bn {:?}",
        algos.fwd,
        algos.bwd_data,
        algos.bwd_filter,
        net.bn_train.mode()
    );
    let dims = (&shape, &act, &filt);
    rows.push(training_step(
        (stream, &timer),
        mode,
        Block::ConvBnRelu,
        dims,
        &mut b,
        &mut |b| net.train_block(cudnn, &algos, &mut ws, b),
        train_algos.clone(),
    )?);

    eprintln!("[{name}] residual training step");
    rows.push(training_step(
        (stream, &timer),
        mode,
        Block::Residual,
        dims,
        &mut b,
        &mut |b| net.train_residual(cudnn, &algos, &mut ws, b),
        train_algos,
    )?);
    for r in &rows {
        if !r.ok {
            eprintln!(
                "[{name}] {} {}: CHECK FAILED: {}",
                r.block.name(),
                r.phase.name(),
                r.problem
            );
        }
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------------------------
// Output: table, TSV, SVG
// ---------------------------------------------------------------------------------------------

fn fmt_opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

fn print_table(rows: &[Row]) {
    if rows.is_empty() {
        return;
    }
    println!(
        "\n{:<10} {:<13} {:<14} {:>10} {:>9} {:>8} {:>10} {:>10} {:>9}  check",
        "mode",
        "block",
        "phase",
        "unfused ms",
        "fused ms",
        "speedup",
        "max|diff|",
        "limit",
        "ref err"
    );
    for r in rows {
        println!(
            "{:<10} {:<13} {:<14} {:>10.4} {:>9} {:>8} {:>10} {:>10} {:>9.2e}  {}",
            r.mode.name(),
            r.block.name(),
            r.phase.name(),
            r.unfused_ms,
            fmt_opt(r.fused_ms, |v| format!("{v:.4}")),
            fmt_opt(r.speedup(), |v| format!("{v:.2}x")),
            fmt_opt(r.diff.map(|d| d.0), |v| format!("{v:.2e}")),
            fmt_opt(r.diff.map(|(_, s)| s * r.tol), |v| format!("{v:.2e}")),
            r.ref_err,
            if r.ok { "ok" } else { "FAILED" },
        );
    }
    println!(
        "\nlimit = tolerance x largest |unfused output| (tolerance: fp32 1e-3, tf32 1e-2, fp16 \
         2e-2); ref err: inference outputs against the f64 CPU reference on {SAMPLES} points, \
         training dbeta against the sum of the gradient reaching batch norm (relative)."
    );
    for r in rows {
        println!(
            "{} {} {}: {}",
            r.mode.name(),
            r.block.name(),
            r.phase.name(),
            r.algos
        );
    }
}

/// The conv-bn-relu inference times as JSON lines named like `benches/pytorch/nn_ops.py`'s
/// (`conv_bn_relu_infer_*` unfused, `conv_bn_relu_folded_*` fused), for side-by-side reading.
/// PyTorch's float32 convolutions use TF32 by default, so its float32 lines compare with the
/// `tf32` mode; the strict `fp32` mode is printed under the same names with `"mode": "fp32"`.
fn pytorch_lines(rows: &[Row], shape: &Shape) -> Vec<String> {
    let mut lines = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.block == Block::ConvBnRelu && r.phase == Phase::Inference)
    {
        let dtype = if r.mode == Mode::Fp16 {
            "float16"
        } else {
            "float32"
        };
        let dims = format!("{}x{}x{}x{}", shape.n, shape.c, shape.h, shape.w);
        for (kind, ms) in [("infer", Some(r.unfused_ms)), ("folded", r.fused_ms)] {
            if let Some(ms) = ms {
                lines.push(format!(
                    "{{\"op\": \"conv_bn_relu_{kind}_{dtype}_{dims}\", \"ms\": {ms:.5}, \
                     \"impl\": \"cudnn-safe\", \"mode\": \"{}\"}}",
                    r.mode.key()
                ));
            }
        }
    }
    lines
}

type WriteResult<T = ()> = std::result::Result<T, Box<dyn StdError>>;

/// Writes the TSV and the SVG into the output directory; their paths.
fn write_outputs(rows: &[Row], modes: &[Mode]) -> WriteResult<Vec<String>> {
    let dir = common::out_dir()?;
    let tsv = dir.join("conv_bn_relu.tsv");
    let svg = dir.join("conv_bn_relu.svg");
    write_tsv(&tsv, rows)?;
    write_svg(&svg, rows, modes)?;
    Ok(vec![tsv.display().to_string(), svg.display().to_string()])
}

fn write_tsv(path: &Path, rows: &[Row]) -> WriteResult {
    let mut out = String::from(
        "mode\tblock\tphase\tunfused_ms\tfused_ms\tspeedup\tmax_abs_diff\ttolerance\tref_err\tok\talgos\n",
    );
    let opt = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.6e}"));
    for r in rows {
        out.push_str(&format!(
            "{}\t{}\t{}\t{:.6}\t{}\t{}\t{}\t{:.0e}\t{:.6e}\t{}\t{}\n",
            r.mode.key(),
            r.block.name(),
            r.phase.name(),
            r.unfused_ms,
            r.fused_ms.map_or_else(String::new, |v| format!("{v:.6}")),
            r.speedup().map_or_else(String::new, |v| format!("{v:.4}")),
            opt(r.diff.map(|d| d.0)),
            r.tol,
            r.ref_err,
            if r.ok { 1 } else { 0 },
            r.algos.replace(['\t', '\n'], " "),
        ));
    }
    std::fs::write(path, out)?;
    Ok(())
}

/// The bar groups of each panel, in order.
const GROUPS: [(Block, Phase); 4] = [
    (Block::ConvBnRelu, Phase::Inference),
    (Block::Residual, Phase::Inference),
    (Block::ConvBnRelu, Phase::Training),
    (Block::Residual, Phase::Training),
];

/// One panel per mode: per block and phase, a bar for the unfused time and (inference) one for
/// the fused time, labelled with ms and the speedup.
fn write_svg(path: &Path, rows: &[Row], modes: &[Mode]) -> WriteResult {
    use plotters::prelude::*;

    const PANEL: (u32, u32) = (820, 400);
    let unfused_color = RGBColor(31, 119, 180);
    let fused_color = RGBColor(255, 127, 14);
    let cols = modes.len().clamp(1, 2);
    let rows_n = modes.len().div_ceil(2).max(1);
    let root = SVGBackend::new(path, (PANEL.0 * cols as u32, PANEL.1 * rows_n as u32 + 40))
        .into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "Conv+BN+ReLU and residual block: unfused vs fused (ms per call, CUDA events, median)",
        ("sans-serif", 20),
    )?;
    for (panel, &mode) in root.split_evenly((rows_n, cols)).iter().zip(modes) {
        let bars: Vec<(usize, &Row)> = GROUPS
            .iter()
            .enumerate()
            .filter_map(|(x, &(block, phase))| {
                rows.iter()
                    .find(|r| r.mode == mode && r.block == block && r.phase == phase)
                    .map(|r| (x, r))
            })
            .collect();
        if bars.is_empty() {
            panel.draw(&Text::new(
                format!("{}: no data", mode.name()),
                (40, 40),
                ("sans-serif", 18),
            ))?;
            continue;
        }
        let top = bars
            .iter()
            .map(|(_, r)| r.unfused_ms.max(r.fused_ms.unwrap_or(0.0)))
            .fold(0.0, f64::max)
            * 1.25;
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{} ({} math)", mode.name(), mode.math().name()),
                ("sans-serif", 17),
            )
            .margin(12)
            .x_label_area_size(34)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.5f64..GROUPS.len() as f64 - 0.5, 0f64..top)?;
        let x_label = |x: &f64| {
            let i = x.round();
            match GROUPS.get(i as usize) {
                Some((block, phase)) if (x - i).abs() < 1e-6 && i >= 0.0 => {
                    format!("{} {}", block.name(), phase.name())
                }
                _ => String::new(),
            }
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(GROUPS.len() + 1)
            .x_label_formatter(&x_label)
            .y_desc("ms per call")
            .draw()?;
        let font = ("sans-serif", 13).into_font();
        chart
            .draw_series(bars.iter().map(|&(x, r)| {
                let x = x as f64;
                Rectangle::new(
                    [(x - 0.38, 0.0), (x - 0.02, r.unfused_ms)],
                    unfused_color.filled(),
                )
            }))?
            .label("unfused")
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 10, y + 5)], unfused_color.filled())
            });
        chart
            .draw_series(bars.iter().filter_map(|&(x, r)| {
                let x = x as f64;
                let ms = r.fused_ms?;
                Some(Rectangle::new(
                    [(x + 0.02, 0.0), (x + 0.38, ms)],
                    fused_color.filled(),
                ))
            }))?
            .label("fused (BN folded, one cuDNN call per convolution)")
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 10, y + 5)], fused_color.filled())
            });
        chart.draw_series(bars.iter().map(|&(x, r)| {
            Text::new(
                format!("{:.3}", r.unfused_ms),
                (x as f64 - 0.36, r.unfused_ms + top * 0.06),
                font.clone(),
            )
        }))?;
        chart.draw_series(bars.iter().filter_map(|&(x, r)| {
            let ms = r.fused_ms?;
            Some(Text::new(
                format!("{ms:.3} ({:.2}x)", r.speedup()?),
                (x as f64 + 0.04, ms + top * 0.06),
                font.clone(),
            ))
        }))?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// The folding, the CPU reference, the checks and the writers, on the host (no GPU needed):
/// `cargo test -p cudnn-safe-tools --bin conv_bn_relu`.
#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: Shape = Shape {
        n: 2,
        c: 3,
        h: 5,
        w: 4,
    };

    /// A 3×3 filter bank `[C, C, 3, 3]` with `f(k, c, r, s)` at each tap.
    fn filter(shape: &Shape, f: impl Fn(usize, usize, usize, usize) -> f64) -> Vec<f64> {
        let mut w = Vec::with_capacity(shape.filter_len());
        for k in 0..shape.c {
            for c in 0..shape.c {
                for r in 0..3 {
                    for s in 0..3 {
                        w.push(f(k, c, r, s));
                    }
                }
            }
        }
        w
    }

    fn identity_bn(c: usize) -> BnHost {
        BnHost {
            gamma: vec![1.0; c],
            beta: vec![0.0; c],
            mean: vec![0.0; c],
            var: vec![1.0 - EPS; c],
        }
    }

    #[test]
    fn conv_handles_padding() {
        let s = SMALL;
        // All-ones filters on an all-ones image count the taps inside the image, per channel.
        let ones = filter(&s, |_, _, _, _| 1.0);
        let count = |i, j| conv3x3_at(&s, &ones, 0, i, j, |_, _, _| 1.0) / s.c as f64;
        assert_eq!(count(0, 0), 4.0);
        assert_eq!(count(0, 1), 6.0);
        assert_eq!(count(2, 2), 9.0);
        assert_eq!(count(s.h - 1, s.w - 1), 4.0);
        // The centre tap of channel k copies channel k.
        let centre = filter(&s, |k, c, r, q| {
            f64::from(u8::from(k == c && r == 1 && q == 1))
        });
        let img = |c: usize, p: usize, q: usize| (c * 100 + p * 10 + q) as f64;
        for (k, i, j) in [(0, 0, 0), (1, 4, 3), (2, 2, 1)] {
            assert_eq!(conv3x3_at(&s, &centre, k, i, j, img), img(k, i, j));
        }
        // The top-left tap reads the pixel up and to the left (cross-correlation).
        let corner = filter(&s, |k, c, r, q| {
            f64::from(u8::from(k == c && r == 0 && q == 0))
        });
        assert_eq!(conv3x3_at(&s, &corner, 1, 3, 2, img), img(1, 2, 1));
        assert_eq!(conv3x3_at(&s, &corner, 1, 0, 2, img), 0.0);
    }

    #[test]
    fn folding_equals_conv_then_batch_norm() {
        let net = HostNet::random::<f32>(SMALL, 3);
        let (wf, bf) = fold_bn(&net.w1, &net.bn1);
        let s = &net.shape;
        for n in 0..s.n {
            for (k, &bias) in bf.iter().enumerate() {
                for i in 0..s.h {
                    for j in 0..s.w {
                        let input = |c, p, q| net.x[s.at(n, c, p, q)];
                        let (scale, shift) = net.bn1.affine(k);
                        let unfused = scale * conv3x3_at(s, &net.w1, k, i, j, input) + shift;
                        let fused = conv3x3_at(s, &wf, k, i, j, input) + bias;
                        assert!((unfused - fused).abs() < 1e-12, "{unfused} vs {fused}");
                        assert_eq!(unfused.max(0.0), net.block_at(n, k, i, j));
                    }
                }
            }
        }
    }

    #[test]
    fn random_data_is_nontrivial_and_representable() {
        let net = HostNet::random::<f16>(SMALL, 9);
        assert!(net.x.iter().all(|&v| v != 0.0 && v.abs() <= 1.0));
        assert!(net.x.iter().all(|&v| f16::from_f64(v).to_f64() == v));
        assert!(net.w1.iter().any(|&v| v != 0.0) && net.w1 != net.w2);
        for bn in [&net.bn1, &net.bn2] {
            assert!(bn.gamma.iter().all(|&g| (0.5..=1.5).contains(&g)));
            assert!(bn.var.iter().all(|&v| (0.25..=0.45).contains(&v)));
            assert!(bn
                .mean
                .iter()
                .all(|&m| m != 0.0 && f64::from(m as f32) == m));
        }
    }

    #[test]
    fn residual_reference_adds_the_skip() {
        let mut net = HostNet::random::<f32>(SMALL, 5);
        let s = net.shape;
        // Zero second convolution and identity bn2: y = relu(x).
        net.w2 = vec![0.0; s.filter_len()];
        net.bn2 = identity_bn(s.c);
        for (n, k, i, j) in [(0, 0, 0, 0), (1, 2, 4, 3), (1, 1, 2, 2)] {
            let y = net.residual_at(n, k, i, j);
            assert!((y - net.x[s.at(n, k, i, j)].max(0.0)).abs() < 1e-12);
        }
        // Centre-tap identity second convolution: y = relu(block(x) + x).
        net.w2 = filter(&s, |k, c, r, q| {
            f64::from(u8::from(k == c && r == 1 && q == 1))
        });
        for (n, k, i, j) in [(0, 1, 0, 3), (1, 0, 3, 1)] {
            let want = (net.block_at(n, k, i, j) + net.x[s.at(n, k, i, j)]).max(0.0);
            assert!((net.residual_at(n, k, i, j) - want).abs() < 1e-9);
        }
    }

    #[test]
    fn sample_points_cover_corners_and_stay_inside() {
        let s = Shape {
            n: 4,
            c: 64,
            h: 56,
            w: 56,
        };
        let p = sample_points(&s, SAMPLES, 1);
        assert_eq!(p.len(), SAMPLES);
        assert!(p.contains(&[0, 0, 0, 0]) && p.contains(&[3, 32, 55, 55]));
        assert!(p
            .iter()
            .all(|&[n, k, i, j]| n < s.n && k < s.c && i < s.h && j < s.w));
        let distinct: std::collections::HashSet<_> = p.iter().collect();
        assert!(distinct.len() > SAMPLES / 2);
    }

    #[test]
    fn comparisons_treat_nan_as_failure() {
        assert_eq!(max_abs_diff(&[1.0, -2.5], &[1.5, -3.0]), (0.5, 3.0));
        assert_eq!(max_abs_diff(&[f64::NAN], &[1.0]).0, f64::INFINITY);
        let s = SMALL;
        let mut got = vec![0.0; s.len()];
        got[s.at(1, 2, 3, 1)] = 2.0;
        let points = [[1, 2, 3, 1], [0, 0, 0, 0]];
        assert_eq!(sample_error(&s, &got, &points, &[2.5, -1.0]), (1.0, 2.5));
        got[0] = f64::NAN;
        assert_eq!(
            sample_error(&s, &got, &points, &[2.0, 0.0]).0,
            f64::INFINITY
        );
        assert!(finite_nonzero(&[0.0, 1e-30]));
        assert!(!finite_nonzero(&[0.0, 0.0]) && !finite_nonzero(&[1.0, f64::NAN]));
    }

    #[test]
    fn dbeta_error_is_relative_to_the_channel_sums() {
        let s = SMALL;
        let du: Vec<f64> = (0..s.len()).map(|i| (i % 7) as f64 - 3.0).collect();
        let sums: Vec<f32> = (0..s.c)
            .map(|k| {
                (0..s.n)
                    .flat_map(|n| (0..s.h * s.w).map(move |p| (n, p)))
                    .map(|(n, p)| du[s.at(n, k, 0, 0) + p])
                    .sum::<f64>() as f32
            })
            .collect();
        assert_eq!(dbeta_error(&s, &du, &sums), 0.0);
        let mut off = sums.clone();
        off[1] += 1.0;
        let e = dbeta_error(&s, &du, &off);
        assert!(e > 0.0 && e < 0.1, "{e}");
        off[2] = f32::NAN;
        assert_eq!(dbeta_error(&s, &du, &off), f64::INFINITY);
    }

    #[test]
    fn offsets_follow_the_layout() {
        let nhwc = Layout::nhwc(2, 3, 2, 2).unwrap();
        let mut seen = Vec::new();
        for_each_offset(&nhwc, |i, off| seen.push((i, off)));
        assert_eq!(seen.len(), 24);
        // Logical (n=0, c=1, h=0, w=0) is element 4 in NCHW order, offset 1 in NHWC.
        assert_eq!(seen[4], (4, 1));
        // Logical (n=1, c=2, h=1, w=1) is the last element either way.
        assert_eq!(seen[23], (23, 23));
        let nchw = Layout::nchw(2, 3, 2, 2).unwrap();
        let mut identity = true;
        for_each_offset(&nchw, |i, off| identity &= i == off);
        assert!(identity);
    }

    #[test]
    fn options_parse_and_reject() {
        let o = Options::parse(&[]).unwrap();
        assert_eq!((o.modes.as_slice(), o.batch), (&DEFAULT_MODES[..], BATCH));
        assert_eq!(o.shape().dims(), [32, 64, 56, 56]);
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = Options::parse(&args(&["--modes", "fp16,fp32,fp16", "--batch=4"])).unwrap();
        assert_eq!((o.modes, o.batch), (vec![Mode::Fp16, Mode::Fp32], 4));
        for bad in [
            &["--modes", "bf16"][..],
            &["--modes"],
            &["--batch", "1"],
            &["--batch", "x"],
            &["--fast"],
        ] {
            assert!(Options::parse(&args(bad)).is_err(), "{bad:?}");
        }
    }

    fn fake_rows() -> Vec<Row> {
        let mut rows = Vec::new();
        for mode in DEFAULT_MODES {
            for (i, &(block, phase)) in GROUPS.iter().enumerate() {
                let fused = phase == Phase::Inference;
                rows.push(Row {
                    mode,
                    block,
                    phase,
                    unfused_ms: 0.5 + i as f64,
                    fused_ms: fused.then_some(0.25 + i as f64 / 2.0),
                    diff: fused.then_some((1e-6, 3.0)),
                    ref_err: 2e-7,
                    tol: mode.tolerance(),
                    ok: i != 3,
                    algos: "fwd WINOGRAD_NONFUSED;\tfused IMPLICIT_PRECOMP_GEMM".into(),
                    problem: String::new(),
                });
            }
        }
        rows
    }

    #[test]
    fn writers_produce_complete_files() {
        let rows = fake_rows();
        let dir = std::env::temp_dir().join(format!("conv-bn-relu-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tsv = dir.join("a.tsv");
        write_tsv(&tsv, &rows).unwrap();
        let text = std::fs::read_to_string(&tsv).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + rows.len());
        assert!(lines.iter().all(|l| l.split('\t').count() == 11), "{text}");
        assert!(text.contains("fp32\tconv-bn-relu\tinference\t0.500000\t0.250000\t2.0000\t"));
        assert!(text.contains("fp16\tresidual\ttrain-fwd-bwd\t3.500000\t\t\t\t2e-2\t"));
        assert!(text.contains("\t0\tfwd WINOGRAD_NONFUSED; fused"));

        let svg = dir.join("c.svg");
        write_svg(&svg, &rows, &DEFAULT_MODES).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.starts_with("<svg"));
        for needle in [
            "fp32-nchw",
            "tf32-nchw",
            "fp16-nhwc",
            "residual train-fwd-bwd",
            "unfused",
            "(2.00x)",
        ] {
            assert!(text.contains(needle), "{needle} missing from the chart");
        }
        let lines = pytorch_lines(&rows, &Options::parse(&[]).unwrap().shape());
        assert_eq!(lines.len(), 6);
        assert_eq!(
            lines[5],
            "{\"op\": \"conv_bn_relu_folded_float16_32x64x56x56\", \"ms\": 0.25000, \
             \"impl\": \"cudnn-safe\", \"mode\": \"fp16\"}"
        );
        assert!(lines[0].starts_with("{\"op\": \"conv_bn_relu_infer_float32_32x64x56x56\""));

        // A mode without rows gets an empty panel, not an error.
        write_svg(&svg, &rows[..4], &[Mode::Fp32, Mode::Fp16]).unwrap();
        assert!(std::fs::read_to_string(&svg)
            .unwrap()
            .contains("fp16-nhwc: no data"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
