//! Tests of the normalization family: batch normalization (inference, training with running
//! statistics, backward with separate data / parameter alpha and beta, the Ex calls with fused
//! add + ReLU), and layer, instance and group normalization forward and backward.
//!
//! References are computed on the host in `f64` from the values as stored (inputs rounded to
//! the tensor type first), with the analytic formulas of each layer's forward and backward pass,
//! on random values from a seeded PRNG. Host data is kept in logical row-major order and reaches
//! the device through the layouts' own offsets, so NHWC, 5-D, 2-D and padded (strided) inputs
//! are checked too; gaps of strided outputs hold a sentinel that must survive.
//!
//! Outputs are poisoned with NaN before each call that does not read them (`beta = 0`); the
//! blending tests start from random outputs. A rejected call must leave every output untouched
//! (sentinel-filled buffers compared after the call).
//!
//! Host-only tests (builders and their validation against the real cuDNN library) skip when
//! cuDNN cannot be loaded, unless `CUDNN_SAFE_REQUIRE_LIBRARY=1`. GPU tests skip without a GPU
//! (`skipping: ...`), unless `CUDNN_SAFE_REQUIRE_GPU=1`.
mod common;

use std::sync::Arc;

use common::*;
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::norm::{
    BatchNorm, BatchNormMode, BatchNormOps, BatchNormSaved, FeatureLayout, GroupNorm, LayerNorm,
    LayerNormGraphSaved, LayerNormPath, NormAffine, NormMethod, NormParamGrads, NormStats,
    NormType, RmsNorm, RmsNormSaved, RunningStats, MIN_EPSILON,
};
use cudnn_safe::{Cudnn, DType, DataType, Error, Layout, Workspace};

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------

/// The packed row-major layout of `dims`, as the layer, group and RMS norms take it.
fn nchw(dims: &[i64]) -> Layout {
    Layout::nchw_nd(dims).unwrap()
}

/// Tolerance for data-type outputs of normalization. f64 gets 1e-10 rather than 1e-12: each
/// output chains a reduction, a square root and (backward) a second reduction.
fn dtol<T: DataType>() -> f64 {
    if T::DTYPE == DType::F64 {
        1e-10
    } else {
        tol::<T>()
    }
}

/// Tolerance for the `T::Param` outputs (statistics, running averages, scale and bias
/// gradients). They are sums over every value of a channel accumulated in f32 (f64 for f64
/// data), hence 1e-4 rather than 1e-5 for f32; for f16/bf16 data cuDNN may form `x̂` at the data
/// precision before the products are summed, hence the data type's tolerance.
fn ptol<T: DataType>() -> f64 {
    match T::DTYPE {
        DType::F64 => 1e-10,
        DType::F32 => 1e-4,
        _ => tol::<T>(),
    }
}

/// The scalar cuDNN reads for `T`, from an `f64`.
fn sc<T: DataType>(v: f64) -> T::Scalar {
    scalar::<T>(v).0
}

/// Uploads logical values `v` through `layout` (gaps hold [`SENTINEL`]); returns the buffer and
/// its host image.
fn upload<T: DataType>(
    stream: &Arc<CudaStream>,
    layout: &Layout,
    v: &[T],
) -> (CudaSlice<T>, Vec<T>) {
    let img = image(layout.span(), &layout_offsets(layout), |i| v[i]);
    (stream.clone_htod(&img).unwrap(), img)
}

/// Logical values of a buffer laid out as `layout`.
fn gather<T: DataType>(layout: &Layout, buf: &[T]) -> Vec<T> {
    layout_offsets(layout).iter().map(|&o| buf[o]).collect()
}

/// A packed device buffer holding `v`.
fn dev<T: DataType>(stream: &Arc<CudaStream>, v: &[T]) -> CudaSlice<T> {
    stream.clone_htod(v).unwrap()
}

/// `f64` copies of values rounded to `T`.
fn rounded<T: DataType>(v: &[T]) -> Vec<f64> {
    to_f64(v)
}

// ---------------------------------------------------------------------------------------------
// Host-only: builders and validation against the real library
// ---------------------------------------------------------------------------------------------

#[test]
fn param_types_follow_cudnn_rule() {
    fn param<T: NormType>() -> DType {
        <T::Param as DataType>::DTYPE
    }
    assert_eq!(param::<f32>(), DType::F32);
    assert_eq!(param::<f64>(), DType::F64);
    assert_eq!(param::<f16>(), DType::F32);
    assert_eq!(param::<bf16>(), DType::F32);
    assert_eq!(MIN_EPSILON, 0.0);
    assert_send::<BatchNorm<f16>>();
    assert_send::<BatchNormSaved<f32>>();
    assert_send::<LayerNorm<f32>>();
    assert_send::<GroupNorm<bf16>>();
}

/// Builds a batch norm for `layout` and returns its parameter layout's dims and strides.
fn derived<T: NormType>(mode: BatchNormMode, layout: &Layout) -> (Vec<i64>, Vec<i64>) {
    let bn = BatchNorm::builder()
        .mode(mode)
        .build::<T>(layout)
        .unwrap_or_else(|e| panic!("{mode:?} {layout}: {e}"));
    let p = bn.param_layout();
    assert_eq!(bn.param_len(), p.span());
    assert!(p.is_packed());
    (p.dims().to_vec(), p.strides().to_vec())
}

#[test]
fn batch_norm_parameter_layout_is_what_cudnn_derives() {
    let Some(_) = lib() else { return };
    fn all<T: NormType>() {
        use BatchNormMode::*;
        let nchw = Layout::nchw(4, 6, 5, 7).unwrap();
        let nhwc = Layout::nhwc(4, 6, 5, 7).unwrap();
        for l in [&nchw, &nhwc] {
            for m in [Spatial, SpatialPersistent] {
                assert_eq!(derived::<T>(m, l), (vec![1, 6, 1, 1], vec![6, 1, 1, 1]));
            }
            assert_eq!(
                derived::<T>(PerActivation, l),
                (vec![1, 6, 5, 7], vec![210, 35, 7, 1])
            );
        }
        // 2-D and 3-D inputs are padded to 4-D; 5-D stays 5-D.
        let flat = Layout::nchw_nd(&[16, 12]).unwrap();
        assert_eq!(derived::<T>(Spatial, &flat).0, vec![1, 12, 1, 1]);
        assert_eq!(derived::<T>(PerActivation, &flat).0, vec![1, 12, 1, 1]);
        let seq = Layout::nchw_nd(&[3, 5, 9]).unwrap();
        assert_eq!(derived::<T>(PerActivation, &seq).0, vec![1, 5, 9, 1]);
        let vol = Layout::ncdhw(2, 3, 4, 5, 6).unwrap();
        assert_eq!(derived::<T>(Spatial, &vol).0, vec![1, 3, 1, 1, 1]);
        assert_eq!(derived::<T>(PerActivation, &vol).0, vec![1, 3, 4, 5, 6]);
        let bn = BatchNorm::builder().build::<T>(&flat).unwrap();
        assert_eq!(bn.dims(), &[16, 12]);
        assert_eq!(bn.layout().dims(), &[16, 12, 1, 1]);
        assert_eq!(bn.mode(), BatchNormMode::Spatial);
        assert_eq!(bn.epsilon(), 1e-5);
    }
    all::<f32>();
    all::<f64>();
    all::<f16>();
    all::<bf16>();
}

#[test]
fn batch_norm_builder_rejects_bad_input() {
    let Some(_) = lib() else { return };
    let l = Layout::nchw(2, 3, 4, 4).unwrap();
    for eps in [-1e-5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let r = BatchNorm::builder().epsilon(eps).build::<f32>(&l);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "epsilon {eps}: {r:?}"
        );
    }
    // Epsilon 0 is CUDNN_BN_MIN_EPSILON and accepted.
    BatchNorm::builder().epsilon(0.0).build::<f32>(&l).unwrap();
    for dims in [vec![7i64], vec![2, 3, 4, 5, 6, 7]] {
        let r = BatchNorm::builder().build::<f32>(&Layout::nchw_nd(&dims).unwrap());
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "{dims:?}: {r:?}"
        );
    }
    // A layout addressing an element twice cannot be written as y or dx.
    let overlapping = Layout::strided(&[2, 3, 4, 4], &[16, 1, 4, 1]).unwrap();
    let r = BatchNorm::builder().build::<f32>(&overlapping);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::OverlappingOutput { .. })),
        "{r:?}"
    );
}

