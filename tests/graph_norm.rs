//! Tests of the graph normalizations: layer, RMS, instance and batch norm as cuDNN
//! `NORM_FORWARD` / `NORM_BACKWARD` operations, and group norm built on layer norm plus a
//! per-channel affine step in the same graph.
//!
//! Host tests (no GPU; the cuDNN library finalizes the descriptors when it can be loaded): output
//! shapes and layouts, shape errors naming the tensor, f64 refused with `UnsupportedDataType`,
//! group-norm view rules, signatures.
//!
//! GPU tests: every mode forward (training: y and statistics, running statistics for batch norm;
//! inference) and backward (dx, dscale, dbias against the analytic gradients) against f64
//! references computed from the values as stored, for f32, f16 and bf16 data with f32 scale,
//! bias and statistics (cudnn-frontend's configuration), in the channels-last layout of
//! cudnn-frontend's samples. Outputs are poisoned with NaN; a buffer one element short is
//! refused when the plan executes and every output keeps its sentinel.
//!
//! The configurations cudnn-frontend's samples and tests run ("required") must get a plan on the
//! GPU, or the test fails. Others (NCHW instance / batch norm, NHWC group norm) are exercised
//! when cuDNN offers a plan and otherwise only required to fail with a typed error; the test
//! prints which happened.
mod common;

use std::sync::Arc;

use common::graph_io::{fetch, poisoned, upload};
use common::{
    assert_untouched, download, gpu, have_cudnn, offsets, sentinel_buffer, to_f64, tol, Kind, Rng,
};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::graph::{
    Args, BatchNormRunning, Graph, GroupNormMethod, OperationGraph, Plan, PlanFilter,
    PointwiseMode, TensorId,
};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::{Cudnn, DType, DataType, Error, Workspace};

const EPS: f64 = 1e-5;
const MOMENTUM: f64 = 0.1;

// ---------------------------------------------------------------------------------------------
// Modes and shapes
// ---------------------------------------------------------------------------------------------

/// What a test case normalizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Layer,
    Rms,
    Instance,
    Batch,
    /// Batch norm, inference phase (statistics are inputs).
    BatchInference,
    /// Group norm with this many groups, in this formulation, with or without the fused
    /// per-channel affine step.
    Group(i64, GroupNormMethod, bool),
}

impl Mode {
    /// x's dimensions: rows of 128 for layer / RMS norm (`[N, D, 1, 1]`, as cudnn-frontend's
    /// samples), small images for the others (channels a multiple of 8, as every sample has).
    fn x_dims(self) -> Vec<i64> {
        match self {
            Mode::Layer | Mode::Rms => vec![8, 128, 1, 1],
            Mode::Instance => vec![2, 16, 6, 5],
            Mode::Batch | Mode::BatchInference => vec![4, 16, 5, 4],
            Mode::Group(..) => vec![2, 16, 6, 5],
        }
    }

    /// Dimensions of scale and bias.
    fn param_dims(self) -> Vec<i64> {
        let x = self.x_dims();
        match self {
            Mode::Layer | Mode::Rms => vec![1, x[1], x[2], x[3]],
            _ => vec![1, x[1], 1, 1],
        }
    }

    /// Dimensions of the statistics (mean, inverse standard deviation / RMS).
    fn stats_dims(self) -> Vec<i64> {
        let x = self.x_dims();
        match self {
            Mode::Layer | Mode::Rms => vec![x[0], 1, 1, 1],
            Mode::Instance => vec![x[0], x[1], 1, 1],
            Mode::Batch | Mode::BatchInference => vec![1, x[1], 1, 1],
            Mode::Group(g, ..) => vec![x[0], g, 1, 1],
        }
    }
}

fn count(d: &[i64]) -> usize {
    d.iter().product::<i64>() as usize
}

/// For each element of x (logical row-major order of `[N, C, S]`), the statistics group it
/// belongs to and the scale / bias element it is multiplied with.
struct Groups {
    group: Vec<usize>,
    param: Vec<usize>,
    ngroups: usize,
    nparams: usize,
}

fn groups(mode: Mode) -> Groups {
    groups_of(mode, &mode.x_dims())
}

/// [`groups`] for x of dimensions `x` (`[N, C, H, W]`).
fn groups_of(mode: Mode, x: &[i64]) -> Groups {
    let (n, c) = (x[0] as usize, x[1] as usize);
    let s = (x[2] * x[3]) as usize;
    let mut group = Vec::with_capacity(n * c * s);
    let mut param = Vec::with_capacity(n * c * s);
    for ni in 0..n {
        for ci in 0..c {
            for si in 0..s {
                let (gi, pi) = match mode {
                    Mode::Layer | Mode::Rms => (ni, ci * s + si),
                    Mode::Instance => (ni * c + ci, ci),
                    Mode::Batch | Mode::BatchInference => (ci, ci),
                    Mode::Group(g, ..) => {
                        let g = g as usize;
                        (ni * g + ci / (c / g), ci)
                    }
                };
                group.push(gi);
                param.push(pi);
            }
        }
    }
    let (ngroups, nparams) = match mode {
        Mode::Layer | Mode::Rms => (n, c * s),
        Mode::Instance => (n * c, c),
        Mode::Batch | Mode::BatchInference => (c, c),
        Mode::Group(g, ..) => (n * g as usize, c),
    };
    Groups {
        group,
        param,
        ngroups,
        nparams,
    }
}

/// Per-group mean (0 for RMS norm) and inverse standard deviation `1/√(var + ε)` (biased) or
/// inverse RMS `1/√(mean(x²) + ε)`, and the biased variance.
fn stats_ref(gr: &Groups, x: &[f64], rms: bool) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut sum = vec![0.0; gr.ngroups];
    let mut cnt = vec![0.0; gr.ngroups];
    for (i, &v) in x.iter().enumerate() {
        sum[gr.group[i]] += v;
        cnt[gr.group[i]] += 1.0;
    }
    let mean: Vec<f64> = if rms {
        vec![0.0; gr.ngroups]
    } else {
        sum.iter().zip(&cnt).map(|(s, c)| s / c).collect()
    };
    let mut sq = vec![0.0; gr.ngroups];
    for (i, &v) in x.iter().enumerate() {
        sq[gr.group[i]] += (v - mean[gr.group[i]]).powi(2);
    }
    let var: Vec<f64> = sq.iter().zip(&cnt).map(|(s, c)| s / c).collect();
    let inv = var.iter().map(|v| 1.0 / (v + EPS).sqrt()).collect();
    (mean, inv, var)
}

/// `y = (x − mean) · inv · scale + bias`.
fn forward_ref(
    gr: &Groups,
    x: &[f64],
    mean: &[f64],
    inv: &[f64],
    scale: &[f64],
    bias: Option<&[f64]>,
) -> Vec<f64> {
    (0..x.len())
        .map(|i| {
            let (g, p) = (gr.group[i], gr.param[i]);
            (x[i] - mean[g]) * inv[g] * scale[p] + bias.map_or(0.0, |b| b[p])
        })
        .collect()
}

/// Analytic gradients of `y = x̂ · scale + bias` with `x̂ = (x − mean) · inv` and the statistics
/// of each group computed from x: `dx = inv · (g − mean(g) − x̂ · mean(g · x̂))` with
/// `g = dy · scale` (RMS norm: no mean subtracted, so no `mean(g)` term), `dscale = Σ dy · x̂`,
/// `dbias = Σ dy`, sums over every element sharing the parameter.
fn backward_ref(
    gr: &Groups,
    x: &[f64],
    dy: &[f64],
    scale: &[f64],
    mean: &[f64],
    inv: &[f64],
    rms: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let n = x.len();
    let xhat: Vec<f64> = (0..n)
        .map(|i| (x[i] - mean[gr.group[i]]) * inv[gr.group[i]])
        .collect();
    let gv: Vec<f64> = (0..n).map(|i| dy[i] * scale[gr.param[i]]).collect();
    let mut cnt = vec![0.0; gr.ngroups];
    let mut mg = vec![0.0; gr.ngroups];
    let mut mgx = vec![0.0; gr.ngroups];
    for i in 0..n {
        let g = gr.group[i];
        cnt[g] += 1.0;
        mg[g] += gv[i];
        mgx[g] += gv[i] * xhat[i];
    }
    for g in 0..gr.ngroups {
        mg[g] /= cnt[g];
        mgx[g] /= cnt[g];
    }
    let dx = (0..n)
        .map(|i| {
            let g = gr.group[i];
            let centre = if rms { 0.0 } else { mg[g] };
            inv[g] * (gv[i] - centre - xhat[i] * mgx[g])
        })
        .collect();
    let mut ds = vec![0.0; gr.nparams];
    let mut db = vec![0.0; gr.nparams];
    for i in 0..n {
        ds[gr.param[i]] += dy[i] * xhat[i];
        db[gr.param[i]] += dy[i];
    }
    (dx, ds, db)
}

