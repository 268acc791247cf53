//! Where the time of layer and group normalization goes, and which formulation is fastest.
//!
//! Two problems, the ones `benches/nn.rs` and `benches/pytorch/nn_ops.py` compare with PyTorch:
//! * `ln_fp32_32768x1024`: layer normalization over the last dimension of `32768×1024` f32
//!   (134 MB);
//! * `gn32_fp32_32x256x56x56`: group normalization in 32 groups of `32×256×56×56` f32 (103 MB).
//!
//! For each (ids `norm/<problem>-<what>`):
//! * `copy`: a device-to-device copy of the tensor, the bandwidth yardstick;
//! * `fwd-<method>`, `train-<method>`, `bwd-<method>`: the library's plain forward, training
//!   forward (returning the saved values) and backward, for each formulation:
//!   `reductions` ([`NormMethod::reductions`], op-tensor affine map and reductions for `dγ`,
//!   `dβ`: the reference), `default` (what [`LayerNorm::new`] / [`GroupNorm::new`] build: for
//!   the layer norm the fused graph path of [`LayerNormPath::Auto`](cudnn_safe::norm::LayerNormPath::Auto),
//!   for the group norm [`NormMethod::default_for_group`] — batch-norm affine map and
//!   gradients on the channels-first view, the former `fewest_passes_nchw`), `bn_default`
//!   (the layer norm's batch-norm formulation by default, [`NormMethod::default_for_layer`]:
//!   batch-norm affine map on the channels-last feature view, two-stage reductions for the
//!   gradients, the `default` before the fused path), the default with its other gradient formulation
//!   (`default_grads_bn` for the layer norm: batch-norm gradients, its former default, once
//!   `fewest_passes_nhwc`; `default_grads_2stage` for the group norm), and alternatives moved
//!   from `reductions` (`stats_row`, `stats_square`, `stats_persistent`: the [`NormStats`]
//!   views; `affine_bn_nchw` / `_nhwc`: [`NormAffine::BatchNormInference`] on the
//!   channels-first / channels-last feature view; `grads_bn_nchw` / `_nhwc`:
//!   [`NormParamGrads::BatchNormBackward`]; `grads_2stage`:
//!   [`NormParamGrads::TwoStageReduce`]; `_nhwc` variants for the layer norm only, which has
//!   a channels-last description). `train_bwd-<method>`: training forward then backward.
//!   Every formulation's first results are compared with those of `reductions`: its JSON
//!   line carries `max_abs_diff` (largest absolute difference of `y`, or of `dx`, `dγ`, `dβ`),
//!   so a fast but wrong formulation shows;
//! * `part-…`: the calls each formulation is made of, alone, through the public API:
//!   the batch-norm training forward on each statistics view (`part-stats-<view>`) and its
//!   backward (`part-stats_bwd-<view>`); the affine map as `cudnnOpTensor` + `cudnnAddTensor`
//!   (`part-affine_optensor`), each alone (`part-mul`, `part-mul_inplace`, `part-add`), with
//!   `β` written first and one multiply accumulating into it (`part-affine_preset`), as one
//!   batch-norm inference (`part-affine_bn_nchw`, `_nhwc`, `_peract`); the backward pieces
//!   (`part-reduce_dbeta`, `part-mul_dy_xhat`, `part-mul_dy_gamma`, and
//!   `part-bn_bwd_feature_nchw` / `_nhwc`: a batch-norm backward on the feature view, the
//!   shape of the `grads_bn` call); other descriptions of the `dβ` reduction (`Σ dy` into
//!   `[1, B, 1, 1]`): `part-reduce_dbeta_nhwc` (layer norm: the input described channels-last,
//!   `[1, D, rows, 1]` with strides `[rows·D, 1, D, D]`), and two-stage reductions through an
//!   intermediate tensor, the `rows` of a layer norm split as `h·w` (near-square) and viewed
//!   as `[h, w, D, 1]`: `part-reduce_dbeta_2stage_inner` (`w` first: `[h, 1, D, 1]`, then
//!   `h`) and `part-reduce_dbeta_2stage_outer` (`h` first: `[1, w, D, 1]`, then `w`); for the
//!   group norm `[N, C, S, 1]` the same names reduce `S` first (`[N, C, 1, 1]`, then `N`)
//!   and `N` first (`[1, C, S, 1]`, then `S`);
//! * the layer norm only, its graph formulation (one cuDNN normalization kernel per call):
//!   `fwd-graph`, `train-graph` (y and the f32 statistics), `bwd-graph` (dx, dγ, dβ) and
//!   `train_bwd-graph`, compared with `reductions` like the others.
//!
//! Then [`RmsNorm`] (cuDNN's fused RMS-norm graphs) on `rms_fp32_32768x1024` and
//! `rms_bf16_16384x4096`: `fwd`, `train` (y and the f32 inverse RMS), `bwd` (dx, dγ) and
//! `train_bwd` (PyTorch's counterparts: `benches/pytorch/rms_norm.py`).
//!
//! Bytes are counted as the PyTorch script counts them: each input read once, each output
//! written once (forward `2×`, backward `3×` the tensor: `dy` and `x` in, `dx` out; parts by
//! their own tensor-sized operands).
//!
//! Before each benchmark a JSON line gives the per-call device time from CUDA events (median
//! of 5 batches of about 25 ms, after a warm-up call) and the bandwidth, e.g.
//! `{"op": "ln_fp32_32768x1024-fwd-default", "ms": 0.5560, "TB/s": 0.483}`; a call that fails
//! prints `{"op": …, "error": …}` instead (a view cuDNN refuses, for example). A table closes
//! the run. Criterion then measures the same calls with CUDA events (`iter_custom`), with
//! short default warm-up and measurement times (override them on the command line); with
//! `NORM_BENCH_JSON_ONLY=1` only the JSON lines are produced (about 0.2 s per operation).
//!
//! A filter argument selects benchmarks as criterion does; data are only set up for a problem
//! the filter can select, and `--list` sets up nothing. Without a GPU it prints
//! `no GPU: <why>` and exits cleanly.
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{
    exit_on_error, list_only, median_ms, print_header, print_op_error, print_op_line,
    print_summary, sample_size, setup_or_skip, timed_iters, values, Args, BoxResult, Summary,
};
use criterion::{Criterion, Throughput};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::half::bf16;
use cudnn_safe::norm::{
    BatchNorm, BatchNormMode, FeatureLayout, GroupNorm, LayerNorm, NormAffine, NormMethod,
    NormParamGrads, NormSaved, NormStats, NormType, RmsNorm,
};
use cudnn_safe::ops::OpTensorOp;
use cudnn_safe::reduce::ReduceOp;
use cudnn_safe::{Cudnn, DataType, Layout, TensorDesc, Workspace};