#[test]
fn layer_and_group_norm_constructors_validate() {
    let Some(_) = lib() else { return };
    let ln = LayerNorm::<f32>::new(&nchw(&[3, 4, 20]), 2, 1e-5).unwrap();
    assert_eq!((ln.rows(), ln.features(), ln.len()), (3, 80, 240));
    assert_eq!(ln.dims(), &[3, 4, 20]);
    let ln = LayerNorm::<f16>::new(&nchw(&[64]), 1, 1e-6).unwrap();
    assert_eq!((ln.rows(), ln.features()), (1, 64));
    for k in [0usize, 4] {
        let r = LayerNorm::<f32>::new(&nchw(&[3, 4, 20]), k, 1e-5);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "normalized {k}: {r:?}"
        );
    }
    assert!(matches!(
        &Layout::nchw_nd(&[3, 0, 20]).and_then(|x| LayerNorm::<f32>::new(&x, 1, 1e-5)),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        &LayerNorm::<f32>::new(&nchw(&[3, 20]), 1, -1.0),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));

    let gn = GroupNorm::<f32>::new(&nchw(&[4, 8, 5, 6]), 2, 1e-5).unwrap();
    assert_eq!(
        (gn.groups(), gn.channels(), gn.group_count(), gn.len()),
        (2, 8, 8, 960)
    );
    let inorm = GroupNorm::<bf16>::instance(&nchw(&[4, 8, 5, 6]), 1e-5).unwrap();
    assert_eq!((inorm.groups(), inorm.group_count()), (8, 32));
    for g in [0i64, 3, -2, 16] {
        let r = GroupNorm::<f32>::new(&nchw(&[4, 8, 5, 6]), g, 1e-5);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "groups {g}: {r:?}"
        );
    }
    assert!(matches!(
        &GroupNorm::<f32>::new(&nchw(&[8]), 1, 1e-5),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        &GroupNorm::<f64>::new(&nchw(&[4, 8, 5]), 4, f64::NAN),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
}

/// Host only: layer, group, instance and RMS norm take `x`'s [`Layout`] and refuse every layout
/// but packed row-major with an error naming `x`, before touching cuDNN; strides of extent-1
/// dimensions are not compared.
#[test]
fn norm_constructors_refuse_unpacked_layouts() {
    let nhwc = Layout::nhwc_nd(&[4, 8, 5, 6]).unwrap();
    let padded = Layout::strided(&[6, 40], &[48, 1]).unwrap();
    let transposed = Layout::strided(&[6, 40], &[1, 6]).unwrap();
    let x_layout = |r: &cudnn_safe::Result<()>, want: &str| {
        assert!(
            matches!(r, Err(Error::InvalidArgument { what, .. }) if *what == want),
            "{r:?}"
        );
    };
    for x in [&nhwc, &padded, &transposed] {
        let r = LayerNorm::<f32>::new(x, 1, 1e-5).map(drop);
        x_layout(&r, "layer-norm x layout");
        let r = RmsNorm::<f32>::new(x, 1, 1e-6).map(drop);
        x_layout(&r, "RMS-norm x layout");
        let r = GroupNorm::<f32>::new(x, 2, 1e-5).map(drop);
        x_layout(&r, "group-norm x layout");
        let r = GroupNorm::<bf16>::instance(x, 1e-5).map(drop);
        x_layout(&r, "group-norm x layout");
    }
    // [N, C, 1, 1] channels-last is the same memory as row-major: accepted.
    let rows = Layout::nhwc_nd(&[6, 40, 1, 1]).unwrap();
    let rn = RmsNorm::<f32>::new(&rows, 3, 1e-6).unwrap();
    assert_eq!((rn.rows(), rn.features(), rn.normalized_dims()), (6, 40, 3));
    assert_eq!(rn.layout(), &rows);
    let Some(_) = lib() else { return };
    let ln = LayerNorm::<f32>::new(&rows, 3, 1e-5).unwrap();
    assert_eq!((ln.rows(), ln.features(), ln.normalized_dims()), (6, 40, 3));
    assert_eq!(ln.layout(), &rows);
    let gn = GroupNorm::<f32>::new(&rows, 4, 1e-5).unwrap();
    assert_eq!((gn.groups(), gn.channels(), gn.layout()), (4, 40, &rows));
}

// ---------------------------------------------------------------------------------------------
// Batch normalization: reference
// ---------------------------------------------------------------------------------------------

/// Which statistic each logical element (row-major over `dims`) belongs to, how many
/// statistics there are, and how many values each is computed from.
fn stat_map(dims: &[i64], mode: BatchNormMode) -> (Vec<usize>, usize, usize) {
    let per_act = mode == BatchNormMode::PerActivation;
    let inner: i64 = dims[1..].iter().product();
    let nstats = if per_act { inner } else { dims[1] } as usize;
    let mut map = Vec::new();
    for_each_index(dims, |idx| {
        let s = if per_act {
            let mut s = 0i64;
            for (i, &d) in idx[1..].iter().zip(&dims[1..]) {
                s = s * d + i;
            }
            s
        } else {
            idx[1]
        };
        map.push(s as usize);
    });
    let m = map.len() / nstats;
    (map, nstats, m)
}

/// Batch mean and biased variance per statistic.
fn batch_stats(x: &[f64], map: &[usize], nstats: usize, m: usize) -> (Vec<f64>, Vec<f64>) {
    let mut mean = vec![0.0; nstats];
    for (&v, &s) in x.iter().zip(map) {
        mean[s] += v;
    }
    mean.iter_mut().for_each(|v| *v /= m as f64);
    let mut var = vec![0.0; nstats];
    for (&v, &s) in x.iter().zip(map) {
        var[s] += (v - mean[s]).powi(2);
    }
    var.iter_mut().for_each(|v| *v /= m as f64);
    (mean, var)
}

/// `x̂ = (x − μ)/sqrt(σ² + ε)` per element.
fn normalized(x: &[f64], map: &[usize], mean: &[f64], var: &[f64], eps: f64) -> Vec<f64> {
    x.iter()
        .zip(map)
        .map(|(&v, &s)| (v - mean[s]) / (var[s] + eps).sqrt())
        .collect()
}

/// Batch-norm backward for `x̂`, `dy`: (dx, dscale, dbias) before blending.
fn bn_backward_ref(
    xhat: &[f64],
    dy: &[f64],
    map: &[usize],
    nstats: usize,
    m: usize,
    scale: &[f64],
    inv_std: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut dscale = vec![0.0; nstats];
    let mut dbias = vec![0.0; nstats];
    for ((&xh, &g), &s) in xhat.iter().zip(dy).zip(map) {
        dscale[s] += g * xh;
        dbias[s] += g;
    }
    let mf = m as f64;
    let dx = xhat
        .iter()
        .zip(dy)
        .zip(map)
        .map(|((&xh, &g), &s)| scale[s] * inv_std[s] / mf * (mf * g - dbias[s] - xh * dscale[s]))
        .collect();
    (dx, dscale, dbias)
}

// ---------------------------------------------------------------------------------------------
// Batch normalization: GPU cases
// ---------------------------------------------------------------------------------------------

/// The input layouts every mode and type runs on.
fn bn_layouts() -> Vec<(&'static str, Layout)> {
    let (n, c, h, w) = (4, 8, 5, 6);
    // NCHW rows padded to w + 2 elements: gaps must survive.
    let padded = Layout::strided(&[n, c, h, w], &[c * h * (w + 2), h * (w + 2), w + 2, 1]).unwrap();
    vec![
        ("nchw", Layout::nchw(n, c, h, w).unwrap()),
        ("nhwc", Layout::nhwc(n, c, h, w).unwrap()),
        ("padded", padded),
        ("2-d", Layout::nchw_nd(&[16, 12]).unwrap()),
        ("3-d", Layout::nchw_nd(&[3, 4, 7]).unwrap()),
        ("ncdhw", Layout::ncdhw(3, 4, 2, 3, 5).unwrap()),
    ]
}

const MODES: [BatchNormMode; 3] = [
    BatchNormMode::PerActivation,
    BatchNormMode::Spatial,
    BatchNormMode::SpatialPersistent,
];

/// Training forward (with running statistics, then with alpha/beta blending), inference and
/// backward (plain, then blended) of one mode and layout, against the f64 reference.
fn bn_case<T: NormType>(
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    mode: BatchNormMode,
    name: &str,
    layout: &Layout,
    seed: u64,
) {
    let what = format!("{} {mode:?} {name}", T::DTYPE);
    let eps = 1e-3;
    let bn = BatchNorm::builder()
        .mode(mode)
        .epsilon(eps)
        .build::<T>(layout)
        .unwrap();
    let dims = layout.dims().to_vec();
    let (map, nstats, m) = stat_map(&dims, mode);
    assert_eq!(nstats, bn.param_len(), "{what}");
    let count = map.len();
    let mut rng = Rng::new(seed);
    let xv: Vec<T> = rng.values(count);
    let x64 = rounded(&xv);
    let scale: Vec<T::Param> = rng.values_in(nstats, 0.5, 1.5);
    let bias: Vec<T::Param> = rng.values(nstats);
    let (s64, b64) = (rounded(&scale), rounded(&bias));
    let rmean0: Vec<T::Param> = rng.values(nstats);
    let rvar0: Vec<T::Param> = rng.values_in(nstats, 0.5, 2.0);
    let (x, _) = upload(stream, layout, &xv);
    let (d_scale, d_bias) = (dev(stream, &scale), dev(stream, &bias));
    let mut rmean = dev(stream, &rmean0);
    let mut rvar = dev(stream, &rvar0);

    // Reference statistics.
    let (mu, var) = batch_stats(&x64, &map, nstats, m);
    let inv: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let xhat = normalized(&x64, &map, &mu, &var, eps);
    let y_ref: Vec<f64> = xhat
        .iter()
        .zip(&map)
        .map(|(&xh, &s)| s64[s] * xh + b64[s])
        .collect();

    // 1. Training forward, y poisoned, running statistics updated.
    let ypoison = vec![poison::<T>(); count];
    let (mut y, y_before) = upload(stream, layout, &ypoison);
    let factor = 0.3;
    let saved = cudnn
        .batch_norm_forward_training(
            &bn,
            sc::<T>(1.0),
            sc::<T>(0.0),
            &x,
            &mut y,
            &d_scale,
            &d_bias,
            Some(RunningStats::new(&mut rmean, &mut rvar, factor)),
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = download(stream, &y);
    check_strided(
        &format!("{what} y"),
        &got,
        &y_before,
        &layout_offsets(layout),
        &y_ref,
        dtol::<T>(),
    );
    assert_close(
        &format!("{what} saved mean"),
        &download(stream, saved.mean()),
        &mu,
        ptol::<T>(),
    );
    assert_close(
        &format!("{what} saved inverse std"),
        &download(stream, saved.inv_std()),
        &inv,
        ptol::<T>(),
    );
    let unbiased = m as f64 / (m as f64 - 1.0);
    let rm_ref: Vec<f64> = rounded(&rmean0)
        .iter()
        .zip(&mu)
        .map(|(&r, &b)| (1.0 - factor) * r + factor * b)
        .collect();
    let rv_ref: Vec<f64> = rounded(&rvar0)
        .iter()
        .zip(&var)
        .map(|(&r, &b)| (1.0 - factor) * r + factor * b * unbiased)
        .collect();
    assert_close(
        &format!("{what} running mean"),
        &download(stream, &rmean),
        &rm_ref,
        ptol::<T>(),
    );
    assert_close(
        &format!("{what} running variance (unbiased batch variance)"),
        &download(stream, &rvar),
        &rv_ref,
        ptol::<T>(),
    );

    // 2. Training forward blended into a random y, without running statistics.
    let prior: Vec<T> = rng.values(count);
    let (mut y2, y2_before) = upload(stream, layout, &prior);
    let (alpha, beta) = (0.75, -0.5);
    let _saved2 = cudnn
        .batch_norm_forward_training(
            &bn,
            sc::<T>(alpha),
            sc::<T>(beta),
            &x,
            &mut y2,
            &d_scale,
            &d_bias,
            None,
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let want = blend(alpha, &y_ref, beta, &rounded(&prior));
    let got = download(stream, &y2);
    check_strided(
        &format!("{what} blended y"),
        &got,
        &y2_before,
        &layout_offsets(layout),
        &want,
        dtol::<T>(),
    );

    // 3. Inference with given statistics, blended.
    let emean: Vec<T::Param> = rng.values(nstats);
    let evar: Vec<T::Param> = rng.values_in(nstats, 0.25, 2.0);
    let (em64, ev64) = (rounded(&emean), rounded(&evar));
    let (d_em, d_ev) = (dev(stream, &emean), dev(stream, &evar));
    let prior: Vec<T> = rng.values(count);
    let (mut y3, y3_before) = upload(stream, layout, &prior);
    let (alpha, beta) = (1.25, 0.5);
    cudnn
        .batch_norm_forward_inference(
            &bn,
            sc::<T>(alpha),
            sc::<T>(beta),
            &x,
            &mut y3,
            &d_scale,
            &d_bias,
            &d_em,
            &d_ev,
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let inf: Vec<f64> = x64
        .iter()
        .zip(&map)
        .map(|(&v, &s)| s64[s] * (v - em64[s]) / (ev64[s] + eps).sqrt() + b64[s])
        .collect();
    let want = blend(alpha, &inf, beta, &rounded(&prior));
    let got = download(stream, &y3);
    check_strided(
        &format!("{what} inference"),
        &got,
        &y3_before,
        &layout_offsets(layout),
        &want,
        dtol::<T>(),
    );
    // Inference with beta = 0 into a poisoned y.
    let (mut y4, y4_before) = upload(stream, layout, &ypoison);
    cudnn
        .batch_norm_forward_inference(
            &bn,
            sc::<T>(1.0),
            sc::<T>(0.0),
            &x,
            &mut y4,
            &d_scale,
            &d_bias,
            &d_em,
            &d_ev,
        )
        .unwrap();
    let got = download(stream, &y4);
    check_strided(
        &format!("{what} inference β=0"),
        &got,
        &y4_before,
        &layout_offsets(layout),
        &inf,
        dtol::<T>(),
    );

    // 4. Backward: plain into poisoned outputs, then blended into random ones.
    let dyv: Vec<T> = rng.values(count);
    let (dy, _) = upload(stream, layout, &dyv);
    let (dx_ref, ds_ref, db_ref) =
        bn_backward_ref(&xhat, &rounded(&dyv), &map, nstats, m, &s64, &inv);
    let (mut dx, dx_before) = upload(stream, layout, &ypoison);
    let mut dscale = poisoned_buffer::<T::Param>(stream, nstats);
    let mut dbias = poisoned_buffer::<T::Param>(stream, nstats);
    cudnn
        .batch_norm_backward(
            &bn,
            &saved,
            sc::<T>(1.0),
            sc::<T>(0.0),
            sc::<T>(1.0),
            sc::<T>(0.0),
            &x,
            &dy,
            &mut dx,
            &d_scale,
            &mut dscale,
            &mut dbias,
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = download(stream, &dx);
    check_strided(
        &format!("{what} dx"),
        &got,
        &dx_before,
        &layout_offsets(layout),
        &dx_ref,
        dtol::<T>(),
    );
    assert_close(
        &format!("{what} dscale"),
        &download(stream, &dscale),
        &ds_ref,
        ptol::<T>(),
    );
    assert_close(
        &format!("{what} dbias"),
        &download(stream, &dbias),
        &db_ref,
        ptol::<T>(),
    );

    let dx_prior: Vec<T> = rng.values(count);
    let (mut dx2, dx2_before) = upload(stream, layout, &dx_prior);
    let ds_prior: Vec<T::Param> = rng.values(nstats);
    let db_prior: Vec<T::Param> = rng.values(nstats);
    let mut dscale2 = dev(stream, &ds_prior);
    let mut dbias2 = dev(stream, &db_prior);
    let (ad, bd, ap, bp) = (0.5, 0.25, 2.0, -1.0);
    cudnn
        .batch_norm_backward(
            &bn,
            &saved,
            sc::<T>(ad),
            sc::<T>(bd),
            sc::<T>(ap),
            sc::<T>(bp),
            &x,
            &dy,
            &mut dx2,
            &d_scale,
            &mut dscale2,
            &mut dbias2,
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = download(stream, &dx2);
    let want = blend(ad, &dx_ref, bd, &rounded(&dx_prior));
    check_strided(
        &format!("{what} blended dx"),
        &got,
        &dx2_before,
        &layout_offsets(layout),
        &want,
        dtol::<T>(),
    );
    let want = blend(ap, &ds_ref, bp, &rounded(&ds_prior));
    assert_close(
        &format!("{what} blended dscale"),
        &download(stream, &dscale2),
        &want,
        ptol::<T>(),
    );
    let want = blend(ap, &db_ref, bp, &rounded(&db_prior));
    assert_close(
        &format!("{what} blended dbias"),
        &download(stream, &dbias2),
        &want,
        ptol::<T>(),
    );
}

fn bn_all<T: NormType>(seed: u64) {
    let Some((stream, cudnn)) = gpu() else { return };
    for (i, (name, layout)) in bn_layouts().iter().enumerate() {
        for (j, &mode) in MODES.iter().enumerate() {
            bn_case::<T>(
                &stream,
                &cudnn,
                mode,
                name,
                layout,
                seed + 10 * i as u64 + j as u64,
            );
        }
    }
}

#[test]
fn batch_norm_f32() {
    bn_all::<f32>(100);
}
#[test]
fn batch_norm_f64() {
    bn_all::<f64>(200);
}
#[test]
fn batch_norm_f16() {
    bn_all::<f16>(300);
}
#[test]
fn batch_norm_bf16() {
    bn_all::<bf16>(400);
}

// ---------------------------------------------------------------------------------------------
// Batch normalization, Ex calls (fused add + ReLU)
// ---------------------------------------------------------------------------------------------

/// Ex forward and backward of `ops`, against BN (+ z) (+ ReLU) references. With `required`
/// false the configuration may be one cuDNN does not support: then the call must fail with a
/// cuDNN status before touching `y`, and the case reports what happened.
#[allow(clippy::too_many_arguments)]
fn bn_ex_case<T: NormType>(
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    mode: BatchNormMode,
    layout: &Layout,
    ops: BatchNormOps,
    required: bool,
    seed: u64,
) {
    let what = format!("{} {mode:?} {} {ops:?}", T::DTYPE, layout);
    let eps = 1e-4;
    let bn = BatchNorm::builder()
        .mode(mode)
        .epsilon(eps)
        .build::<T>(layout)
        .unwrap();
    let (map, nstats, m) = stat_map(layout.dims(), mode);
    let count = map.len();
    let mut rng = Rng::new(seed);
    let xv: Vec<T> = rng.values(count);
    let zv: Vec<T> = rng.values(count);
    let scale: Vec<T::Param> = rng.values_in(nstats, 0.5, 1.5);
    let bias: Vec<T::Param> = rng.values(nstats);
    let (x64, z64, s64, b64) = (rounded(&xv), rounded(&zv), rounded(&scale), rounded(&bias));
    let rmean0: Vec<T::Param> = rng.values(nstats);
    let rvar0: Vec<T::Param> = rng.values_in(nstats, 0.5, 2.0);
    let (x, _) = upload(stream, layout, &xv);
    let (z, _) = upload(stream, layout, &zv);
    let (d_scale, d_bias) = (dev(stream, &scale), dev(stream, &bias));
    let mut rmean = dev(stream, &rmean0);
    let mut rvar = dev(stream, &rvar0);
    let mut ws = Workspace::new(stream.clone());

    let (mut y, y_before) = if required {
        upload(stream, layout, &vec![poison::<T>(); count])
    } else {
        upload(stream, layout, &vec![T::from_f64(SENTINEL); count])
    };
    let zarg = if ops.has_add() {
        Some(z.as_view())
    } else {
        None
    };
    let factor = 0.125;
    let r = cudnn.batch_norm_forward_training_ex(
        &bn,
        ops,
        sc::<T>(1.0),
        sc::<T>(0.0),
        &x,
        zarg,
        &mut y,
        &d_scale,
        &d_bias,
        Some(RunningStats::new(&mut rmean, &mut rvar, factor)),
        &mut ws,
    );
    let mut saved = match r {
        Ok(s) => s,
        Err(e) if !required => {
            assert!(
                e.status().is_some(),
                "{what}: expected a cuDNN status, got {e}"
            );
            eprintln!("{what}: not supported by this cuDNN: {e}");
            assert_untouched(&what, stream, &y, &y_before);
            return;
        }
        Err(e) => panic!("{what}: {e}"),
    };
    eprintln!(
        "{what}: supported (workspace {} B, reserve {} B)",
        ws.capacity(),
        saved.reserve_bytes()
    );
    assert_eq!(saved.ops(), Some(ops));

    let (mu, var) = batch_stats(&x64, &map, nstats, m);
    let inv: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let xhat = normalized(&x64, &map, &mu, &var, eps);
    let y_ref: Vec<f64> = xhat
        .iter()
        .zip(&map)
        .zip(&z64)
        .map(|((&xh, &s), &zz)| {
            let v = s64[s] * xh + b64[s] + if ops.has_add() { zz } else { 0.0 };
            if ops.has_activation() {
                v.max(0.0)
            } else {
                v
            }
        })
        .collect();
    // The Ex forward keeps y borrowed for the backward (whose ReLU gradient reads it).
    let ygot = download(stream, &saved.y().expect("the Ex forward holds y"));
    check_strided(
        &format!("{what} y"),
        &ygot,
        &y_before,
        &layout_offsets(layout),
        &y_ref,
        dtol::<T>(),
    );
    assert_close(
        &format!("{what} saved mean"),
        &download(stream, saved.mean()),
        &mu,
        ptol::<T>(),
    );
    assert_close(
        &format!("{what} saved inverse std"),
        &download(stream, saved.inv_std()),
        &inv,
        ptol::<T>(),
    );
    let unbiased = m as f64 / (m as f64 - 1.0);
    let rv_ref: Vec<f64> = rounded(&rvar0)
        .iter()
        .zip(&var)
        .map(|(&r, &b)| (1.0 - factor) * r + factor * b * unbiased)
        .collect();
    assert_close(
        &format!("{what} running variance"),
        &download(stream, &rvar),
        &rv_ref,
        ptol::<T>(),
    );
    let rm_ref: Vec<f64> = rounded(&rmean0)
        .iter()
        .zip(&mu)
        .map(|(&r, &b)| (1.0 - factor) * r + factor * b)
        .collect();
    assert_close(
        &format!("{what} running mean"),
        &download(stream, &rmean),
        &rm_ref,
        ptol::<T>(),
    );

    // Backward: the ReLU passes dy where the forward output is positive (the mask is taken from
    // the GPU's own y, which is what cuDNN differentiates).
    let dyv: Vec<T> = rng.values(count);
    let y_logical = gather(layout, &ygot);
    let dy_eff: Vec<f64> = rounded(&dyv)
        .iter()
        .zip(&y_logical)
        .map(|(&g, &yy)| {
            if !ops.has_activation() || yy.to_f64() > 0.0 {
                g
            } else {
                0.0
            }
        })
        .collect();
    let (dx_ref, ds_ref, db_ref) = bn_backward_ref(&xhat, &dy_eff, &map, nstats, m, &s64, &inv);
    let (dy, _) = upload(stream, layout, &dyv);
    let poisoned = vec![poison::<T>(); count];
    let (mut dx, dx_before) = upload(stream, layout, &poisoned);
    let (mut dz, dz_before) = upload(stream, layout, &poisoned);
    let ds_prior: Vec<T::Param> = rng.values(nstats);
    let mut dscale = dev(stream, &ds_prior);
    let db_prior: Vec<T::Param> = rng.values(nstats);
    let mut dbias = dev(stream, &db_prior);
    let dzarg = if ops.has_add() {
        Some(dz.as_view_mut())
    } else {
        None
    };
    let (ap, bp) = (0.5, 0.25);
    cudnn
        .batch_norm_backward_ex(
            &bn,
            &mut saved,
            sc::<T>(1.0),
            sc::<T>(0.0),
            sc::<T>(ap),
            sc::<T>(bp),
            &x,
            &dy,
            dzarg,
            &mut dx,
            &d_scale,
            &d_bias,
            &mut dscale,
            &mut dbias,
            &mut ws,
        )
        .unwrap_or_else(|e| panic!("{what} backward: {e}"));
    let got = download(stream, &dx);
    check_strided(
        &format!("{what} dx"),
        &got,
        &dx_before,
        &layout_offsets(layout),
        &dx_ref,
        dtol::<T>(),
    );
    if ops.has_add() {
        let got = download(stream, &dz);
        check_strided(
            &format!("{what} dz"),
            &got,
            &dz_before,
            &layout_offsets(layout),
            &dy_eff,
            dtol::<T>(),
        );
    } else {
        assert_untouched(
            &format!("{what} dz (not an output)"),
            stream,
            &dz,
            &dz_before,
        );
    }
    let want = blend(ap, &ds_ref, bp, &rounded(&ds_prior));
    assert_close(
        &format!("{what} dscale"),
        &download(stream, &dscale),
        &want,
        ptol::<T>(),
    );
    let want = blend(ap, &db_ref, bp, &rounded(&db_prior));
    assert_close(
        &format!("{what} dbias"),
        &download(stream, &dbias),
        &want,
        ptol::<T>(),
    );

    // Without a fused op, the plain backward takes the Ex forward's statistics too.
    if !ops.has_activation() {
        let (mut dx, dx_before) = upload(stream, layout, &poisoned);
        let mut dscale = poisoned_buffer::<T::Param>(stream, nstats);
        let mut dbias = poisoned_buffer::<T::Param>(stream, nstats);
        cudnn
            .batch_norm_backward(
                &bn,
                &saved,
                sc::<T>(1.0),
                sc::<T>(0.0),
                sc::<T>(1.0),
                sc::<T>(0.0),
                &x,
                &dy,
                &mut dx,
                &d_scale,
                &mut dscale,
                &mut dbias,
            )
            .unwrap_or_else(|e| panic!("{what} plain backward: {e}"));
        let got = download(stream, &dx);
        check_strided(
            &format!("{what} plain dx"),
            &got,
            &dx_before,
            &layout_offsets(layout),
            &dx_ref,
            dtol::<T>(),
        );
        assert_close(
            &format!("{what} plain dscale"),
            &download(stream, &dscale),
            &ds_ref,
            ptol::<T>(),
        );
        assert_close(
            &format!("{what} plain dbias"),
            &download(stream, &dbias),
            &db_ref,
            ptol::<T>(),
        );
    }
}

#[test]
fn batch_norm_ex_fused_nhwc_f16() {
    let Some((stream, cudnn)) = gpu() else { return };
    // cuDNN's fast NHWC path: packed NHWC half, spatial persistent, C a multiple of 4.
    let layout = Layout::nhwc(4, 8, 5, 6).unwrap();
    for (i, ops) in [
        BatchNormOps::Bn,
        BatchNormOps::BnRelu,
        BatchNormOps::BnAddRelu,
    ]
    .into_iter()
    .enumerate()
    {
        bn_ex_case::<f16>(
            &stream,
            &cudnn,
            BatchNormMode::SpatialPersistent,
            &layout,
            ops,
            true,
            500 + i as u64,
        );
    }
}

#[test]
fn batch_norm_ex_plain_ops_every_type() {
    let Some((stream, cudnn)) = gpu() else { return };
    for (i, (_, layout)) in bn_layouts().iter().enumerate() {
        for mode in MODES {
            let seed = 600 + 10 * i as u64;
            bn_ex_case::<f32>(&stream, &cudnn, mode, layout, BatchNormOps::Bn, true, seed);
            bn_ex_case::<f64>(
                &stream,
                &cudnn,
                mode,
                layout,
                BatchNormOps::Bn,
                true,
                seed + 1,
            );
            bn_ex_case::<f16>(
                &stream,
                &cudnn,
                mode,
                layout,
                BatchNormOps::Bn,
                true,
                seed + 2,
            );
            bn_ex_case::<bf16>(
                &stream,
                &cudnn,
                mode,
                layout,
                BatchNormOps::Bn,
                true,
                seed + 3,
            );
        }
    }
}

#[test]
fn batch_norm_ex_fused_elsewhere_works_or_is_refused() {
    let Some((stream, cudnn)) = gpu() else { return };
    let nhwc = Layout::nhwc(4, 8, 5, 6).unwrap();
    let nchw = Layout::nchw(4, 8, 5, 6).unwrap();
    let odd_c = Layout::nhwc(4, 6, 5, 6).unwrap();
    for (i, ops) in [BatchNormOps::BnRelu, BatchNormOps::BnAddRelu]
        .into_iter()
        .enumerate()
    {
        let s = 700 + 10 * i as u64;
        let pers = BatchNormMode::SpatialPersistent;
        bn_ex_case::<bf16>(&stream, &cudnn, pers, &nhwc, ops, false, s);
        bn_ex_case::<f32>(&stream, &cudnn, pers, &nhwc, ops, false, s + 1);
        bn_ex_case::<f16>(&stream, &cudnn, pers, &odd_c, ops, false, s + 2);
        bn_ex_case::<f16>(
            &stream,
            &cudnn,
            BatchNormMode::Spatial,
            &nhwc,
            ops,
            false,
            s + 3,
        );
        bn_ex_case::<f32>(
            &stream,
            &cudnn,
            BatchNormMode::Spatial,
            &nchw,
            ops,
            false,
            s + 4,
        );
        bn_ex_case::<f64>(&stream, &cudnn, pers, &nhwc, ops, false, s + 5);
    }
}

// ---------------------------------------------------------------------------------------------
// Batch normalization: rejections
// ---------------------------------------------------------------------------------------------

#[test]
fn batch_norm_rejections_leave_outputs_untouched() {
    let Some((stream, cudnn)) = gpu() else { return };
    let layout = Layout::nchw(4, 8, 5, 6).unwrap();
    let (n, c) = (layout.span(), 8usize);
    let bn = BatchNorm::builder().build::<f32>(&layout).unwrap();
    let mut rng = Rng::new(900);
    let xv: Vec<f32> = rng.values(n);
    let x = dev(&stream, &xv);
    let scale = dev(&stream, &rng.values_in::<f32>(c, 0.5, 1.5));
    let bias = dev(&stream, &rng.values::<f32>(c));
    let (one, zero) = (1.0f32, 0.0f32);

    // Short y.
    let (mut y, before) = sentinel_buffer::<f32>(&stream, n - 1);
    let r = cudnn.batch_norm_forward_training(&bn, one, zero, &x, &mut y, &scale, &bias, None);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    assert_untouched("short y", &stream, &y, &before);

    // Wrong running-statistics size.
    let (mut y, ybefore) = sentinel_buffer::<f32>(&stream, n);
    let (mut rm, rmb) = sentinel_buffer::<f32>(&stream, c);
    let (mut rv, rvb) = sentinel_buffer::<f32>(&stream, c - 1);
    let r = cudnn.batch_norm_forward_training(
        &bn,
        one,
        zero,
        &x,
        &mut y,
        &scale,
        &bias,
        Some(RunningStats::new(&mut rm, &mut rv, 0.1)),
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    assert_untouched("y (short running variance)", &stream, &y, &ybefore);
    assert_untouched("running mean", &stream, &rm, &rmb);
    assert_untouched("running variance", &stream, &rv, &rvb);

    // Exponential average factor outside 0..=1.
    let (mut rv, rvb) = sentinel_buffer::<f32>(&stream, c);
    for f in [1.5, -0.1, f64::NAN] {
        let r = cudnn.batch_norm_forward_training(
            &bn,
            one,
            zero,
            &x,
            &mut y,
            &scale,
            &bias,
            Some(RunningStats::new(&mut rm, &mut rv, f)),
        );
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "factor {f}: {r:?}"
        );
    }
    assert_untouched("y (bad factor)", &stream, &y, &ybefore);
    assert_untouched("running variance (bad factor)", &stream, &rv, &rvb);

    // Short inference statistics.
    let short = dev(&stream, &vec![1.0f32; c - 1]);
    let r = cudnn
        .batch_norm_forward_inference(&bn, one, zero, &x, &mut y, &scale, &bias, &short, &scale);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    assert_untouched("y (short mean)", &stream, &y, &ybefore);

    // One value per statistic: the batch variance is undefined.
    let single = Layout::nchw(1, 8, 5, 6).unwrap();
    let bn1 = BatchNorm::builder()
        .mode(BatchNormMode::PerActivation)
        .build::<f32>(&single)
        .unwrap();
    let scale1 = dev(&stream, &vec![1.0f32; bn1.param_len()]);
    let r = cudnn.batch_norm_forward_training(&bn1, one, zero, &x, &mut y, &scale1, &scale1, None);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    assert_untouched("y (one value per statistic)", &stream, &y, &ybefore);

    // Statistics saved by another BatchNorm of the same shape, or for another x buffer.
    let mut y_ok = dev(&stream, &vec![0.0f32; n]);
    let saved = cudnn
        .batch_norm_forward_training(&bn, one, zero, &x, &mut y_ok, &scale, &bias, None)
        .unwrap();
    let bn2 = BatchNorm::builder().build::<f32>(&layout).unwrap();
    let saved2 = cudnn
        .batch_norm_forward_training(&bn2, one, zero, &x, &mut y_ok, &scale, &bias, None)
        .unwrap();
    let dy = dev(&stream, &rng.values::<f32>(n));
    let (mut dx, dxb) = sentinel_buffer::<f32>(&stream, n);
    let (mut ds, dsb) = sentinel_buffer::<f32>(&stream, c);
    let (mut db, dbb) = sentinel_buffer::<f32>(&stream, c);
    let x_copy = dev(&stream, &xv);
    let mut backward =
        |saved: &BatchNormSaved<f32>, x: &CudaSlice<f32>, ds: &mut CudaSlice<f32>| {
            cudnn.batch_norm_backward(
                &bn, saved, one, zero, one, zero, x, &dy, &mut dx, &scale, ds, &mut db,
            )
        };
    let r = backward(&saved2, &x, &mut ds);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "foreign saved: {r:?}"
    );
    let r = backward(&saved, &x_copy, &mut ds);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "other x: {r:?}"
    );
    let (mut ds_short, dssb) = sentinel_buffer::<f32>(&stream, c - 1);
    let r = backward(&saved, &x, &mut ds_short);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "short dscale: {r:?}"
    );
    assert_untouched("dscale (short)", &stream, &ds_short, &dssb);
    assert_untouched("dx", &stream, &dx, &dxb);
    assert_untouched("dscale", &stream, &ds, &dsb);
    assert_untouched("dbias", &stream, &db, &dbb);
    // The matching call works.
    cudnn
        .batch_norm_backward(
            &bn, &saved, one, zero, one, zero, &x, &dy, &mut dx, &scale, &mut ds, &mut db,
        )
        .unwrap();

    // Ex: z exactly for the add op; the plain saved value has no reserve space.
    let mut ws = Workspace::new(stream.clone());
    let r = cudnn.batch_norm_forward_training_ex(
        &bn,
        BatchNormOps::Bn,
        one,
        zero,
        &x,
        Some(x_copy.as_view()),
        &mut y,
        &scale,
        &bias,
        None,
        &mut ws,
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "z with Bn: {r:?}"
    );
    let r = cudnn.batch_norm_forward_training_ex(
        &bn,
        BatchNormOps::BnAddRelu,
        one,
        zero,
        &x,
        None,
        &mut y,
        &scale,
        &bias,
        None,
        &mut ws,
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "no z with BnAddRelu: {r:?}"
    );
    assert_untouched("y (Ex z rules)", &stream, &y, &ybefore);
    let mut plain = saved;
    let (mut dx, dxb) = sentinel_buffer::<f32>(&stream, n);
    let r = cudnn.batch_norm_backward_ex(
        &bn, &mut plain, one, zero, one, zero, &x, &dy, None, &mut dx, &scale, &bias, &mut ds,
        &mut db, &mut ws,
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "Ex backward of a plain forward: {r:?}"
    );
    assert_untouched("dx (Ex backward of a plain forward)", &stream, &dx, &dxb);
}

#[test]
fn batch_norm_fused_saved_values_are_checked() {
    let Some((stream, cudnn)) = gpu() else { return };
    let layout = Layout::nhwc(4, 8, 5, 6).unwrap();
    let (n, c) = (layout.span(), 8usize);
    let bn = BatchNorm::builder()
        .mode(BatchNormMode::SpatialPersistent)
        .build::<f16>(&layout)
        .unwrap();
    let mut rng = Rng::new(950);
    let x = dev(&stream, &rng.values::<f16>(n));
    let scale = dev(&stream, &rng.values_in::<f32>(c, 0.5, 1.5));
    let bias = dev(&stream, &rng.values::<f32>(c));
    let mut y = dev(&stream, &vec![f16::ZERO; n]);
    let mut ws = Workspace::new(stream.clone());
    let mut saved = cudnn
        .batch_norm_forward_training_ex(
            &bn,
            BatchNormOps::BnRelu,
            1.0,
            0.0,
            &x,
            None,
            &mut y,
            &scale,
            &bias,
            None,
            &mut ws,
        )
        .unwrap();
    let dy = dev(&stream, &rng.values::<f16>(n));
    let (mut dx, dxb) = sentinel_buffer::<f16>(&stream, n);
    let (mut ds, dsb) = sentinel_buffer::<f32>(&stream, c);
    let (mut db, dbb) = sentinel_buffer::<f32>(&stream, c);
    // The plain backward would ignore the ReLU.
    let r = cudnn.batch_norm_backward(
        &bn, &saved, 1.0, 0.0, 1.0, 0.0, &x, &dy, &mut dx, &scale, &mut ds, &mut db,
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "plain backward of BnRelu: {r:?}"
    );
    // y comes from `saved` (the forward keeps it borrowed), so no other buffer can stand in for
    // it; x is still checked to be the forward's.
    let x_copy = dev(&stream, &download(&stream, &x));
    let r = cudnn.batch_norm_backward_ex(
        &bn, &mut saved, 1.0, 0.0, 1.0, 0.0, &x_copy, &dy, None, &mut dx, &scale, &bias, &mut ds,
        &mut db, &mut ws,
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "another x: {r:?}"
    );
    // dz is not an output of BnRelu.
    let (mut dz, dzb) = sentinel_buffer::<f16>(&stream, n);
    let r = cudnn.batch_norm_backward_ex(
        &bn,
        &mut saved,
        1.0,
        0.0,
        1.0,
        0.0,
        &x,
        &dy,
        Some(dz.as_view_mut()),
        &mut dx,
        &scale,
        &bias,
        &mut ds,
        &mut db,
        &mut ws,
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "dz with BnRelu: {r:?}"
    );
    assert_untouched("dx", &stream, &dx, &dxb);
    assert_untouched("dz", &stream, &dz, &dzb);
    assert_untouched("dscale", &stream, &ds, &dsb);
    assert_untouched("dbias", &stream, &db, &dbb);
    // The matching call works.
    cudnn
        .batch_norm_backward_ex(
            &bn, &mut saved, 1.0, 0.0, 1.0, 0.0, &x, &dy, None, &mut dx, &scale, &bias, &mut ds,
            &mut db, &mut ws,
        )
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Layer, instance and group normalization
// ---------------------------------------------------------------------------------------------

/// A layer or group normalization under test.
enum Norm<T: NormType> {
    Layer(LayerNorm<T>),
    Group(GroupNorm<T>),
}

/// Group and feature of every logical element, and the group and feature counts.
struct Maps {
    group: Vec<usize>,
    feature: Vec<usize>,
    groups: usize,
    features: usize,
}

impl<T: NormType> Norm<T> {
    fn maps(&self) -> Maps {
        match self {
            Norm::Layer(ln) => {
                let d = ln.features();
                let n = ln.len();
                Maps {
                    group: (0..n).map(|i| i / d).collect(),
                    feature: (0..n).map(|i| i % d).collect(),
                    groups: ln.rows(),
                    features: d,
                }
            }
            Norm::Group(gn) => {
                let dims = gn.dims();
                let c = dims[1] as usize;
                let per = c / gn.groups() as usize;
                let (mut group, mut feature) = (Vec::new(), Vec::new());
                for_each_index(dims, |idx| {
                    let (n, ch) = (idx[0] as usize, idx[1] as usize);
                    group.push(n * gn.groups() as usize + ch / per);
                    feature.push(ch);
                });
                Maps {
                    group,
                    feature,
                    groups: gn.group_count(),
                    features: c,
                }
            }
        }
    }
    fn len(&self) -> usize {
        match self {
            Norm::Layer(n) => n.len(),
            Norm::Group(n) => n.len(),
        }
    }
    fn forward(
        &self,
        cudnn: &Cudnn,
        x: &CudaSlice<T>,
        g: &CudaSlice<T>,
        b: &CudaSlice<T>,
        y: &mut CudaSlice<T>,
    ) -> Result<(), Error> {
        match self {
            Norm::Layer(n) => cudnn.layer_norm_forward(n, x, g, b, y),
            Norm::Group(n) => cudnn.group_norm_forward(n, x, g, b, y),
        }
    }
    fn forward_training<'x>(
        &self,
        cudnn: &Cudnn,
        x: &'x CudaSlice<T>,
        g: &CudaSlice<T>,
        b: &CudaSlice<T>,
        y: &mut CudaSlice<T>,
    ) -> Result<cudnn_safe::norm::NormSaved<'x, T>, Error> {
        match self {
            Norm::Layer(n) => cudnn.layer_norm_forward_training(n, x, g, b, y),
            Norm::Group(n) => cudnn.group_norm_forward_training(n, x, g, b, y),
        }
    }
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &self,
        cudnn: &Cudnn,
        saved: &cudnn_safe::norm::NormSaved<'_, T>,
        x: &CudaSlice<T>,
        dy: &CudaSlice<T>,
        g: &CudaSlice<T>,
        dx: &mut CudaSlice<T>,
        dg: &mut CudaSlice<T>,
        db: &mut CudaSlice<T>,
        ws: &mut Workspace,
    ) -> Result<(), Error> {
        match self {
            Norm::Layer(n) => cudnn.layer_norm_backward(n, saved, x, dy, g, dx, dg, db, ws),
            Norm::Group(n) => cudnn.group_norm_backward(n, saved, x, dy, g, dx, dg, db, ws),
        }
    }
}

/// Forward reference: (y, x̂, mean, 1/std) of each group.
fn affine_forward_ref(
    x: &[f64],
    maps: &Maps,
    gamma: &[f64],
    beta: &[f64],
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mean, var) = batch_stats(x, &maps.group, maps.groups, x.len() / maps.groups);
    let rstd: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let xhat = normalized(x, &maps.group, &mean, &var, eps);
    let y = xhat
        .iter()
        .zip(&maps.feature)
        .map(|(&xh, &f)| xh * gamma[f] + beta[f])
        .collect();
    (y, xhat, mean, rstd)
}