// ---------------------------------------------------------------------------------------------
// Host-only tests
// ---------------------------------------------------------------------------------------------

/// An input of `dims` in the given layout.
fn input(g: &mut Graph, name: &'static str, dims: &[i64], nhwc: bool, dt: DType) -> TensorId {
    if nhwc {
        g.tensor_nhwc(name, dims, dt).unwrap()
    } else {
        g.tensor_nchw(name, dims, dt).unwrap()
    }
}

/// The tensors of a forward graph.
struct Fwd {
    g: Graph,
    x: TensorId,
    /// `None` for group norm without the affine step.
    scale: Option<TensorId>,
    bias: Option<TensorId>,
    /// Batch-norm inference: the statistics inputs; batch-norm training: previous running
    /// statistics; group norm: the unit scale and zero bias.
    extra_in: Option<(TensorId, TensorId)>,
    y: TensorId,
    /// (mean, inverse std / RMS); mean is `None` for RMS norm.
    stats: Option<(Option<TensorId>, TensorId)>,
    /// Next running mean and variance (batch norm with running statistics).
    running: Option<(TensorId, TensorId)>,
}

/// A forward graph of `mode` on x of type `dt` (f32 scale, bias and statistics).
fn fwd_graph(mode: Mode, dt: DType, nhwc: bool, training: bool, with_bias: bool) -> Fwd {
    let mut g = Graph::new(dt, DType::F32, DType::F32);
    let x = input(&mut g, "x", &mode.x_dims(), nhwc, dt);
    let pd = mode.param_dims();
    let has_scale = !matches!(mode, Mode::Group(_, _, false));
    let scale_in = has_scale.then(|| input(&mut g, "scale", &pd, nhwc, DType::F32));
    let bias = (with_bias && has_scale).then(|| input(&mut g, "bias", &pd, nhwc, DType::F32));
    let scale = scale_in.unwrap_or(x);
    let (y, stats, extra_in, running) = match mode {
        Mode::Layer => {
            let o = g
                .layer_norm(x, scale, bias.unwrap(), EPS, training)
                .unwrap();
            (o.y, o.stats.map(|(m, v)| (Some(m), v)), None, None)
        }
        Mode::Rms => {
            let o = g.rms_norm(x, scale, bias, EPS, training).unwrap();
            (o.y, o.inv_rms.map(|v| (None, v)), None, None)
        }
        Mode::Instance => {
            let o = g
                .instance_norm(x, scale, bias.unwrap(), EPS, training)
                .unwrap();
            (o.y, o.stats.map(|(m, v)| (Some(m), v)), None, None)
        }
        Mode::Batch => {
            let sd = mode.stats_dims();
            let pm = input(&mut g, "prev_mean", &sd, nhwc, DType::F32);
            let pv = input(&mut g, "prev_var", &sd, nhwc, DType::F32);
            let run = BatchNormRunning {
                mean: pm,
                var: pv,
                momentum: MOMENTUM,
            };
            let o = g
                .batch_norm(x, scale, bias.unwrap(), EPS, Some(run))
                .unwrap();
            (
                o.y,
                Some((Some(o.mean), o.inv_var)),
                Some((pm, pv)),
                o.running,
            )
        }
        Mode::BatchInference => {
            let sd = mode.stats_dims();
            let m = input(&mut g, "mean", &sd, nhwc, DType::F32);
            let v = input(&mut g, "inv_var", &sd, nhwc, DType::F32);
            let y = g
                .batch_norm_inference(x, scale, bias.unwrap(), m, v)
                .unwrap();
            (y, None, Some((m, v)), None)
        }
        Mode::Group(groups, method, _) => {
            let o = g
                .group_norm_with(x, groups, scale_in.zip(bias), EPS, training, method)
                .unwrap();
            (
                o.y,
                o.stats.map(|(m, v)| (Some(m), v)),
                Some((o.unit_scale, o.zero_bias)),
                None,
            )
        }
    };
    g.mark_output(y).unwrap();
    if let Some((m, v)) = stats {
        if let Some(m) = m {
            g.mark_output_as(m, DType::F32).unwrap();
        }
        g.mark_output_as(v, DType::F32).unwrap();
    }
    if let Some((m, v)) = running {
        g.mark_output_as(m, DType::F32).unwrap();
        g.mark_output_as(v, DType::F32).unwrap();
    }
    Fwd {
        g,
        x,
        scale: scale_in,
        bias,
        extra_in,
        y,
        stats,
        running,
    }
}

/// The tensors of a backward graph.
struct Bwd {
    g: Graph,
    dy: TensorId,
    x: TensorId,
    scale: TensorId,
    mean: Option<TensorId>,
    inv: TensorId,
    dx: TensorId,
    dscale: TensorId,
    dbias: Option<TensorId>,
}

/// A backward graph of `mode` (layer, RMS, instance or batch) on dy, x, dx of type `dt`.
fn bwd_graph(mode: Mode, dt: DType, nhwc: bool, with_dbias: bool) -> Bwd {
    let mut g = Graph::new(dt, DType::F32, DType::F32);
    let xd = mode.x_dims();
    let dy = input(&mut g, "dy", &xd, nhwc, dt);
    let x = input(&mut g, "x", &xd, nhwc, dt);
    let scale = input(&mut g, "scale", &mode.param_dims(), nhwc, DType::F32);
    let sd = mode.stats_dims();
    let mean = (mode != Mode::Rms).then(|| input(&mut g, "mean", &sd, nhwc, DType::F32));
    let inv = input(&mut g, "inv_var", &sd, nhwc, DType::F32);
    let (dx, dscale, dbias) = match mode {
        Mode::Layer => {
            let r = g
                .layer_norm_backward(dy, x, scale, mean.unwrap(), inv)
                .unwrap();
            (r.dx, r.dscale, Some(r.dbias))
        }
        Mode::Rms => {
            let r = g.rms_norm_backward(dy, x, scale, inv, with_dbias).unwrap();
            (r.dx, r.dscale, r.dbias)
        }
        Mode::Instance => {
            let r = g
                .instance_norm_backward(dy, x, scale, mean.unwrap(), inv)
                .unwrap();
            (r.dx, r.dscale, Some(r.dbias))
        }
        Mode::Batch => {
            let r = g
                .batch_norm_backward(dy, x, scale, mean.unwrap(), inv)
                .unwrap();
            (r.dx, r.dscale, Some(r.dbias))
        }
        m => panic!("no backward graph for {m:?}"),
    };
    g.mark_output(dx).unwrap();
    g.mark_output_as(dscale, DType::F32).unwrap();
    if let Some(db) = dbias {
        g.mark_output_as(db, DType::F32).unwrap();
    }
    Bwd {
        g,
        dy,
        x,
        scale,
        mean,
        inv,
        dx,
        dscale,
        dbias,
    }
}