/// Criterion group of every benchmark here.
const GROUP: &str = "norm";
const EPS: f64 = 1e-5;

/// Runs the selected measurements: selection, JSON line, criterion.
struct Runner<'a> {
    c: &'a mut Criterion,
    args: &'a Args,
    stream: &'a Arc<CudaStream>,
    json_only: bool,
    summary: Vec<Summary>,
}

impl Runner<'_> {
    /// Whether criterion will run `op`; if not, registers it (for `--list` and filters).
    fn selected(&mut self, op: &str) -> bool {
        if self.args.runs(&format!("{GROUP}/{op}")) {
            true
        } else {
            list_only(self.c, GROUP, &[op]);
            false
        }
    }

    /// Whether any of `ops` is selected (without registering anything).
    fn any_selected(&self, ops: &[String]) -> bool {
        ops.iter()
            .any(|op| self.args.runs(&format!("{GROUP}/{op}")))
    }

    /// A checked first call, the JSON line (with `note`, extra JSON fields), then criterion.
    /// A failing first call prints the error instead and registers nothing (a stand-in would
    /// be reported as if it were the operation).
    fn bench(
        &mut self,
        op: &str,
        bytes: Option<f64>,
        note: Option<String>,
        call: &mut dyn FnMut() -> BoxResult<()>,
    ) {
        let ms = match call().and_then(|()| median_ms(self.stream, self.args.test, &mut *call)) {
            Ok(ms) => ms,
            Err(e) => {
                print_op_error(op, &e);
                return;
            }
        };
        print_op_line(op, ms, bytes, note.as_deref());
        self.summary.push(Summary {
            op: op.to_string(),
            ms,
            bytes,
        });
        if self.json_only {
            return;
        }
        let stream = self.stream;
        let mut g = self.c.benchmark_group(GROUP);
        g.sample_size(sample_size(ms));
        if let Some(b) = bytes {
            g.throughput(Throughput::Bytes(b as u64));
        }
        g.bench_function(op, |b| {
            b.iter_custom(|iters| timed_iters(stream, iters, &mut *call))
        });
        g.finish();
    }
}

/// `(H, W)` with `H·W = m` and `W` the largest divisor of `m` not above `√m` (the library's
/// [`NormStats::SpatialSquare`] split).
fn near_square(m: i64) -> (i64, i64) {
    let mut w = (m as f64).sqrt() as i64;
    while w > 1 && w * w > m {
        w -= 1;
    }
    while (w + 1) * (w + 1) <= m {
        w += 1;
    }
    let w = (1..=w.max(1)).rev().find(|d| m % d == 0).unwrap_or(1);
    (m / w, w)
}

/// A packed `[A, B, S, 1]` tensor whose `A·G` groups of `B·S/G` consecutive elements are
/// normalized, with a `B`-element affine map (the library's own decomposition).
struct Problem {
    name: &'static str,
    /// The dimensions handed to [`LayerNorm`] / [`GroupNorm`].
    dims: &'static [i64],
    layer: bool,
    a: i64,
    b: i64,
    s: i64,
    g: i64,
}

const LN: Problem = Problem {
    name: "ln_fp32_32768x1024",
    dims: &[32768, 1024],
    layer: true,
    a: 32768,
    b: 1024,
    s: 1,
    g: 1,
};

const GN: Problem = Problem {
    name: "gn32_fp32_32x256x56x56",
    dims: &[32, 256, 56, 56],
    layer: false,
    a: 32,
    b: 256,
    s: 56 * 56,
    g: 32,
};