/// Backward reference: (dx, dγ, dβ, Σ|dy·x̂| and Σ|dy| per feature — the magnitudes the
/// rounding error of the sums dγ and dβ scales with).
type BackwardRef = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);

fn affine_backward_ref(
    xhat: &[f64],
    dy: &[f64],
    maps: &Maps,
    gamma: &[f64],
    rstd: &[f64],
) -> BackwardRef {
    let m = (xhat.len() / maps.groups) as f64;
    let mut dgamma = vec![0.0; maps.features];
    let mut dbeta = vec![0.0; maps.features];
    let mut dgamma_mag = vec![0.0; maps.features];
    let mut dbeta_mag = vec![0.0; maps.features];
    let mut sum = vec![0.0; maps.groups];
    let mut sum_xh = vec![0.0; maps.groups];
    let dxhat: Vec<f64> = dy
        .iter()
        .zip(&maps.feature)
        .map(|(&g, &f)| g * gamma[f])
        .collect();
    for i in 0..xhat.len() {
        let (g, f) = (maps.group[i], maps.feature[i]);
        dgamma[f] += dy[i] * xhat[i];
        dbeta[f] += dy[i];
        dgamma_mag[f] += (dy[i] * xhat[i]).abs();
        dbeta_mag[f] += dy[i].abs();
        sum[g] += dxhat[i];
        sum_xh[g] += dxhat[i] * xhat[i];
    }
    let dx = (0..xhat.len())
        .map(|i| {
            let g = maps.group[i];
            rstd[g] / m * (m * dxhat[i] - sum[g] - xhat[i] * sum_xh[g])
        })
        .collect();
    (dx, dgamma, dbeta, dgamma_mag, dbeta_mag)
}