#[test]
fn host_output_shapes_layouts_and_types() {
    for mode in [Mode::Layer, Mode::Rms, Mode::Instance, Mode::Batch] {
        let f = fwd_graph(mode, DType::F16, true, true, true);
        let g = &f.g;
        assert_eq!(g.dims(f.y).unwrap(), &mode.x_dims()[..], "{mode:?} y");
        assert_eq!(
            g.strides(f.y).unwrap(),
            g.strides(f.x).unwrap(),
            "{mode:?} y"
        );
        assert_eq!(g.dtype(f.y).unwrap(), DType::F16);
        let (m, v) = f.stats.expect("training gives statistics");
        assert_eq!(
            m.is_none(),
            mode == Mode::Rms,
            "{mode:?}: RMS norm has no mean"
        );
        for t in m.into_iter().chain([v]) {
            assert_eq!(g.dims(t).unwrap(), &mode.stats_dims()[..], "{mode:?} stats");
            assert_eq!(g.dtype(t).unwrap(), DType::F32);
            assert!(!g.is_virtual(t).unwrap());
        }
        // Statistics follow x's memory order: channels-last `[.., C, 1, 1]` as cudnn-frontend.
        let sd = mode.stats_dims();
        assert_eq!(
            g.strides(v).unwrap(),
            &common::channels_last_strides(&sd)[..],
            "{mode:?} stats strides"
        );
        assert_eq!(f.running.is_some(), mode == Mode::Batch);
        if let Some((nm, nv)) = f.running {
            for t in [nm, nv] {
                assert_eq!(g.dims(t).unwrap(), &sd[..]);
            }
        }
    }
    for mode in [Mode::Layer, Mode::Rms, Mode::Instance] {
        let f = fwd_graph(mode, DType::F32, false, false, true);
        assert!(f.stats.is_none(), "{mode:?}: inference gives no statistics");
    }
    let f = fwd_graph(Mode::BatchInference, DType::BF16, true, false, true);
    assert!(f.stats.is_none() && f.running.is_none() && f.extra_in.is_some());
    let f = fwd_graph(Mode::Rms, DType::F32, true, true, false);
    assert!(f.bias.is_none());
    for mode in [Mode::Layer, Mode::Rms, Mode::Instance, Mode::Batch] {
        let b = bwd_graph(mode, DType::BF16, true, mode != Mode::Rms);
        let g = &b.g;
        assert_eq!(g.dims(b.dx).unwrap(), &mode.x_dims()[..]);
        assert_eq!(g.strides(b.dx).unwrap(), g.strides(b.dy).unwrap());
        assert_eq!(g.dims(b.dscale).unwrap(), &mode.param_dims()[..]);
        assert_eq!(g.strides(b.dscale).unwrap(), g.strides(b.scale).unwrap());
        assert_eq!(b.dbias.is_none(), mode == Mode::Rms);
        assert_eq!(b.mean.is_none(), mode == Mode::Rms);
    }
    let b = bwd_graph(Mode::Rms, DType::F32, true, true);
    assert!(b.dbias.is_some());

    // Signatures tell the modes and phases apart; layer norm keeps its earlier spelling.
    let sigs: Vec<String> = [
        (Mode::Layer, true),
        (Mode::Layer, false),
        (Mode::Rms, true),
        (Mode::Instance, true),
        (Mode::Batch, true),
        (Mode::BatchInference, false),
    ]
    .map(|(mode, training)| {
        fwd_graph(mode, DType::F32, true, training, true)
            .g
            .signature()
    })
    .into();
    for (i, a) in sigs.iter().enumerate() {
        for b in &sigs[i + 1..] {
            assert_ne!(a, b);
        }
    }
    assert!(sigs[0].contains("ln("), "{}", sigs[0]);
    let lb = bwd_graph(Mode::Layer, DType::F32, true, true).g.signature();
    assert!(lb.contains("lnb("), "{lb}");

    // cuDNN's own validation of every descriptor (no GPU needed).
    if !have_cudnn() {
        return;
    }
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for nhwc in [true, false] {
            for mode in [
                Mode::Layer,
                Mode::Rms,
                Mode::Instance,
                Mode::Batch,
                Mode::Group(4, GroupNormMethod::InstanceNormView, true),
                Mode::Group(4, GroupNormMethod::InstanceNormView, false),
                Mode::Group(4, GroupNormMethod::LayerNormView, true),
                Mode::Group(4, GroupNormMethod::LayerNormView, false),
            ] {
                for training in [true, false] {
                    let f = fwd_graph(mode, dt, nhwc, training || mode == Mode::Batch, true);
                    common::check_with_record(&f.g).unwrap_or_else(|e| {
                        panic!("{mode:?} {dt} nhwc {nhwc} training {training}: {e}")
                    });
                }
                if !matches!(mode, Mode::Group(..)) {
                    let b = bwd_graph(mode, dt, nhwc, true);
                    common::check_with_record(&b.g)
                        .unwrap_or_else(|e| panic!("{mode:?} backward {dt} nhwc {nhwc}: {e}"));
                }
            }
            let f = fwd_graph(Mode::BatchInference, dt, nhwc, false, true);
            common::check_with_record(&f.g)
                .unwrap_or_else(|e| panic!("batch norm inference {dt} nhwc {nhwc}: {e}"));
            let f = fwd_graph(Mode::Rms, dt, nhwc, true, false);
            common::check_with_record(&f.g)
                .unwrap_or_else(|e| panic!("RMS norm without bias {dt}: {e}"));
            let b = bwd_graph(Mode::Rms, dt, nhwc, false);
            common::check_with_record(&b.g)
                .unwrap_or_else(|e| panic!("RMS norm backward without dbias {dt}: {e}"));
        }
    }
}

/// f64 has no norm engine: refused with `UnsupportedDataType` before cuDNN sees the graph, for
/// data, parameters or statistics of f64.
#[test]
fn host_f64_is_refused_by_type() {
    // The type check runs where the descriptors are made, so it needs the library.
    if !have_cudnn() {
        return;
    }
    for mode in [
        Mode::Layer,
        Mode::Rms,
        Mode::Instance,
        Mode::Batch,
        Mode::BatchInference,
    ] {
        let f = fwd_graph(mode, DType::F64, true, mode != Mode::BatchInference, true);
        let r = f.g.check();
        assert!(
            matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
            "{mode:?}: {r:?}"
        );
        assert!(format!("{r:?}").contains('x'), "{r:?}");
    }
    let b = bwd_graph(Mode::Instance, DType::F64, true, true);
    let r = b.g.check();
    assert!(
        matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
        "{r:?}"
    );
    // f32 data with f64 statistics marked as outputs.
    let mut f = fwd_graph(Mode::Layer, DType::F32, true, true, true);
    let (m, _) = f.stats.unwrap();
    f.g.mark_output_as(m.unwrap(), DType::F64).unwrap();
    let r = f.g.check();
    assert!(
        matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
        "{r:?}"
    );
    assert!(format!("{r:?}").contains("layer_norm.mean"), "{r:?}");
}

/// Asserts `r` is an error of kind `kind` whose structured `Debug` form contains `name`.
fn named<T: std::fmt::Debug>(r: &cudnn_safe::Result<T>, kind: Kind, name: &str) {
    assert!(matches!(r, Err(e) if kind(e)), "{name}: {r:?}");
    assert!(format!("{r:#?}").contains(name), "{name}: {r:#?}");
}

#[test]
fn host_shape_errors_name_the_tensor() {
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let x = g.tensor_nhwc("x", &[4, 16, 3, 3], DType::F32).unwrap();
    let x2 = g.tensor_nchw("x2", &[4, 16], DType::F32).unwrap();
    let c = g.tensor_nhwc("c", &[1, 16, 1, 1], DType::F32).unwrap();
    let c_bad = g.tensor_nhwc("c_bad", &[1, 15, 1, 1], DType::F32).unwrap();
    let row = g.tensor_nhwc("row", &[1, 16, 3, 3], DType::F32).unwrap();
    let nc = g.tensor_nhwc("nc", &[4, 16, 1, 1], DType::F32).unwrap();
    let n1 = g.tensor_nhwc("n1", &[4, 1, 1, 1], DType::F32).unwrap();
    let sc = g.scalar("sc", 1.0, DType::F32).unwrap();
    // RMS norm: scale and bias are x's dims with N = 1.
    named(
        &g.rms_norm(x, c, None, EPS, true),
        kind!(ShapeMismatch),
        "\"c\"",
    );
    named(
        &g.rms_norm(x, row, Some(c_bad), EPS, true),
        kind!(ShapeMismatch),
        "c_bad",
    );
    named(
        &g.rms_norm(x2, row, None, EPS, true),
        kind!(InvalidArgument),
        "`x2`",
    );
    named(
        &g.rms_norm(x, sc, None, EPS, true),
        kind!(ShapeMismatch),
        "\"sc\"",
    );
    for eps in [f64::NAN, -1.0, f64::INFINITY] {
        let r = g.rms_norm(x, row, None, eps, true);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "eps {eps}: {r:?}"
        );
    }
    // Instance and batch norm: scale and bias are [1, C, 1, 1].
    named(
        &g.instance_norm(x, row, c, EPS, true),
        kind!(ShapeMismatch),
        "\"row\"",
    );
    named(
        &g.instance_norm(x, c, c_bad, EPS, true),
        kind!(ShapeMismatch),
        "c_bad",
    );
    named(
        &g.batch_norm(x, c_bad, c, EPS, None),
        kind!(ShapeMismatch),
        "c_bad",
    );
    let run = |mean, var, momentum| {
        Some(BatchNormRunning {
            mean,
            var,
            momentum,
        })
    };
    named(
        &g.batch_norm(x, c, c, EPS, run(nc, c, 0.1)),
        kind!(ShapeMismatch),
        "\"nc\"",
    );
    named(
        &g.batch_norm(x, c, c, EPS, run(c, c_bad, 0.1)),
        kind!(ShapeMismatch),
        "c_bad",
    );
    for m in [-0.1, 1.5, f64::NAN] {
        let r = g.batch_norm(x, c, c, EPS, run(c, c, m));
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "momentum {m}: {r:?}"
        );
    }
    named(
        &g.batch_norm_inference(x, c, c, nc, c),
        kind!(ShapeMismatch),
        "\"nc\"",
    );
    named(
        &g.batch_norm_inference(x, c, c, c, c_bad),
        kind!(ShapeMismatch),
        "c_bad",
    );
    // Backward: dy like x; statistics of the mode's shape.
    named(
        &g.rms_norm_backward(nc, x, row, n1, true),
        kind!(ShapeMismatch),
        "\"nc\"",
    );
    named(
        &g.rms_norm_backward(x, x, row, nc, true),
        kind!(ShapeMismatch),
        "\"nc\"",
    );
    named(
        &g.instance_norm_backward(x, x, c, n1, nc),
        kind!(ShapeMismatch),
        "\"n1\"",
    );
    named(
        &g.instance_norm_backward(x, x, row, nc, nc),
        kind!(ShapeMismatch),
        "\"row\"",
    );
    named(
        &g.batch_norm_backward(x, x, c, nc, c),
        kind!(ShapeMismatch),
        "\"nc\"",
    );
    named(
        &g.batch_norm_backward(x, x, c, c, c_bad),
        kind!(ShapeMismatch),
        "c_bad",
    );
    let mut other = Graph::new(DType::F32, DType::F32, DType::F32);
    let foreign = other
        .tensor_nhwc("foreign", &[1, 16, 1, 1], DType::F32)
        .unwrap();
    let r = g.batch_norm_backward(x, x, foreign, c, c);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    // Rejected calls left the graph unchanged: no operation, no stray scalar. (Without the
    // cuDNN library, the check stops at loading it.)
    let r = g.check();
    if cudnn_safe::sys::library().is_ok() {
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    } else {
        assert!(matches!(r, Err(Error::Load(_))), "{r:?}");
    }
    let before = g.signature();
    assert!(!before.contains("norm"), "{before}");
    assert_eq!(
        before.matches("/s").count(),
        1,
        "only `sc` is a scalar: {before}"
    );
}