impl Problem {
    fn len(&self) -> usize {
        (self.a * self.b * self.s) as usize
    }
    fn rows(&self) -> i64 {
        self.a * self.g
    }
    fn group_len(&self) -> i64 {
        self.b * self.s / self.g
    }
    /// Bytes of the tensor.
    fn nb(&self) -> f64 {
        (self.len() * std::mem::size_of::<f32>()) as f64
    }
    fn op(&self, what: &str) -> String {
        format!("{}-{what}", self.name)
    }
    /// The normalization computed with `method`, or as the constructor builds it (`None`).
    fn norm(&self, method: Option<NormMethod>) -> cudnn_safe::Result<Norm> {
        Ok(if self.layer {
            let n = LayerNorm::new(&Layout::nchw_nd(self.dims)?, 1, EPS)?;
            Norm::Layer(match method {
                Some(m) => n.with_method(m)?,
                None => n,
            })
        } else {
            let n = GroupNorm::new(&Layout::nchw_nd(self.dims)?, self.g, EPS)?;
            Norm::Group(match method {
                Some(m) => n.with_method(m)?,
                None => n,
            })
        })
    }
    /// The statistics views of the parts: name, layout, batch-norm mode.
    fn stats_views(&self) -> cudnn_safe::Result<Vec<(&'static str, Layout, BatchNormMode)>> {
        let (r, m) = (self.rows(), self.group_len());
        let (h, w) = near_square(m);
        Ok(vec![
            ("col", Layout::nchw(1, r, m, 1)?, BatchNormMode::Spatial),
            ("row", Layout::nchw(1, r, 1, m)?, BatchNormMode::Spatial),
            ("square", Layout::nchw(1, r, h, w)?, BatchNormMode::Spatial),
            (
                "persistent",
                Layout::nchw(1, r, m, 1)?,
                BatchNormMode::SpatialPersistent,
            ),
        ])
    }
    /// The feature views of the parts (features as batch-norm channels): name, layout.
    fn feature_views(&self) -> cudnn_safe::Result<Vec<(&'static str, Layout)>> {
        let mut v = vec![("nchw", Layout::nchw(self.a, self.b, self.s, 1)?)];
        if self.s == 1 {
            v.push(("nhwc", Layout::nhwc(1, self.b, self.a, 1)?));
        }
        Ok(v)
    }
    /// The library formulations measured: name, method (`None`: the constructor's default),
    /// whether only the backward differs from `reductions` (from `default` for the
    /// `default_…` variants).
    fn methods(&self) -> Vec<(&'static str, Option<NormMethod>, bool)> {
        let d = NormMethod::reductions();
        let bn_affine = d.with_affine(NormAffine::BatchNormInference);
        let bn_grads = d.with_param_grads(NormParamGrads::BatchNormBackward);
        let first = FeatureLayout::ChannelsFirst;
        let last = FeatureLayout::ChannelsLast;
        // The default with the gradient formulation it does not use.
        let other_default = if self.layer {
            (
                "default_grads_bn",
                NormMethod::default_for_layer().with_param_grads(NormParamGrads::BatchNormBackward),
            )
        } else {
            (
                "default_grads_2stage",
                NormMethod::default_for_group().with_param_grads(NormParamGrads::TwoStageReduce),
            )
        };
        let mut v = vec![
            ("reductions", Some(d), false),
            ("default", None, false),
            (other_default.0, Some(other_default.1), true),
        ];
        if self.layer {
            // The layer norm's default is the fused graph path; this is its batch-norm default.
            v.push(("bn_default", Some(NormMethod::default_for_layer()), false));
        }
        v.extend([
            (
                "stats_row",
                Some(d.with_stats(NormStats::SpatialRow)),
                false,
            ),
            (
                "stats_square",
                Some(d.with_stats(NormStats::SpatialSquare)),
                false,
            ),
            (
                "stats_persistent",
                Some(d.with_stats(NormStats::SpatialPersistent)),
                false,
            ),
            (
                "affine_bn_nchw",
                Some(bn_affine.with_feature_layout(first)),
                false,
            ),
            (
                "grads_bn_nchw",
                Some(bn_grads.with_feature_layout(first)),
                true,
            ),
            (
                "grads_2stage",
                Some(d.with_param_grads(NormParamGrads::TwoStageReduce)),
                true,
            ),
        ]);
        if self.s == 1 {
            v.push((
                "affine_bn_nhwc",
                Some(bn_affine.with_feature_layout(last)),
                false,
            ));
            v.push((
                "grads_bn_nhwc",
                Some(bn_grads.with_feature_layout(last)),
                true,
            ));
        }
        v
    }
    /// Every id this problem may run (to decide whether to set up its data).
    fn all_ops(&self) -> Vec<String> {
        let mut v = vec![self.op("copy")];
        for (name, _, _) in self.methods() {
            for kind in ["fwd", "train", "bwd", "train_bwd"] {
                v.push(self.op(&format!("{kind}-{name}")));
            }
        }
        if self.layer {
            for kind in ["fwd", "train", "bwd", "train_bwd"] {
                v.push(self.op(&format!("{kind}-graph")));
            }
        }
        for p in PARTS {
            v.push(self.op(p));
        }
        for view in ["col", "row", "square", "persistent"] {
            v.push(self.op(&format!("part-stats-{view}")));
            v.push(self.op(&format!("part-stats_bwd-{view}")));
        }
        for f in ["nchw", "nhwc"] {
            v.push(self.op(&format!("part-affine_bn_{f}")));
            v.push(self.op(&format!("part-bn_bwd_feature_{f}")));
        }
        v
    }
}

/// The parts with fixed names.
const PARTS: [&str; 12] = [
    "part-affine_optensor",
    "part-mul",
    "part-mul_inplace",
    "part-add",
    "part-affine_preset",
    "part-affine_bn_peract",
    "part-reduce_dbeta",
    "part-reduce_dbeta_nhwc",
    "part-reduce_dbeta_2stage_inner",
    "part-reduce_dbeta_2stage_outer",
    "part-mul_dy_xhat",
    "part-mul_dy_gamma",
];

/// A layer or a group normalization, called alike.
enum Norm {
    Layer(LayerNorm<f32>),
    Group(GroupNorm<f32>),
}

impl Norm {
    fn forward(&self, cudnn: &Cudnn, d: &mut Data) -> cudnn_safe::Result<()> {
        match self {
            Norm::Layer(n) => cudnn.layer_norm_forward(n, &d.x, &d.gamma, &d.beta, &mut d.y),
            Norm::Group(n) => cudnn.group_norm_forward(n, &d.x, &d.gamma, &d.beta, &mut d.y),
        }
    }
    /// The training forward on `d`'s x, γ, β into its y; the saved values keep `x` borrowed,
    /// so `d`'s other fields stay free (see [`train!`] and [`backward!`]).
    fn train<'x>(
        &self,
        cudnn: &Cudnn,
        x: &'x CudaSlice<f32>,
        (gamma, beta): (&CudaSlice<f32>, &CudaSlice<f32>),
        y: &mut CudaSlice<f32>,
    ) -> cudnn_safe::Result<NormSaved<'x, f32>> {
        match self {
            Norm::Layer(n) => cudnn.layer_norm_forward_training(n, x, gamma, beta, y),
            Norm::Group(n) => cudnn.group_norm_forward_training(n, x, gamma, beta, y),
        }
    }
    fn backward(
        &self,
        cudnn: &Cudnn,
        saved: &NormSaved<'_, f32>,
        (x, dy, gamma): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
        (dx, dgamma, dbeta): Grads<'_>,
        ws: &mut Workspace,
    ) -> cudnn_safe::Result<()> {
        match self {
            Norm::Layer(n) => {
                cudnn.layer_norm_backward(n, saved, x, dy, gamma, dx, dgamma, dbeta, ws)
            }
            Norm::Group(n) => {
                cudnn.group_norm_backward(n, saved, x, dy, gamma, dx, dgamma, dbeta, ws)
            }
        }
    }
}