/// Checks the parameter gradients, which are sums over every element of a feature:
/// `|got − want| ≤ dtol + rel·Σ|terms|`. With f16/bf16 data the terms are formed from the
/// stored (rounded) `x̂` and `dy`, so each carries a relative error of the type's unit
/// roundoff and the sum's error grows with `Σ|terms|`, not with `|want|` (which cancellation
/// can make small): the bound uses twice the unit roundoff (2⁻⁸ for bf16, 2⁻¹¹ for f16).
fn assert_sum_close<T: DataType>(what: &str, got: &[T], want: &[f64], mag: &[f64]) {
    let rel = match T::DTYPE {
        DType::BF16 => 2.0 * 2f64.powi(-8),
        DType::F16 => 2.0 * 2f64.powi(-11),
        DType::F32 => 1e-6,
        _ => 1e-12,
    };
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(mag).enumerate() {
        let g = g.to_f64();
        let bound = dtol::<T>() * (1.0 + w.abs()) + rel * m;
        assert!(
            g.is_finite() && (g - w).abs() <= bound,
            "{what}: element {i}: got {g}, want {w} (bound {bound:.3e}, Σ|terms| {m:.3e})"
        );
    }
}

fn affine_case<T: NormType>(
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    what: &str,
    norm: &Norm<T>,
    eps: f64,
    seed: u64,
) {
    let what = format!("{} {what}", T::DTYPE);
    let maps = norm.maps();
    let n = norm.len();
    let mut rng = Rng::new(seed);
    let xv: Vec<T> = rng.values(n);
    let gv: Vec<T> = rng.values_in(maps.features, 0.5, 1.5);
    let bv: Vec<T> = rng.values(maps.features);
    let (x64, g64, b64) = (rounded(&xv), rounded(&gv), rounded(&bv));
    let (x, gamma, beta) = (dev(stream, &xv), dev(stream, &gv), dev(stream, &bv));
    let (y_ref, xhat, mean, rstd) = affine_forward_ref(&x64, &maps, &g64, &b64, eps);

    let mut y = poisoned_buffer::<T>(stream, n);
    norm.forward(cudnn, &x, &gamma, &beta, &mut y)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_close(
        &format!("{what} forward y"),
        &download(stream, &y),
        &y_ref,
        dtol::<T>(),
    );

    let mut y = poisoned_buffer::<T>(stream, n);
    let saved = norm
        .forward_training(cudnn, &x, &gamma, &beta, &mut y)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_close(
        &format!("{what} training y"),
        &download(stream, &y),
        &y_ref,
        dtol::<T>(),
    );
    match saved.xhat() {
        Some(saved_xhat) => assert_close(
            &format!("{what} x̂"),
            &download(stream, saved_xhat),
            &xhat,
            dtol::<T>(),
        ),
        // The fused graph path keeps only the statistics: layer norms only.
        None => assert!(
            matches!(norm, Norm::Layer(_)) && saved.from_graph(),
            "{what}: no x̂ saved"
        ),
    }
    assert_close(
        &format!("{what} mean"),
        &download(stream, saved.mean()),
        &mean,
        ptol::<T>(),
    );
    assert_close(
        &format!("{what} rstd"),
        &download(stream, saved.inv_std()),
        &rstd,
        ptol::<T>(),
    );

    let mut ws = Workspace::new(stream.clone());
    // Twice, with different dy, so that the reused scratch is exercised.
    for round in 0..2 {
        let dyv: Vec<T> = rng.values(n);
        let dy = dev(stream, &dyv);
        let (dx_ref, dg_ref, db_ref, dg_mag, db_mag) =
            affine_backward_ref(&xhat, &rounded(&dyv), &maps, &g64, &rstd);
        let mut dx = poisoned_buffer::<T>(stream, n);
        let mut dg = poisoned_buffer::<T>(stream, maps.features);
        let mut db = poisoned_buffer::<T>(stream, maps.features);
        norm.backward(
            cudnn, &saved, &x, &dy, &gamma, &mut dx, &mut dg, &mut db, &mut ws,
        )
        .unwrap_or_else(|e| panic!("{what} backward: {e}"));
        assert_close(
            &format!("{what} dx ({round})"),
            &download(stream, &dx),
            &dx_ref,
            dtol::<T>(),
        );
        assert_sum_close(
            &format!("{what} dγ ({round})"),
            &download(stream, &dg),
            &dg_ref,
            &dg_mag,
        );
        assert_sum_close(
            &format!("{what} dβ ({round})"),
            &download(stream, &db),
            &db_ref,
            &db_mag,
        );
    }
}