/// The layout group norm's x `[2, 16, 6, 5]` is declared with, and the group view the graph
/// made of it.
fn declared_and_view(
    g: &Graph,
    x: TensorId,
    nhwc: bool,
) -> (cudnn_safe::Layout, cudnn_safe::Layout) {
    let declared = if nhwc {
        cudnn_safe::Layout::nhwc_nd(&[2, 16, 6, 5]).unwrap()
    } else {
        cudnn_safe::Layout::nchw_nd(&[2, 16, 6, 5]).unwrap()
    };
    let view = cudnn_safe::Layout::strided(g.dims(x).unwrap(), g.strides(x).unwrap()).unwrap();
    (declared, view)
}

/// The offsets a layout addresses, sorted.
fn sorted_offsets(l: &cudnn_safe::Layout) -> Vec<usize> {
    let mut o = offsets(l.dims(), l.strides());
    o.sort();
    o
}

/// Group norm's scale and bias `s`, `b` of `[1, 12, 1, 1]` (f32 NCHW).
fn group_scale_bias(g: &mut Graph) -> (TensorId, TensorId) {
    let s = g.tensor_nchw("s", &[1, 12, 1, 1], DType::F32).unwrap();
    let b = g.tensor_nchw("b", &[1, 12, 1, 1], DType::F32).unwrap();
    (s, b)
}

#[test]
fn host_group_norm_view_and_rules() {
    // The layer-norm view: x [N, G, C/G, S], scale and bias [1, G, C/G, 1], statistics
    // [N, G, 1, 1].
    for nhwc in [false, true] {
        let f = fwd_graph(
            Mode::Group(4, GroupNormMethod::LayerNormView, true),
            DType::F16,
            nhwc,
            true,
            true,
        );
        let g = &f.g;
        assert_eq!(g.dims(f.x).unwrap(), &[2, 4, 4, 30]);
        assert_eq!(g.dims(f.scale.unwrap()).unwrap(), &[1, 4, 4, 1]);
        assert_eq!(g.dims(f.y).unwrap(), &[2, 4, 4, 30]);
        assert_eq!(g.strides(f.y).unwrap(), g.strides(f.x).unwrap());
        let want_x: &[i64] = if nhwc {
            &[480, 4, 1, 16]
        } else {
            &[480, 120, 30, 1]
        };
        assert_eq!(g.strides(f.x).unwrap(), want_x, "nhwc {nhwc}");
        let (m, v) = f.stats.unwrap();
        assert_eq!(g.dims(m.unwrap()).unwrap(), &[2, 4, 1, 1]);
        assert_eq!(g.dims(v).unwrap(), &[2, 4, 1, 1]);
        let (unit, zero) = f.extra_in.unwrap();
        for t in [unit, zero] {
            assert_eq!(g.dims(t).unwrap(), &[1, 1, 4, 30]);
            assert_eq!(g.dtype(t).unwrap(), DType::F32);
        }
        // The x buffer of the declared layout still fits: same span.
        let (declared, view) = declared_and_view(g, f.x, nhwc);
        assert_eq!(view.span(), declared.span());
        assert_eq!(
            sorted_offsets(&view),
            sorted_offsets(&declared),
            "the view addresses exactly x's elements"
        );
    }
    // The instance-norm view (the default): x [N, G, C/G, S, 1] (packed NCHW: strides
    // [C·S, (C/G)·S, S, 1, 1]), scale and bias [1, G, C/G, 1, 1], statistics [N, G, 1, 1, 1],
    // unit scale and zero bias [1, G, 1, 1, 1]; without the affine step y is the
    // normalization's output and no scale or bias is read.
    for (nhwc, affine) in [(false, true), (true, true), (false, false), (true, false)] {
        let mode = Mode::Group(4, GroupNormMethod::InstanceNormView, affine);
        let f = fwd_graph(mode, DType::BF16, nhwc, true, true);
        let g = &f.g;
        assert_eq!(g.dims(f.x).unwrap(), &[2, 4, 4, 30, 1]);
        let want_x: &[i64] = if nhwc {
            &[480, 4, 1, 16, 16]
        } else {
            &[480, 120, 30, 1, 1]
        };
        assert_eq!(g.strides(f.x).unwrap(), want_x, "nhwc {nhwc}");
        assert_eq!(g.dims(f.y).unwrap(), &[2, 4, 4, 30, 1]);
        assert_eq!(g.strides(f.y).unwrap(), g.strides(f.x).unwrap());
        assert_eq!(g.name(f.y).unwrap(), "group_norm.y");
        assert_eq!(f.scale.is_some(), affine);
        assert_eq!(f.bias.is_some(), affine);
        if let Some(sc) = f.scale {
            assert_eq!(g.dims(sc).unwrap(), &[1, 4, 4, 1, 1]);
        }
        let (m, v) = f.stats.unwrap();
        assert_eq!(g.dims(m.unwrap()).unwrap(), &[2, 4, 1, 1, 1]);
        assert_eq!(g.dims(v).unwrap(), &[2, 4, 1, 1, 1]);
        let (unit, zero) = f.extra_in.unwrap();
        for t in [unit, zero] {
            assert_eq!(g.dims(t).unwrap(), &[1, 4, 1, 1, 1]);
            assert_eq!(g.dtype(t).unwrap(), DType::F32);
        }
        let (declared, view) = declared_and_view(g, f.x, nhwc);
        assert_eq!(
            sorted_offsets(&view),
            sorted_offsets(&declared),
            "the view addresses exactly x's elements"
        );
        // The view's logical order is x's (n, c, spatial) order.
        assert_eq!(
            offsets(view.dims(), view.strides()),
            offsets(declared.dims(), declared.strides())
        );
    }
    // The default method of `group_norm` is the instance-norm view.
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let x = g.tensor_nchw("x", &[2, 12, 4, 4], DType::F32).unwrap();
    let (s, b) = group_scale_bias(&mut g);
    let out = g.group_norm(x, 3, s, b, EPS, false).unwrap();
    assert_eq!(g.dims(out.y).unwrap(), &[2, 3, 4, 16, 1]);
    assert!(out.stats.is_none());
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let x = g.tensor_nchw("x", &[2, 12, 4, 4], DType::F32).unwrap();
    let (s, b) = group_scale_bias(&mut g);
    let s_bad = g.tensor_nchw("s_bad", &[1, 6, 1, 1], DType::F32).unwrap();
    for groups in [0, 5, -3] {
        let r = g.group_norm(x, groups, s, b, EPS, true);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "{groups} groups: {r:?}"
        );
    }
    let r = g.group_norm(x, 3, s_bad, b, EPS, true);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. }))
            && format!("{r:?}").contains("s_bad"),
        "{r:?}"
    );
    let r = g.group_norm(x, 3, s, s, EPS, true);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    let r = g.group_norm(x, 3, s, b, -1.0, true);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    // Rejected calls left x as declared.
    assert_eq!(g.dims(x).unwrap(), &[2, 12, 4, 4]);
    // x read by another operation, or an operation's output: refused.
    let relu = g.pointwise(PointwiseMode::Relu, x, None).unwrap();
    let r = g.group_norm(x, 3, s, b, EPS, true);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. }))
            && format!("{r:?}").contains('x'),
        "{r:?}"
    );
    let r = g.group_norm(relu, 3, s, b, EPS, true);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    // Spatial dimensions that do not form one run (a padded row) cannot merge.
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let xp = g
        .tensor("xp", &[2, 12, 4, 4], &[12 * 4 * 8, 4 * 8, 8, 1], DType::F32)
        .unwrap();
    let (s, b) = group_scale_bias(&mut g);
    let r = g.group_norm(xp, 3, s, b, EPS, false);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. }))
            && format!("{r:?}").contains("xp"),
        "{r:?}"
    );
    // A channel-padded x (channel stride beyond the spatial run) is fine: the view keeps it.
    let xq = g
        .tensor("xq", &[2, 12, 4, 4], &[12 * 20, 20, 4, 1], DType::F32)
        .unwrap();
    let out = g
        .group_norm_with(
            xq,
            3,
            Some((s, b)),
            EPS,
            false,
            GroupNormMethod::LayerNormView,
        )
        .unwrap();
    assert_eq!(g.strides(xq).unwrap(), &[240, 80, 20, 1]);
    assert_eq!(g.dims(out.y).unwrap(), &[2, 3, 4, 16]);
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let xq = g
        .tensor("xq", &[2, 12, 4, 4], &[12 * 20, 20, 4, 1], DType::F32)
        .unwrap();
    let out = g
        .group_norm_with(xq, 3, None, EPS, true, GroupNormMethod::InstanceNormView)
        .unwrap();
    assert_eq!(g.strides(xq).unwrap(), &[240, 80, 20, 1, 1]);
    assert_eq!(g.dims(out.y).unwrap(), &[2, 3, 4, 16, 1]);
}