/// `dx`, `dγ`, `dβ` of a backward call.
type Grads<'a> = (
    &'a mut CudaSlice<f32>,
    &'a mut CudaSlice<f32>,
    &'a mut CudaSlice<f32>,
);

/// [`Norm::train`] on the fields of a [`Data`] (borrowed one by one, so that the saved value's
/// borrow of `x` leaves the others free).
macro_rules! train {
    ($norm:expr, $cudnn:expr, $d:expr) => {
        $norm.train($cudnn, &$d.x, (&$d.gamma, &$d.beta), &mut $d.y)
    };
}

/// [`Norm::backward`] on the fields of a [`Data`].
macro_rules! backward {
    ($norm:expr, $cudnn:expr, $saved:expr, $d:expr) => {
        $norm.backward(
            $cudnn,
            $saved,
            (&$d.x, &$d.dy, &$d.gamma),
            (&mut $d.dx, &mut $d.dgamma, &mut $d.dbeta),
            &mut $d.ws,
        )
    };
}

/// Buffers of one problem (f32).
struct Data {
    /// `[A, B, S, 1]` and `[1, B, 1, 1]`.
    full: TensorDesc<f32>,
    affine: TensorDesc<f32>,
    x: CudaSlice<f32>,
    y: CudaSlice<f32>,
    dy: CudaSlice<f32>,
    dx: CudaSlice<f32>,
    /// A real `x̂` (from the default training forward), input of the parts.
    xhat: CudaSlice<f32>,
    tmp: CudaSlice<f32>,
    gamma: CudaSlice<f32>,
    beta: CudaSlice<f32>,
    /// `γ = 1`, for the in-place multiply repeated on the same buffer.
    unit: CudaSlice<f32>,
    dgamma: CudaSlice<f32>,
    dbeta: CudaSlice<f32>,
    /// `R` (groups) and `B` (features) vectors of 1 and 0, and `R` discarded gradients.
    ones_r: CudaSlice<f32>,
    zeros_r: CudaSlice<f32>,
    dscale_r: CudaSlice<f32>,
    dbias_r: CudaSlice<f32>,
    ones_b: CudaSlice<f32>,
    zeros_b: CudaSlice<f32>,
    ws: Workspace,
}

impl Data {
    fn new(p: &Problem, stream: &Arc<CudaStream>) -> BoxResult<Data> {
        let (n, b, r) = (p.len(), p.b as usize, p.rows() as usize);
        // PyTorch's parameters: weight in [0.5, 1.5], bias around 0.
        let weight: Vec<f32> = values::<f32>(b, 0.5).iter().map(|v| v + 1.0).collect();
        Ok(Data {
            full: TensorDesc::nchw(p.a, p.b, p.s, 1)?,
            affine: TensorDesc::nchw(1, p.b, 1, 1)?,
            x: stream.clone_htod(&values::<f32>(n, 2.0))?,
            y: stream.alloc_zeros(n)?,
            dy: stream.clone_htod(&values::<f32>(n, 1.0))?,
            dx: stream.alloc_zeros(n)?,
            xhat: stream.alloc_zeros(n)?,
            tmp: stream.alloc_zeros(n)?,
            gamma: stream.clone_htod(&weight)?,
            beta: stream.clone_htod(&values::<f32>(b, 1.0))?,
            unit: stream.clone_htod(&vec![1.0f32; b])?,
            dgamma: stream.alloc_zeros(b)?,
            dbeta: stream.alloc_zeros(b)?,
            ones_r: stream.clone_htod(&vec![1.0f32; r])?,
            zeros_r: stream.alloc_zeros(r)?,
            dscale_r: stream.alloc_zeros(r)?,
            dbias_r: stream.alloc_zeros(r)?,
            ones_b: stream.clone_htod(&vec![1.0f32; b])?,
            zeros_b: stream.alloc_zeros(b)?,
            ws: Workspace::new(stream.clone()),
        })
    }
}

/// Largest absolute difference between a device buffer and host values (NaN if any value is
/// not finite), as a JSON value.
fn max_abs_diff(stream: &Arc<CudaStream>, got: &CudaSlice<f32>, want: &[f32]) -> BoxResult<String> {
    stream.synchronize()?;
    let g = stream.clone_dtoh(got)?;
    let mut m = 0.0f64;
    for (a, b) in g.iter().zip(want) {
        let d = (f64::from(*a) - f64::from(*b)).abs();
        if !d.is_finite() {
            return Ok("\"nan\"".into());
        }
        m = m.max(d);
    }
    Ok(format!("{m:.3e}"))
}

/// What [`NormMethod::reductions`] computes, for the comparison of the others.
struct Reference {
    y: Vec<f32>,
    dx: Vec<f32>,
    dgamma: Vec<f32>,
    dbeta: Vec<f32>,
}

/// The kinds of library call measured for a formulation.
fn kinds(name: &str, bwd_only: bool) -> &'static [&'static str] {
    if name.starts_with("default_") {
        &["bwd", "train_bwd"]
    } else if bwd_only {
        &["bwd"]
    } else if matches!(name, "default" | "reductions" | "bn_default") {
        &["fwd", "train", "bwd", "train_bwd"]
    } else {
        &["fwd", "train", "bwd"]
    }
}

/// The results of [`NormMethod::reductions`] (and a real `x̂` into `d.xhat`).
fn reference(
    p: &Problem,
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    d: &mut Data,
) -> BoxResult<Reference> {
    let norm = p.norm(Some(NormMethod::reductions()))?;
    let saved = train!(norm, cudnn, d)?;
    let xhat = saved
        .xhat()
        .ok_or("the batch-norm formulation saved no x̂")?;
    stream.memcpy_dtod(xhat, &mut d.xhat)?;
    backward!(norm, cudnn, &saved, d)?;
    drop(saved);
    norm.forward(cudnn, d)?;
    stream.synchronize()?;
    Ok(Reference {
        y: stream.clone_dtoh(&d.y)?,
        dx: stream.clone_dtoh(&d.dx)?,
        dgamma: stream.clone_dtoh(&d.dgamma)?,
        dbeta: stream.clone_dtoh(&d.dbeta)?,
    })
}