/// Every case with each kind's default method (the constructors' own).
fn affine_all<T: NormType>(seed: u64) {
    affine_all_with::<T>(seed, None);
}

/// Every layer / group / instance case of [`affine_case`], computed with `method` (or with the
/// constructors' default when `None`).
fn affine_all_with<T: NormType>(seed: u64, method: Option<NormMethod>) {
    let Some((stream, cudnn)) = gpu() else { return };
    let eps = 1e-5;
    let with = |n: LayerNorm<T>| match method {
        Some(m) => n.with_method(m),
        None => Ok(n),
    };
    let with_g = |n: GroupNorm<T>| match method {
        Some(m) => n.with_method(m),
        None => Ok(n),
    };
    let layer = |dims: &[i64], k: usize| {
        Norm::Layer(
            LayerNorm::<T>::new(&nchw(dims), k, eps)
                .and_then(with)
                .unwrap(),
        )
    };
    let group = |dims: &[i64], g: i64| {
        Norm::Group(
            GroupNorm::<T>::new(&nchw(dims), g, eps)
                .and_then(with_g)
                .unwrap(),
        )
    };
    let cases: Vec<(&str, Norm<T>)> = vec![
        ("layer [6, 40] over 1", layer(&[6, 40], 1)),
        ("layer [3, 4, 20] over 2", layer(&[3, 4, 20], 2)),
        ("layer [2, 3, 4, 5] over 1", layer(&[2, 3, 4, 5], 1)),
        ("layer [37] over 1", layer(&[37], 1)),
        // 13 rows (prime): the two-stage sums fall back to one reduction; 26 = 13·2 rows:
        // the most lopsided split.
        ("layer [13, 24] over 1", layer(&[13, 24], 1)),
        ("layer [26, 8] over 1", layer(&[26, 8], 1)),
        ("group [4, 8, 5, 6] G=2", group(&[4, 8, 5, 6], 2)),
        ("group [4, 8, 5, 6] G=1", group(&[4, 8, 5, 6], 1)),
        (
            "instance [4, 8, 5, 6]",
            Norm::Group(
                GroupNorm::<T>::instance(&nchw(&[4, 8, 5, 6]), eps)
                    .and_then(with_g)
                    .unwrap(),
            ),
        ),
        ("group [3, 6, 10] G=3", group(&[3, 6, 10], 3)),
        ("group [2, 4, 2, 3, 4] G=2", group(&[2, 4, 2, 3, 4], 2)),
        ("group [5, 12] G=4", group(&[5, 12], 4)),
        // One sample: the two-stage sums split the 20 spatial positions as 5·4; 7 (prime)
        // positions are summed in one call.
        ("group [1, 6, 4, 5] G=3", group(&[1, 6, 4, 5], 3)),
        ("group [1, 4, 7] G=2", group(&[1, 4, 7], 2)),
    ];
    for (i, (what, norm)) in cases.iter().enumerate() {
        let what = match norm {
            Norm::Layer(n) => format!("{what} {:?}", n.method()),
            Norm::Group(n) => format!("{what} {:?}", n.method()),
        };
        affine_case(&stream, &cudnn, &what, norm, eps, seed + i as u64);
    }
}

#[test]
fn layer_group_instance_norm_f32() {
    affine_all::<f32>(1000);
}
#[test]
fn layer_group_instance_norm_f64() {
    affine_all::<f64>(1100);
}
#[test]
fn layer_group_instance_norm_f16() {
    affine_all::<f16>(1200);
}
#[test]
fn layer_group_instance_norm_bf16() {
    affine_all::<bf16>(1300);
}

/// A layer norm's default path is the fused graph for the data types cuDNN has normalization
/// engines for: the training forward saves no `x̂`, and forward, training forward and backward
/// agree with the f64 reference (every case of [`affine_case`] also runs the default path).
fn fused_default<T: NormType>(seed: u64) {
    let Some((stream, cudnn)) = gpu() else { return };
    let cases: [(&[i64], usize); 3] = [(&[64, 768], 1), (&[4, 33, 96], 1), (&[8, 16, 48], 2)];
    for (i, (dims, k)) in cases.into_iter().enumerate() {
        let ln = LayerNorm::<T>::new(&nchw(dims), k, 1e-5).unwrap();
        assert_eq!(ln.path(), LayerNormPath::Auto);
        let (n, d) = (ln.len(), ln.features());
        let mut rng = Rng::new(seed + i as u64);
        let x = dev(&stream, &rng.values::<T>(n));
        let g = dev(&stream, &rng.values_in::<T>(d, 0.5, 1.5));
        let mut y = poisoned_buffer::<T>(&stream, n);
        let saved = cudnn
            .layer_norm_forward_training(&ln, &x, &g, &g, &mut y)
            .unwrap();
        assert!(
            saved.from_graph() && saved.xhat().is_none(),
            "{} {dims:?}: the default path saved x̂ (batch-norm formulation)",
            T::DTYPE
        );
        drop(saved);
        let what = format!("default path {dims:?} over {k}");
        affine_case(
            &stream,
            &cudnn,
            &what,
            &Norm::Layer(ln),
            1e-5,
            seed + 10 + i as u64,
        );
    }
}

#[test]
fn layer_norm_default_is_the_fused_graph_path() {
    fused_default::<f32>(1500);
    fused_default::<f16>(1520);
    fused_default::<bf16>(1540);
}

/// f64 has no graph engine: the default path is the batch-norm formulation, and asking for
/// the graph path is a typed error that leaves the output untouched.
#[test]
fn layer_norm_f64_runs_the_batch_norm_formulation() {
    let Some((stream, cudnn)) = gpu() else { return };
    let ln = LayerNorm::<f64>::new(&nchw(&[6, 40]), 1, 1e-5).unwrap();
    let (n, d) = (ln.len(), ln.features());
    let mut rng = Rng::new(1560);
    let x = dev(&stream, &rng.values::<f64>(n));
    let g = dev(&stream, &rng.values_in::<f64>(d, 0.5, 1.5));
    let mut y = poisoned_buffer::<f64>(&stream, n);
    let saved = cudnn
        .layer_norm_forward_training(&ln, &x, &g, &g, &mut y)
        .unwrap();
    assert!(saved.xhat().is_some() && !saved.from_graph());
    let graph = LayerNorm::<f64>::new(&nchw(&[6, 40]), 1, 1e-5)
        .unwrap()
        .with_path(LayerNormPath::Graph);
    let (mut y, yb) = sentinel_buffer::<f64>(&stream, n);
    let r = cudnn.layer_norm_forward(&graph, &x, &g, &g, &mut y);
    assert!(
        matches!(&r, Err(Error::UnsupportedDataType { .. })),
        "{r:?}"
    );
    assert_untouched("y (f64 graph path)", &stream, &y, &yb);
}

/// Views that start one element into their allocation (not 16-byte aligned, which the graph
/// binds at) run the fused path through aligned copies: the results equal those of aligned
/// buffers (the forward bit for bit), and nothing outside the views is written.
fn fused_unaligned<T: NormType>(seed: u64) {
    let Some((stream, cudnn)) = gpu() else { return };
    let ln = LayerNorm::<T>::new(&nchw(&[24, 100]), 1, 1e-5).unwrap();
    let (n, d) = (ln.len(), ln.features());
    let mut rng = Rng::new(seed);
    let (xv, dyv): (Vec<T>, Vec<T>) = (rng.values(n), rng.values(n));
    let (gv, bv): (Vec<T>, Vec<T>) = (rng.values_in(d, 0.5, 1.5), rng.values(d));
    let shifted = |v: &[T]| {
        let mut h = vec![T::from_f64(SENTINEL)];
        h.extend_from_slice(v);
        dev(&stream, &h)
    };
    let mut ws = Workspace::new(stream.clone());

    // Aligned: the reference results of the same plan.
    let (x, dy, g, b) = (
        dev(&stream, &xv),
        dev(&stream, &dyv),
        dev(&stream, &gv),
        dev(&stream, &bv),
    );
    let mut y = poisoned_buffer::<T>(&stream, n);
    cudnn.layer_norm_forward(&ln, &x, &g, &b, &mut y).unwrap();
    let y_plain = download(&stream, &y);
    let mut y = poisoned_buffer::<T>(&stream, n);
    let saved = cudnn
        .layer_norm_forward_training(&ln, &x, &g, &b, &mut y)
        .unwrap();
    assert!(saved.from_graph(), "{}: not the fused path", T::DTYPE);
    let y_train = download(&stream, &y);
    let mut dx = poisoned_buffer::<T>(&stream, n);
    let mut dg = poisoned_buffer::<T>(&stream, d);
    let mut db = poisoned_buffer::<T>(&stream, d);
    cudnn
        .layer_norm_backward(&ln, &saved, &x, &dy, &g, &mut dx, &mut dg, &mut db, &mut ws)
        .unwrap();
    let want = [
        download(&stream, &dx),
        download(&stream, &dg),
        download(&stream, &db),
    ];
    drop(saved);

    // Every buffer one element in.
    let (xs, dys, gs, bs) = (shifted(&xv), shifted(&dyv), shifted(&gv), shifted(&bv));
    let (xs, dys, gs, bs) = (xs.slice(1..), dys.slice(1..), gs.slice(1..), bs.slice(1..));
    let (mut ys, yb) = sentinel_buffer::<T>(&stream, n + 1);
    cudnn
        .layer_norm_forward(&ln, &xs, &gs, &bs, &mut ys.slice_mut(1..))
        .unwrap();
    let got = download(&stream, &ys);
    assert!(
        same_bits(&got[1..], &y_plain),
        "{} unaligned forward",
        T::DTYPE
    );
    assert!(same_bits(&got[..1], &yb[..1]), "{} y[-1] written", T::DTYPE);
    let (mut ys, _) = sentinel_buffer::<T>(&stream, n + 1);
    let mut yv = ys.slice_mut(1..);
    let saved = cudnn
        .layer_norm_forward_training(&ln, &xs, &gs, &bs, &mut yv)
        .unwrap();
    assert!(saved.from_graph());
    let bufs = [n + 1, d + 1, d + 1].map(|len| sentinel_buffer::<T>(&stream, len));
    let [(mut dxs, _), (mut dgs, _), (mut dbs, sb)] = bufs;
    cudnn
        .layer_norm_backward(
            &ln,
            &saved,
            &xs,
            &dys,
            &gs,
            &mut dxs.slice_mut(1..),
            &mut dgs.slice_mut(1..),
            &mut dbs.slice_mut(1..),
            &mut ws,
        )
        .unwrap();
    drop(saved);
    assert!(
        same_bits(&download(&stream, &ys)[1..], &y_train),
        "{} unaligned training y",
        T::DTYPE
    );
    // The backward's sums over the rows may be formed in another order from call to call.
    for (what, buf, want) in [
        ("dx", &dxs, &want[0]),
        ("dγ", &dgs, &want[1]),
        ("dβ", &dbs, &want[2]),
    ] {
        let got = download(&stream, buf);
        let what = format!("{} unaligned {what}", T::DTYPE);
        assert_close(&what, &got[1..], &to_f64(want), dtol::<T>());
        assert!(
            same_bits(&got[..1], &sb[..1]),
            "{} {what}[-1] written",
            T::DTYPE
        );
    }
}

/// Bitwise equality (NaN equal to itself).
fn same_bits<T: DataType>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}

#[test]
fn layer_norm_fused_path_takes_unaligned_views() {
    fused_unaligned::<f32>(1580);
    fused_unaligned::<bf16>(1590);
}