// ---------------------------------------------------------------------------------------------
// Device helpers
// ---------------------------------------------------------------------------------------------

fn is_no_engine(e: &Error) -> bool {
    matches!(
        e,
        Error::Cudnn { .. } | Error::NoAlgorithm { .. } | Error::NoEngine { .. }
    )
}

/// What one GPU test function saw: every case prints one line (`OK <case> (required|tried):
/// plan ...` or `REFUSED <case> (required|tried): <error>`); refusals of required cases (and
/// untyped failures of any case) are collected here and fail the test at the end, so one run
/// reports the whole matrix. Numerical mismatches still panic at once.
#[derive(Default)]
struct Outcomes {
    failures: Vec<String>,
    ok: usize,
    refused: usize,
}

impl Outcomes {
    /// Fails the test listing every required refusal, after a summary line.
    fn finish(self, test: &str) {
        eprintln!(
            "SUMMARY {test}: {} with plans, {} refused, {} failing",
            self.ok,
            self.refused,
            self.failures.len()
        );
        assert!(
            self.failures.is_empty(),
            "{test}: {} required case(s) failed:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

/// Builds the graph and up to 3 plans. `None` when cuDNN refuses the configuration (printed;
/// the failure must be a typed cuDNN error), which is recorded as a failure when `required`.
fn plans(
    cudnn: &Cudnn,
    g: &Graph,
    what: &str,
    required: bool,
    out: &mut Outcomes,
) -> Option<(OperationGraph, Vec<Plan>)> {
    let tag = if required { "required" } else { "tried" };
    let r = g.build(cudnn).and_then(|og| {
        og.plans(cudnn, &PlanFilter::new().with_max_plans(Some(3)))
            .map(|p| (og, p))
    });
    let e = match r {
        Ok((og, list)) if !list.plans.is_empty() => {
            let names: Vec<String> = list
                .plans
                .iter()
                .map(|p| format!("{} (ws {})", p.name(), p.workspace_size()))
                .collect();
            eprintln!("OK {what} ({tag}): plan {}", names.join(", "));
            out.ok += 1;
            return Some((og, list.plans));
        }
        Ok(_) => "no plan (an empty list)".to_string(),
        Err(e) => {
            if !is_no_engine(&e) {
                eprintln!("UNTYPED {what} ({tag}): {e:?}");
                out.failures
                    .push(format!("UNTYPED {what}: untyped failure {e:?}"));
                return None;
            }
            e.to_string()
        }
    };
    eprintln!("REFUSED {what} ({tag}): {e}");
    out.refused += 1;
    if required {
        out.failures.push(format!(
            "REFUSED {what}: refused although cudnn-frontend runs this configuration: {e}"
        ));
    }
    None
}

/// f32 results computed in f32 by the engines (statistics, parameter gradients): the one-pass /
/// rsqrt-based statistics lose a few bits against the f64 reference, so 1e-4 rather than fp32's
/// 1e-5; from half data 1e-3 in case an engine keeps half intermediates.
fn f32_tol<T: DataType>() -> f64 {
    if T::DTYPE == DType::F32 {
        1e-4
    } else {
        1e-3
    }
}

/// Tolerance of outputs stored as `T`: the type's, at least 1e-4 (f32 statistics, as above).
fn t_tol<T: DataType>() -> f64 {
    tol::<T>().max(1e-4)
}

/// The bound tensors of one execution: inputs of type `T` and f32, and expected outputs of type
/// `T` and f32 (tensor, logical values, tolerance).
struct Binding<T> {
    ins_t: Vec<(TensorId, Vec<T>)>,
    ins_f: Vec<(TensorId, Vec<f32>)>,
    outs_t: Vec<(TensorId, Vec<f64>, f64)>,
    outs_f: Vec<(TensorId, Vec<f64>, f64)>,
}

/// Binds the uploaded inputs: those of type `T`, then the f32 ones.
fn bind_inputs<'a, T: DataType>(
    args: &mut Args<'a>,
    ins_t: &'a [(TensorId, CudaSlice<T>)],
    ins_f: &'a [(TensorId, CudaSlice<f32>)],
) {
    for (t, buf) in ins_t {
        args.input(*t, buf).unwrap();
    }
    for (t, buf) in ins_f {
        args.input(*t, buf).unwrap();
    }
}

/// Binds `bufs` as the outputs of `expected`, in order.
fn bind_outputs<'a, T: DataType>(
    args: &mut Args<'a>,
    expected: &[(TensorId, Vec<f64>, f64)],
    bufs: &'a mut [CudaSlice<T>],
) {
    for ((t, ..), buf) in expected.iter().zip(bufs.iter_mut()) {
        args.output(*t, buf).unwrap();
    }
}

/// Checks each output buffer against its expected values and tolerance.
fn check_outputs<T: DataType>(
    s: &Arc<CudaStream>,
    og: &OperationGraph,
    plan: &Plan,
    expected: &[(TensorId, Vec<f64>, f64)],
    bufs: &[CudaSlice<T>],
    what: &str,
) {
    for ((t, want, tl), buf) in expected.iter().zip(bufs) {
        let name = format!("{what} {} `{}`", plan.name(), og.name(*t).unwrap());
        common::assert_close(&name, &fetch(s, og, *t, buf), want, *tl);
    }
}

/// Runs every plan on poisoned outputs and checks them; then binds the first `T` output one
/// element short, which must be refused with every output (all sentinel-filled) untouched.
fn run_and_check<T: DataType>(
    s: &Arc<CudaStream>,
    cudnn: &Cudnn,
    og: &OperationGraph,
    plans: &[Plan],
    b: &Binding<T>,
    what: &str,
) {
    let ins_t: Vec<(TensorId, CudaSlice<T>)> = b
        .ins_t
        .iter()
        .map(|(t, v)| (*t, upload(s, og, *t, v)))
        .collect();
    let ins_f: Vec<(TensorId, CudaSlice<f32>)> = b
        .ins_f
        .iter()
        .map(|(t, v)| (*t, upload(s, og, *t, v)))
        .collect();
    let mut ws = Workspace::new(s.clone());
    for plan in plans {
        let mut outs_t: Vec<CudaSlice<T>> =
            b.outs_t.iter().map(|(t, ..)| poisoned(s, og, *t)).collect();
        let mut outs_f: Vec<CudaSlice<f32>> =
            b.outs_f.iter().map(|(t, ..)| poisoned(s, og, *t)).collect();
        {
            let mut args = Args::new(cudnn);
            bind_inputs(&mut args, &ins_t, &ins_f);
            bind_outputs(&mut args, &b.outs_t, &mut outs_t);
            bind_outputs(&mut args, &b.outs_f, &mut outs_f);
            cudnn
                .execute(plan, &args, &mut ws)
                .unwrap_or_else(|e| panic!("{what} {}: {e}", plan.name()));
        }
        check_outputs(s, og, plan, &b.outs_t, &outs_t, what);
        check_outputs(s, og, plan, &b.outs_f, &outs_f, what);
    }
    // Rejected: the first T output one element short. Spans are checked when the plan
    // executes (a binding only records the buffer) or already when bound.
    let mut short_and_t: Vec<(CudaSlice<T>, Vec<T>)> = b
        .outs_t
        .iter()
        .enumerate()
        .map(|(i, (t, ..))| sentinel_buffer::<T>(s, og.span(*t).unwrap() - usize::from(i == 0)))
        .collect();
    let mut sent_f: Vec<(CudaSlice<f32>, Vec<f32>)> = b
        .outs_f
        .iter()
        .map(|(t, ..)| sentinel_buffer::<f32>(s, og.span(*t).unwrap()))
        .collect();
    {
        let mut args = Args::new(cudnn);
        bind_inputs(&mut args, &ins_t, &ins_f);
        for ((t, ..), (buf, _)) in b.outs_f.iter().zip(sent_f.iter_mut()) {
            args.output(*t, buf).unwrap();
        }
        let mut bound = Ok(());
        for (i, ((t, ..), (buf, _))) in b.outs_t.iter().zip(short_and_t.iter_mut()).enumerate() {
            let r = args.output(*t, buf).map(|_| ());
            if i == 0 {
                bound = r;
            } else {
                r.unwrap();
            }
        }
        let r = cudnn.execute(&plans[0], &args, &mut ws);
        if bound.is_ok() {
            assert!(
                matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
                "{what}: short output: {r:?}"
            );
        } else {
            assert!(
                matches!(&bound, Err(cudnn_safe::Error::BufferTooSmall { .. })),
                "{what}: {bound:?}"
            );
            assert!(
                r.is_err(),
                "{what}: executed without the short output bound"
            );
        }
    }
    for (buf, before) in &short_and_t {
        assert_untouched(&format!("{what} rejected call"), s, buf, before);
    }
    for (buf, before) in &sent_f {
        assert_untouched(&format!("{what} rejected call"), s, buf, before);
    }
}

/// f32 values uniform in `[lo, hi)` and their exact f64 values.
fn f32_values(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> (Vec<f32>, Vec<f64>) {
    let v: Vec<f32> = rng.values_in(n, lo, hi);
    let f = to_f64(&v);
    (v, f)
}

/// f32 values as stored in f32, as f64 (for statistics the reference then uses exactly).
fn as_f32(v: &[f64]) -> (Vec<f32>, Vec<f64>) {
    let s: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    let f = to_f64(&s);
    (s, f)
}

// ---------------------------------------------------------------------------------------------
// GPU cases
// ---------------------------------------------------------------------------------------------

fn layout_name(nhwc: bool) -> &'static str {
    if nhwc {
        "NHWC"
    } else {
        "NCHW"
    }
}

/// One forward configuration against the f64 reference: y (and the statistics in the training
/// phase, and the running statistics of batch norm), then a rejected short buffer.
fn fwd_case<T: DataType>(
    mode: Mode,
    nhwc: bool,
    training: bool,
    with_bias: bool,
    seed: u64,
    required: bool,
    out: &mut Outcomes,
) {
    let Some((s, cudnn)) = gpu() else { return };
    let what = format!(
        "{mode:?} forward {} {} training {training} bias {with_bias}",
        T::DTYPE,
        layout_name(nhwc)
    );
    let f = fwd_graph(mode, T::DTYPE, nhwc, training, with_bias);
    let Some((og, plans)) = plans(&cudnn, &f.g, &what, required, out) else {
        return;
    };
    let gr = groups(mode);
    let mut rng = Rng::new(seed);
    let n = count(&mode.x_dims());
    // An offset keeps the means away from 0 so that a wrong mean shows.
    let xv: Vec<T> = rng.values_in(n, -1.5, 2.5);
    let xf = to_f64(&xv);
    let (sv, sf) = f32_values(&mut rng, gr.nparams, -2.0, 2.0);
    let (bv, bf) = f32_values(&mut rng, gr.nparams, -2.0, 2.0);
    let bias_ref = f.bias.map(|_| &bf[..]);
    // Group norm without the affine step: a unit scale.
    let sf = if f.scale.is_some() {
        sf
    } else {
        vec![1.0; gr.nparams]
    };
    let mut b = Binding {
        ins_t: vec![(f.x, xv)],
        ins_f: f.scale.map(|t| (t, sv)).into_iter().collect(),
        outs_t: Vec::new(),
        outs_f: Vec::new(),
    };
    if let Some(bias) = f.bias {
        b.ins_f.push((bias, bv));
    }
    if mode == Mode::BatchInference {
        let (m, v) = f.extra_in.expect("statistics inputs");
        let (mv, mf) = f32_values(&mut rng, gr.ngroups, -1.0, 1.0);
        let (iv, inf) = f32_values(&mut rng, gr.ngroups, 0.5, 2.0);
        b.ins_f.push((m, mv));
        b.ins_f.push((v, iv));
        let y = forward_ref(&gr, &xf, &mf, &inf, &sf, bias_ref);
        b.outs_t.push((f.y, y, t_tol::<T>()));
    } else {
        let (mean, inv, var) = stats_ref(&gr, &xf, mode == Mode::Rms);
        let y = forward_ref(&gr, &xf, &mean, &inv, &sf, bias_ref);
        b.outs_t.push((f.y, y, t_tol::<T>()));
        if let Some((m, v)) = f.stats {
            if let Some(m) = m {
                b.outs_f.push((m, mean.clone(), f32_tol::<T>()));
            }
            b.outs_f.push((v, inv.clone(), f32_tol::<T>()));
        }
        if let Mode::Group(..) = mode {
            let (unit, zero) = f.extra_in.expect("unit scale and zero bias");
            let k = count(og.layout(unit).unwrap().unwrap().dims());
            b.ins_f.push((unit, vec![1.0; k]));
            b.ins_f.push((zero, vec![0.0; k]));
        }
        if let (Mode::Batch, Some((pm, pv)), Some((nm, nv))) = (mode, f.extra_in, f.running) {
            let (pmv, pmf) = f32_values(&mut rng, gr.ngroups, -1.0, 1.0);
            let (pvv, pvf) = f32_values(&mut rng, gr.ngroups, 0.5, 1.5);
            b.ins_f.push((pm, pmv));
            b.ins_f.push((pv, pvv));
            // The running variance takes the unbiased batch variance (`m / (m − 1)` for m
            // elements per channel), as cuDNN's legacy batch norm and PyTorch do.
            let m = (n / gr.ngroups) as f64;
            let want_m: Vec<f64> = (0..gr.ngroups)
                .map(|c| (1.0 - MOMENTUM) * pmf[c] + MOMENTUM * mean[c])
                .collect();
            let want_v: Vec<f64> = (0..gr.ngroups)
                .map(|c| (1.0 - MOMENTUM) * pvf[c] + MOMENTUM * var[c] * m / (m - 1.0))
                .collect();
            let biased: Vec<f64> = (0..gr.ngroups)
                .map(|c| (1.0 - MOMENTUM) * pvf[c] + MOMENTUM * var[c])
                .collect();
            eprintln!(
                "{what}: next running var expected (unbiased) {:?}..., a biased update would give {:?}...",
                &want_v[..2],
                &biased[..2]
            );
            b.outs_f.push((nm, want_m, f32_tol::<T>()));
            b.outs_f.push((nv, want_v, f32_tol::<T>()));
        }
    }
    run_and_check(&s, &cudnn, &og, &plans, &b, &what);
}

/// One backward configuration against the analytic f64 gradients, from statistics as a training
/// forward pass stores them (f32; the reference uses exactly those values).
fn bwd_case<T: DataType>(
    mode: Mode,
    nhwc: bool,
    with_dbias: bool,
    seed: u64,
    required: bool,
    out: &mut Outcomes,
) {
    let Some((s, cudnn)) = gpu() else { return };
    let what = format!(
        "{mode:?} backward {} {} dbias {with_dbias}",
        T::DTYPE,
        layout_name(nhwc)
    );
    let bg = bwd_graph(mode, T::DTYPE, nhwc, with_dbias);
    let Some((og, plans)) = plans(&cudnn, &bg.g, &what, required, out) else {
        return;
    };
    let gr = groups(mode);
    let rms = mode == Mode::Rms;
    let mut rng = Rng::new(seed);
    let n = count(&mode.x_dims());
    let xv: Vec<T> = rng.values_in(n, -1.5, 2.5);
    let xf = to_f64(&xv);
    let dyv: Vec<T> = rng.values(n);
    let dyf = to_f64(&dyv);
    let (sv, sf) = f32_values(&mut rng, gr.nparams, -2.0, 2.0);
    let (mean, inv, _) = stats_ref(&gr, &xf, rms);
    let (mv, mf) = as_f32(&mean);
    let (iv, inf) = as_f32(&inv);
    let (dx, ds, db) = backward_ref(&gr, &xf, &dyf, &sf, &mf, &inf, rms);
    let mut b = Binding {
        ins_t: vec![(bg.dy, dyv), (bg.x, xv)],
        ins_f: vec![(bg.scale, sv), (bg.inv, iv)],
        outs_t: vec![(bg.dx, dx, t_tol::<T>())],
        outs_f: vec![(bg.dscale, ds, f32_tol::<T>())],
    };
    if let Some(m) = bg.mean {
        b.ins_f.push((m, mv));
    }
    if let Some(dbias) = bg.dbias {
        b.outs_f.push((dbias, db, f32_tol::<T>()));
    }
    run_and_check(&s, &cudnn, &og, &plans, &b, &what);
}

/// Forward (training, inference) and backward of one mode for one data type. Batch-norm
/// inference alone is only tried: cudnn-frontend runs it fused into
/// `batch norm inference → ReLU backward → batch norm backward` only
/// ([`gpu_batch_norm_inference_drelu_dbn`]), and cuDNN 9.14 refused it alone.
fn mode_all<T: DataType>(mode: Mode, nhwc: bool, seed: u64, required: bool, out: &mut Outcomes) {
    match mode {
        Mode::Batch | Mode::BatchInference => {
            fwd_case::<T>(Mode::Batch, nhwc, true, true, seed, required, out);
            fwd_case::<T>(
                Mode::BatchInference,
                nhwc,
                false,
                true,
                seed + 1,
                false,
                out,
            );
            bwd_case::<T>(Mode::Batch, nhwc, true, seed + 2, required, out);
        }
        Mode::Group(..) => {
            fwd_case::<T>(mode, nhwc, true, true, seed, required, out);
            fwd_case::<T>(mode, nhwc, false, true, seed + 1, required, out);
        }
        Mode::Rms => {
            fwd_case::<T>(mode, nhwc, true, true, seed, required, out);
            fwd_case::<T>(mode, nhwc, true, false, seed + 1, required, out);
            fwd_case::<T>(mode, nhwc, false, true, seed + 2, required, out);
            bwd_case::<T>(mode, nhwc, true, seed + 3, required, out);
            bwd_case::<T>(mode, nhwc, false, seed + 4, required, out);
        }
        Mode::Layer | Mode::Instance => {
            fwd_case::<T>(mode, nhwc, true, true, seed, required, out);
            fwd_case::<T>(mode, nhwc, false, true, seed + 1, required, out);
            bwd_case::<T>(mode, nhwc, true, seed + 2, required, out);
        }
    }
}

/// Every data type in the channels-last layout of cudnn-frontend's samples (required), and
/// NCHW where given (exercised when cuDNN offers a plan).
fn every_dtype(mode: Mode, seed: u64, nchw_required: Option<bool>, out: &mut Outcomes) {
    mode_all::<f32>(mode, true, seed, true, out);
    mode_all::<f16>(mode, true, seed + 10, true, out);
    mode_all::<bf16>(mode, true, seed + 20, true, out);
    if let Some(required) = nchw_required {
        mode_all::<f32>(mode, false, seed + 30, required, out);
        mode_all::<f16>(mode, false, seed + 40, required, out);
        mode_all::<bf16>(mode, false, seed + 50, required, out);
    }
}

/// Layer norm on rows `[N, D, 1, 1]` (whose NCHW and NHWC layouts address the same elements).
#[test]
fn gpu_layer_norm_every_dtype() {
    let mut out = Outcomes::default();
    every_dtype(Mode::Layer, 100, None, &mut out);
    out.finish("gpu_layer_norm_every_dtype");
}

/// RMS norm with and without bias, forward and backward.
#[test]
fn gpu_rms_norm_every_dtype() {
    let mut out = Outcomes::default();
    every_dtype(Mode::Rms, 200, None, &mut out);
    out.finish("gpu_rms_norm_every_dtype");
}

/// Instance norm: channels-last as cudnn-frontend's tests; NCHW when cuDNN offers a plan.
#[test]
fn gpu_instance_norm_every_dtype() {
    let mut out = Outcomes::default();
    every_dtype(Mode::Instance, 300, Some(false), &mut out);
    out.finish("gpu_instance_norm_every_dtype");
}

/// Batch norm training with running statistics and backward: channels-last as
/// cudnn-frontend's samples (required); NCHW when cuDNN offers a plan; inference alone tried
/// everywhere (see [`mode_all`]).
#[test]
fn gpu_batch_norm_every_dtype() {
    let mut out = Outcomes::default();
    every_dtype(Mode::Batch, 400, Some(false), &mut out);
    out.finish("gpu_batch_norm_every_dtype");
}

/// cudnn-frontend's `BN_inference DRelu DBN Graph` (samples/cpp/norm/batchnorm.cpp, and
/// `test_bn_infer_drelu_dbn` in its Python tests): `y = batch_norm_inference(x)` (virtual, f32),
/// `g = relu_backward(dy, y)` (virtual, of the data type), then batch norm backward of g with
/// the same statistics. x `[4, 32, 16, 16]`, f32 scale, bias, mean and inverse variance.
/// The statistics given are x's own batch statistics, so the analytic batch-norm gradient is
/// the reference; dy is zeroed where y is within 1e-3 of 0 (where the ReLU mask could differ by
/// rounding).
fn bn_infer_drelu_dbn<T: DataType>(nhwc: bool, seed: u64, required: bool, out: &mut Outcomes) {
    let Some((s, cudnn)) = gpu() else { return };
    let what = format!(
        "BatchInference+ReluBwd+BatchBackward {} {}",
        T::DTYPE,
        layout_name(nhwc)
    );
    let xd = BN_FUSED_X;
    let (g, [x, scale, bias, mean, inv, dy], grads) = bn_infer_drelu_dbn_graph(T::DTYPE, nhwc);
    let Some((og, plans)) = plans(&cudnn, &g, &what, required, out) else {
        return;
    };
    let gr = groups_of(Mode::Batch, &xd);
    let mut rng = Rng::new(seed);
    let n = count(&xd);
    let xv: Vec<T> = rng.values_in(n, -1.5, 2.5);
    let xf = to_f64(&xv);
    let (sv, sf) = f32_values(&mut rng, gr.nparams, -2.0, 2.0);
    let (bv, bf) = f32_values(&mut rng, gr.nparams, -2.0, 2.0);
    let (m, i, _) = stats_ref(&gr, &xf, false);
    let (mv, mf) = as_f32(&m);
    let (iv, inf) = as_f32(&i);
    let yref = forward_ref(&gr, &xf, &mf, &inf, &sf, Some(&bf));
    let mut dyv: Vec<T> = rng.values(n);
    for (d, yv) in dyv.iter_mut().zip(&yref) {
        if yv.abs() < 1e-3 {
            *d = T::from_f64(0.0);
        }
    }
    let dyf = to_f64(&dyv);
    let gyf: Vec<f64> = dyf
        .iter()
        .zip(&yref)
        .map(|(&d, &yv)| if yv > 0.0 { d } else { 0.0 })
        .collect();
    let (dx, ds, db) = backward_ref(&gr, &xf, &gyf, &sf, &mf, &inf, false);
    let b = Binding {
        ins_t: vec![(x, xv), (dy, dyv)],
        ins_f: vec![(scale, sv), (bias, bv), (mean, mv), (inv, iv)],
        outs_t: vec![(grads.dx, dx, t_tol::<T>())],
        outs_f: vec![
            (grads.dscale, ds, f32_tol::<T>()),
            (grads.dbias, db, f32_tol::<T>()),
        ],
    };
    run_and_check(&s, &cudnn, &og, &plans, &b, &what);
}

/// The x dimensions of cudnn-frontend's `BN_inference DRelu DBN Graph`.
const BN_FUSED_X: [i64; 4] = [4, 32, 16, 16];

/// The graph of [`bn_infer_drelu_dbn`]: inputs x, scale, bias, mean, inverse variance, dy.
fn bn_infer_drelu_dbn_graph(
    dt: DType,
    nhwc: bool,
) -> (Graph, [TensorId; 6], cudnn_safe::LayerNormGrads) {
    let xd = BN_FUSED_X;
    let pd = [1, xd[1], 1, 1];
    let mut g = Graph::new(dt, DType::F32, DType::F32);
    let x = input(&mut g, "x", &xd, nhwc, dt);
    let scale = input(&mut g, "scale", &pd, nhwc, DType::F32);
    let bias = input(&mut g, "bias", &pd, nhwc, DType::F32);
    let mean = input(&mut g, "mean", &pd, nhwc, DType::F32);
    let inv = input(&mut g, "inv_variance", &pd, nhwc, DType::F32);
    let dy = input(&mut g, "dy", &xd, nhwc, dt);
    let y = g.batch_norm_inference(x, scale, bias, mean, inv).unwrap();
    let gy = g.pointwise_bwd(PointwiseMode::ReluBwd, dy, y).unwrap();
    // cudnn-frontend: y stays in the intermediate f32, the ReLU gradient in the data type.
    g.set_virtual_dtype(gy, dt).unwrap();
    let grads = g.batch_norm_backward(gy, x, scale, mean, inv).unwrap();
    g.mark_output(grads.dx).unwrap();
    g.mark_output_as(grads.dscale, DType::F32).unwrap();
    g.mark_output_as(grads.dbias, DType::F32).unwrap();
    (g, [x, scale, bias, mean, inv, dy], grads)
}

/// The fused batch-norm inference graph passes cuDNN's descriptor validation in every data
/// type and layout; `set_virtual_dtype` takes only virtual tensors.
#[test]
fn host_batch_norm_inference_drelu_dbn_graph() {
    let (mut g, [x, ..], grads) = bn_infer_drelu_dbn_graph(DType::F16, true);
    assert_eq!(g.dtype(grads.dx).unwrap(), DType::F16);
    assert_eq!(g.dims(grads.dscale).unwrap(), &[1, 32, 1, 1]);
    let r = g.set_virtual_dtype(x, DType::F32);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "input: {r:?}"
    );
    let r = g.set_virtual_dtype(grads.dx, DType::F32);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "marked output: {r:?}"
    );
    if !have_cudnn() {
        return;
    }
    for dt in [DType::F16, DType::BF16, DType::F32] {
        for nhwc in [true, false] {
            let (g, ..) = bn_infer_drelu_dbn_graph(dt, nhwc);
            common::check_with_record(&g)
                .unwrap_or_else(|e| panic!("BN inference + dReLU + DBN {dt} nhwc {nhwc}: {e}"));
        }
    }
}