/// The library's formulations, full calls.
fn run_methods(
    r: &mut Runner,
    p: &Problem,
    cudnn: &Cudnn,
    d: &mut Data,
    reference: &Reference,
) -> BoxResult<()> {
    let stream = r.stream;
    let nb = p.nb();
    for (name, method, bwd_only) in p.methods() {
        let ops: Vec<String> = kinds(name, bwd_only)
            .iter()
            .map(|k| p.op(&format!("{k}-{name}")))
            .collect();
        let norm = match p.norm(method) {
            Ok(n) => n,
            Err(e) => {
                for op in &ops {
                    print_op_error(op, &e);
                }
                continue;
            }
        };
        let compare = name != "reductions";
        for (kind, op) in kinds(name, bwd_only).iter().zip(&ops) {
            if !r.selected(op) {
                continue;
            }
            match *kind {
                "fwd" => {
                    let note = match norm.forward(cudnn, d) {
                        Ok(()) if compare => Some(format!(
                            "\"max_abs_diff\": {}",
                            max_abs_diff(stream, &d.y, &reference.y)?
                        )),
                        _ => None,
                    };
                    r.bench(
                        op,
                        Some(2.0 * nb),
                        note,
                        &mut || Ok(norm.forward(cudnn, d)?),
                    );
                }
                "train" => {
                    let note = match train!(norm, cudnn, d) {
                        Ok(_) if compare => Some(format!(
                            "\"max_abs_diff\": {}",
                            max_abs_diff(stream, &d.y, &reference.y)?
                        )),
                        _ => None,
                    };
                    r.bench(op, Some(2.0 * nb), note, &mut || {
                        train!(norm, cudnn, d)?;
                        Ok(())
                    });
                }
                "bwd" => {
                    let saved = match train!(norm, cudnn, d) {
                        Ok(s) => s,
                        Err(e) => {
                            print_op_error(op, &e);
                            continue;
                        }
                    };
                    let note = match backward!(norm, cudnn, &saved, d) {
                        Ok(()) if compare => Some(format!(
                            "\"max_abs_diff\": {{\"dx\": {}, \"dgamma\": {}, \"dbeta\": {}}}",
                            max_abs_diff(stream, &d.dx, &reference.dx)?,
                            max_abs_diff(stream, &d.dgamma, &reference.dgamma)?,
                            max_abs_diff(stream, &d.dbeta, &reference.dbeta)?
                        )),
                        _ => None,
                    };
                    r.bench(op, Some(3.0 * nb), note, &mut || {
                        Ok(backward!(norm, cudnn, &saved, d)?)
                    });
                }
                _ => {
                    r.bench(op, None, None, &mut || {
                        let saved = train!(norm, cudnn, d)?;
                        backward!(norm, cudnn, &saved, d)?;
                        Ok(())
                    });
                }
            }
        }
    }
    Ok(())
}