/// The layer-norm rejections of [`layer_and_group_norm_rejections_leave_outputs_untouched`] on
/// one path.
fn layer_norm_rejections(stream: &Arc<CudaStream>, cudnn: &Cudnn, path: LayerNormPath) {
    let stream = stream.clone();
    let ln = LayerNorm::<f32>::new(&nchw(&[6, 40]), 1, 1e-5)
        .unwrap()
        .with_path(path);
    let (n, d) = (ln.len(), ln.features());
    let mut rng = Rng::new(1400);
    let xv: Vec<f32> = rng.values(n);
    let x = dev(&stream, &xv);
    let gamma = dev(&stream, &rng.values_in::<f32>(d, 0.5, 1.5));
    let beta = dev(&stream, &rng.values::<f32>(d));

    // Short y, short gamma.
    let (mut y, yb) = sentinel_buffer::<f32>(&stream, n - 1);
    let r = cudnn.layer_norm_forward(&ln, &x, &gamma, &beta, &mut y);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    let r = cudnn.layer_norm_forward_training(&ln, &x, &gamma, &beta, &mut y);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    assert_untouched("short y", &stream, &y, &yb);
    let short_gamma = dev(&stream, &vec![1.0f32; d - 1]);
    let (mut y, yb) = sentinel_buffer::<f32>(&stream, n);
    let r = cudnn.layer_norm_forward(&ln, &x, &short_gamma, &beta, &mut y);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    assert_untouched("y (short gamma)", &stream, &y, &yb);

    // Saved values from another object of the same shape, or for another x.
    let mut y_ok = dev(&stream, &vec![0.0f32; n]);
    let saved = cudnn
        .layer_norm_forward_training(&ln, &x, &gamma, &beta, &mut y_ok)
        .unwrap();
    let ln2 = LayerNorm::<f32>::new(&nchw(&[6, 40]), 1, 1e-5)
        .unwrap()
        .with_path(path);
    let saved2 = cudnn
        .layer_norm_forward_training(&ln2, &x, &gamma, &beta, &mut y_ok)
        .unwrap();
    let x_copy = dev(&stream, &xv);
    let dy = dev(&stream, &rng.values::<f32>(n));
    let (mut dx, dxb) = sentinel_buffer::<f32>(&stream, n);
    let (mut dg, dgb) = sentinel_buffer::<f32>(&stream, d);
    let (mut db, dbb) = sentinel_buffer::<f32>(&stream, d);
    let mut ws = Workspace::new(stream.clone());
    let r = cudnn.layer_norm_backward(
        &ln, &saved2, &x, &dy, &gamma, &mut dx, &mut dg, &mut db, &mut ws,
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "foreign saved: {r:?}"
    );
    let r = cudnn.layer_norm_backward(
        &ln, &saved, &x_copy, &dy, &gamma, &mut dx, &mut dg, &mut db, &mut ws,
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "other x: {r:?}"
    );
    // A short dgamma is caught before dβ (computed with or before dγ) is written.
    let (mut dg_short, dgsb) = sentinel_buffer::<f32>(&stream, d - 1);
    let r = cudnn.layer_norm_backward(
        &ln,
        &saved,
        &x,
        &dy,
        &gamma,
        &mut dx,
        &mut dg_short,
        &mut db,
        &mut ws,
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "short dgamma: {r:?}"
    );
    assert_untouched("dx", &stream, &dx, &dxb);
    assert_untouched("dgamma", &stream, &dg, &dgb);
    assert_untouched("short dgamma", &stream, &dg_short, &dgsb);
    assert_untouched("dbeta", &stream, &db, &dbb);
}

#[test]
fn layer_and_group_norm_rejections_leave_outputs_untouched() {
    let Some((stream, cudnn)) = gpu() else { return };
    for path in [LayerNormPath::Auto, LayerNormPath::BatchNorm] {
        layer_norm_rejections(&stream, &cudnn, path);
    }
    let mut rng = Rng::new(1401);
    let mut ws = Workspace::new(stream.clone());

    // Group norm: short dx.
    let gn = GroupNorm::<f32>::new(&nchw(&[4, 8, 5, 6]), 4, 1e-5).unwrap();
    let (n, c) = (gn.len(), gn.channels());
    let x = dev(&stream, &rng.values::<f32>(n));
    let gamma = dev(&stream, &rng.values_in::<f32>(c, 0.5, 1.5));
    let beta = dev(&stream, &rng.values::<f32>(c));
    let mut y = dev(&stream, &vec![0.0f32; n]);
    let saved = cudnn
        .group_norm_forward_training(&gn, &x, &gamma, &beta, &mut y)
        .unwrap();
    let dy = dev(&stream, &rng.values::<f32>(n));
    let (mut dx, dxb) = sentinel_buffer::<f32>(&stream, n - 1);
    let (mut dg, dgb) = sentinel_buffer::<f32>(&stream, c);
    let (mut db, dbb) = sentinel_buffer::<f32>(&stream, c);
    let r = cudnn.group_norm_backward(
        &gn, &saved, &x, &dy, &gamma, &mut dx, &mut dg, &mut db, &mut ws,
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "short dx: {r:?}"
    );
    assert_untouched("group dx", &stream, &dx, &dxb);
    assert_untouched("group dgamma", &stream, &dg, &dgb);
    assert_untouched("group dbeta", &stream, &db, &dbb);
    // Saved values of a layer norm (either path) do not fit a group norm.
    let (mut dx, dxb) = sentinel_buffer::<f32>(&stream, n);
    for path in [LayerNormPath::Auto, LayerNormPath::BatchNorm] {
        // As many rows as the group norm has groups (16): the statistics fit, the origin not.
        let ln = LayerNorm::<f32>::new(&nchw(&[16, 60]), 1, 1e-5)
            .unwrap()
            .with_path(path);
        let g_ln = dev(&stream, &vec![1.0f32; 60]);
        let mut y_ln = dev(&stream, &vec![0.0f32; n]);
        let saved_ln = cudnn
            .layer_norm_forward_training(&ln, &x, &g_ln, &g_ln, &mut y_ln)
            .unwrap();
        let r = cudnn.group_norm_backward(
            &gn, &saved_ln, &x, &dy, &gamma, &mut dx, &mut dg, &mut db, &mut ws,
        );
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "{path:?}: {r:?}"
        );
        assert_untouched("group dx (foreign saved)", &stream, &dx, &dxb);
        assert_untouched("group dbeta (foreign saved)", &stream, &db, &dbb);
    }
}

// ---------------------------------------------------------------------------------------------
// Layer / group normalization: the other formulations (NormMethod)
// ---------------------------------------------------------------------------------------------

/// Every combination of the method knobs.
fn all_methods() -> Vec<NormMethod> {
    let mut v = Vec::new();
    for stats in NormStats::ALL {
        for affine in [NormAffine::OpTensor, NormAffine::BatchNormInference] {
            for grads in NormParamGrads::ALL {
                for fl in [FeatureLayout::ChannelsFirst, FeatureLayout::ChannelsLast] {
                    v.push(
                        NormMethod::reductions()
                            .with_stats(stats)
                            .with_affine(affine)
                            .with_param_grads(grads)
                            .with_feature_layout(fl),
                    );
                }
            }
        }
    }
    v
}

/// The formulations the f32 GPU tests run besides each kind's default (`affine_all`): the
/// first formulation (op-tensor + reductions), each knob moved alone from it, each kind's
/// default applied to both kinds, and the layer-norm default with batch-norm gradients (the
/// former default).
fn tested_methods() -> Vec<NormMethod> {
    let d = NormMethod::reductions();
    let mut v = vec![d];
    v.extend(NormStats::ALL[1..].iter().map(|&s| d.with_stats(s)));
    for fl in [FeatureLayout::ChannelsFirst, FeatureLayout::ChannelsLast] {
        v.push(
            d.with_affine(NormAffine::BatchNormInference)
                .with_feature_layout(fl),
        );
        v.push(
            d.with_param_grads(NormParamGrads::BatchNormBackward)
                .with_feature_layout(fl),
        );
    }
    v.push(d.with_param_grads(NormParamGrads::TwoStageReduce));
    v.push(NormMethod::default_for_layer());
    v.push(NormMethod::default_for_group());
    v.push(NormMethod::default_for_layer().with_param_grads(NormParamGrads::BatchNormBackward));
    v
}

#[test]
fn layer_and_group_norm_every_method_builds() {
    let Some(_) = lib() else { return };
    let methods = all_methods();
    assert_eq!(methods.len(), 48);
    for m in methods {
        let ln = LayerNorm::<f32>::new(&nchw(&[6, 40]), 1, 1e-5)
            .and_then(|n| n.with_method(m))
            .unwrap_or_else(|e| panic!("{m:?}: {e}"));
        assert_eq!(ln.method(), m);
        assert_eq!((ln.rows(), ln.features(), ln.len()), (6, 40, 240));
        assert!(format!("{ln:?}").contains("method"));
        let ln = LayerNorm::<f16>::new(&nchw(&[37]), 1, 1e-5)
            .and_then(|n| n.with_method(m))
            .unwrap_or_else(|e| panic!("{m:?}: {e}"));
        assert_eq!((ln.rows(), ln.features()), (1, 37));
        let gn = GroupNorm::<bf16>::new(&nchw(&[4, 8, 5, 6]), 2, 1e-5)
            .and_then(|n| n.with_method(m))
            .unwrap_or_else(|e| panic!("{m:?}: {e}"));
        assert_eq!(gn.method(), m);
        assert_eq!((gn.group_count(), gn.channels(), gn.len()), (8, 8, 960));
        let gn = GroupNorm::<f64>::instance(&nchw(&[2, 3, 7]), 1e-5)
            .and_then(|n| n.with_method(m))
            .unwrap_or_else(|e| panic!("{m:?}: {e}"));
        assert_eq!(gn.group_count(), 6);
    }
    // Each kind's default; rebuilding keeps shape and epsilon.
    let ln = LayerNorm::<f32>::new(&nchw(&[3, 4, 20]), 2, 1e-3).unwrap();
    assert_eq!(ln.method(), NormMethod::default_for_layer());
    let ln = ln.with_method(NormMethod::reductions()).unwrap();
    assert_eq!(ln.method(), NormMethod::reductions());
    assert_eq!((ln.rows(), ln.features(), ln.epsilon()), (3, 80, 1e-3));
    assert_eq!(ln.dims(), &[3, 4, 20]);
    let gn = GroupNorm::<f16>::new(&nchw(&[4, 8, 5, 6]), 2, 1e-5).unwrap();
    assert_eq!(gn.method(), NormMethod::default_for_group());
    let inorm = GroupNorm::<f32>::instance(&nchw(&[4, 8, 5, 6]), 1e-5).unwrap();
    assert_eq!(inorm.method(), NormMethod::default_for_group());
}

#[test]
fn layer_group_instance_norm_methods_f32() {
    for (i, m) in tested_methods().into_iter().enumerate() {
        affine_all_with::<f32>(3000 + 100 * i as u64, Some(m));
    }
}

/// The first formulation, the other statistics views, the two-stage sums, both defaults (with
/// their f32 conversions of `γ`, `β`, `dγ`, `dβ` for the half types) and the layer-norm
/// default with batch-norm gradients (the former default) in every other data type.
fn methods_every_view<T: NormType>(seed: u64) {
    let d = NormMethod::reductions();
    let mut methods = vec![d];
    methods.extend(NormStats::ALL[1..].iter().map(|&s| d.with_stats(s)));
    methods.push(d.with_param_grads(NormParamGrads::TwoStageReduce));
    methods.push(NormMethod::default_for_layer());
    methods.push(NormMethod::default_for_group());
    methods
        .push(NormMethod::default_for_layer().with_param_grads(NormParamGrads::BatchNormBackward));
    for (i, m) in methods.into_iter().enumerate() {
        affine_all_with::<T>(seed + 100 * i as u64, Some(m));
    }
}

#[test]
fn layer_group_instance_norm_methods_f64() {
    methods_every_view::<f64>(4000);
}
#[test]
fn layer_group_instance_norm_methods_f16() {
    methods_every_view::<f16>(5000);
}
#[test]
fn layer_group_instance_norm_methods_bf16() {
    methods_every_view::<bf16>(6000);
}

#[test]
fn norm_backward_workspace_is_reserved_before_any_write() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(7000);
    // One row and no spatial extent: the "reductions" are copies, no workspace.
    let ln = LayerNorm::<f32>::new(&nchw(&[37]), 1, 1e-5)
        .and_then(|n| n.with_method(NormMethod::reductions()))
        .unwrap();
    assert_eq!(ln.backward_workspace_size(&cudnn).unwrap(), 0);
    // dγ, dβ from a batch-norm backward (the group-norm default, the former layer-norm
    // default): no workspace.
    let ln = LayerNorm::<f32>::new(&nchw(&[6, 40]), 1, 1e-5)
        .and_then(|n| {
            n.with_method(
                NormMethod::default_for_layer().with_param_grads(NormParamGrads::BatchNormBackward),
            )
        })
        .unwrap();
    assert_eq!(ln.backward_workspace_size(&cudnn).unwrap(), 0);
    let gn = GroupNorm::<f32>::new(&nchw(&[4, 8, 5, 6]), 2, 1e-5).unwrap();
    assert_eq!(gn.backward_workspace_size(&cudnn).unwrap(), 0);

    let gn = GroupNorm::<f32>::new(&nchw(&[4, 8, 5, 6]), 2, 1e-5)
        .and_then(|g| g.with_method(NormMethod::reductions()))
        .unwrap();
    let need = gn.backward_workspace_size(&cudnn).unwrap();
    let gn_bn = GroupNorm::<f32>::new(&nchw(&[4, 8, 5, 6]), 2, 1e-5)
        .and_then(|g| {
            g.with_method(
                NormMethod::reductions().with_param_grads(NormParamGrads::BatchNormBackward),
            )
        })
        .unwrap();
    assert_eq!(gn_bn.backward_workspace_size(&cudnn).unwrap(), 0);

    let (n, c) = (gn.len(), gn.channels());
    let x = dev(&stream, &rng.values::<f32>(n));
    let gamma = dev(&stream, &rng.values_in::<f32>(c, 0.5, 1.5));
    let beta = dev(&stream, &rng.values::<f32>(c));
    let dy = dev(&stream, &rng.values::<f32>(n));
    let mut y = dev(&stream, &vec![0.0f32; n]);
    let saved = cudnn
        .group_norm_forward_training(&gn, &x, &gamma, &beta, &mut y)
        .unwrap();
    let (mut dx, dxb) = sentinel_buffer::<f32>(&stream, n);
    let (mut dg, dgb) = sentinel_buffer::<f32>(&stream, c);
    let (mut db, dbb) = sentinel_buffer::<f32>(&stream, c);
    if need > 0 {
        let mut ws = Workspace::new(stream.clone()).with_limit(need - 1);
        let r = cudnn.group_norm_backward(
            &gn, &saved, &x, &dy, &gamma, &mut dx, &mut dg, &mut db, &mut ws,
        );
        assert!(
            matches!(&r, Err(cudnn_safe::Error::WorkspaceLimit { .. })),
            "{r:?}"
        );
        assert_untouched("dx (workspace limit)", &stream, &dx, &dxb);
        assert_untouched("dgamma (workspace limit)", &stream, &dg, &dgb);
        assert_untouched("dbeta (workspace limit)", &stream, &db, &dbb);
    } else {
        eprintln!(
            "note: cuDNN asks no reduction workspace for {:?}",
            gn.dims()
        );
    }
    let mut ws = Workspace::new(stream.clone()).with_limit(need);
    cudnn
        .group_norm_backward(
            &gn, &saved, &x, &dy, &gamma, &mut dx, &mut dg, &mut db, &mut ws,
        )
        .unwrap();
    assert!(download(&stream, &dx).iter().all(|v| v.is_finite()));

    // The batch-norm gradient formulation runs with no workspace at all, and agrees.
    let mut y2 = dev(&stream, &vec![0.0f32; n]);
    let saved2 = cudnn
        .group_norm_forward_training(&gn_bn, &x, &gamma, &beta, &mut y2)
        .unwrap();
    let mut ws0 = Workspace::new(stream.clone()).with_limit(0);
    let mut dx2 = poisoned_buffer::<f32>(&stream, n);
    let mut dg2 = poisoned_buffer::<f32>(&stream, c);
    let mut db2 = poisoned_buffer::<f32>(&stream, c);
    cudnn
        .group_norm_backward(
            &gn_bn, &saved2, &x, &dy, &gamma, &mut dx2, &mut dg2, &mut db2, &mut ws0,
        )
        .unwrap();
    for (what, a, b) in [
        ("dx", &dx, &dx2),
        ("dgamma", &dg, &dg2),
        ("dbeta", &db, &db2),
    ] {
        let want = to_f64(&download(&stream, a));
        assert_close(what, &download(&stream, b), &want, 1e-4);
    }
    // Saved values of one formulation do not fit an object built with another.
    let r = cudnn.group_norm_backward(
        &gn_bn, &saved, &x, &dy, &gamma, &mut dx2, &mut dg2, &mut db2, &mut ws0,
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
}