/// Batch-norm inference as cudnn-frontend runs it (fused with ReLU backward and batch norm
/// backward): f16 channels-last is its configuration (required); bf16, f32 and NCHW tried.
#[test]
fn gpu_batch_norm_inference_drelu_dbn() {
    let mut out = Outcomes::default();
    bn_infer_drelu_dbn::<f16>(true, 600, true, &mut out);
    bn_infer_drelu_dbn::<bf16>(true, 610, false, &mut out);
    bn_infer_drelu_dbn::<f32>(true, 620, false, &mut out);
    bn_infer_drelu_dbn::<f16>(false, 630, false, &mut out);
    bn_infer_drelu_dbn::<f32>(false, 640, false, &mut out);
    out.finish("gpu_batch_norm_inference_drelu_dbn");
}

/// Group norm without the fused affine step: the normalization alone in a graph (y an output
/// laid out like x), then the affine step through [`Cudnn::group_norm_affine`] on the same
/// buffer, checked against the f64 reference; then rejected affine calls (short bias, wrong
/// parameter shape) leave y untouched. Returns whether the graph got a plan.
fn group_norm_unfused<T: DataType>(
    method: GroupNormMethod,
    nhwc: bool,
    seed: u64,
    out: &mut Outcomes,
) -> bool {
    let Some((s, cudnn)) = gpu() else {
        return false;
    };
    let mode = Mode::Group(4, method, false);
    let what = format!(
        "{mode:?} forward {} {} + group_norm_affine (unfused)",
        T::DTYPE,
        layout_name(nhwc)
    );
    let f = fwd_graph(mode, T::DTYPE, nhwc, false, false);
    let Some((og, plans)) = plans(&cudnn, &f.g, &what, false, out) else {
        return false;
    };
    let xd = mode.x_dims();
    let gr = groups(mode);
    let mut rng = Rng::new(seed);
    let n = count(&xd);
    let xv: Vec<T> = rng.values_in(n, -1.5, 2.5);
    let xf = to_f64(&xv);
    let gamma: Vec<T> = rng.values(gr.nparams);
    let beta: Vec<T> = rng.values(gr.nparams);
    let (mean, inv, _) = stats_ref(&gr, &xf, false);
    let want = forward_ref(&gr, &xf, &mean, &inv, &to_f64(&gamma), Some(&to_f64(&beta)));
    let (unit, zero) = f.extra_in.expect("unit scale and zero bias");
    let k = count(og.layout(unit).unwrap().unwrap().dims());
    let xb = upload(&s, &og, f.x, &xv);
    let ones = s.clone_htod(&vec![1f32; k]).unwrap();
    let zeros = s.clone_htod(&vec![0f32; k]).unwrap();
    let (y_desc, p_desc) = if nhwc {
        (
            cudnn_safe::TensorDesc::<T>::nhwc(xd[0], xd[1], xd[2], xd[3]).unwrap(),
            cudnn_safe::TensorDesc::<T>::nhwc(1, xd[1], 1, 1).unwrap(),
        )
    } else {
        (
            cudnn_safe::TensorDesc::<T>::nchw(xd[0], xd[1], xd[2], xd[3]).unwrap(),
            cudnn_safe::TensorDesc::<T>::nchw(1, xd[1], 1, 1).unwrap(),
        )
    };
    // y (the group view) addresses the elements of x's declared layout: a buffer of that
    // layout's span fits both.
    assert_eq!(og.span(f.y).unwrap(), y_desc.span());
    let gb = s.clone_htod(&gamma).unwrap();
    let bb = s.clone_htod(&beta).unwrap();
    let mut ws = Workspace::new(s.clone());
    let declared = offsets(y_desc.dims(), y_desc.layout().strides());
    for plan in &plans {
        let mut yb = poisoned::<T>(&s, &og, f.y);
        {
            let mut args = Args::new(&cudnn);
            args.input(f.x, &xb).unwrap();
            args.input(unit, &ones).unwrap();
            args.input(zero, &zeros).unwrap();
            args.output(f.y, &mut yb).unwrap();
            cudnn
                .execute(plan, &args, &mut ws)
                .unwrap_or_else(|e| panic!("{what} {}: {e}", plan.name()));
        }
        cudnn
            .group_norm_affine(&y_desc, &mut yb, &p_desc, &gb, &bb)
            .unwrap_or_else(|e| panic!("{what}: group_norm_affine: {e}"));
        let host = download(&s, &yb);
        let got: Vec<T> = declared.iter().map(|&o| host[o]).collect();
        common::assert_close(
            &format!("{what} {}", plan.name()),
            &got,
            &want,
            t_tol::<T>(),
        );
        // Rejected: a bias one element short, and parameters of the wrong shape.
        let before = download(&s, &yb);
        let short = s.clone_htod(&beta[..beta.len() - 1]).unwrap();
        let r = cudnn.group_norm_affine(&y_desc, &mut yb, &p_desc, &gb, &short);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
            "{what}: short bias: {r:?}"
        );
        let p_bad = cudnn_safe::TensorDesc::<T>::nchw(1, xd[1] / 2, 1, 1).unwrap();
        let r = cudnn.group_norm_affine(&y_desc, &mut yb, &p_bad, &gb, &bb);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
            "{what}: bad shape: {r:?}"
        );
        assert_untouched(&format!("{what} rejected affine"), &s, &yb, &before);
    }
    true
}