/// The calls the formulations are made of, alone.
fn run_parts(
    r: &mut Runner,
    p: &Problem,
    cudnn: &Cudnn,
    d: &mut Data,
    reference: &Reference,
) -> BoxResult<()> {
    let nb = p.nb();
    let bn = |mode: BatchNormMode, eps: f64, layout: &Layout| {
        BatchNorm::builder()
            .mode(mode)
            .epsilon(eps)
            .build::<f32>(layout)
    };

    // Step 1: statistics and x̂ on each view, and the view's backward (step 3).
    for (view, layout, mode) in p.stats_views()? {
        let (op, op_b) = (
            p.op(&format!("part-stats-{view}")),
            p.op(&format!("part-stats_bwd-{view}")),
        );
        let (run_f, run_b) = (r.selected(&op), r.selected(&op_b));
        if !run_f && !run_b {
            continue;
        }
        let bn = match bn(mode, EPS, &layout) {
            Ok(b) => b,
            Err(e) => {
                print_op_error(&op, &e);
                print_op_error(&op_b, &e);
                continue;
            }
        };
        if run_f {
            r.bench(&op, Some(2.0 * nb), None, &mut || {
                cudnn.batch_norm_forward_training(
                    &bn, 1.0, 0.0, &d.x, &mut d.tmp, &d.ones_r, &d.zeros_r, None,
                )?;
                Ok(())
            });
        }
        if run_b {
            match cudnn.batch_norm_forward_training(
                &bn, 1.0, 0.0, &d.x, &mut d.tmp, &d.ones_r, &d.zeros_r, None,
            ) {
                Ok(saved) => r.bench(&op_b, Some(3.0 * nb), None, &mut || {
                    Ok(cudnn.batch_norm_backward(
                        &bn,
                        &saved,
                        1.0,
                        0.0,
                        1.0,
                        0.0,
                        &d.x,
                        &d.dy,
                        &mut d.dx,
                        &d.ones_r,
                        &mut d.dscale_r,
                        &mut d.dbias_r,
                    )?)
                }),
                Err(e) => print_op_error(&op_b, &e),
            }
        }
    }

    // Step 2: the affine map.
    let op = p.op("part-affine_optensor");
    if r.selected(&op) {
        r.bench(&op, Some(2.0 * nb), None, &mut || {
            cudnn.op_tensor(
                OpTensorOp::Mul,
                1.0,
                &d.full,
                &d.xhat,
                1.0,
                &d.affine,
                &d.gamma,
                0.0,
                &d.full,
                &mut d.y,
            )?;
            Ok(cudnn.add_tensor(1.0, &d.affine, &d.beta, 1.0, &d.full, &mut d.y)?)
        });
    }
    let op = p.op("part-mul");
    if r.selected(&op) {
        r.bench(&op, Some(2.0 * nb), None, &mut || {
            Ok(cudnn.op_tensor(
                OpTensorOp::Mul,
                1.0,
                &d.full,
                &d.xhat,
                1.0,
                &d.affine,
                &d.gamma,
                0.0,
                &d.full,
                &mut d.y,
            )?)
        });
    }
    let op = p.op("part-mul_inplace");
    if r.selected(&op) {
        r.bench(&op, Some(2.0 * nb), None, &mut || {
            Ok(cudnn.op_tensor_inplace(
                OpTensorOp::Mul,
                1.0,
                1.0,
                &d.affine,
                &d.unit,
                0.0,
                &d.full,
                &mut d.y,
            )?)
        });
    }
    let op = p.op("part-add");
    if r.selected(&op) {
        r.bench(&op, Some(2.0 * nb), None, &mut || {
            Ok(cudnn.add_tensor(1.0, &d.affine, &d.beta, 1.0, &d.full, &mut d.y)?)
        });
    }
    let op = p.op("part-affine_preset");
    if r.selected(&op) {
        r.bench(&op, Some(2.0 * nb), None, &mut || {
            cudnn.add_tensor(1.0, &d.affine, &d.beta, 0.0, &d.full, &mut d.y)?;
            Ok(cudnn.op_tensor(
                OpTensorOp::Mul,
                1.0,
                &d.full,
                &d.xhat,
                1.0,
                &d.affine,
                &d.gamma,
                1.0,
                &d.full,
                &mut d.y,
            )?)
        });
    }
    // As a batch-norm inference: scale γ, bias β, mean 0, variance 1, epsilon 0.
    let mut affine_views: Vec<(String, Layout, BatchNormMode)> = p
        .feature_views()?
        .into_iter()
        .map(|(f, l)| {
            (
                p.op(&format!("part-affine_bn_{f}")),
                l,
                BatchNormMode::Spatial,
            )
        })
        .collect();
    if p.s == 1 {
        affine_views.push((
            p.op("part-affine_bn_peract"),
            Layout::nchw(p.a, p.b, 1, 1)?,
            BatchNormMode::PerActivation,
        ));
    }
    for (op, layout, mode) in affine_views {
        if !r.selected(&op) {
            continue;
        }
        match bn(mode, 0.0, &layout) {
            Ok(bn) => r.bench(&op, Some(2.0 * nb), None, &mut || {
                Ok(cudnn.batch_norm_forward_inference(
                    &bn, 1.0, 0.0, &d.xhat, &mut d.y, &d.gamma, &d.beta, &d.zeros_b, &d.ones_b,
                )?)
            }),
            Err(e) => print_op_error(&op, &e),
        }
    }

    // Backward pieces.
    let op = p.op("part-reduce_dbeta");
    if r.selected(&op) {
        r.bench(&op, Some(nb), None, &mut || {
            Ok(cudnn.reduce_tensor(
                ReduceOp::Add,
                1.0,
                &d.full,
                &d.dy,
                0.0,
                &d.affine,
                &mut d.dbeta,
                &mut d.ws,
            )?)
        });
    }
    run_reduce_variants(r, p, cudnn, d, reference)?;
    let op = p.op("part-mul_dy_xhat");
    if r.selected(&op) {
        r.bench(&op, Some(3.0 * nb), None, &mut || {
            Ok(cudnn.op_tensor(
                OpTensorOp::Mul,
                1.0,
                &d.full,
                &d.dy,
                1.0,
                &d.full,
                &d.xhat,
                0.0,
                &d.full,
                &mut d.tmp,
            )?)
        });
    }
    let op = p.op("part-mul_dy_gamma");
    if r.selected(&op) {
        r.bench(&op, Some(2.0 * nb), None, &mut || {
            Ok(cudnn.op_tensor(
                OpTensorOp::Mul,
                1.0,
                &d.full,
                &d.dy,
                1.0,
                &d.affine,
                &d.gamma,
                0.0,
                &d.full,
                &mut d.tmp,
            )?)
        });
    }
    // A batch-norm backward on the feature view (x = x̂): the shape of the call of
    // NormParamGrads::BatchNormBackward (which passes saved mean 0 / inverse std 1 instead).
    for (f, layout) in p.feature_views()? {
        let op = p.op(&format!("part-bn_bwd_feature_{f}"));
        if !r.selected(&op) {
            continue;
        }
        let bn = match bn(BatchNormMode::Spatial, EPS, &layout) {
            Ok(b) => b,
            Err(e) => {
                print_op_error(&op, &e);
                continue;
            }
        };
        match cudnn.batch_norm_forward_training(
            &bn, 1.0, 0.0, &d.xhat, &mut d.tmp, &d.ones_b, &d.zeros_b, None,
        ) {
            Ok(saved) => r.bench(&op, Some(3.0 * nb), None, &mut || {
                Ok(cudnn.batch_norm_backward(
                    &bn,
                    &saved,
                    1.0,
                    0.0,
                    1.0,
                    0.0,
                    &d.xhat,
                    &d.dy,
                    &mut d.dx,
                    &d.ones_b,
                    &mut d.dgamma,
                    &mut d.dbeta,
                )?)
            }),
            Err(e) => print_op_error(&op, &e),
        }
    }
    Ok(())
}