/// The layer-norm default sums `dγ`, `dβ` in two reductions sharing the caller's workspace:
/// for bf16 (reduced through an f32 copy of the tensor) its size is at least that copy, a
/// workspace limited below it is refused before anything is written (every output keeps its
/// sentinel), and one limited to exactly it gives the reference gradients.
#[test]
fn layer_norm_two_stage_workspace_is_reserved_before_any_write() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(7100);
    let eps = 1e-5;
    // The batch-norm formulation's reductions (the fused path's plan needs its own workspace).
    let ln = LayerNorm::<bf16>::new(&nchw(&[6, 40]), 1, eps)
        .unwrap()
        .with_path(LayerNormPath::BatchNorm);
    assert_eq!(ln.method().param_grads, NormParamGrads::TwoStageReduce);
    let (n, d) = (ln.len(), ln.features());
    let need = ln.backward_workspace_size(&cudnn).unwrap();
    assert!(
        need >= 4 * n,
        "{need} bytes for the f32 copy of {n} elements"
    );
    // The one-call reductions need that copy too; the batch-norm gradients nothing.
    for (grads, zero) in [
        (NormParamGrads::Reduce, false),
        (NormParamGrads::BatchNormBackward, true),
    ] {
        let other = LayerNorm::<bf16>::new(&nchw(&[6, 40]), 1, eps)
            .and_then(|l| l.with_method(NormMethod::default_for_layer().with_param_grads(grads)))
            .unwrap();
        let bytes = other.backward_workspace_size(&cudnn).unwrap();
        assert_eq!(bytes == 0, zero, "{grads:?}: {bytes} bytes");
        assert!(zero || bytes >= 4 * n, "{grads:?}: {bytes} bytes");
    }

    let norm = Norm::Layer(ln);
    let maps = norm.maps();
    let xv: Vec<bf16> = rng.values(n);
    let gv: Vec<bf16> = rng.values_in(d, 0.5, 1.5);
    let bv: Vec<bf16> = rng.values(d);
    let dyv: Vec<bf16> = rng.values(n);
    let (x, gamma, beta, dy) = (
        dev(&stream, &xv),
        dev(&stream, &gv),
        dev(&stream, &bv),
        dev(&stream, &dyv),
    );
    let mut y = dev(&stream, &vec![bf16::ZERO; n]);
    let saved = norm
        .forward_training(&cudnn, &x, &gamma, &beta, &mut y)
        .unwrap();
    let (mut dx, dxb) = sentinel_buffer::<bf16>(&stream, n);
    let (mut dg, dgb) = sentinel_buffer::<bf16>(&stream, d);
    let (mut db, dbb) = sentinel_buffer::<bf16>(&stream, d);
    let mut ws = Workspace::new(stream.clone()).with_limit(need - 1);
    let r = norm.backward(
        &cudnn, &saved, &x, &dy, &gamma, &mut dx, &mut dg, &mut db, &mut ws,
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::WorkspaceLimit { .. })),
        "{r:?}"
    );
    assert_untouched("dx (workspace limit)", &stream, &dx, &dxb);
    assert_untouched("dgamma (workspace limit)", &stream, &dg, &dgb);
    assert_untouched("dbeta (workspace limit)", &stream, &db, &dbb);

    let mut ws = Workspace::new(stream.clone()).with_limit(need);
    norm.backward(
        &cudnn, &saved, &x, &dy, &gamma, &mut dx, &mut dg, &mut db, &mut ws,
    )
    .unwrap();
    let g64 = rounded(&gv);
    let (_, xhat, _, rstd) = affine_forward_ref(&rounded(&xv), &maps, &g64, &rounded(&bv), eps);
    let (dx_ref, dg_ref, db_ref, dg_mag, db_mag) =
        affine_backward_ref(&xhat, &rounded(&dyv), &maps, &g64, &rstd);
    assert_close("bf16 dx", &download(&stream, &dx), &dx_ref, dtol::<bf16>());
    assert_sum_close("bf16 dγ", &download(&stream, &dg), &dg_ref, &dg_mag);
    assert_sum_close("bf16 dβ", &download(&stream, &db), &db_ref, &db_mag);
}

// ---------------------------------------------------------------------------------------------
// LayerNorm through the graph formulation (`Cudnn::layer_norm_forward_graph`)
// ---------------------------------------------------------------------------------------------

/// Row layer norm reference: `y = (x − mean)/√(var + ε)·γ + β` per row of `d` (biased variance).
fn ln_rows_ref(x: &[f64], d: usize, gamma: &[f64], beta: &[f64], eps: f64) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(d) {
        let mean = row.iter().sum::<f64>() / d as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
        let inv = 1.0 / (var + eps).sqrt();
        y.extend(
            row.iter()
                .enumerate()
                .map(|(i, v)| (v - mean) * inv * gamma[i] + beta[i]),
        );
    }
    y
}

/// The graph formulation of one `LayerNorm<T>` against the f64 reference: NaN-poisoned y, the
/// plan built once and reused, a short y or a short γ refused with y untouched.
fn layer_norm_graph_case<T: NormType>(seed: u64) {
    let Some((stream, cudnn)) = gpu() else { return };
    let what = format!("LayerNorm graph {}", T::DTYPE);
    // Leading dims [4, 6] (24 rows), normalized [2, 64] (128 features).
    let ln = LayerNorm::<T>::new(&nchw(&[4, 6, 2, 64]), 2, 1e-5).unwrap();
    let (n, d) = (ln.len(), ln.features());
    assert!(!ln.has_graph_plan());
    let mut rng = Rng::new(seed);
    let xv: Vec<T> = rng.values_in(n, -1.5, 2.5);
    let gv: Vec<T> = rng.values_in(d, 0.5, 1.5);
    let bv: Vec<T> = rng.values(d);
    let want = ln_rows_ref(&rounded(&xv), d, &rounded(&gv), &rounded(&bv), 1e-5);
    let (x, gamma, beta) = (dev(&stream, &xv), dev(&stream, &gv), dev(&stream, &bv));
    let mut ws = Workspace::new(stream.clone());
    // The data type's tolerance, at least 1e-4: the engine's f32 statistics (one pass,
    // rsqrt) lose a few bits against the f64 reference.
    let t = dtol::<T>().max(1e-4);
    for round in 0..2 {
        let mut y = poisoned_buffer::<T>(&stream, n);
        cudnn
            .layer_norm_forward_graph(&ln, &x, &gamma, &beta, &mut y, &mut ws)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(ln.has_graph_plan(), "{what}: plan kept after round {round}");
        assert_close(&format!("{what} y"), &download(&stream, &y), &want, t);
    }
    // Rejections: y one element short; γ one element short. y untouched.
    let (mut short, before) = sentinel_buffer::<T>(&stream, n - 1);
    let r = cudnn.layer_norm_forward_graph(&ln, &x, &gamma, &beta, &mut short, &mut ws);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{what}: {r:?}"
    );
    assert_untouched(&format!("{what} short y"), &stream, &short, &before);
    let short_g = dev(&stream, &gv[..d - 1]);
    let (mut y, before) = sentinel_buffer::<T>(&stream, n);
    let r = cudnn.layer_norm_forward_graph(&ln, &x, &short_g, &beta, &mut y, &mut ws);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{what}: {r:?}"
    );
    assert_untouched(&format!("{what} y (short gamma)"), &stream, &y, &before);
    // The method (batch-norm formulation) does not affect the graph plan's result.
    let ln2 = LayerNorm::<T>::new(&nchw(&[4, 6, 2, 64]), 2, 1e-5)
        .unwrap()
        .with_method(NormMethod::reductions())
        .unwrap();
    let mut y = poisoned_buffer::<T>(&stream, n);
    cudnn
        .layer_norm_forward_graph(&ln2, &x, &gamma, &beta, &mut y, &mut ws)
        .unwrap();
    assert_close(
        &format!("{what} y (second object)"),
        &download(&stream, &y),
        &want,
        t,
    );
}

/// f32 as measured on the H200 (32768×1024: 1.49× PyTorch); f16 and bf16 with γ, β of the data
/// type, as cudnn-frontend's layer-norm tests run them.
#[test]
fn layer_norm_graph_formulation_every_type() {
    layer_norm_graph_case::<f32>(901);
    layer_norm_graph_case::<f16>(902);
    layer_norm_graph_case::<bf16>(903);
}

/// The graph training path of one `LayerNorm<T>` (`rows × d`) against the f64 reference: y and
/// the f32 statistics of the forward, then dx, dγ, dβ of the backward for two different dy, all
/// outputs poisoned with NaN; then the rejections (saved values of another object or another
/// x, a short dx, a short γ), each leaving every output untouched.
fn layer_norm_graph_training_case<T: NormType>(dims: &[i64], normalized: usize, seed: u64) {
    let Some((stream, cudnn)) = gpu() else { return };
    let what = format!("LayerNorm graph training {} {dims:?}", T::DTYPE);
    let eps = 1e-5;
    let ln = LayerNorm::<T>::new(&nchw(dims), normalized, eps).unwrap();
    let (n, d, rows) = (ln.len(), ln.features(), ln.rows());
    assert!(!ln.has_graph_training_plans());
    let maps = Maps {
        group: (0..n).map(|i| i / d).collect(),
        feature: (0..n).map(|i| i % d).collect(),
        groups: rows,
        features: d,
    };
    let mut rng = Rng::new(seed);
    let xv: Vec<T> = rng.values_in(n, -1.5, 2.5);
    let gv: Vec<T> = rng.values_in(d, 0.5, 1.5);
    let bv: Vec<T> = rng.values(d);
    let (x64, g64, b64) = (rounded(&xv), rounded(&gv), rounded(&bv));
    let (y_ref, xhat, mean_ref, rstd_ref) = affine_forward_ref(&x64, &maps, &g64, &b64, eps);
    let (x, gamma, beta) = (dev(&stream, &xv), dev(&stream, &gv), dev(&stream, &bv));
    let mut ws = Workspace::new(stream.clone());
    // The engine's f32 statistics (one pass, rsqrt) lose a few bits against the f64 reference.
    let t = dtol::<T>().max(1e-4);

    let mut y = poisoned_buffer::<T>(&stream, n);
    let saved = cudnn
        .layer_norm_forward_training_graph(&ln, &x, &gamma, &beta, &mut y, &mut ws)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(ln.has_graph_training_plans());
    assert_close(&format!("{what} y"), &download(&stream, &y), &y_ref, t);
    assert_eq!(saved.mean().len(), rows);
    let pt = ptol::<T>().max(1e-4);
    assert_close(
        &format!("{what} mean"),
        &download(&stream, saved.mean()),
        &mean_ref,
        pt,
    );
    assert_close(
        &format!("{what} rstd"),
        &download(&stream, saved.inv_std()),
        &rstd_ref,
        pt,
    );

    // Twice, with different dy: the held plan is reused.
    for round in 0..2 {
        let dyv: Vec<T> = rng.values(n);
        let dy = dev(&stream, &dyv);
        let (dx_ref, dg_ref, db_ref, dg_mag, db_mag) =
            affine_backward_ref(&xhat, &rounded(&dyv), &maps, &g64, &rstd_ref);
        let mut dx = poisoned_buffer::<T>(&stream, n);
        let mut dg = poisoned_buffer::<T>(&stream, d);
        let mut db = poisoned_buffer::<T>(&stream, d);
        cudnn
            .layer_norm_backward_graph(
                &ln, &saved, &x, &dy, &gamma, &mut dx, &mut dg, &mut db, &mut ws,
            )
            .unwrap_or_else(|e| panic!("{what} backward: {e}"));
        assert_close(
            &format!("{what} dx ({round})"),
            &download(&stream, &dx),
            &dx_ref,
            t,
        );
        assert_sum_close(
            &format!("{what} dγ ({round})"),
            &download(&stream, &dg),
            &dg_ref,
            &dg_mag,
        );
        assert_sum_close(
            &format!("{what} dβ ({round})"),
            &download(&stream, &db),
            &db_ref,
            &db_mag,
        );
    }

    // Rejections, every output untouched.
    let dy = dev(&stream, &rng.values::<T>(n));
    let backward = |why: &str, saved: &LayerNormGraphSaved, x: &CudaSlice<T>, dx_len: usize| {
        let (mut dx, dx0) = sentinel_buffer::<T>(&stream, dx_len);
        let (mut dg, dg0) = sentinel_buffer::<T>(&stream, d);
        let (mut db, db0) = sentinel_buffer::<T>(&stream, d);
        let mut ws = Workspace::new(stream.clone());
        let r = cudnn.layer_norm_backward_graph(
            &ln, saved, x, &dy, &gamma, &mut dx, &mut dg, &mut db, &mut ws,
        );
        assert_untouched(&format!("{what} dx ({why})"), &stream, &dx, &dx0);
        assert_untouched(&format!("{what} dγ ({why})"), &stream, &dg, &dg0);
        assert_untouched(&format!("{what} dβ ({why})"), &stream, &db, &db0);
        r
    };
    // Saved by another object of the same shape.
    let other = LayerNorm::<T>::new(&nchw(dims), normalized, eps).unwrap();
    let mut y2 = poisoned_buffer::<T>(&stream, n);
    let foreign = cudnn
        .layer_norm_forward_training_graph(&other, &x, &gamma, &beta, &mut y2, &mut ws)
        .unwrap();
    let r = backward("foreign saved", &foreign, &x, n);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{what} foreign saved: {r:?}"
    );
    // Another x buffer (same values).
    let x_copy = dev(&stream, &xv);
    let r = backward("other x", &saved, &x_copy, n);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{what} other x: {r:?}"
    );
    // dx one element short.
    let r = backward("short dx", &saved, &x, n - 1);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{what} short dx: {r:?}"
    );
    // Forward with γ one element short: y untouched.
    let short_g = dev(&stream, &gv[..d - 1]);
    let (mut y, before) = sentinel_buffer::<T>(&stream, n);
    let r = cudnn.layer_norm_forward_training_graph(&ln, &x, &short_g, &beta, &mut y, &mut ws);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{what} short gamma: {r:?}"
    );
    assert_untouched(&format!("{what} y (short gamma)"), &stream, &y, &before);
}