/// [`mode_all`] of a group-norm mode (only tried); records `"<dtype> <mode>"` in `working` when
/// any case got a plan.
fn group_norm_fused<T: DataType>(
    mode: Mode,
    nhwc: bool,
    seed: u64,
    out: &mut Outcomes,
    working: &mut Vec<String>,
) {
    let before = out.ok;
    mode_all::<T>(mode, nhwc, seed, false, out);
    if out.ok > before {
        working.push(format!("{} {mode:?}", T::DTYPE));
    }
}

/// Group norm in every formulation: fused with the affine step or the normalization alone
/// (instance norm on `[N, G, C/G, S, 1]`, layer norm on `[N, G, C/G, S]`), training and
/// inference, each data type, NCHW and NHWC; every variant is tried and printed, so the run
/// tells what cuDNN fuses. Required: for each data type in NCHW, group norm works end to end
/// in at least one way (a fused graph, or the normalization alone followed by
/// [`Cudnn::group_norm_affine`]).
#[test]
fn gpu_group_norm_fused_affine() {
    let mut out = Outcomes::default();
    let methods = [
        GroupNormMethod::InstanceNormView,
        GroupNormMethod::LayerNormView,
    ];
    for (nhwc, base) in [(false, 500), (true, 560)] {
        let mut working: Vec<String> = Vec::new();
        for (mi, &method) in methods.iter().enumerate() {
            let seed = base + 30 * mi as u64;
            for affine in [true, false] {
                let mode = Mode::Group(4, method, affine);
                group_norm_fused::<f32>(mode, nhwc, seed, &mut out, &mut working);
                group_norm_fused::<f16>(mode, nhwc, seed + 10, &mut out, &mut working);
                group_norm_fused::<bf16>(mode, nhwc, seed + 20, &mut out, &mut working);
            }
            let how = format!("{method:?} + group_norm_affine");
            for (dt, ok) in [
                (
                    DType::F32,
                    group_norm_unfused::<f32>(method, nhwc, seed + 5, &mut out),
                ),
                (
                    DType::F16,
                    group_norm_unfused::<f16>(method, nhwc, seed + 15, &mut out),
                ),
                (
                    DType::BF16,
                    group_norm_unfused::<bf16>(method, nhwc, seed + 25, &mut out),
                ),
            ] {
                if ok {
                    working.push(format!("{dt} {how}"));
                }
            }
        }
        eprintln!("GROUP NORM {} works as: {working:?}", layout_name(nhwc));
        if !nhwc && gpu_available() {
            for dt in [DType::F32, DType::F16, DType::BF16] {
                let prefix = format!("{dt} ");
                if !working.iter().any(|w| w.starts_with(&prefix)) {
                    out.failures.push(format!(
                        "group norm {dt} NCHW: no formulation (fused or unfused) got a plan"
                    ));
                }
            }
        }
    }
    out.finish("gpu_group_norm_fused_affine");
}

/// Whether a GPU is there (without one, every case above was skipped).
fn gpu_available() -> bool {
    cudnn_safe::cuda_context(0).is_ok()
}