/// The `dβ = Σ dy` reduction described otherwise than `part-reduce_dbeta` (`[A, B, S, 1]` into
/// `[1, B, 1, 1]`): channels-last for the layer norm, and in two stages through `d.tmp`. Each
/// JSON line carries the largest difference from the reference `dβ`.
fn run_reduce_variants(
    r: &mut Runner,
    p: &Problem,
    cudnn: &Cudnn,
    d: &mut Data,
    reference: &Reference,
) -> BoxResult<()> {
    let stream = r.stream;
    let nb = p.nb();
    let check = |d: &Data| -> BoxResult<Option<String>> {
        Ok(Some(format!(
            "\"max_abs_diff\": {}",
            max_abs_diff(stream, &d.dbeta, &reference.dbeta)?
        )))
    };
    let op = p.op("part-reduce_dbeta_nhwc");
    if p.s == 1 && r.selected(&op) {
        // Element (i, f) at i·D + f is (h = i, c = f) of a channels-last [1, D, rows, 1].
        let a_desc = TensorDesc::<f32>::nhwc(1, p.b, p.a, 1)?;
        let call = |d: &mut Data| -> BoxResult<()> {
            Ok(cudnn.reduce_tensor(
                ReduceOp::Add,
                1.0,
                &a_desc,
                &d.dy,
                0.0,
                &d.affine,
                &mut d.dbeta,
                &mut d.ws,
            )?)
        };
        match call(d) {
            Ok(()) => {
                let note = check(d)?;
                r.bench(&op, Some(nb), note, &mut || call(d));
            }
            Err(e) => print_op_error(&op, &e),
        }
    }
    // (input view, intermediate, output) of each two-stage split.
    let (input, inner, outer, output) = if p.s == 1 {
        let (h, w) = near_square(p.a);
        (
            TensorDesc::<f32>::nchw(h, w, p.b, 1)?,
            TensorDesc::<f32>::nchw(h, 1, p.b, 1)?,
            TensorDesc::<f32>::nchw(1, w, p.b, 1)?,
            TensorDesc::<f32>::nchw(1, 1, p.b, 1)?,
        )
    } else {
        (
            TensorDesc::<f32>::nchw(p.a, p.b, p.s, 1)?,
            TensorDesc::<f32>::nchw(p.a, p.b, 1, 1)?,
            TensorDesc::<f32>::nchw(1, p.b, p.s, 1)?,
            TensorDesc::<f32>::nchw(1, p.b, 1, 1)?,
        )
    };
    for (name, mid) in [("inner", &inner), ("outer", &outer)] {
        let op = p.op(&format!("part-reduce_dbeta_2stage_{name}"));
        if !r.selected(&op) {
            continue;
        }
        let call = |d: &mut Data| -> BoxResult<()> {
            let Data {
                dy, tmp, dbeta, ws, ..
            } = d;
            cudnn.reduce_tensor(ReduceOp::Add, 1.0, &input, &*dy, 0.0, mid, tmp, ws)?;
            Ok(cudnn.reduce_tensor(ReduceOp::Add, 1.0, mid, &*tmp, 0.0, &output, dbeta, ws)?)
        };
        match call(d) {
            Ok(()) => {
                let note = check(d)?;
                r.bench(&op, Some(nb), note, &mut || call(d));
            }
            Err(e) => print_op_error(&op, &e),
        }
    }
    Ok(())
}

/// Sets up and runs one problem's selected measurements.
fn run_problem(
    r: &mut Runner,
    p: &Problem,
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
) -> BoxResult<()> {
    let all = p.all_ops();
    if !r.any_selected(&all) {
        for op in &all {
            list_only(r.c, GROUP, &[op.as_str()]);
        }
        return Ok(());
    }
    let mut d = Data::new(p, stream)?;
    let op = p.op("copy");
    if r.selected(&op) {
        let nb = p.nb();
        r.bench(&op, Some(2.0 * nb), None, &mut || {
            Ok(stream.memcpy_dtod(&d.x, &mut d.y)?)
        });
    }
    let reference = reference(p, stream, cudnn, &mut d)?;
    run_methods(r, p, cudnn, &mut d, &reference)?;
    if p.layer {
        run_graph(r, p, cudnn, &mut d, &reference)?;
    }
    run_parts(r, p, cudnn, &mut d, &reference)
}

/// The layer norm's graph formulation (one cuDNN normalization kernel per call):
/// `fwd-graph` ([`Cudnn::layer_norm_forward_graph`]), `train-graph`
/// ([`Cudnn::layer_norm_forward_training_graph`]), `bwd-graph`
/// ([`Cudnn::layer_norm_backward_graph`]) and `train_bwd-graph`, compared with
/// `reductions` as the other formulations are. The plans are built before the first timed call.
fn run_graph(
    r: &mut Runner,
    p: &Problem,
    cudnn: &Cudnn,
    d: &mut Data,
    reference: &Reference,
) -> BoxResult<()> {
    let stream = r.stream;
    let nb = p.nb();
    let ops: Vec<String> = ["fwd", "train", "bwd", "train_bwd"]
        .iter()
        .map(|k| p.op(&format!("{k}-graph")))
        .collect();
    if !r.any_selected(&ops) {
        for op in &ops {
            list_only(r.c, GROUP, &[op.as_str()]);
        }
        return Ok(());
    }
    let ln = LayerNorm::<f32>::new(&Layout::nchw_nd(p.dims)?, 1, EPS)?;
    if let Err(e) = ln
        .build_graph_plan(cudnn)
        .and_then(|()| ln.build_graph_training_plans(cudnn))
    {
        for op in &ops {
            print_op_error(op, &e);
        }
        return Ok(());
    }
    let diff = |d: &Data| -> BoxResult<String> {
        Ok(format!(
            "\"max_abs_diff\": {{\"dx\": {}, \"dgamma\": {}, \"dbeta\": {}}}",
            max_abs_diff(stream, &d.dx, &reference.dx)?,
            max_abs_diff(stream, &d.dgamma, &reference.dgamma)?,
            max_abs_diff(stream, &d.dbeta, &reference.dbeta)?
        ))
    };
    // The two forwards (inference, training), each checked against `reductions` first.
    for (op, training) in [(&ops[0], false), (&ops[1], true)] {
        if !r.selected(op) {
            continue;
        }
        let Data {
            x,
            gamma,
            beta,
            y,
            ws,
            ..
        } = &mut *d;
        let mut call = |y: &mut CudaSlice<f32>| -> cudnn_safe::Result<()> {
            if training {
                cudnn.layer_norm_forward_training_graph(&ln, x, gamma, beta, y, ws)?;
                Ok(())
            } else {
                cudnn.layer_norm_forward_graph(&ln, x, gamma, beta, y, ws)
            }
        };
        let note = match call(y) {
            Ok(()) => Some(format!(
                "\"max_abs_diff\": {}",
                max_abs_diff(stream, y, &reference.y)?
            )),
            Err(_) => None,
        };
        r.bench(op, Some(2.0 * nb), note, &mut || Ok(call(y)?));
    }
    if r.selected(&ops[2]) {
        // The saved values keep `d.x` borrowed: the calls below name the other fields.
        let saved = cudnn
            .layer_norm_forward_training_graph(&ln, &d.x, &d.gamma, &d.beta, &mut d.y, &mut d.ws);
        match saved {
            Err(e) => print_op_error(&ops[2], &e),
            Ok(saved) => {
                macro_rules! call {
                    () => {
                        cudnn.layer_norm_backward_graph(
                            &ln,
                            &saved,
                            &d.x,
                            &d.dy,
                            &d.gamma,
                            &mut d.dx,
                            &mut d.dgamma,
                            &mut d.dbeta,
                            &mut d.ws,
                        )
                    };
                }
                let note = match call!() {
                    Ok(()) => Some(diff(d)?),
                    Err(_) => None,
                };
                r.bench(&ops[2], Some(3.0 * nb), note, &mut || Ok(call!()?));
            }
        }
    }
    if r.selected(&ops[3]) {
        r.bench(&ops[3], None, None, &mut || {
            let Data {
                x,
                dy,
                gamma,
                beta,
                y,
                dx,
                dgamma,
                dbeta,
                ws,
                ..
            } = d;
            let saved = cudnn.layer_norm_forward_training_graph(&ln, x, gamma, beta, y, ws)?;
            cudnn.layer_norm_backward_graph(&ln, &saved, x, dy, gamma, dx, dgamma, dbeta, ws)?;
            Ok(())
        });
    }
    Ok(())
}