/// The graph training path in every type cuDNN has a norm engine for: f16 and bf16 with γ, β
/// and their gradients of the data type (the configuration that gets an engine; f32
/// statistics). Two shapes: rows of 128 over two normalized dimensions, and 37 rows of 1024.
#[test]
fn layer_norm_graph_training_every_type() {
    layer_norm_graph_training_case::<f32>(&[4, 6, 2, 64], 2, 911);
    layer_norm_graph_training_case::<f16>(&[4, 6, 2, 64], 2, 912);
    layer_norm_graph_training_case::<bf16>(&[4, 6, 2, 64], 2, 913);
    layer_norm_graph_training_case::<f32>(&[37, 1024], 1, 914);
    layer_norm_graph_training_case::<bf16>(&[37, 1024], 1, 915);
}

/// cuDNN has no f64 norm engine: the graph formulation refuses f64 with a typed error before
/// anything runs, and the batch-norm formulation still serves f64.
#[test]
fn layer_norm_graph_formulation_refuses_f64() {
    let Some((stream, cudnn)) = gpu() else { return };
    let ln = LayerNorm::<f64>::new(&nchw(&[8, 128]), 1, 1e-5).unwrap();
    let r = ln.build_graph_plan(&cudnn);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
        "{r:?}"
    );
    assert!(!ln.has_graph_plan());
    let x = dev(&stream, &vec![0.5f64; ln.len()]);
    let g = dev(&stream, &vec![1.0f64; 128]);
    let b = dev(&stream, &vec![0.25f64; 128]);
    let (mut y, before) = sentinel_buffer::<f64>(&stream, ln.len());
    let mut ws = Workspace::new(stream.clone());
    let r = cudnn.layer_norm_forward_graph(&ln, &x, &g, &b, &mut y, &mut ws);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
        "{r:?}"
    );
    assert_untouched("f64 graph layer norm", &stream, &y, &before);
    // The graph training path likewise.
    let r = ln.build_graph_training_plans(&cudnn);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
        "{r:?}"
    );
    assert!(!ln.has_graph_training_plans());
    let r = cudnn.layer_norm_forward_training_graph(&ln, &x, &g, &b, &mut y, &mut ws);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
        "{r:?}"
    );
    assert_untouched("f64 graph layer norm training", &stream, &y, &before);
}

// ---------------------------------------------------------------------------------------------
// RmsNorm (cuDNN's fused RMS-norm graphs)
// ---------------------------------------------------------------------------------------------

/// RMS-norm reference per row of `d`: (y, r, dx, dγ, Σ|dy·x·r| per feature) with
/// `r = 1/√(mean(x²) + ε)`, `y = x·r·γ`, `dx = r·γ·dy − x·r³/d·Σ_j dy_j·γ_j·x_j`,
/// `dγ = Σ_rows dy·x·r`.
type RmsRef = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);

fn rms_ref(x: &[f64], d: usize, gamma: &[f64], dy: &[f64], eps: f64) -> RmsRef {
    let (mut y, mut r, mut dx) = (Vec::new(), Vec::new(), Vec::new());
    let (mut dg, mut dg_mag) = (vec![0.0; d], vec![0.0; d]);
    for (row, g) in x.chunks(d).zip(dy.chunks(d)) {
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / d as f64 + eps).sqrt();
        r.push(inv);
        let dot: f64 = (0..d).map(|j| g[j] * gamma[j] * row[j]).sum();
        for j in 0..d {
            y.push(row[j] * inv * gamma[j]);
            dx.push(inv * gamma[j] * g[j] - row[j] * inv.powi(3) / d as f64 * dot);
            dg[j] += g[j] * row[j] * inv;
            dg_mag[j] += (g[j] * row[j] * inv).abs();
        }
    }
    (y, r, dx, dg, dg_mag)
}

/// One `RmsNorm<T>` against the f64 reference: inference y, training y and r, then dx and dγ
/// for two different dy, all outputs poisoned with NaN; then the rejections (saved values of
/// another object or another x, a short dx, a short γ), each leaving every output untouched.
fn rms_norm_case<T: NormType>(dims: &[i64], normalized: usize, seed: u64) {
    let Some((stream, cudnn)) = gpu() else { return };
    let what = format!("RmsNorm {} {dims:?}", T::DTYPE);
    let eps = 1e-6;
    let rn = RmsNorm::<T>::new(&nchw(dims), normalized, eps).unwrap();
    let (n, d, rows) = (rn.len(), rn.features(), rn.rows());
    assert!(!rn.has_plan() && !rn.has_training_plans());
    let mut rng = Rng::new(seed);
    let xv: Vec<T> = rng.values_in(n, -1.5, 2.5);
    let gv: Vec<T> = rng.values_in(d, 0.5, 1.5);
    let (x64, g64) = (rounded(&xv), rounded(&gv));
    let (x, gamma) = (dev(&stream, &xv), dev(&stream, &gv));
    let mut ws = Workspace::new(stream.clone());
    // The engine's f32 statistics (rsqrt) lose a few bits against the f64 reference.
    let t = dtol::<T>().max(1e-4);

    let dy0: Vec<T> = rng.values(n);
    let (y_ref, r_ref, _, _, _) = rms_ref(&x64, d, &g64, &rounded(&dy0), eps);
    let mut y = poisoned_buffer::<T>(&stream, n);
    cudnn
        .rms_norm_forward(&rn, &x, &gamma, &mut y, &mut ws)
        .unwrap_or_else(|e| panic!("{what} inference: {e}"));
    assert!(rn.has_plan());
    assert_close(
        &format!("{what} inference y"),
        &download(&stream, &y),
        &y_ref,
        t,
    );

    let mut y = poisoned_buffer::<T>(&stream, n);
    let saved = cudnn
        .rms_norm_forward_training(&rn, &x, &gamma, &mut y, &mut ws)
        .unwrap_or_else(|e| panic!("{what} training: {e}"));
    assert!(rn.has_training_plans());
    assert_close(
        &format!("{what} training y"),
        &download(&stream, &y),
        &y_ref,
        t,
    );
    assert_eq!(saved.inv_rms().len(), rows);
    let pt = ptol::<T>().max(1e-4);
    assert_close(
        &format!("{what} r"),
        &download(&stream, saved.inv_rms()),
        &r_ref,
        pt,
    );

    // Twice, with different dy: the held plan is reused.
    for round in 0..2 {
        let dyv: Vec<T> = rng.values(n);
        let dy = dev(&stream, &dyv);
        let (_, _, dx_ref, dg_ref, dg_mag) = rms_ref(&x64, d, &g64, &rounded(&dyv), eps);
        let mut dx = poisoned_buffer::<T>(&stream, n);
        let mut dg = poisoned_buffer::<T>(&stream, d);
        cudnn
            .rms_norm_backward(&rn, &saved, &x, &dy, &gamma, &mut dx, &mut dg, &mut ws)
            .unwrap_or_else(|e| panic!("{what} backward: {e}"));
        assert_close(
            &format!("{what} dx ({round})"),
            &download(&stream, &dx),
            &dx_ref,
            t,
        );
        assert_sum_close(
            &format!("{what} dγ ({round})"),
            &download(&stream, &dg),
            &dg_ref,
            &dg_mag,
        );
    }

    // Rejections, every output untouched.
    let dy = dev(&stream, &rng.values::<T>(n));
    let backward = |why: &str, saved: &RmsNormSaved, x: &CudaSlice<T>, dx_len: usize| {
        let (mut dx, dx0) = sentinel_buffer::<T>(&stream, dx_len);
        let (mut dg, dg0) = sentinel_buffer::<T>(&stream, d);
        let mut ws = Workspace::new(stream.clone());
        let r = cudnn.rms_norm_backward(&rn, saved, x, &dy, &gamma, &mut dx, &mut dg, &mut ws);
        assert_untouched(&format!("{what} dx ({why})"), &stream, &dx, &dx0);
        assert_untouched(&format!("{what} dγ ({why})"), &stream, &dg, &dg0);
        r
    };
    let other = RmsNorm::<T>::new(&nchw(dims), normalized, eps).unwrap();
    let mut y2 = poisoned_buffer::<T>(&stream, n);
    let foreign = cudnn
        .rms_norm_forward_training(&other, &x, &gamma, &mut y2, &mut ws)
        .unwrap();
    let r = backward("foreign saved", &foreign, &x, n);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{what} foreign saved: {r:?}"
    );
    let x_copy = dev(&stream, &xv);
    let r = backward("other x", &saved, &x_copy, n);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{what} other x: {r:?}"
    );
    let r = backward("short dx", &saved, &x, n - 1);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{what} short dx: {r:?}"
    );
    let short_g = dev(&stream, &gv[..d - 1]);
    for training in [false, true] {
        let (mut y, before) = sentinel_buffer::<T>(&stream, n);
        let r = if training {
            cudnn
                .rms_norm_forward_training(&rn, &x, &short_g, &mut y, &mut ws)
                .map(|_| ())
        } else {
            cudnn.rms_norm_forward(&rn, &x, &short_g, &mut y, &mut ws)
        };
        assert!(
            matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
            "{what} short gamma: {r:?}"
        );
        assert_untouched(&format!("{what} y (short gamma)"), &stream, &y, &before);
    }
}

/// Every type cuDNN has a norm engine for (γ and dγ of the data type, f32 r), on rows of 128
/// over two normalized dimensions and on 37 rows of 1024.
#[test]
fn rms_norm_every_type() {
    rms_norm_case::<f32>(&[4, 6, 2, 64], 2, 921);
    rms_norm_case::<f16>(&[4, 6, 2, 64], 2, 922);
    rms_norm_case::<bf16>(&[4, 6, 2, 64], 2, 923);
    rms_norm_case::<f32>(&[37, 1024], 1, 924);
    rms_norm_case::<bf16>(&[37, 1024], 1, 925);
}

/// f64 has no norm engine: refused with a typed error before anything runs.
#[test]
fn rms_norm_refuses_f64() {
    let Some((stream, cudnn)) = gpu() else { return };
    let rn = RmsNorm::<f64>::new(&nchw(&[8, 128]), 1, 1e-6).unwrap();
    for r in [rn.build_plan(&cudnn), rn.build_training_plans(&cudnn)] {
        assert!(
            matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
            "{r:?}"
        );
    }
    assert!(!rn.has_plan() && !rn.has_training_plans());
    let x = dev(&stream, &vec![0.5f64; rn.len()]);
    let g = dev(&stream, &vec![1.0f64; 128]);
    let (mut y, before) = sentinel_buffer::<f64>(&stream, rn.len());
    let mut ws = Workspace::new(stream.clone());
    let r = cudnn.rms_norm_forward(&rn, &x, &g, &mut y, &mut ws);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
        "{r:?}"
    );
    assert_untouched("f64 RMS norm", &stream, &y, &before);
}

/// Host only: the constructor's checks, the shape accessors, and the layer objects of the
/// graph paths being `Send` (moved to another thread with their plans).
#[test]
fn rms_norm_builder_checks() {
    let rn = RmsNorm::<f32>::new(&nchw(&[4, 6, 2, 64]), 2, 1e-6).unwrap();
    assert_eq!((rn.rows(), rn.features(), rn.len()), (24, 128, 3072));
    assert_eq!(rn.dims(), &[4, 6, 2, 64]);
    // epsilon 0 is accepted (cuDNN's batch-norm minimum does not apply to the graph).
    assert!(RmsNorm::<f32>::new(&nchw(&[2, 8]), 1, 0.0).is_ok());
    for (dims, k, eps) in [
        (&[4i64, 8][..], 0usize, 1e-6),
        (&[4, 8][..], 3, 1e-6),
        (&[4, 0][..], 1, 1e-6),
        (&[4, 8][..], 1, f64::NAN),
        (&[4, 8][..], 1, -1e-6),
        (&[4, 8][..], 1, f64::INFINITY),
    ] {
        let r = Layout::nchw_nd(dims).and_then(|x| RmsNorm::<f32>::new(&x, k, eps));
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "{dims:?} {k} {eps}: {r:?}"
        );
    }
    fn is_send<S: Send>() {}
    is_send::<RmsNorm<bf16>>();
    is_send::<RmsNormSaved>();
    is_send::<LayerNorm<f16>>();
    is_send::<LayerNormGraphSaved>();
}