/// [`RmsNorm`] (cuDNN's fused RMS-norm graphs) on `rows × d` of `T`: ops `<name>-fwd`
/// (inference), `-train` (y and r), `-bwd` (dx, dγ) and `-train_bwd`; bytes as the other
/// lines count them. The plans are built before the first timed call.
fn run_rms<T: NormType + DataType>(
    r: &mut Runner,
    name: &str,
    [rows, d]: [usize; 2],
    cudnn: &Cudnn,
) -> BoxResult<()> {
    let ops: Vec<String> = ["fwd", "train", "bwd", "train_bwd"]
        .iter()
        .map(|k| format!("{name}-{k}"))
        .collect();
    if !r.any_selected(&ops) {
        for op in &ops {
            list_only(r.c, GROUP, &[op.as_str()]);
        }
        return Ok(());
    }
    let stream = r.stream;
    let n = rows * d;
    let nb = (n * std::mem::size_of::<T>()) as f64;
    let rn = RmsNorm::<T>::new(&Layout::nchw_nd(&[rows as i64, d as i64])?, 1, 1e-6)?;
    if let Err(e) = rn
        .build_plan(cudnn)
        .and_then(|()| rn.build_training_plans(cudnn))
    {
        for op in &ops {
            print_op_error(op, &e);
        }
        return Ok(());
    }
    let weight: Vec<T> = values::<f32>(d, 0.5)
        .iter()
        .map(|v| T::from_f64(f64::from(v + 1.0)))
        .collect();
    let x = stream.clone_htod(&values::<T>(n, 2.0))?;
    let dy = stream.clone_htod(&values::<T>(n, 1.0))?;
    let gamma = stream.clone_htod(&weight)?;
    let mut y = stream.alloc_zeros::<T>(n)?;
    let mut dx = stream.alloc_zeros::<T>(n)?;
    let mut dgamma = stream.alloc_zeros::<T>(d)?;
    let mut ws = Workspace::new(stream.clone());
    if r.selected(&ops[0]) {
        r.bench(&ops[0], Some(2.0 * nb), None, &mut || {
            Ok(cudnn.rms_norm_forward(&rn, &x, &gamma, &mut y, &mut ws)?)
        });
    }
    if r.selected(&ops[1]) {
        r.bench(&ops[1], Some(2.0 * nb), None, &mut || {
            cudnn.rms_norm_forward_training(&rn, &x, &gamma, &mut y, &mut ws)?;
            Ok(())
        });
    }
    if r.selected(&ops[2]) {
        let saved = cudnn.rms_norm_forward_training(&rn, &x, &gamma, &mut y, &mut ws)?;
        r.bench(&ops[2], Some(3.0 * nb), None, &mut || {
            Ok(cudnn.rms_norm_backward(
                &rn,
                &saved,
                &x,
                &dy,
                &gamma,
                &mut dx,
                &mut dgamma,
                &mut ws,
            )?)
        });
    }
    if r.selected(&ops[3]) {
        r.bench(&ops[3], None, None, &mut || {
            let saved = cudnn.rms_norm_forward_training(&rn, &x, &gamma, &mut y, &mut ws)?;
            cudnn.rms_norm_backward(&rn, &saved, &x, &dy, &gamma, &mut dx, &mut dgamma, &mut ws)?;
            Ok(())
        });
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
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    let json_only = std::env::var("NORM_BENCH_JSON_ONLY").as_deref() == Ok("1");
    let mut runner = Runner {
        c: &mut c,
        args: &args,
        stream: &stream,
        json_only,
        summary: Vec::new(),
    };
    let mut outcome = Ok(());
    for p in [&LN, &GN] {
        if let Err(e) = run_problem(&mut runner, p, &stream, &cudnn) {
            outcome = Err(e);
            break;
        }
    }
    if outcome.is_ok() {
        outcome = run_rms::<f32>(&mut runner, "rms_fp32_32768x1024", [32768, 1024], &cudnn)
            .and_then(|()| {
                run_rms::<bf16>(&mut runner, "rms_bf16_16384x4096", [16384, 4096], &cudnn)
            });
    }
    print_summary(&runner.summary, 56);
    c.final_summary();
    exit_on_error("norm", outcome);
}
