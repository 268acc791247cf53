//! Pooling, activation and softmax: forward and backward against `f64` host references, for
//! every mode, every float type (f32, f64, f16, bf16) and channels-first, channels-last and
//! padded-strided layouts (1-D on `[N, C, W]` tensors, 2-D and 3-D), the 1-D convolution forward
//! on `[N, C, W]` tensors, plus the argument checks that must reject a call before launch, and
//! host-only checks of the descriptors against the real cuDNN library.
//!
//! References are computed from the values as stored (inputs rounded to the tensor type first),
//! on random inputs from a seeded PRNG. Max-pooling inputs are distinct within each `(n, c)`
//! plane (a shuffled set of multiples of 1/64, exact in every type), so every window has one
//! maximum and the backward reference can route `dy` to it. Activation inputs stay away from the
//! kinks (0, the clipped-ReLU ceiling) where the derivative is ambiguous.
//!
//! Outputs are poisoned with NaN when `beta = 0` (so unwritten elements show) or filled with
//! random values when `beta ≠ 0`; gaps between the elements of padded layouts hold a sentinel
//! that must survive; a rejected call must leave its whole output untouched.
//!
//! Without a GPU every GPU test prints `skipping: <why>` and passes (unless
//! `CUDNN_SAFE_REQUIRE_GPU=1`); host tests skip when cuDNN cannot be loaded (unless
//! `CUDNN_SAFE_REQUIRE_LIBRARY=1`).
mod common;

use std::ffi::c_int;
use std::sync::Arc;

use common::Rng;
use common::*;
use cudnn_safe::activation::{ActivationDesc, ActivationMode, GeluApproximation, NanPropagation};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::pooling::{PoolingDesc, PoolingMode};
use cudnn_safe::softmax::{SoftmaxAlgorithm, SoftmaxMode};
use cudnn_safe::sys;
use cudnn_safe::{Cudnn, DType, DataType, Error, Layout, StatusFamily, TensorDesc};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// Layouts and host images
// ---------------------------------------------------------------------------------------------

/// Memory layouts used by the tests (logical dims are always `[N, C, spatial...]`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fmt {
    /// Packed channels-first (NCHW, NCDHW).
    First,
    /// Packed channels-last (NHWC, NDHWC).
    Last,
    /// Channels-first with a gap after every row, plane, ... (strides computed over dims + 1).
    Padded,
}

const FMTS: [Fmt; 3] = [Fmt::First, Fmt::Last, Fmt::Padded];

/// Strides of `dims` in `fmt`, computed here, independently of the crate.
fn strides_of(dims: &[i64], fmt: Fmt) -> Vec<i64> {
    match fmt {
        Fmt::First => packed_strides(dims),
        Fmt::Last => channels_last_strides(dims),
        Fmt::Padded => {
            let r = dims.len();
            let mut s = vec![1i64; r];
            for i in (0..r - 1).rev() {
                s[i] = s[i + 1] * (dims[i + 1] + 1);
            }
            s
        }
    }
}

/// A tensor's descriptor and the offsets of its logical elements (row-major order).
struct Tensor<T: DataType> {
    desc: TensorDesc<T>,
    dims: Vec<i64>,
    offs: Vec<usize>,
}

impl<T: DataType> Tensor<T> {
    fn new(dims: &[i64], fmt: Fmt) -> Self {
        let strides = strides_of(dims, fmt);
        let desc = match fmt {
            Fmt::First => TensorDesc::<T>::nchw_nd(dims),
            Fmt::Last => TensorDesc::<T>::nhwc_nd(dims),
            Fmt::Padded => TensorDesc::<T>::strided(dims, &strides),
        }
        .unwrap_or_else(|e| panic!("descriptor {dims:?} {fmt:?}: {e}"));
        assert_eq!(desc.layout().strides(), &strides[..], "{dims:?} {fmt:?}");
        Tensor {
            desc,
            dims: dims.to_vec(),
            offs: offsets(dims, &strides),
        }
    }

    fn with_strides(dims: &[i64], strides: &[i64]) -> Self {
        Tensor {
            desc: TensorDesc::<T>::strided(dims, strides).unwrap(),
            dims: dims.to_vec(),
            offs: offsets(dims, strides),
        }
    }

    fn len(&self) -> usize {
        self.offs.len()
    }

    fn span(&self) -> usize {
        self.desc.span()
    }

    /// Uploads `vals` (logical order) with the sentinel in the gaps; returns the host image too.
    fn upload(&self, s: &Arc<CudaStream>, vals: &[T]) -> (CudaSlice<T>, Vec<T>) {
        assert_eq!(vals.len(), self.len());
        let host = image(self.span(), &self.offs, |i| vals[i]);
        (s.clone_htod(&host).unwrap(), host)
    }

    /// An output buffer for `beta`: NaN-poisoned when `beta == 0` (not read), random values
    /// otherwise. Returns the buffer, its host image and the logical prior values.
    fn output(
        &self,
        s: &Arc<CudaStream>,
        rng: &mut Rng,
        beta: f64,
    ) -> (CudaSlice<T>, Vec<T>, Vec<f64>) {
        let prior: Vec<T> = if beta == 0.0 {
            vec![poison::<T>(); self.len()]
        } else {
            rng.values(self.len())
        };
        let (dev, host) = self.upload(s, &prior);
        (dev, host, to_f64(&prior))
    }

    /// Downloads `dev` and checks the addressed elements against `want` and the gaps against
    /// `before`.
    fn check(
        &self,
        what: &str,
        s: &Arc<CudaStream>,
        dev: &CudaSlice<T>,
        before: &[T],
        want: &[f64],
        tol: f64,
    ) {
        let got = download(s, dev);
        check_strided(what, &got, before, &self.offs, want, tol);
    }
}

/// The (alpha, beta) pair used with each layout: plain, scaled with the output unread, and
/// scaled blending into a prior output.
fn scales(fmt: Fmt) -> (f64, f64) {
    match fmt {
        Fmt::First => (1.0, 0.0),
        Fmt::Last => (0.5, 0.0),
        Fmt::Padded => (1.25, -0.5),
    }
}

/// Whether a call's failure is cuDNN saying it does not support this data type: tolerated for
/// bf16 only (ONNX Runtime records that cuDNN 8's softmax took no bf16; whether cuDNN 9's legacy
/// pooling, activation and softmax kernels do is what the GPU run shows), reported on stderr so
/// the run shows it. Any other failure panics.
fn unsupported_bf16<T: DataType>(what: &str, r: Result<(), Error>) -> bool {
    match r {
        Ok(()) => false,
        Err(e)
            if T::DTYPE == DType::BF16
                && e.status().map(|s| s.family()) == Some(StatusFamily::NotSupported) =>
        {
            eprintln!("note: cuDNN does not support {what} for bf16: {e}");
            true
        }
        Err(e) => panic!("{what} ({}): {e}", T::DTYPE),
    }
}

/// Runs `f` for every float type.
macro_rules! for_floats {
    ($f:ident, $($arg:expr),*) => {{
        $f::<f32>($($arg),*);
        $f::<f64>($($arg),*);
        $f::<f16>($($arg),*);
        $f::<bf16>($($arg),*);
    }};
}

// ---------------------------------------------------------------------------------------------
// Pooling references
// ---------------------------------------------------------------------------------------------

/// A pooling problem: window, padding, strides and input dims.
#[derive(Clone, Debug)]
struct PoolCase {
    window: &'static [i64],
    pads: &'static [i64],
    strides: &'static [i64],
    x: &'static [i64],
}

/// 2-D, 3-D and 1-D (`[N, C, W]` tensors) cases: non-overlapping, overlapping with padding,
/// asymmetric. Every `(n, c)` plane holds at most 257 elements, so its values can be distinct
/// multiples of 1/64.
const POOL_CASES: [PoolCase; 8] = [
    PoolCase {
        window: &[2, 2],
        pads: &[0, 0],
        strides: &[2, 2],
        x: &[2, 3, 8, 9],
    },
    PoolCase {
        window: &[3, 3],
        pads: &[1, 1],
        strides: &[2, 2],
        x: &[2, 3, 9, 11],
    },
    PoolCase {
        window: &[3, 2],
        pads: &[1, 0],
        strides: &[1, 2],
        x: &[1, 4, 7, 9],
    },
    PoolCase {
        window: &[2, 2, 2],
        pads: &[0, 0, 0],
        strides: &[2, 2, 2],
        x: &[2, 2, 4, 5, 6],
    },
    PoolCase {
        window: &[3, 3, 2],
        pads: &[1, 1, 1],
        strides: &[2, 1, 2],
        x: &[1, 3, 5, 6, 7],
    },
    PoolCase {
        window: &[2],
        pads: &[0],
        strides: &[2],
        x: &[2, 3, 9],
    },
    PoolCase {
        window: &[3],
        pads: &[1],
        strides: &[2],
        x: &[2, 3, 11],
    },
    PoolCase {
        window: &[4],
        pads: &[1],
        strides: &[1],
        x: &[1, 4, 10],
    },
];

const POOL_MODES: [PoolingMode; 4] = [
    PoolingMode::Max,
    PoolingMode::MaxDeterministic,
    PoolingMode::AvgIncludePadding,
    PoolingMode::AvgExcludePadding,
];

impl PoolCase {
    fn desc(&self, mode: PoolingMode) -> PoolingDesc {
        PoolingDesc::builder(mode, self.window)
            .pads(self.pads)
            .strides(self.strides)
            .build()
            .unwrap()
    }

    /// Output dims, computed here: `(in + 2·pad − window) / stride + 1`.
    fn y_dims(&self) -> Vec<i64> {
        let mut y = vec![self.x[0], self.x[1]];
        for i in 0..self.window.len() {
            y.push((self.x[2 + i] + 2 * self.pads[i] - self.window[i]) / self.strides[i] + 1);
        }
        y
    }

    /// Calls `f(y_index, members)` for every output element, `members` being the row-major
    /// indices of the input elements its window covers inside the input.
    fn windows(&self, mut f: impl FnMut(usize, &[usize])) {
        let y_dims = self.y_dims();
        let sp = self.window.len();
        let mut members = Vec::new();
        for_each_index(&y_dims, |yi| {
            members.clear();
            for_each_index(self.window, |k| {
                let mut xi = vec![yi[0], yi[1]];
                for d in 0..sp {
                    let p = yi[2 + d] * self.strides[d] - self.pads[d] + k[d];
                    if p < 0 || p >= self.x[2 + d] {
                        return;
                    }
                    xi.push(p);
                }
                members.push(linear(self.x, &xi));
            });
            assert!(!members.is_empty(), "a window outside the input");
            f(linear(&y_dims, yi), &members);
        });
    }

    fn window_size(&self) -> f64 {
        self.window.iter().product::<i64>() as f64
    }

    fn forward_ref(&self, mode: PoolingMode, x: &[f64]) -> Vec<f64> {
        let mut y = vec![0.0; self.y_dims().iter().product::<i64>() as usize];
        self.windows(|o, m| {
            let sum: f64 = m.iter().map(|&i| x[i]).sum();
            y[o] = match mode {
                PoolingMode::Max | PoolingMode::MaxDeterministic => {
                    m.iter().map(|&i| x[i]).fold(f64::NEG_INFINITY, f64::max)
                }
                PoolingMode::AvgIncludePadding => sum / self.window_size(),
                PoolingMode::AvgExcludePadding => sum / m.len() as f64,
            };
        });
        y
    }

    fn backward_ref(&self, mode: PoolingMode, x: &[f64], dy: &[f64]) -> Vec<f64> {
        let mut dx = vec![0.0; x.len()];
        self.windows(|o, m| match mode {
            PoolingMode::Max | PoolingMode::MaxDeterministic => {
                let arg = *m
                    .iter()
                    .max_by(|&&a, &&b| x[a].partial_cmp(&x[b]).unwrap())
                    .unwrap();
                dx[arg] += dy[o];
            }
            PoolingMode::AvgIncludePadding | PoolingMode::AvgExcludePadding => {
                let count = if mode == PoolingMode::AvgIncludePadding {
                    self.window_size()
                } else {
                    m.len() as f64
                };
                for &i in m {
                    dx[i] += dy[o] / count;
                }
            }
        });
        dx
    }
}

/// Values distinct within every `(n, c)` plane of `dims`: shuffled multiples of 1/64 in
/// `[-2, 2]`, exact in f16 and bf16 too, so no window has two maxima.
fn distinct_planes<T: DataType>(rng: &mut Rng, dims: &[i64]) -> Vec<T> {
    let plane = dims[2..].iter().product::<i64>() as usize;
    assert!(plane <= 257, "plane of {plane} elements");
    let mut out = Vec::with_capacity(plane * (dims[0] * dims[1]) as usize);
    for _ in 0..dims[0] * dims[1] {
        let mut ks: Vec<i64> = (-128..=128).collect();
        for i in 0..plane {
            let j = rng.range(i as i64, ks.len() as i64) as usize;
            ks.swap(i, j);
        }
        out.extend(ks[..plane].iter().map(|&k| T::from_f64(k as f64 / 64.0)));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Pooling on the GPU
// ---------------------------------------------------------------------------------------------

/// Forward then backward of one pooling case, each against the host reference.
fn pooling_case<T: DataType>(
    s: &Arc<CudaStream>,
    cudnn: &Cudnn,
    rng: &mut Rng,
    mode: PoolingMode,
    case: &PoolCase,
    fmt: Fmt,
) {
    let pool = case.desc(mode);
    let y_dims = case.y_dims();
    assert_eq!(pool.output_dims(case.x).unwrap(), y_dims);
    let (xt, yt) = (
        Tensor::<T>::new(case.x, fmt),
        Tensor::<T>::new(&y_dims, fmt),
    );
    let (alpha, beta) = scales(fmt);
    let ((a, af), (b, bf)) = (scalar::<T>(alpha), scalar::<T>(beta));
    let what = format!(
        "pooling {mode:?} {} {fmt:?} window {:?} pads {:?} strides {:?}",
        T::DTYPE,
        case.window,
        case.pads,
        case.strides
    );

    let xv: Vec<T> = distinct_planes(rng, case.x);
    let xf = to_f64(&xv);
    let (x, _) = xt.upload(s, &xv);
    let (mut y, y_before, y_prior) = yt.output(s, rng, bf);
    let r = cudnn.pooling_forward(&pool, a, &xt.desc, &x, b, &yt.desc, &mut y);
    if unsupported_bf16::<T>(&what, r) {
        assert_untouched(&what, s, &y, &y_before);
        return;
    }
    let y_ref = case.forward_ref(mode, &xf);
    let want = blend(af, &y_ref, bf, &y_prior);
    yt.check(
        &format!("{what} forward"),
        s,
        &y,
        &y_before,
        &want,
        tol::<T>(),
    );

    // Backward from the forward's output as stored (exact for the max modes).
    let y_stored: Vec<T> = y_ref.iter().map(|&v| T::from_f64(v)).collect();
    let (y_in, _) = yt.upload(s, &y_stored);
    let dyv: Vec<T> = rng.values(yt.len());
    let (dy, _) = yt.upload(s, &dyv);
    let (mut dx, dx_before, dx_prior) = xt.output(s, rng, bf);
    let r = cudnn.pooling_backward(
        &pool, a, &yt.desc, &y_in, &yt.desc, &dy, &xt.desc, &x, b, &xt.desc, &mut dx,
    );
    if unsupported_bf16::<T>(&what, r) {
        assert_untouched(&what, s, &dx, &dx_before);
        return;
    }
    let dx_ref = case.backward_ref(mode, &xf, &to_f64(&dyv));
    let want = blend(af, &dx_ref, bf, &dx_prior);
    xt.check(
        &format!("{what} backward"),
        s,
        &dx,
        &dx_before,
        &want,
        tol::<T>(),
    );
}

fn pooling_all<T: DataType>(s: &Arc<CudaStream>, cudnn: &Cudnn, seed: u64) {
    let mut rng = Rng::new(seed);
    for mode in POOL_MODES {
        for case in &POOL_CASES {
            for fmt in FMTS {
                pooling_case::<T>(s, cudnn, &mut rng, mode, case, fmt);
            }
        }
    }
}

#[test]
fn pooling_matches_reference_f32() {
    let Some((s, cudnn)) = gpu() else { return };
    pooling_all::<f32>(&s, &cudnn, 1);
}

#[test]
fn pooling_matches_reference_f64() {
    let Some((s, cudnn)) = gpu() else { return };
    pooling_all::<f64>(&s, &cudnn, 2);
}

#[test]
fn pooling_matches_reference_f16() {
    let Some((s, cudnn)) = gpu() else { return };
    pooling_all::<f16>(&s, &cudnn, 3);
}

#[test]
fn pooling_matches_reference_bf16() {
    let Some((s, cudnn)) = gpu() else { return };
    pooling_all::<bf16>(&s, &cudnn, 4);
}

#[test]
fn deterministic_max_pooling_backward_is_reproducible() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(5);
    // Overlapping windows: several outputs route gradient to the same input.
    let case = &POOL_CASES[1];
    let pool = case.desc(PoolingMode::MaxDeterministic);
    let y_dims = case.y_dims();
    let (xt, yt) = (
        Tensor::<f32>::new(case.x, Fmt::First),
        Tensor::<f32>::new(&y_dims, Fmt::First),
    );
    let xv: Vec<f32> = distinct_planes(&mut rng, case.x);
    let (x, _) = xt.upload(&s, &xv);
    let mut y = poisoned_buffer::<f32>(&s, yt.span());
    cudnn
        .pooling_forward(&pool, 1.0, &xt.desc, &x, 0.0, &yt.desc, &mut y)
        .unwrap();
    let dyv: Vec<f32> = rng.values(yt.len());
    let (dy, _) = yt.upload(&s, &dyv);
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut dx = poisoned_buffer::<f32>(&s, xt.span());
        cudnn
            .pooling_backward(
                &pool, 1.0, &yt.desc, &y, &yt.desc, &dy, &xt.desc, &x, 0.0, &xt.desc, &mut dx,
            )
            .unwrap();
        runs.push(download(&s, &dx));
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&runs[0]), bits(&runs[1]));
    let want = case.backward_ref(PoolingMode::MaxDeterministic, &to_f64(&xv), &to_f64(&dyv));
    assert_close("deterministic max backward", &runs[0], &want, tol::<f32>());
}

#[test]
fn max_pooling_propagates_nan_when_asked() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(6);
    let case = &POOL_CASES[0];
    let pool = PoolingDesc::builder(PoolingMode::Max, case.window)
        .strides(case.strides)
        .nan(NanPropagation::Propagate)
        .build()
        .unwrap();
    let y_dims = case.y_dims();
    let (xt, yt) = (
        Tensor::<f32>::new(case.x, Fmt::First),
        Tensor::<f32>::new(&y_dims, Fmt::First),
    );
    let mut xv: Vec<f32> = distinct_planes(&mut rng, case.x);
    xv[0] = f32::NAN; // in the first window only
    let (x, _) = xt.upload(&s, &xv);
    let mut y = poisoned_buffer::<f32>(&s, yt.span());
    cudnn
        .pooling_forward(&pool, 1.0, &xt.desc, &x, 0.0, &yt.desc, &mut y)
        .unwrap();
    let got = download(&s, &y);
    assert!(got[0].is_nan(), "window with a NaN gave {}", got[0]);
    let mut xf = to_f64(&xv);
    xf[0] = -10.0; // any value below the others: the remaining windows are unaffected
    let want = case.forward_ref(PoolingMode::Max, &xf);
    assert_close("windows without NaN", &got[1..], &want[1..], tol::<f32>());
}

// ---------------------------------------------------------------------------------------------
// Activation references and GPU tests
// ---------------------------------------------------------------------------------------------

/// The clipped-ReLU ceiling, ELU alpha and swish beta of the tests (exact in every type).
const CEILING: f64 = 1.5;

const GELU: ActivationMode = ActivationMode::Gelu {
    approximate: GeluApproximation::Exact,
};
const GELU_TANH: ActivationMode = ActivationMode::Gelu {
    approximate: GeluApproximation::Tanh,
};

const ACT_MODES: [ActivationMode; 8] = [
    ActivationMode::Sigmoid,
    ActivationMode::Relu,
    ActivationMode::Tanh,
    ActivationMode::ClippedRelu { ceiling: CEILING },
    ActivationMode::Elu { alpha: 0.75 },
    ActivationMode::Swish { beta: 1.25 },
    GELU,
    GELU_TANH,
];

/// `erf(x)` in f64 (the standard library has none): the Maclaurin series for `|x| < 3`
/// (about 1e-14 absolute there), `1 − erfc(x)` from erfc's continued fraction beyond.
fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a < 3.0 {
        // erf(x) = 2/√π · Σ (−1)ⁿ x^(2n+1) / (n!·(2n+1))
        let (mut term, mut sum) = (x, x);
        for n in 1..200 {
            term *= -x * x / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        return sum * 2.0 / std::f64::consts::PI.sqrt();
    }
    // erfc(a) = e^(−a²)/√π · 1/(a + (1/2)/(a + 1/(a + (3/2)/(a + …))))
    let mut t = a;
    for k in (1..=80).rev() {
        t = a + (k as f64 / 2.0) / t;
    }
    let erfc = (-a * a).exp() / std::f64::consts::PI.sqrt() / t;
    (1.0 - erfc).copysign(x)
}

/// `(f(x), f′(x))` in f64.
fn act_ref(mode: ActivationMode, x: f64) -> (f64, f64) {
    let sigmoid = |v: f64| 1.0 / (1.0 + (-v).exp());
    match mode {
        ActivationMode::Sigmoid => {
            let s = sigmoid(x);
            (s, s * (1.0 - s))
        }
        ActivationMode::Relu => (x.max(0.0), if x > 0.0 { 1.0 } else { 0.0 }),
        ActivationMode::Tanh => {
            let t = x.tanh();
            (t, 1.0 - t * t)
        }
        ActivationMode::ClippedRelu { ceiling } => (
            x.clamp(0.0, ceiling),
            if x > 0.0 && x < ceiling { 1.0 } else { 0.0 },
        ),
        ActivationMode::Elu { alpha } => {
            if x > 0.0 {
                (x, 1.0)
            } else {
                (alpha * (x.exp() - 1.0), alpha * x.exp())
            }
        }
        ActivationMode::Swish { beta } => {
            let s = sigmoid(beta * x);
            (x * s, s + beta * x * s * (1.0 - s))
        }
        ActivationMode::Gelu {
            approximate: GeluApproximation::Exact,
        } => {
            let cdf = 0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2));
            let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            (x * cdf, cdf + x * pdf)
        }
        ActivationMode::Gelu {
            approximate: GeluApproximation::Tanh,
        } => {
            let (k, kappa) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715);
            let t = (k * (x + kappa * x * x * x)).tanh();
            let dt = (1.0 - t * t) * k * (1.0 + 3.0 * kappa * x * x);
            (0.5 * x * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * x * dt)
        }
        ActivationMode::Identity => (x, 1.0),
    }
}

/// Whether `mode` is GELU (which runs only on the crate's own kernels).
fn is_gelu(mode: ActivationMode) -> bool {
    matches!(mode, ActivationMode::Gelu { .. })
}

/// Whether a GELU call on `T` tensors whose layouts are all `fmt` is refused before launch
/// (cuDNN has no GELU; the crate's kernels take f32, f16 and bf16 on one packed layout), and
/// the error it must be refused with.
fn gelu_refusal<T: DataType>(mode: ActivationMode, fmt: Fmt) -> Option<Kind> {
    if !is_gelu(mode) {
        None
    } else if T::DTYPE == DType::F64 {
        Some(kind!(UnsupportedDataType))
    } else if fmt == Fmt::Padded {
        Some(kind!(InvalidArgument))
    } else {
        None
    }
}

/// `n` inputs uniform in `[-3, 3]`, rounded to `T`, at least 0.05 away from the kinks (0 and
/// the clipped-ReLU ceiling) so that every derivative is unambiguous.
fn act_inputs<T: DataType>(rng: &mut Rng, n: usize) -> Vec<T> {
    (0..n)
        .map(|_| loop {
            let v = T::from_f64(rng.uniform(-3.0, 3.0));
            let f = v.to_f64();
            if f.abs() >= 0.05 && (f - CEILING).abs() >= 0.05 {
                break v;
            }
        })
        .collect()
}

/// Forward, in-place forward, backward and in-place backward of one activation case, with the
/// layout's usual (alpha, beta).
fn activation_case<T: DataType>(
    s: &Arc<CudaStream>,
    cudnn: &Cudnn,
    rng: &mut Rng,
    mode: ActivationMode,
    dims: &[i64],
    fmt: Fmt,
) {
    activation_case_scaled::<T>(s, cudnn, rng, mode, dims, fmt, scales(fmt));
}

/// [`activation_case`] with a given (alpha, beta).
fn activation_case_scaled<T: DataType>(
    s: &Arc<CudaStream>,
    cudnn: &Cudnn,
    rng: &mut Rng,
    mode: ActivationMode,
    dims: &[i64],
    fmt: Fmt,
    (alpha, beta): (f64, f64),
) {
    let act = ActivationDesc::new(mode).unwrap();
    let t = Tensor::<T>::new(dims, fmt);
    let ((a, af), (b, bf)) = (scalar::<T>(alpha), scalar::<T>(beta));
    let what = format!(
        "activation {mode:?} {} {fmt:?} {dims:?} alpha {alpha} beta {beta}",
        T::DTYPE
    );
    if let Some(kind) = gelu_refusal::<T>(mode, fmt) {
        gelu_refused::<T>(s, cudnn, rng, &act, &t, &t, kind, &what);
        return;
    }
    let xv: Vec<T> = act_inputs(rng, t.len());
    let xf = to_f64(&xv);
    let refs: Vec<(f64, f64)> = xf.iter().map(|&v| act_ref(mode, v)).collect();
    let f: Vec<f64> = refs.iter().map(|r| r.0).collect();
    let (x, _) = t.upload(s, &xv);

    // Forward.
    let (mut y, y_before, y_prior) = t.output(s, rng, bf);
    let r = cudnn.activation_forward(&act, a, &t.desc, &x, b, &t.desc, &mut y);
    if unsupported_bf16::<T>(&what, r) {
        assert_untouched(&what, s, &y, &y_before);
        return;
    }
    let want = blend(af, &f, bf, &y_prior);
    t.check(
        &format!("{what} forward"),
        s,
        &y,
        &y_before,
        &want,
        tol::<T>(),
    );

    // Forward in place: the prior contents are the input.
    let (mut xy, xy_before) = t.upload(s, &xv);
    let r = cudnn.activation_forward_in_place(&act, a, b, &t.desc, &mut xy);
    if unsupported_bf16::<T>(&what, r) {
        assert_untouched(&what, s, &xy, &xy_before);
    } else {
        let want = blend(af, &f, bf, &xf);
        t.check(
            &format!("{what} forward in place"),
            s,
            &xy,
            &xy_before,
            &want,
            tol::<T>(),
        );
    }

    // Backward from the forward's output as stored.
    let y_stored: Vec<T> = f.iter().map(|&v| T::from_f64(v)).collect();
    let (y_in, _) = t.upload(s, &y_stored);
    let dyv: Vec<T> = rng.values(t.len());
    let dyf = to_f64(&dyv);
    let (dy, _) = t.upload(s, &dyv);
    let grad: Vec<f64> = dyf.iter().zip(&refs).map(|(&d, r)| d * r.1).collect();
    let (mut dx, dx_before, dx_prior) = t.output(s, rng, bf);
    let r = cudnn.activation_backward(
        &act, a, &t.desc, &y_in, &t.desc, &dy, &t.desc, &x, b, &t.desc, &mut dx,
    );
    if unsupported_bf16::<T>(&what, r) {
        assert_untouched(&what, s, &dx, &dx_before);
    } else {
        let want = blend(af, &grad, bf, &dx_prior);
        t.check(
            &format!("{what} backward"),
            s,
            &dx,
            &dx_before,
            &want,
            tol::<T>(),
        );
    }

    // Backward in place: the gradient overwrites dy.
    let (mut g, g_before) = t.upload(s, &dyv);
    let r = cudnn
        .activation_backward_in_place(&act, a, &t.desc, &y_in, &t.desc, &x, b, &t.desc, &mut g);
    if unsupported_bf16::<T>(&what, r) {
        assert_untouched(&what, s, &g, &g_before);
    } else {
        let want = blend(af, &grad, bf, &dyf);
        t.check(
            &format!("{what} backward in place"),
            s,
            &g,
            &g_before,
            &want,
            tol::<T>(),
        );
    }
}

/// Every activation call on GELU with input layout `xt` and output layout `yt` (forward:
/// x → y, backward: y, dy in `yt`, x, dx in `xt`; in place on `yt`) must fail with `kind`
/// before launch, leaving every output untouched.
#[allow(clippy::too_many_arguments)] // the case, spelled out
fn gelu_refused<T: DataType>(
    s: &Arc<CudaStream>,
    cudnn: &Cudnn,
    rng: &mut Rng,
    act: &ActivationDesc,
    xt: &Tensor<T>,
    yt: &Tensor<T>,
    kind: Kind,
    what: &str,
) {
    let (one, zero) = (scalar::<T>(1.0).0, scalar::<T>(0.0).0);
    let (x, _) = xt.upload(s, &act_inputs(rng, xt.len()));
    let (y_in, _) = yt.upload(s, &act_inputs(rng, yt.len()));
    let (dy, _) = yt.upload(s, &rng.values(yt.len()));
    let (mut y, y_before) = yt.upload(s, &rng.values(yt.len()));
    let r = cudnn.activation_forward(act, one, &xt.desc, &x, zero, &yt.desc, &mut y);
    rejected(&format!("{what} forward"), r, kind, s, &y, &y_before);
    let r = cudnn.activation_forward_in_place(act, one, zero, &yt.desc, &mut y);
    if xt.desc.layout().strides() == yt.desc.layout().strides() {
        rejected(
            &format!("{what} forward in place"),
            r,
            kind,
            s,
            &y,
            &y_before,
        );
    } else {
        // One packed layout in place: the crate's kernel runs.
        r.unwrap_or_else(|e| panic!("{what} forward in place on {:?}: {e}", yt.dims));
    }
    let (mut dx, dx_before) = xt.upload(s, &rng.values(xt.len()));
    let r = cudnn.activation_backward(
        act, one, &yt.desc, &y_in, &yt.desc, &dy, &xt.desc, &x, zero, &xt.desc, &mut dx,
    );
    rejected(&format!("{what} backward"), r, kind, s, &dx, &dx_before);
    if xt.desc.layout().strides() == yt.desc.layout().strides() {
        let r = cudnn.activation_backward_in_place(
            act, one, &yt.desc, &y_in, &xt.desc, &x, zero, &xt.desc, &mut dx,
        );
        rejected(
            &format!("{what} backward in place"),
            r,
            kind,
            s,
            &dx,
            &dx_before,
        );
    }
}

/// Shapes of the activation tests. On packed layouts (`First`, `Last`: alpha 1 / beta 0 and
/// alpha 0.5 / beta 0 here, blending in `activation_packed_layouts_blend`) the crate's own
/// kernels run: ReLU forward on f32, and sigmoid, tanh, swish, ELU and GELU forward and
/// backward on f32, f16 and bf16; padded layouts, f64 and the other modes go to cuDNN (GELU is
/// refused there). Both paths are checked; the kernels' edge cases have their own tests below.
const ACT_DIMS: [&[i64]; 6] = [
    &[2, 3, 4, 5],
    &[2, 3, 2, 3, 4],
    &[4, 8, 8, 8],
    &[2, 4, 4, 8, 8],
    &[2, 3, 7],
    &[3, 5, 16],
];

fn activation_all<T: DataType>(s: &Arc<CudaStream>, cudnn: &Cudnn, seed: u64) {
    let mut rng = Rng::new(seed);
    for mode in ACT_MODES {
        for dims in ACT_DIMS {
            for fmt in FMTS {
                activation_case::<T>(s, cudnn, &mut rng, mode, dims, fmt);
            }
        }
    }
}

#[test]
fn activation_matches_reference_f32() {
    let Some((s, cudnn)) = gpu() else { return };
    activation_all::<f32>(&s, &cudnn, 11);
}

#[test]
fn activation_matches_reference_f64() {
    let Some((s, cudnn)) = gpu() else { return };
    activation_all::<f64>(&s, &cudnn, 12);
}

#[test]
fn activation_matches_reference_f16() {
    let Some((s, cudnn)) = gpu() else { return };
    activation_all::<f16>(&s, &cudnn, 13);
}

#[test]
fn activation_matches_reference_bf16() {
    let Some((s, cudnn)) = gpu() else { return };
    activation_all::<bf16>(&s, &cudnn, 14);
}

/// More than 5 dimensions, spatial dimensions packed (cuDNN's documented rule for them).
#[test]
fn activation_takes_six_dimensions() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(15);
    for mode in [ActivationMode::Relu, ActivationMode::Tanh] {
        activation_case::<f32>(&s, &cudnn, &mut rng, mode, &[2, 3, 2, 2, 3, 2], Fmt::First);
        // 2048 elements; ReLU runs the crate's kernel.
        activation_case::<f32>(&s, &cudnn, &mut rng, mode, &[2, 4, 2, 4, 4, 8], Fmt::First);
    }
}

/// Packed tensors with a blending `beta ≠ 0` (the prior output is read), in channels-first and
/// channels-last order, for every float type (the crate's kernels where they run, cuDNN for
/// the rest; f64 GELU refused); and the same with `beta = 0` on the largest count of these
/// tests.
#[test]
fn activation_packed_layouts_blend() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(18);
    fn run<T: DataType>(s: &Arc<CudaStream>, cudnn: &Cudnn, rng: &mut Rng) {
        for mode in [
            ActivationMode::Relu,
            ActivationMode::Swish { beta: 1.25 },
            ActivationMode::Sigmoid,
            GELU_TANH,
        ] {
            for fmt in [Fmt::First, Fmt::Last] {
                activation_case_scaled::<T>(s, cudnn, rng, mode, &[4, 8, 8, 8], fmt, (1.25, -0.5));
            }
            // 65536 elements.
            let dims = [8, 16, 16, 32];
            activation_case_scaled::<T>(s, cudnn, rng, mode, &dims, Fmt::Last, (1.0, 0.0));
        }
    }
    for_floats!(run, &s, &cudnn, &mut rng);
}

/// The forward pass reads and writes different layouts (NCHW in, NHWC out).
#[test]
fn activation_forward_converts_layouts() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(16);
    fn run<T: DataType>(s: &Arc<CudaStream>, cudnn: &Cudnn, rng: &mut Rng, dims: [i64; 4]) {
        let (xt, yt) = (
            Tensor::<T>::new(&dims, Fmt::First),
            Tensor::<T>::new(&dims, Fmt::Last),
        );
        let mode = ActivationMode::Swish { beta: 1.25 };
        let act = ActivationDesc::new(mode).unwrap();
        let xv: Vec<T> = act_inputs(rng, xt.len());
        let (x, _) = xt.upload(s, &xv);
        let (mut y, y_before, _) = yt.output(s, rng, 0.0);
        let r = cudnn.activation_forward(
            &act,
            scalar::<T>(1.0).0,
            &xt.desc,
            &x,
            scalar::<T>(0.0).0,
            &yt.desc,
            &mut y,
        );
        let what = format!("activation NCHW -> NHWC {} {dims:?}", T::DTYPE);
        if unsupported_bf16::<T>(&what, r) {
            assert_untouched(&what, s, &y, &y_before);
            return;
        }
        let want: Vec<f64> = to_f64(&xv).iter().map(|&v| act_ref(mode, v).0).collect();
        yt.check(&what, s, &y, &y_before, &want, tol::<T>());
    }
    // 120 elements, and 2048. The layouts differ, so even ReLU on f32 would go to cuDNN.
    for dims in [[2, 5, 3, 4], [4, 8, 8, 8]] {
        for_floats!(run, &s, &cudnn, &mut rng, dims);
    }
}

#[test]
fn relu_propagates_nan_when_asked() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(17);
    let act = ActivationDesc::builder(ActivationMode::Relu)
        .nan(NanPropagation::Propagate)
        .build()
        .unwrap();
    let t = Tensor::<f32>::new(&[1, 2, 3, 4], Fmt::First);
    let mut xv: Vec<f32> = act_inputs(&mut rng, t.len());
    xv[5] = f32::NAN;
    let (x, _) = t.upload(&s, &xv);
    let mut y = poisoned_buffer::<f32>(&s, t.span());
    cudnn
        .activation_forward(&act, 1.0, &t.desc, &x, 0.0, &t.desc, &mut y)
        .unwrap();
    let got = download(&s, &y);
    assert!(got[5].is_nan(), "relu(NaN) gave {}", got[5]);
    for (i, (&g, &x)) in got.iter().zip(&xv).enumerate() {
        if i != 5 {
            assert_eq!(g, x.max(0.0), "element {i}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The crate's own ReLU kernel (f32, one packed layout for x and y)
// ---------------------------------------------------------------------------------------------
//
// `activation_forward` runs ReLU on f32 tensors whose x and y share one packed layout on the
// crate's kernel (a loop over 8-element units of two 16-byte vectors, then a tail of
// `n mod 8` elements; a scalar loop when x or y is not 16-byte aligned); everything else runs
// cuDNN. These tests aim at the kernel's edges: counts with every tail length, tiny and large
// counts, views that start one element into a buffer, NaN and infinities under both NaN rules,
// the in-place form, and elements beyond the tensor that must stay untouched.

/// Elements past the tensor in every buffer here (sentinel-filled in outputs).
const SLACK: usize = 9;

/// A ReLU descriptor with the given NaN rule.
fn relu_desc(nan: NanPropagation) -> ActivationDesc {
    ActivationDesc::builder(ActivationMode::Relu)
        .nan(nan)
        .build()
        .unwrap()
}

/// `relu(x)` as the kernel must give it exactly (alpha 1, beta 0).
fn relu_exact(x: f32, nan: NanPropagation) -> f32 {
    match (x.is_nan(), nan) {
        (true, NanPropagation::Propagate) => f32::NAN,
        (true, NanPropagation::NotPropagate) => 0.0,
        (false, _) => x.max(0.0),
    }
}

/// Exact comparison, NaN matching NaN.
fn assert_bits_relu(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            g == w || (g.is_nan() && w.is_nan()),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

/// Checks a whole output buffer: exactly `want_exact` at `off..off + want_exact.len()`, the
/// sentinel everywhere else.
fn check_window(what: &str, got: &[f32], off: usize, want_exact: &[f32]) {
    assert_bits_relu(what, &got[off..off + want_exact.len()], want_exact);
    for (p, &g) in got.iter().enumerate() {
        if p < off || p >= off + want_exact.len() {
            assert_eq!(
                g, SENTINEL as f32,
                "{what}: element {p} outside the tensor changed"
            );
        }
    }
}

/// An output buffer of `len` elements: the sentinel, with `window` (poison or prior values)
/// at `off`.
fn output_window(s: &Arc<CudaStream>, len: usize, off: usize, window: &[f32]) -> CudaSlice<f32> {
    let mut host = vec![SENTINEL as f32; len];
    host[off..off + window.len()].copy_from_slice(window);
    s.clone_htod(&host).unwrap()
}

/// The descriptor of `n` packed elements as `[1, 1, 1, n]`.
fn row_desc(n: usize) -> TensorDesc<f32> {
    TensorDesc::<f32>::nchw(1, 1, 1, n as i64).unwrap()
}

/// Counts with every tail length (`n mod 8`), fewer than one vector, and one large tensor of
/// 3·2²⁰ + 3 elements (1536 units per block of the widest grid, plus a tail), in NCHW and NHWC
/// descriptions; alpha 1 / beta 0 exactly (output poisoned), alpha 0.5 / beta 0, and a
/// blending alpha 1.25 / beta −0.5 against the f64 reference. Buffers hold more than the
/// tensor: the extra output elements must keep their sentinel.
#[test]
fn fast_relu_counts_and_scales() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(41);
    let act = relu_desc(NanPropagation::Propagate);
    let mut descs: Vec<(String, TensorDesc<f32>)> = [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 15, 17, 1021]
        .iter()
        .map(|&n| (format!("[1, 1, 1, {n}]"), row_desc(n)))
        .collect();
    descs.push((
        "NHWC [3, 5, 1, 7]".into(),
        TensorDesc::nhwc(3, 5, 1, 7).unwrap(),
    ));
    descs.push((
        "NCHW [2, 3, 7, 11]".into(),
        TensorDesc::nchw(2, 3, 7, 11).unwrap(),
    ));
    let large = 3 * (1 << 20) + 3;
    descs.push(("[1, 1, 1, 3·2^20 + 3]".into(), row_desc(large)));
    for (name, desc) in &descs {
        let n = desc.span();
        let xv: Vec<f32> = act_inputs(&mut rng, n + SLACK);
        let x = s.clone_htod(&xv).unwrap();
        let xf = to_f64(&xv[..n]);

        // alpha 1, beta 0: exact, the poisoned output never read.
        let mut y = output_window(&s, n + SLACK, 0, &vec![f32::NAN; n]);
        cudnn
            .activation_forward(&act, 1.0, desc, &x, 0.0, desc, &mut y)
            .unwrap();
        let want: Vec<f32> = xv[..n].iter().map(|&v| v.max(0.0)).collect();
        check_window(&format!("relu {name}"), &download(&s, &y), 0, &want);

        // Scaled, with and without blending a prior output.
        for (alpha, beta) in [(0.5f32, 0.0f32), (1.25, -0.5)] {
            let prior: Vec<f32> = if beta == 0.0 {
                vec![f32::NAN; n]
            } else {
                rng.values(n)
            };
            let mut y = output_window(&s, n + SLACK, 0, &prior);
            cudnn
                .activation_forward(&act, alpha, desc, &x, beta, desc, &mut y)
                .unwrap();
            let relu: Vec<f64> = xf.iter().map(|&v| v.max(0.0)).collect();
            let want = blend(alpha.into(), &relu, beta.into(), &to_f64(&prior));
            let got = download(&s, &y);
            let what = format!("relu {name} alpha {alpha} beta {beta}");
            assert_close(&what, &got[..n], &want, tol::<f32>());
            assert!(
                got[n..].iter().all(|&g| g == SENTINEL as f32),
                "{what}: wrote past the tensor"
            );
        }
    }
}

/// Views that start 1, 2 or 3 elements into their buffer (`slice(k..)`: 4 to 12 bytes past
/// a 16-byte boundary) for x, for y and for both: the kernel must not assume alignment.
/// Exact with alpha 1 / beta 0, against the reference when blending.
#[test]
fn fast_relu_misaligned_views() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(42);
    let act = relu_desc(NanPropagation::Propagate);
    for n in [3usize, 8, 1027, 4099] {
        let desc = row_desc(n);
        for (x_off, y_off) in [(1usize, 0usize), (0, 1), (1, 1), (2, 3), (3, 2), (0, 4)] {
            let what = format!("relu n {n} x at +{x_off} y at +{y_off}");
            let xv: Vec<f32> = act_inputs(&mut rng, n + SLACK);
            let x = s.clone_htod(&xv).unwrap();
            let x_view = x.slice(x_off..);
            let want: Vec<f32> = xv[x_off..x_off + n].iter().map(|&v| v.max(0.0)).collect();

            let mut y = output_window(&s, n + SLACK, y_off, &vec![f32::NAN; n]);
            {
                let mut y_view = y.slice_mut(y_off..);
                cudnn
                    .activation_forward(&act, 1.0, &desc, &x_view, 0.0, &desc, &mut y_view)
                    .unwrap();
            }
            check_window(&what, &download(&s, &y), y_off, &want);

            let prior: Vec<f32> = rng.values(n);
            let mut y = output_window(&s, n + SLACK, y_off, &prior);
            {
                let mut y_view = y.slice_mut(y_off..);
                cudnn
                    .activation_forward(&act, 1.25, &desc, &x_view, -0.5, &desc, &mut y_view)
                    .unwrap();
            }
            let relu: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
            let want_blend = blend(1.25, &relu, -0.5, &to_f64(&prior));
            let got = download(&s, &y);
            assert_close(
                &format!("{what} blending"),
                &got[y_off..y_off + n],
                &want_blend,
                tol::<f32>(),
            );
            for (p, &g) in got.iter().enumerate() {
                if p < y_off || p >= y_off + n {
                    assert_eq!(g, SENTINEL as f32, "{what} blending: element {p} changed");
                }
            }
        }
    }
}

/// NaN, ±infinity and ±0 inputs, in the vector body and in the tail, aligned and misaligned,
/// under both NaN rules: `relu(NaN)` is NaN when NaN propagates and 0 otherwise, on the crate's
/// kernel (packed layout) and on cuDNN's (the same values in a padded layout): the two paths
/// must agree with each other and with that rule.
#[test]
fn fast_relu_nan_rules_match_cudnn() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(43);
    let dims = [1i64, 1, 13, 79]; // 1027 elements: 128 units and a tail of 3
    let n = 1027usize;
    let mut xv: Vec<f32> = act_inputs(&mut rng, n + 1);
    for &i in &[0usize, 5, 8 * 17 + 3, 8 * 100, n - 3, n - 1] {
        xv[i] = f32::NAN;
    }
    xv[7] = f32::INFINITY;
    xv[9] = f32::NEG_INFINITY;
    xv[n - 2] = f32::NEG_INFINITY;
    xv[11] = -0.0;
    xv[12] = 0.0;
    for nan in [NanPropagation::Propagate, NanPropagation::NotPropagate] {
        let act = relu_desc(nan);
        // Offsets 0 (vector kernel) and 1 (scalar kernel) into the same values.
        for off in [0usize, 1] {
            let vals = &xv[off..off + n];
            let want: Vec<f32> = vals.iter().map(|&v| relu_exact(v, nan)).collect();
            let what = format!("relu {nan:?} x and y at +{off}");

            let packed = Tensor::<f32>::new(&dims, Fmt::First);
            let x = s.clone_htod(&xv).unwrap();
            let mut y = output_window(&s, n + 1, off, &vec![f32::NAN; n]);
            {
                let mut y_view = y.slice_mut(off..);
                cudnn
                    .activation_forward(
                        &act,
                        1.0,
                        &packed.desc,
                        &x.slice(off..),
                        0.0,
                        &packed.desc,
                        &mut y_view,
                    )
                    .unwrap();
            }
            let got = download(&s, &y);
            // ±0 in: +0 or −0 out are both max(±0, 0); compare those by value.
            let fixed: Vec<f32> = got[off..off + n]
                .iter()
                .zip(&want)
                .map(|(&g, &w)| if g == 0.0 && w == 0.0 { w } else { g })
                .collect();
            assert_bits_relu(&format!("{what} (crate kernel)"), &fixed, &want);

            // cuDNN on the same logical values.
            let padded = Tensor::<f32>::new(&dims, Fmt::Padded);
            let (px, _) = padded.upload(&s, vals);
            let (mut py, py_before, _) = padded.output(&s, &mut rng, 0.0);
            cudnn
                .activation_forward(&act, 1.0, &padded.desc, &px, 0.0, &padded.desc, &mut py)
                .unwrap();
            let got = download(&s, &py);
            let picked: Vec<f32> = padded
                .offs
                .iter()
                .zip(&want)
                .map(|(&o, &w)| if got[o] == 0.0 && w == 0.0 { w } else { got[o] })
                .collect();
            assert_bits_relu(&format!("{what} (cuDNN, padded layout)"), &picked, &want);
            for (p, (&g, &b)) in got.iter().zip(&py_before).enumerate() {
                if !padded.offs.contains(&p) {
                    assert!(same(g, b), "{what} (cuDNN): gap {p} changed");
                }
            }
        }
    }
}

/// The in-place form on the crate's kernel: aligned and one element in (`slice_mut(1..)`),
/// counts with a tail and a large one, NaN under both rules, and a blend whose prior output is
/// the input itself.
#[test]
fn fast_relu_in_place() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(44);
    for n in [3usize, 1027, 3 * (1 << 20) + 3] {
        let desc = row_desc(n);
        for nan in [NanPropagation::Propagate, NanPropagation::NotPropagate] {
            let act = relu_desc(nan);
            for off in [0usize, 1] {
                let what = format!("relu in place n {n} {nan:?} at +{off}");
                let mut xv: Vec<f32> = act_inputs(&mut rng, n);
                xv[n / 2] = f32::NAN;
                let mut buf = output_window(&s, n + SLACK, off, &xv);
                {
                    let mut view = buf.slice_mut(off..);
                    cudnn
                        .activation_forward_in_place(&act, 1.0, 0.0, &desc, &mut view)
                        .unwrap();
                }
                let want: Vec<f32> = xv.iter().map(|&v| relu_exact(v, nan)).collect();
                check_window(&what, &download(&s, &buf), off, &want);
            }
        }
        // Blending: xy = 1.25·relu(xy) − 0.5·xy.
        let act = relu_desc(NanPropagation::Propagate);
        for off in [0usize, 1] {
            let xv: Vec<f32> = act_inputs(&mut rng, n);
            let mut buf = output_window(&s, n + SLACK, off, &xv);
            {
                let mut view = buf.slice_mut(off..);
                cudnn
                    .activation_forward_in_place(&act, 1.25, -0.5, &desc, &mut view)
                    .unwrap();
            }
            let xf = to_f64(&xv);
            let relu: Vec<f64> = xf.iter().map(|&v| v.max(0.0)).collect();
            let want = blend(1.25, &relu, -0.5, &xf);
            let got = download(&s, &buf);
            let what = format!("relu in place n {n} blending at +{off}");
            assert_close(&what, &got[off..off + n], &want, tol::<f32>());
            for (p, &g) in got.iter().enumerate() {
                if p < off || p >= off + n {
                    assert_eq!(g, SENTINEL as f32, "{what}: element {p} changed");
                }
            }
        }
    }
}

/// A rejected call never reaches the kernel: a short `y` (a view that loses the first
/// element), in place too, and a short `x` leave the output untouched.
#[test]
fn fast_relu_rejections_leave_output_untouched() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(45);
    let act = relu_desc(NanPropagation::Propagate);
    let n = 1027usize;
    let desc = row_desc(n);
    let xv: Vec<f32> = act_inputs(&mut rng, n);
    let x = s.clone_htod(&xv).unwrap();
    // y one element short, through a view of a full-size buffer.
    let (mut y, y_before) = sentinel_buffer::<f32>(&s, n);
    {
        let mut short = y.slice_mut(1..);
        let r = cudnn.activation_forward(&act, 1.0, &desc, &x, 0.0, &desc, &mut short);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
            "{r:?}"
        );
        let r = cudnn.activation_forward_in_place(&act, 1.0, 0.0, &desc, &mut short);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
            "{r:?}"
        );
    }
    // x short.
    let r = cudnn.activation_forward(&act, 1.0, &desc, &x.slice(1..), 0.0, &desc, &mut y);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    assert_untouched("rejected relu", &s, &y, &y_before);
}

// ---------------------------------------------------------------------------------------------
// The crate's generated activation kernels (sigmoid, tanh, swish, ELU, GELU; f32, f16, bf16)
// ---------------------------------------------------------------------------------------------
//
// On tensors that share one packed layout, `activation_forward` and `activation_backward` run
// kernels generated from one template (a loop over 16-byte vectors, then a tail of `n mod V`
// elements, V = 4 for f32 and 8 for f16/bf16; a scalar loop when a pointer is not 16-byte
// aligned). These tests aim at their edges: every tail length, tiny and large counts, views
// one element into their buffer, blending, the in-place forms, NaN inputs, and elements past
// the tensor that must keep their sentinel.

/// The modes with a generated kernel.
const GENERATED_MODES: [ActivationMode; 6] = [
    ActivationMode::Sigmoid,
    ActivationMode::Tanh,
    ActivationMode::Swish { beta: 1.25 },
    ActivationMode::Elu { alpha: 0.75 },
    GELU,
    GELU_TANH,
];

/// A device buffer of `len` elements: the sentinel, with `window` at `off`.
fn window_buffer<T: DataType>(
    s: &Arc<CudaStream>,
    len: usize,
    off: usize,
    window: &[T],
) -> CudaSlice<T> {
    let mut host = vec![T::from_f64(SENTINEL); len];
    host[off..off + window.len()].copy_from_slice(window);
    s.clone_htod(&host).unwrap()
}

/// Checks a whole buffer: `want` (within `tol`) at `off..off + want.len()`, the sentinel
/// everywhere else.
fn check_window_close<T: DataType>(what: &str, got: &[T], off: usize, want: &[f64], tol: f64) {
    assert_close(what, &got[off..off + want.len()], want, tol);
    for (p, &g) in got.iter().enumerate() {
        if p < off || p >= off + want.len() {
            // The sentinel as stored in `T` (bf16 holds -999 as -1000).
            assert_eq!(
                g.to_f64(),
                T::from_f64(SENTINEL).to_f64(),
                "{what}: element {p} outside the tensor changed"
            );
        }
    }
}

/// The descriptor of `n` packed elements as `[1, 1, 1, n]`.
fn row<T: DataType>(n: usize) -> TensorDesc<T> {
    TensorDesc::<T>::nchw(1, 1, 1, n as i64).unwrap()
}

/// Forward, forward in place, backward and backward in place of `mode` on `n` elements whose
/// inputs sit `in_off` elements and outputs `out_off` elements into buffers of `n + SLACK`
/// (the in-place forms at `out_off`), with `(alpha, beta)`, against the f64 reference; every
/// element outside the tensor must keep its sentinel.
#[allow(clippy::too_many_arguments)] // the case, spelled out
fn generated_case<T: DataType>(
    s: &Arc<CudaStream>,
    cudnn: &Cudnn,
    rng: &mut Rng,
    mode: ActivationMode,
    n: usize,
    (in_off, out_off): (usize, usize),
    (alpha, beta): (f64, f64),
) {
    let act = ActivationDesc::new(mode).unwrap();
    let desc = row::<T>(n);
    let len = n + SLACK;
    let ((a, af), (b, bf)) = (scalar::<T>(alpha), scalar::<T>(beta));
    let what = format!(
        "{mode:?} {} n {n} in +{in_off} out +{out_off} alpha {alpha} beta {beta}",
        T::DTYPE
    );
    let xv: Vec<T> = act_inputs(rng, n);
    let xf = to_f64(&xv);
    let refs: Vec<(f64, f64)> = xf.iter().map(|&v| act_ref(mode, v)).collect();
    let f: Vec<f64> = refs.iter().map(|r| r.0).collect();
    let prior = |rng: &mut Rng| -> Vec<T> {
        if bf == 0.0 {
            vec![poison::<T>(); n]
        } else {
            rng.values(n)
        }
    };
    let x = window_buffer(s, len, in_off, &xv);

    // Forward.
    let y_prior = prior(rng);
    let mut y = window_buffer(s, len, out_off, &y_prior);
    cudnn
        .activation_forward(
            &act,
            a,
            &desc,
            &x.slice(in_off..),
            b,
            &desc,
            &mut y.slice_mut(out_off..),
        )
        .unwrap_or_else(|e| panic!("{what} forward: {e}"));
    let want = blend(af, &f, bf, &to_f64(&y_prior));
    check_window_close(
        &format!("{what} forward"),
        &download(s, &y),
        out_off,
        &want,
        tol::<T>(),
    );

    // Forward in place (the prior output is the input).
    let mut xy = window_buffer(s, len, out_off, &xv);
    cudnn
        .activation_forward_in_place(&act, a, b, &desc, &mut xy.slice_mut(out_off..))
        .unwrap_or_else(|e| panic!("{what} forward in place: {e}"));
    let want = blend(af, &f, bf, &xf);
    check_window_close(
        &format!("{what} forward in place"),
        &download(s, &xy),
        out_off,
        &want,
        tol::<T>(),
    );

    // Backward, from the forward's output as stored.
    let y_stored: Vec<T> = f.iter().map(|&v| T::from_f64(v)).collect();
    let y_in = window_buffer(s, len, in_off, &y_stored);
    let dyv: Vec<T> = rng.values(n);
    let dyf = to_f64(&dyv);
    let dy = window_buffer(s, len, in_off, &dyv);
    let grad: Vec<f64> = dyf.iter().zip(&refs).map(|(&d, r)| d * r.1).collect();
    let dx_prior = prior(rng);
    let mut dx = window_buffer(s, len, out_off, &dx_prior);
    cudnn
        .activation_backward(
            &act,
            a,
            &desc,
            &y_in.slice(in_off..),
            &desc,
            &dy.slice(in_off..),
            &desc,
            &x.slice(in_off..),
            b,
            &desc,
            &mut dx.slice_mut(out_off..),
        )
        .unwrap_or_else(|e| panic!("{what} backward: {e}"));
    let want = blend(af, &grad, bf, &to_f64(&dx_prior));
    check_window_close(
        &format!("{what} backward"),
        &download(s, &dx),
        out_off,
        &want,
        tol::<T>(),
    );

    // Backward in place: the gradient overwrites dy (at `out_off`).
    let mut g = window_buffer(s, len, out_off, &dyv);
    cudnn
        .activation_backward_in_place(
            &act,
            a,
            &desc,
            &y_in.slice(in_off..),
            &desc,
            &x.slice(in_off..),
            b,
            &desc,
            &mut g.slice_mut(out_off..),
        )
        .unwrap_or_else(|e| panic!("{what} backward in place: {e}"));
    let want = blend(af, &grad, bf, &dyf);
    check_window_close(
        &format!("{what} backward in place"),
        &download(s, &g),
        out_off,
        &want,
        tol::<T>(),
    );
}

/// Counts with every tail length of both vector widths and fewer than one vector, aligned and
/// one element in, for every generated mode and type, plain, scaled and blending.
fn generated_edges<T: DataType>(s: &Arc<CudaStream>, cudnn: &Cudnn, rng: &mut Rng) {
    for mode in GENERATED_MODES {
        for n in [1usize, 2, 3, 5, 7, 8, 9, 15, 17, 1021] {
            for offs in [(0, 0), (1, 1), (1, 0), (0, 1)] {
                for scales in [(1.0, 0.0), (0.5, 0.0), (1.25, -0.5)] {
                    generated_case::<T>(s, cudnn, rng, mode, n, offs, scales);
                }
            }
        }
    }
}

#[test]
fn generated_activations_edges_f32() {
    let Some((s, cudnn)) = gpu() else { return };
    generated_edges::<f32>(&s, &cudnn, &mut Rng::new(51));
}

#[test]
fn generated_activations_edges_f16() {
    let Some((s, cudnn)) = gpu() else { return };
    generated_edges::<f16>(&s, &cudnn, &mut Rng::new(52));
}

#[test]
fn generated_activations_edges_bf16() {
    let Some((s, cudnn)) = gpu() else { return };
    generated_edges::<bf16>(&s, &cudnn, &mut Rng::new(53));
}

/// A large count (3·2²⁰ + 3 elements: thousands of blocks and a tail), aligned and one element
/// in, blending, for GELU (tanh) and sigmoid in every type.
#[test]
fn generated_activations_large() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(54);
    fn run<T: DataType>(s: &Arc<CudaStream>, cudnn: &Cudnn, rng: &mut Rng) {
        let n = 3 * (1 << 20) + 3;
        for mode in [GELU_TANH, ActivationMode::Sigmoid] {
            for offs in [(0, 0), (1, 1)] {
                generated_case::<T>(s, cudnn, rng, mode, n, offs, (1.25, -0.5));
            }
        }
    }
    run::<f32>(&s, &cudnn, &mut rng);
    run::<f16>(&s, &cudnn, &mut rng);
    run::<bf16>(&s, &cudnn, &mut rng);
}

/// NaN inputs, in the vector body and in the tail, aligned and one element in, under both NaN
/// rules: the generated kernels give NaN wherever an input is NaN (x forward; x or y, as the
/// backward reads, and dy backward) and the reference elsewhere. Under `Propagate`, cuDNN (on
/// the same values in a padded layout) must agree for the modes it has; under `NotPropagate`
/// its answer at NaN inputs is printed.
#[test]
fn generated_activations_nan_inputs() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(55);
    fn run<T: DataType>(s: &Arc<CudaStream>, cudnn: &Cudnn, rng: &mut Rng) {
        let dims = [1i64, 1, 13, 79]; // 1027 elements: vectors and a tail of 3
        let n = 1027usize;
        let nans = [0usize, 5, 8 * 17 + 3, 8 * 100, n - 3, n - 1];
        let desc = row::<T>(n);
        let (one, zero) = (scalar::<T>(1.0).0, scalar::<T>(0.0).0);
        for mode in GENERATED_MODES {
            for nan in [NanPropagation::Propagate, NanPropagation::NotPropagate] {
                let act = ActivationDesc::builder(mode).nan(nan).build().unwrap();
                for off in [0usize, 1] {
                    let what = format!("{mode:?} {} {nan:?} at +{off}", T::DTYPE);
                    let mut xv: Vec<T> = act_inputs(rng, n);
                    for &i in &nans {
                        xv[i] = T::from_f64(f64::NAN);
                    }
                    let want: Vec<f64> = to_f64(&xv).iter().map(|&v| act_ref(mode, v).0).collect();
                    let x = window_buffer(s, n + SLACK, off, &xv);
                    let mut y = window_buffer(s, n + SLACK, off, &vec![poison::<T>(); n]);
                    cudnn
                        .activation_forward(
                            &act,
                            one,
                            &desc,
                            &x.slice(off..),
                            zero,
                            &desc,
                            &mut y.slice_mut(off..),
                        )
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let got = download(s, &y);
                    for (i, &w) in want.iter().enumerate() {
                        let g = got[off + i].to_f64();
                        if nans.contains(&i) {
                            assert!(g.is_nan(), "{what} forward: f(NaN) gave {g} at {i}");
                        } else {
                            assert!(
                                (g - w).abs() <= tol::<T>() * (1.0 + w.abs()),
                                "{what} forward: element {i}: got {g}, want {w}"
                            );
                        }
                    }
                    // Backward: NaN in the saved tensor (x, and y = f(x)) and in dy elsewhere.
                    let y_stored: Vec<T> = want.iter().map(|&v| T::from_f64(v)).collect();
                    let mut dyv: Vec<T> = rng.values(n);
                    dyv[n / 2] = T::from_f64(f64::NAN);
                    let y_in = window_buffer(s, n + SLACK, off, &y_stored);
                    let dy = window_buffer(s, n + SLACK, off, &dyv);
                    let mut dx = window_buffer(s, n + SLACK, off, &vec![poison::<T>(); n]);
                    cudnn
                        .activation_backward(
                            &act,
                            one,
                            &desc,
                            &y_in.slice(off..),
                            &desc,
                            &dy.slice(off..),
                            &desc,
                            &x.slice(off..),
                            zero,
                            &desc,
                            &mut dx.slice_mut(off..),
                        )
                        .unwrap_or_else(|e| panic!("{what} backward: {e}"));
                    let got = download(s, &dx);
                    for i in 0..n {
                        let g = got[off + i].to_f64();
                        if nans.contains(&i) || i == n / 2 {
                            assert!(g.is_nan(), "{what} backward: NaN input gave {g} at {i}");
                        } else {
                            let w = dyv[i].to_f64() * act_ref(mode, xv[i].to_f64()).1;
                            assert!(
                                (g - w).abs() <= tol::<T>() * (1.0 + w.abs()),
                                "{what} backward: element {i}: got {g}, want {w}"
                            );
                        }
                    }
                    if is_gelu(mode) || off != 0 {
                        continue;
                    }
                    // cuDNN on the same values (a padded layout keeps it off the crate's kernel).
                    let padded = Tensor::<T>::new(&dims, Fmt::Padded);
                    let (px, _) = padded.upload(s, &xv);
                    let (mut py, _, _) = padded.output(s, rng, 0.0);
                    let r = cudnn.activation_forward(
                        &act,
                        one,
                        &padded.desc,
                        &px,
                        zero,
                        &padded.desc,
                        &mut py,
                    );
                    if unsupported_bf16::<T>(&what, r) {
                        continue;
                    }
                    let got = download(s, &py);
                    for (i, &o) in padded.offs.iter().enumerate() {
                        let g = got[o].to_f64();
                        if !nans.contains(&i) {
                            continue;
                        }
                        if nan == NanPropagation::Propagate {
                            assert!(g.is_nan(), "{what} (cuDNN): f(NaN) gave {g} at {i}");
                        } else if !g.is_nan() {
                            eprintln!("note: cuDNN gives {g} for {what} at a NaN input (the crate's kernel gives NaN)");
                        }
                    }
                }
            }
        }
    }
    run::<f32>(&s, &cudnn, &mut rng);
    run::<f16>(&s, &cudnn, &mut rng);
    run::<bf16>(&s, &cudnn, &mut rng);
}

/// The generated kernels and cuDNN agree on the modes both have, on the same values
/// (NCHW packed for the crate's kernel, padded for cuDNN's), forward and backward, f32.
#[test]
fn generated_activations_match_cudnn() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(56);
    let dims = [2i64, 5, 9, 11];
    for mode in GENERATED_MODES.into_iter().filter(|&m| !is_gelu(m)) {
        let act = ActivationDesc::new(mode).unwrap();
        let (packed, padded) = (
            Tensor::<f32>::new(&dims, Fmt::First),
            Tensor::<f32>::new(&dims, Fmt::Padded),
        );
        let xv: Vec<f32> = act_inputs(&mut rng, packed.len());
        let dyv: Vec<f32> = rng.values(packed.len());
        let mut outs = Vec::new();
        for t in [&packed, &padded] {
            let (x, _) = t.upload(&s, &xv);
            let (dy, _) = t.upload(&s, &dyv);
            let (mut y, _, _) = t.output(&s, &mut rng, 0.0);
            cudnn
                .activation_forward(&act, 1.0, &t.desc, &x, 0.0, &t.desc, &mut y)
                .unwrap();
            let (mut dx, _, _) = t.output(&s, &mut rng, 0.0);
            cudnn
                .activation_backward(
                    &act, 1.0, &t.desc, &y, &t.desc, &dy, &t.desc, &x, 0.0, &t.desc, &mut dx,
                )
                .unwrap();
            let (yh, dxh) = (download(&s, &y), download(&s, &dx));
            let pick = |h: &[f32]| -> Vec<f32> { t.offs.iter().map(|&o| h[o]).collect() };
            outs.push((pick(&yh), pick(&dxh)));
        }
        let want_y = to_f64(&outs[1].0);
        let want_dx = to_f64(&outs[1].1);
        assert_close(
            &format!("{mode:?} forward: crate vs cuDNN"),
            &outs[0].0,
            &want_y,
            1e-5,
        );
        assert_close(
            &format!("{mode:?} backward: crate vs cuDNN"),
            &outs[0].1,
            &want_dx,
            1e-5,
        );
    }
}

/// GELU where its kernels cannot run is refused before launch, output untouched: f64 tensors,
/// padded layouts, and x and y (or dy and dx) of different packed layouts.
#[test]
fn gelu_refuses_what_its_kernels_cannot_run() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(57);
    let dims = [2i64, 3, 4, 5];
    for mode in [GELU, GELU_TANH] {
        let act = ActivationDesc::new(mode).unwrap();
        let t = Tensor::<f64>::new(&dims, Fmt::First);
        gelu_refused::<f64>(
            &s,
            &cudnn,
            &mut rng,
            &act,
            &t,
            &t,
            kind!(UnsupportedDataType),
            "GELU f64",
        );
        let t = Tensor::<f32>::new(&dims, Fmt::Padded);
        gelu_refused::<f32>(
            &s,
            &cudnn,
            &mut rng,
            &act,
            &t,
            &t,
            kind!(InvalidArgument),
            "GELU padded",
        );
        let (xt, yt) = (
            Tensor::<bf16>::new(&dims, Fmt::First),
            Tensor::<bf16>::new(&dims, Fmt::Last),
        );
        gelu_refused::<bf16>(
            &s,
            &cudnn,
            &mut rng,
            &act,
            &xt,
            &yt,
            kind!(InvalidArgument),
            "GELU NCHW -> NHWC",
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Softmax references and GPU tests
// ---------------------------------------------------------------------------------------------

const SOFTMAX_ALGOS: [SoftmaxAlgorithm; 3] = [
    SoftmaxAlgorithm::Fast,
    SoftmaxAlgorithm::Accurate,
    SoftmaxAlgorithm::Log,
];
const SOFTMAX_MODES: [SoftmaxMode; 2] = [SoftmaxMode::Instance, SoftmaxMode::Channel];

/// The normalization group of every logical element (row-major order): the image for
/// `Instance`, the image and spatial position for `Channel`.
fn softmax_groups(mode: SoftmaxMode, dims: &[i64]) -> Vec<usize> {
    let spatial = &dims[2..];
    let positions = spatial.iter().product::<i64>() as usize;
    let mut out = Vec::new();
    for_each_index(dims, |idx| {
        out.push(match mode {
            SoftmaxMode::Instance => idx[0] as usize,
            SoftmaxMode::Channel => idx[0] as usize * positions + linear(spatial, &idx[2..]),
        })
    });
    out
}

/// Per-group sums of `v`.
fn group_sums(groups: &[usize], v: &[f64]) -> Vec<f64> {
    let mut sums = vec![0.0; groups.iter().max().unwrap() + 1];
    for (&g, &x) in groups.iter().zip(v) {
        sums[g] += x;
    }
    sums
}

fn softmax_ref(algo: SoftmaxAlgorithm, mode: SoftmaxMode, dims: &[i64], x: &[f64]) -> Vec<f64> {
    let groups = softmax_groups(mode, dims);
    let mut max = vec![f64::NEG_INFINITY; groups.iter().max().unwrap() + 1];
    for (&g, &v) in groups.iter().zip(x) {
        max[g] = max[g].max(v);
    }
    let e: Vec<f64> = groups
        .iter()
        .zip(x)
        .map(|(&g, &v)| (v - max[g]).exp())
        .collect();
    let sums = group_sums(&groups, &e);
    groups
        .iter()
        .zip(x.iter().zip(&e))
        .map(|(&g, (&v, &e))| match algo {
            SoftmaxAlgorithm::Log => v - max[g] - sums[g].ln(),
            _ => e / sums[g],
        })
        .collect()
}

/// `y ⊙ (dy − Σ dy ⊙ y)`, or `dy − e^y ⊙ Σ dy` for log-softmax.
fn softmax_backward_ref(
    algo: SoftmaxAlgorithm,
    mode: SoftmaxMode,
    dims: &[i64],
    y: &[f64],
    dy: &[f64],
) -> Vec<f64> {
    let groups = softmax_groups(mode, dims);
    match algo {
        SoftmaxAlgorithm::Log => {
            let sums = group_sums(&groups, dy);
            (0..y.len())
                .map(|i| dy[i] - y[i].exp() * sums[groups[i]])
                .collect()
        }
        _ => {
            let prod: Vec<f64> = y.iter().zip(dy).map(|(a, b)| a * b).collect();
            let sums = group_sums(&groups, &prod);
            (0..y.len())
                .map(|i| y[i] * (dy[i] - sums[groups[i]]))
                .collect()
        }
    }
}

/// Runs `f`, turning a panic into the first line of its message (so that one failing
/// combination does not hide the others).
fn caught(f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("(panic without a message)");
            Err(msg.lines().next().unwrap_or_default().to_string())
        }
    }
}

/// [`Tensor::check`] that reports instead of panicking, with the extent of the damage: how many
/// addressed elements are wrong and how many of those still hold NaN (the poison: unwritten,
/// or computed as NaN), and how many gap elements changed.
fn check_counted<T: DataType>(
    t: &Tensor<T>,
    what: &str,
    s: &Arc<CudaStream>,
    dev: &CudaSlice<T>,
    before: &[T],
    want: &[f64],
    tol: f64,
) -> Result<(), String> {
    let got = download(s, dev);
    let (mut wrong, mut nan, mut first) = (0usize, 0usize, None);
    for (i, (&o, &w)) in t.offs.iter().zip(want).enumerate() {
        let g = got[o].to_f64();
        if !(g.is_finite() && (g - w).abs() <= tol * (1.0 + w.abs())) {
            wrong += 1;
            nan += usize::from(g.is_nan());
            first.get_or_insert(format!("element {i}: got {g}, want {w}"));
        }
    }
    let mut addressed = vec![false; got.len()];
    for &o in &t.offs {
        addressed[o] = true;
    }
    let gaps = (0..got.len())
        .filter(|&p| !addressed[p] && !same(got[p], before[p]))
        .count();
    if wrong == 0 && gaps == 0 {
        return Ok(());
    }
    Err(format!(
        "{what}: {wrong} of {} elements wrong ({nan} NaN), {gaps} gap elements changed; \
         first: {} (tol {tol})",
        t.len(),
        first.as_deref().unwrap_or("-"),
    ))
}

/// Whether the crate refuses softmax on this tensor before launch: `f64` with a channels-last
/// layout of 5 dimensions, where cuDNN 9.14 on an H200 left outputs unwritten (Fast, Channel,
/// `[2, 3, 2, 3, 2]`) while reporting success.
fn softmax_refused<T: DataType>(dims: &[i64], fmt: Fmt) -> bool {
    T::DTYPE == DType::F64 && dims.len() >= 5 && fmt == Fmt::Last
}

/// Forward and backward of one softmax combination, each checked separately; every failure
/// (wrong values, an error, a refusal not made or not clean) is pushed to `failures` as one
/// line instead of panicking, so that a run shows every failing combination.
#[allow(clippy::too_many_arguments)] // one combination's coordinates
fn softmax_case<T: DataType>(
    s: &Arc<CudaStream>,
    cudnn: &Cudnn,
    rng: &mut Rng,
    algo: SoftmaxAlgorithm,
    mode: SoftmaxMode,
    dims: &[i64],
    fmt: Fmt,
    failures: &mut Vec<String>,
) {
    let t = Tensor::<T>::new(dims, fmt);
    let (alpha, beta) = scales(fmt);
    let ((a, af), (b, bf)) = (scalar::<T>(alpha), scalar::<T>(beta));
    let what = format!("softmax {algo:?} {mode:?} {} {fmt:?} {dims:?}", T::DTYPE);
    let refused = softmax_refused::<T>(dims, fmt);
    let xv: Vec<T> = rng.values(t.len());
    let (x, _) = t.upload(s, &xv);
    let y_ref = softmax_ref(algo, mode, dims, &to_f64(&xv));
    let (mut y, y_before, y_prior) = t.output(s, rng, bf);
    // Backward inputs: the forward's output as stored and a random incoming gradient.
    let y_stored: Vec<T> = y_ref.iter().map(|&v| T::from_f64(v)).collect();
    let (y_in, _) = t.upload(s, &y_stored);
    let dyv: Vec<T> = rng.values(t.len());
    let (dy, _) = t.upload(s, &dyv);
    let (mut dx, dx_before, dx_prior) = t.output(s, rng, bf);

    let forward = caught(|| {
        let what = format!("{what} forward");
        let r = cudnn.softmax_forward(algo, mode, a, &t.desc, &x, b, &t.desc, &mut y);
        if refused {
            rejected(&what, r, kind!(UnsupportedDataType), s, &y, &y_before);
            return Ok(());
        }
        if unsupported_bf16::<T>(&what, r) {
            assert_untouched(&what, s, &y, &y_before);
            return Ok(());
        }
        let want = blend(af, &y_ref, bf, &y_prior);
        check_counted(&t, &what, s, &y, &y_before, &want, tol::<T>())
    });
    let backward = caught(|| {
        let what = format!("{what} backward");
        let r = cudnn.softmax_backward(
            algo, mode, a, &t.desc, &y_in, &t.desc, &dy, b, &t.desc, &mut dx,
        );
        if refused {
            rejected(&what, r, kind!(UnsupportedDataType), s, &dx, &dx_before);
            return Ok(());
        }
        if unsupported_bf16::<T>(&what, r) {
            assert_untouched(&what, s, &dx, &dx_before);
            return Ok(());
        }
        let dx_ref = softmax_backward_ref(algo, mode, dims, &to_f64(&y_stored), &to_f64(&dyv));
        let want = blend(af, &dx_ref, bf, &dx_prior);
        check_counted(&t, &what, s, &dx, &dx_before, &want, tol::<T>())
    });
    failures.extend(forward.err());
    failures.extend(backward.err());
}

/// Every algorithm, mode, shape and layout for `T`; prints every failing combination (one line
/// each) before failing.
fn softmax_all<T: DataType>(s: &Arc<CudaStream>, cudnn: &Cudnn, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut failures = Vec::new();
    let mut checks = 0usize;
    for algo in SOFTMAX_ALGOS {
        for mode in SOFTMAX_MODES {
            // [N, C, W] and [N, C] (as [N, C, 1]) too: cuDNN sees them with a unit height.
            for dims in [
                &[2i64, 5, 3, 4][..],
                &[2, 3, 2, 3, 2],
                &[4, 10, 1, 1],
                &[2, 5, 7],
                &[4, 10, 1],
            ] {
                for fmt in FMTS {
                    softmax_case::<T>(s, cudnn, &mut rng, algo, mode, dims, fmt, &mut failures);
                    checks += 2;
                }
            }
        }
    }
    if !failures.is_empty() {
        eprintln!(
            "softmax {}: {} of {checks} checks failed:",
            T::DTYPE,
            failures.len()
        );
        for f in &failures {
            eprintln!("  FAILED {f}");
        }
        panic!(
            "softmax {}: {} of {checks} checks failed (listed above)",
            T::DTYPE,
            failures.len()
        );
    }
}

#[test]
fn softmax_matches_reference_f32() {
    let Some((s, cudnn)) = gpu() else { return };
    softmax_all::<f32>(&s, &cudnn, 21);
}

#[test]
fn softmax_matches_reference_f64() {
    let Some((s, cudnn)) = gpu() else { return };
    softmax_all::<f64>(&s, &cudnn, 22);
}

#[test]
fn softmax_matches_reference_f16() {
    let Some((s, cudnn)) = gpu() else { return };
    softmax_all::<f16>(&s, &cudnn, 23);
}

#[test]
fn softmax_matches_reference_bf16() {
    let Some((s, cudnn)) = gpu() else { return };
    softmax_all::<bf16>(&s, &cudnn, 24);
}

// ---------------------------------------------------------------------------------------------
// 1-D convolution on [N, C, W] tensors and [K, C/groups, S] filters
// ---------------------------------------------------------------------------------------------

/// A 1-D convolution problem: `x = [N, C, W]`, `w = [K, C/groups, S]`.
struct Conv1d {
    x: [i64; 3],
    w: [i64; 3],
    pad: i64,
    stride: i64,
    dilation: i64,
    groups: i64,
}

const CONV1D_CASES: [Conv1d; 3] = [
    Conv1d {
        x: [2, 4, 17],
        w: [6, 4, 3],
        pad: 1,
        stride: 1,
        dilation: 1,
        groups: 1,
    },
    Conv1d {
        x: [2, 6, 20],
        w: [6, 3, 5],
        pad: 2,
        stride: 2,
        dilation: 2,
        groups: 2,
    },
    // Depthwise.
    Conv1d {
        x: [1, 4, 9],
        w: [4, 1, 3],
        pad: 0,
        stride: 1,
        dilation: 1,
        groups: 4,
    },
];

impl Conv1d {
    /// `[N, K, out]`, computed here: `(W + 2·pad − dilation·(S − 1) − 1) / stride + 1`.
    fn y_dims(&self) -> [i64; 3] {
        let out =
            (self.x[2] + 2 * self.pad - self.dilation * (self.w[2] - 1) - 1) / self.stride + 1;
        [self.x[0], self.w[0], out]
    }

    /// Cross-correlation in f64 over logical (row-major) `x` and `w`: the values and, per
    /// output, the sum of the absolute values of its terms (what rounding errors scale with).
    fn forward_ref(&self, x: &[f64], w: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let [n, c, width] = self.x;
        let [k, cg, taps] = self.w;
        let out = self.y_dims()[2];
        let per_group = k / self.groups;
        let (mut y, mut y_abs) = (Vec::new(), Vec::new());
        for ni in 0..n {
            for ki in 0..k {
                let g = ki / per_group;
                for o in 0..out {
                    let (mut acc, mut abs) = (0.0, 0.0);
                    for ci in 0..cg {
                        let xc = g * cg + ci;
                        for si in 0..taps {
                            let p = o * self.stride - self.pad + si * self.dilation;
                            if (0..width).contains(&p) {
                                let t = x[((ni * c + xc) * width + p) as usize]
                                    * w[((ki * cg + ci) * taps + si) as usize];
                                acc += t;
                                abs += t.abs();
                            }
                        }
                    }
                    y.push(acc);
                    y_abs.push(abs);
                }
            }
        }
        (y, y_abs)
    }
}

/// Every forward algorithm cuDNN accepts for each 1-D case and layout, against the f64
/// reference; the output is NaN-poisoned where beta is 0, the gaps of padded layouts must
/// survive; some algorithm must run for every layout, implicit GEMM for packed NCW.
fn conv1d_all<T: DataType>(s: &Arc<CudaStream>, cudnn: &Cudnn, seed: u64) {
    use cudnn_safe::conv::{ConvAlgorithm, ConvDesc, ConvFwdAlgo, MathType};
    use cudnn_safe::{FilterDesc, TensorFormat, Workspace};
    let mut rng = Rng::new(seed);
    let mut ws = Workspace::new(s.clone());
    for case in &CONV1D_CASES {
        let conv = ConvDesc::builder(1)
            .pads(&[case.pad])
            .strides(&[case.stride])
            .dilations(&[case.dilation])
            .groups(case.groups)
            .math(MathType::Fma)
            .build::<T>()
            .unwrap();
        let y_dims = case.y_dims();
        assert_eq!(conv.output_dims(&case.x, &case.w).unwrap(), y_dims);
        for fmt in FMTS {
            let (xt, yt) = (
                Tensor::<T>::new(&case.x, fmt),
                Tensor::<T>::new(&y_dims, fmt),
            );
            let w_fmt = if fmt == Fmt::Last {
                TensorFormat::Nhwc
            } else {
                TensorFormat::Nchw
            };
            let w_d = FilterDesc::<T>::new(&case.w, w_fmt).unwrap();
            assert_eq!(w_d.dims(), &case.w[..]);
            assert_eq!(conv.cudnn_output_dims(&xt.desc, &w_d).unwrap(), y_dims);
            let (alpha, beta) = scales(fmt);
            let ((a, af), (b, bf)) = (scalar::<T>(alpha), scalar::<T>(beta));
            let xv: Vec<T> = rng.values(xt.len());
            let wv: Vec<T> = rng.values(w_d.layout().element_count());
            let (x, _) = xt.upload(s, &xv);
            let w = s.clone_htod(&w_d.layout().pack(&wv).unwrap()).unwrap();
            let (y_ref, y_abs) = case.forward_ref(&to_f64(&xv), &to_f64(&wv));
            let mut ran = Vec::new();
            for &algo in ConvFwdAlgo::ALL {
                let what = format!(
                    "conv1d {} {fmt:?} x {:?} w {:?} {algo}",
                    T::DTYPE,
                    case.x,
                    case.w
                );
                if cudnn
                    .conv_forward_workspace_size(&xt.desc, &w_d, &conv, &yt.desc, algo)
                    .is_err()
                {
                    continue; // not supported for this case
                }
                let (mut y, y_before, y_prior) = yt.output(s, &mut rng, bf);
                cudnn
                    .conv_forward(
                        a, &xt.desc, &x, &w_d, &w, &conv, algo, &mut ws, b, &yt.desc, &mut y,
                    )
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                // Rounding scales with Σ|terms|; FFT and Winograd transform the whole row first.
                let name = algo.name();
                let transform = name.contains("FFT") || name.contains("WINOGRAD");
                let eps = match (T::DTYPE, transform) {
                    (DType::F64, _) => 1e-12,
                    (_, false) => 1e-5,
                    (_, true) => 1e-4,
                };
                let widest = y_abs.iter().fold(0.0f64, |m, &a| m.max(a));
                let want = blend(af, &y_ref, bf, &y_prior);
                let bound: Vec<f64> = y_abs
                    .iter()
                    .zip(&want)
                    .map(|(&a, &v)| {
                        let terms = if transform { widest } else { a };
                        eps * (1.0 + v.abs() + af.abs() * terms)
                    })
                    .collect();
                let got = download(s, &y);
                for (i, (&o, (&w, &b))) in yt.offs.iter().zip(want.iter().zip(&bound)).enumerate() {
                    let g = got[o].to_f64();
                    assert!(
                        g.is_finite() && (g - w).abs() <= b,
                        "{what}: element {i}: got {g}, want {w} ± {b}"
                    );
                }
                // Nothing but the addressed elements is written (the gaps keep the sentinel).
                check_strided(&what, &got, &y_before, &yt.offs, &want, 1.0 + widest);
                ran.push(algo);
            }
            assert!(
                !ran.is_empty() && (fmt != Fmt::First || ran.contains(&ConvFwdAlgo::ImplicitGemm)),
                "conv1d {} {fmt:?} x {:?}: implicit GEMM did not run (ran {ran:?})",
                T::DTYPE,
                case.x
            );
        }
    }
}

#[test]
fn conv1d_forward_on_3d_tensors_matches_reference_f32() {
    let Some((s, cudnn)) = gpu() else { return };
    conv1d_all::<f32>(&s, &cudnn, 31);
}

#[test]
fn conv1d_forward_on_3d_tensors_matches_reference_f64() {
    let Some((s, cudnn)) = gpu() else { return };
    conv1d_all::<f64>(&s, &cudnn, 32);
}

/// A 1-D transposed convolution of 3-D x and w gives a 3-D y: a y in the 4-D form is refused
/// with a typed error before anything is enqueued, never run with a misread height.
#[test]
fn conv_transpose_refuses_mixed_3d_and_4d_tensors_cleanly() {
    use cudnn_safe::conv::{ConvBwdDataAlgo, ConvDesc};
    use cudnn_safe::{FilterDesc, TensorFormat, Workspace};
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(33);
    let conv = ConvDesc::builder(1)
        .pads(&[1])
        .strides(&[2])
        .build::<f32>()
        .unwrap();
    let (xd, wd) = ([2i64, 6, 10], [6i64, 3, 4]);
    let yd = conv.transpose_output_dims(&xd, &wd, &[1]).unwrap();
    assert_eq!(yd, [2, 3, 21]);
    let x_d = TensorDesc::<f32>::nchw_nd(&xd).unwrap();
    let w_d = FilterDesc::<f32>::new(&wd, TensorFormat::Nchw).unwrap();
    let y_d = TensorDesc::<f32>::nchw_nd(&[yd[0], yd[1], 1, yd[2]]).unwrap();
    let x = s.clone_htod(&rng.values::<f32>(x_d.span())).unwrap();
    let w = s.clone_htod(&rng.values::<f32>(w_d.span())).unwrap();
    let (mut y, y_before) = sentinel_buffer::<f32>(&s, y_d.span());
    let mut ws = Workspace::new(s.clone());
    let r = cudnn.conv_transpose(
        1.0,
        &x_d,
        &x,
        &w_d,
        &w,
        &conv,
        ConvBwdDataAlgo::Algo0,
        &mut ws,
        0.0,
        &y_d,
        &mut y,
    );
    rejected(
        "3-D x and w with a 4-D y (transposed convolution)",
        r,
        kind!(ShapeMismatch),
        &s,
        &y,
        &y_before,
    );
}

// ---------------------------------------------------------------------------------------------
// Rejected calls (GPU): typed error, output untouched
// ---------------------------------------------------------------------------------------------

/// Checks that `r` is an error of `kind` and that `dev` still holds `before`.
fn rejected<T: DataType>(
    what: &str,
    r: Result<(), Error>,
    kind: Kind,
    s: &Arc<CudaStream>,
    dev: &CudaSlice<T>,
    before: &[T],
) {
    assert!(matches!(&r, Err(e) if kind(e)), "{what}: got {r:?}");
    assert_untouched(what, s, dev, before);
}

/// Random values for a tensor's whole span (inputs of rejected calls: content is irrelevant
/// but never zero).
fn filled<T: DataType>(s: &Arc<CudaStream>, rng: &mut Rng, n: usize) -> CudaSlice<T> {
    s.clone_htod(&rng.values::<T>(n)).unwrap()
}

#[test]
fn pooling_rejects_bad_calls() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(31);
    let case = &POOL_CASES[0];
    let pool = case.desc(PoolingMode::Max);
    let xt = Tensor::<f32>::new(case.x, Fmt::First);
    let yt = Tensor::<f32>::new(&case.y_dims(), Fmt::First);
    let x = filled::<f32>(&s, &mut rng, xt.span());
    let (mut y, y_before) = sentinel_buffer::<f32>(&s, yt.span() + 64);

    let short_x = filled::<f32>(&s, &mut rng, xt.span() - 1);
    let r = cudnn.pooling_forward(&pool, 1.0, &xt.desc, &short_x, 0.0, &yt.desc, &mut y);
    rejected("short x", r, kind!(BufferTooSmall), &s, &y, &y_before);

    let (mut short_y, short_before) = sentinel_buffer::<f32>(&s, yt.span() - 1);
    let r = cudnn.pooling_forward(&pool, 1.0, &xt.desc, &x, 0.0, &yt.desc, &mut short_y);
    rejected(
        "short y",
        r,
        kind!(BufferTooSmall),
        &s,
        &short_y,
        &short_before,
    );

    for bad in [
        &[2i64, 3, 4, 5][..],
        &[2, 4, 4, 4],
        &[1, 3, 4, 4],
        &[2, 3, 3, 4],
    ] {
        let bad_y = Tensor::<f32>::new(bad, Fmt::First);
        let r = cudnn.pooling_forward(&pool, 1.0, &xt.desc, &x, 0.0, &bad_y.desc, &mut y);
        rejected(
            &format!("y {bad:?}"),
            r,
            kind!(ShapeMismatch),
            &s,
            &y,
            &y_before,
        );
    }

    // A 5-D input for a 2-D pooling, and a window larger than the padded input.
    let x5 = Tensor::<f32>::new(&[2, 3, 2, 8, 9], Fmt::First);
    let x5_buf = filled::<f32>(&s, &mut rng, x5.span());
    let r = cudnn.pooling_forward(&pool, 1.0, &x5.desc, &x5_buf, 0.0, &yt.desc, &mut y);
    rejected(
        "5-D x for 2-D pooling",
        r,
        kind!(InvalidArgument),
        &s,
        &y,
        &y_before,
    );
    let tiny = Tensor::<f32>::new(&[2, 3, 1, 9], Fmt::First);
    let tiny_buf = filled::<f32>(&s, &mut rng, tiny.span());
    let r = cudnn.pooling_forward(&pool, 1.0, &tiny.desc, &tiny_buf, 0.0, &yt.desc, &mut y);
    rejected(
        "window beyond the input",
        r,
        kind!(InvalidArgument),
        &s,
        &y,
        &y_before,
    );

    // y addressing elements twice (C and W both of stride 1).
    let overlapping = Tensor::<f32>::with_strides(&case.y_dims(), &[48, 1, 4, 1]);
    let r = cudnn.pooling_forward(&pool, 1.0, &xt.desc, &x, 0.0, &overlapping.desc, &mut y);
    rejected(
        "overlapping y",
        r,
        kind!(OverlappingOutput),
        &s,
        &y,
        &y_before,
    );

    // Integer tensors.
    let xi = TensorDesc::<i32>::nchw_nd(case.x).unwrap();
    let yi = TensorDesc::<i32>::nchw_nd(&case.y_dims()).unwrap();
    let xi_buf = s.clone_htod(&vec![3i32; xi.span()]).unwrap();
    let (mut yi_buf, yi_before) = sentinel_buffer::<i32>(&s, yi.span());
    let r = cudnn.pooling_forward(&pool, 1.0, &xi, &xi_buf, 0.0, &yi, &mut yi_buf);
    rejected(
        "i32 pooling",
        r,
        kind!(UnsupportedDataType),
        &s,
        &yi_buf,
        &yi_before,
    );

    // Backward: dy must have y's layout, dx x's; every buffer its span.
    let y_in = filled::<f32>(&s, &mut rng, yt.span());
    let dy = filled::<f32>(&s, &mut rng, yt.span());
    let (mut dx, dx_before) = sentinel_buffer::<f32>(&s, xt.span());
    let dy_last = Tensor::<f32>::new(&case.y_dims(), Fmt::Last);
    let r = cudnn.pooling_backward(
        &pool,
        1.0,
        &yt.desc,
        &y_in,
        &dy_last.desc,
        &dy,
        &xt.desc,
        &x,
        0.0,
        &xt.desc,
        &mut dx,
    );
    rejected(
        "dy strides differ from y",
        r,
        kind!(InvalidArgument),
        &s,
        &dx,
        &dx_before,
    );
    let dx_last = Tensor::<f32>::new(case.x, Fmt::Last);
    let r = cudnn.pooling_backward(
        &pool,
        1.0,
        &yt.desc,
        &y_in,
        &yt.desc,
        &dy,
        &xt.desc,
        &x,
        0.0,
        &dx_last.desc,
        &mut dx,
    );
    rejected(
        "dx strides differ from x",
        r,
        kind!(InvalidArgument),
        &s,
        &dx,
        &dx_before,
    );
    let bad_dy = Tensor::<f32>::new(&[2, 3, 4, 3], Fmt::First);
    let r = cudnn.pooling_backward(
        &pool,
        1.0,
        &yt.desc,
        &y_in,
        &bad_dy.desc,
        &dy,
        &xt.desc,
        &x,
        0.0,
        &xt.desc,
        &mut dx,
    );
    rejected(
        "dy dims differ from y",
        r,
        kind!(ShapeMismatch),
        &s,
        &dx,
        &dx_before,
    );
    let short_dy = filled::<f32>(&s, &mut rng, yt.span() - 1);
    let r = cudnn.pooling_backward(
        &pool, 1.0, &yt.desc, &y_in, &yt.desc, &short_dy, &xt.desc, &x, 0.0, &xt.desc, &mut dx,
    );
    rejected("short dy", r, kind!(BufferTooSmall), &s, &dx, &dx_before);
    let (mut short_dx, short_dx_before) = sentinel_buffer::<f32>(&s, xt.span() - 1);
    let r = cudnn.pooling_backward(
        &pool,
        1.0,
        &yt.desc,
        &y_in,
        &yt.desc,
        &dy,
        &xt.desc,
        &x,
        0.0,
        &xt.desc,
        &mut short_dx,
    );
    rejected(
        "short dx",
        r,
        kind!(BufferTooSmall),
        &s,
        &short_dx,
        &short_dx_before,
    );
}

#[test]
fn activation_rejects_bad_calls() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(32);
    let relu = ActivationDesc::new(ActivationMode::Relu).unwrap();
    let dims = [2i64, 3, 4, 5];
    let t = Tensor::<f32>::new(&dims, Fmt::First);
    let x = filled::<f32>(&s, &mut rng, t.span());
    let (mut y, y_before) = sentinel_buffer::<f32>(&s, t.span());

    let identity = ActivationDesc::new(ActivationMode::Identity).unwrap();
    let r = cudnn.activation_forward(&identity, 1.0, &t.desc, &x, 0.0, &t.desc, &mut y);
    rejected(
        "identity forward",
        r,
        kind!(InvalidArgument),
        &s,
        &y,
        &y_before,
    );
    let r = cudnn.activation_forward_in_place(&identity, 1.0, 0.0, &t.desc, &mut y);
    rejected(
        "identity in place",
        r,
        kind!(InvalidArgument),
        &s,
        &y,
        &y_before,
    );

    let other = Tensor::<f32>::new(&[2, 3, 5, 4], Fmt::First);
    let r = cudnn.activation_forward(&relu, 1.0, &t.desc, &x, 0.0, &other.desc, &mut y);
    rejected(
        "x and y dims differ",
        r,
        kind!(ShapeMismatch),
        &s,
        &y,
        &y_before,
    );

    // Rank 3 ([N, C, W]) runs; rank 2 is refused.
    let rank2 = TensorDesc::<f32>::nchw_nd(&[6, 20]).unwrap();
    let r = cudnn.activation_forward(&relu, 1.0, &rank2, &x, 0.0, &rank2, &mut y);
    rejected("rank 2", r, kind!(InvalidArgument), &s, &y, &y_before);

    let (mut short, short_before) = sentinel_buffer::<f32>(&s, t.span() - 1);
    let r = cudnn.activation_forward(&relu, 1.0, &t.desc, &x, 0.0, &t.desc, &mut short);
    rejected(
        "short y",
        r,
        kind!(BufferTooSmall),
        &s,
        &short,
        &short_before,
    );
    let r = cudnn.activation_forward_in_place(&relu, 1.0, 0.0, &t.desc, &mut short);
    rejected(
        "short in-place buffer",
        r,
        kind!(BufferTooSmall),
        &s,
        &short,
        &short_before,
    );

    let overlapping = Tensor::<f32>::with_strides(&dims, &[60, 1, 5, 1]);
    let r = cudnn.activation_forward(&relu, 1.0, &t.desc, &x, 0.0, &overlapping.desc, &mut y);
    rejected(
        "overlapping y",
        r,
        kind!(OverlappingOutput),
        &s,
        &y,
        &y_before,
    );
    let r = cudnn.activation_forward_in_place(&relu, 1.0, 0.0, &overlapping.desc, &mut y);
    rejected(
        "overlapping in place",
        r,
        kind!(OverlappingOutput),
        &s,
        &y,
        &y_before,
    );

    let ti = TensorDesc::<i32>::nchw_nd(&dims).unwrap();
    let xi = s.clone_htod(&vec![3i32; ti.span()]).unwrap();
    let (mut yi, yi_before) = sentinel_buffer::<i32>(&s, ti.span());
    let r = cudnn.activation_forward(&relu, 1.0, &ti, &xi, 0.0, &ti, &mut yi);
    rejected(
        "i32 activation",
        r,
        kind!(UnsupportedDataType),
        &s,
        &yi,
        &yi_before,
    );

    // Backward: dy has y's strides, dx x's; identity refused; buffers hold their spans.
    let last = Tensor::<f32>::new(&dims, Fmt::Last);
    let y_in = filled::<f32>(&s, &mut rng, t.span());
    let dy = filled::<f32>(&s, &mut rng, t.span());
    let (mut dx, dx_before) = sentinel_buffer::<f32>(&s, t.span());
    let r = cudnn.activation_backward(
        &relu, 1.0, &t.desc, &y_in, &last.desc, &dy, &t.desc, &x, 0.0, &t.desc, &mut dx,
    );
    rejected(
        "dy strides differ from y",
        r,
        kind!(InvalidArgument),
        &s,
        &dx,
        &dx_before,
    );
    let r = cudnn.activation_backward(
        &relu, 1.0, &t.desc, &y_in, &t.desc, &dy, &t.desc, &x, 0.0, &last.desc, &mut dx,
    );
    rejected(
        "dx strides differ from x",
        r,
        kind!(InvalidArgument),
        &s,
        &dx,
        &dx_before,
    );
    let r = cudnn.activation_backward(
        &identity, 1.0, &t.desc, &y_in, &t.desc, &dy, &t.desc, &x, 0.0, &t.desc, &mut dx,
    );
    rejected(
        "identity backward",
        r,
        kind!(InvalidArgument),
        &s,
        &dx,
        &dx_before,
    );
    let r = cudnn.activation_backward(
        &relu,
        1.0,
        &t.desc,
        &y_in,
        &t.desc,
        &dy,
        &other.desc,
        &x,
        0.0,
        &other.desc,
        &mut dx,
    );
    rejected(
        "x dims differ from y",
        r,
        kind!(ShapeMismatch),
        &s,
        &dx,
        &dx_before,
    );
    let short_x = filled::<f32>(&s, &mut rng, t.span() - 1);
    let r = cudnn.activation_backward(
        &relu, 1.0, &t.desc, &y_in, &t.desc, &dy, &t.desc, &short_x, 0.0, &t.desc, &mut dx,
    );
    rejected("short x", r, kind!(BufferTooSmall), &s, &dx, &dx_before);
    let (mut g, g_before) = sentinel_buffer::<f32>(&s, t.span());
    let r = cudnn.activation_backward_in_place(
        &relu, 1.0, &t.desc, &y_in, &last.desc, &x, 0.0, &t.desc, &mut g,
    );
    rejected(
        "in place, x strides differ",
        r,
        kind!(InvalidArgument),
        &s,
        &g,
        &g_before,
    );
    let r = cudnn.activation_backward_in_place(
        &relu, 1.0, &last.desc, &y_in, &t.desc, &x, 0.0, &t.desc, &mut g,
    );
    rejected(
        "in place, y strides differ",
        r,
        kind!(InvalidArgument),
        &s,
        &g,
        &g_before,
    );
    let r = cudnn.activation_backward_in_place(
        &relu, 1.0, &t.desc, &y_in, &t.desc, &x, 0.0, &t.desc, &mut short,
    );
    rejected(
        "in place, short grad",
        r,
        kind!(BufferTooSmall),
        &s,
        &short,
        &short_before,
    );
}

#[test]
fn softmax_rejects_bad_calls() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(33);
    let (algo, mode) = (SoftmaxAlgorithm::Accurate, SoftmaxMode::Channel);
    let dims = [2i64, 5, 3, 4];
    let t = Tensor::<f32>::new(&dims, Fmt::First);
    let x = filled::<f32>(&s, &mut rng, t.span());
    let (mut y, y_before) = sentinel_buffer::<f32>(&s, t.span());

    let other = Tensor::<f32>::new(&[2, 5, 4, 3], Fmt::First);
    let r = cudnn.softmax_forward(algo, mode, 1.0, &t.desc, &x, 0.0, &other.desc, &mut y);
    rejected(
        "x and y dims differ",
        r,
        kind!(ShapeMismatch),
        &s,
        &y,
        &y_before,
    );
    let rank2 = TensorDesc::<f32>::nchw_nd(&[10, 12]).unwrap();
    let r = cudnn.softmax_forward(algo, mode, 1.0, &rank2, &x, 0.0, &rank2, &mut y);
    rejected("rank 2", r, kind!(InvalidArgument), &s, &y, &y_before);
    let (mut short, short_before) = sentinel_buffer::<f32>(&s, t.span() - 1);
    let r = cudnn.softmax_forward(algo, mode, 1.0, &t.desc, &x, 0.0, &t.desc, &mut short);
    rejected(
        "short y",
        r,
        kind!(BufferTooSmall),
        &s,
        &short,
        &short_before,
    );
    let overlapping = Tensor::<f32>::with_strides(&dims, &[60, 1, 4, 1]);
    let r = cudnn.softmax_forward(algo, mode, 1.0, &t.desc, &x, 0.0, &overlapping.desc, &mut y);
    rejected(
        "overlapping y",
        r,
        kind!(OverlappingOutput),
        &s,
        &y,
        &y_before,
    );
    let ti = TensorDesc::<i32>::nchw_nd(&dims).unwrap();
    let xi = s.clone_htod(&vec![3i32; ti.span()]).unwrap();
    let (mut yi, yi_before) = sentinel_buffer::<i32>(&s, ti.span());
    let r = cudnn.softmax_forward(algo, mode, 1.0, &ti, &xi, 0.0, &ti, &mut yi);
    rejected(
        "i32 softmax",
        r,
        kind!(UnsupportedDataType),
        &s,
        &yi,
        &yi_before,
    );

    let dy = filled::<f32>(&s, &mut rng, t.span());
    let (mut dx, dx_before) = sentinel_buffer::<f32>(&s, t.span());
    let r = cudnn.softmax_backward(
        algo,
        mode,
        1.0,
        &t.desc,
        &x,
        &other.desc,
        &dy,
        0.0,
        &t.desc,
        &mut dx,
    );
    rejected(
        "dy dims differ",
        r,
        kind!(ShapeMismatch),
        &s,
        &dx,
        &dx_before,
    );
    let short_dy = filled::<f32>(&s, &mut rng, t.span() - 1);
    let r = cudnn.softmax_backward(
        algo, mode, 1.0, &t.desc, &x, &t.desc, &short_dy, 0.0, &t.desc, &mut dx,
    );
    rejected("short dy", r, kind!(BufferTooSmall), &s, &dx, &dx_before);
    let r = cudnn.softmax_backward(
        algo, mode, 1.0, &t.desc, &x, &t.desc, &dy, 0.0, &t.desc, &mut short,
    );
    rejected(
        "short dx",
        r,
        kind!(BufferTooSmall),
        &s,
        &short,
        &short_before,
    );

    // f64 with a 5-D channels-last tensor (in any position): refused before launch, as cuDNN
    // 9.14 was seen to leave such outputs unwritten while returning success.
    let d5 = [2i64, 3, 2, 3, 2];
    let first = Tensor::<f64>::new(&d5, Fmt::First);
    let last = Tensor::<f64>::new(&d5, Fmt::Last);
    let x = filled::<f64>(&s, &mut rng, last.span());
    let dy = filled::<f64>(&s, &mut rng, last.span());
    let (mut y, y_before) = sentinel_buffer::<f64>(&s, last.span());
    for algo in SOFTMAX_ALGOS {
        for mode in SOFTMAX_MODES {
            for (what, xd, yd) in [
                ("f64 NDHWC softmax", &last, &last),
                ("f64 NCDHW -> NDHWC softmax", &first, &last),
                ("f64 NDHWC -> NCDHW softmax", &last, &first),
            ] {
                let what = format!("{what} {algo:?} {mode:?}");
                let r = cudnn.softmax_forward(algo, mode, 1.0, &xd.desc, &x, 0.0, &yd.desc, &mut y);
                rejected(&what, r, kind!(UnsupportedDataType), &s, &y, &y_before);
                let r = cudnn.softmax_backward(
                    algo, mode, 1.0, &xd.desc, &x, &xd.desc, &dy, 0.0, &yd.desc, &mut y,
                );
                rejected(
                    &format!("{what} backward"),
                    r,
                    kind!(UnsupportedDataType),
                    &s,
                    &y,
                    &y_before,
                );
            }
        }
    }
}

#[test]
fn buffers_of_another_context_are_rejected() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(34);
    let other = other_context(cudnn.context());
    let os = other.default_stream();
    let case = &POOL_CASES[0];
    let xt = Tensor::<f32>::new(case.x, Fmt::First);
    let yt = Tensor::<f32>::new(&case.y_dims(), Fmt::First);
    let x = filled::<f32>(&s, &mut rng, xt.span());
    let foreign_x = filled::<f32>(&os, &mut rng, xt.span());
    let (mut y, y_before) = sentinel_buffer::<f32>(&s, xt.span());
    let (mut foreign_y, foreign_before) = sentinel_buffer::<f32>(&os, xt.span());

    let pool = case.desc(PoolingMode::AvgExcludePadding);
    let r = cudnn.pooling_forward(&pool, 1.0, &xt.desc, &foreign_x, 0.0, &yt.desc, &mut y);
    rejected(
        "pooling, foreign x",
        r,
        kind!(ForeignContext),
        &s,
        &y,
        &y_before,
    );
    let r = cudnn.pooling_forward(&pool, 1.0, &xt.desc, &x, 0.0, &yt.desc, &mut foreign_y);
    rejected(
        "pooling, foreign y",
        r,
        kind!(ForeignContext),
        &os,
        &foreign_y,
        &foreign_before,
    );

    let act = ActivationDesc::new(ActivationMode::Tanh).unwrap();
    let r = cudnn.activation_forward(&act, 1.0, &xt.desc, &foreign_x, 0.0, &xt.desc, &mut y);
    rejected(
        "activation, foreign x",
        r,
        kind!(ForeignContext),
        &s,
        &y,
        &y_before,
    );
    let r = cudnn.activation_forward_in_place(&act, 1.0, 0.0, &xt.desc, &mut foreign_y);
    rejected(
        "activation, foreign in place",
        r,
        kind!(ForeignContext),
        &os,
        &foreign_y,
        &foreign_before,
    );
    let r = cudnn.activation_backward(
        &act, 1.0, &xt.desc, &x, &xt.desc, &foreign_x, &xt.desc, &x, 0.0, &xt.desc, &mut y,
    );
    rejected(
        "activation backward, foreign dy",
        r,
        kind!(ForeignContext),
        &s,
        &y,
        &y_before,
    );

    let (algo, mode) = (SoftmaxAlgorithm::Log, SoftmaxMode::Instance);
    let r = cudnn.softmax_forward(algo, mode, 1.0, &xt.desc, &x, 0.0, &xt.desc, &mut foreign_y);
    rejected(
        "softmax, foreign y",
        r,
        kind!(ForeignContext),
        &os,
        &foreign_y,
        &foreign_before,
    );
    let r = cudnn.softmax_backward(
        algo, mode, 1.0, &xt.desc, &foreign_x, &xt.desc, &x, 0.0, &xt.desc, &mut y,
    );
    rejected(
        "softmax backward, foreign y",
        r,
        kind!(ForeignContext),
        &s,
        &y,
        &y_before,
    );
}

// ---------------------------------------------------------------------------------------------
// Host-only checks (the real cuDNN library, no GPU)
// ---------------------------------------------------------------------------------------------

/// Window, pads, strides and what is wrong with them.
type BadPool = (&'static [i64], &'static [i64], &'static [i64], &'static str);

#[test]
fn pooling_builder_rejects_bad_parameters() {
    let build = |mode, w: &[i64], p: &[i64], s: &[i64]| {
        PoolingDesc::builder(mode, w).pads(p).strides(s).build()
    };
    let m = PoolingMode::Max;
    let cases: [BadPool; 11] = [
        (&[2, 2, 2, 2], &[], &[], "4-D window"),
        (&[], &[], &[], "empty window"),
        (&[0, 2], &[], &[], "zero window"),
        (&[2, -1], &[], &[], "negative window"),
        (&[2, 2], &[0, 0], &[0, 1], "zero stride"),
        (&[2, 2], &[-1, 0], &[], "negative pad"),
        (&[2, 2], &[2, 0], &[], "pad equal to the window"),
        (&[3, 3], &[1, 5], &[], "pad beyond the window"),
        (&[2, 2], &[0], &[], "pads of the wrong length"),
        (&[2, 2], &[], &[1, 1, 1], "strides of the wrong length"),
        (&[2, 1 << 31], &[], &[], "window beyond int"),
    ];
    for (w, p, s, what) in cases {
        let r = build(m, w, p, s);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "{what}: {r:?}"
        );
    }
    let r = build(m, &[2, 2], &[], &[1, 1 << 31]);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "stride beyond int: {r:?}"
    );
}

#[test]
fn activation_builder_rejects_bad_parameters() {
    for bad in [
        ActivationMode::ClippedRelu { ceiling: 0.0 },
        ActivationMode::ClippedRelu { ceiling: -6.0 },
        ActivationMode::ClippedRelu { ceiling: f64::NAN },
        ActivationMode::ClippedRelu {
            ceiling: f64::INFINITY,
        },
        ActivationMode::Elu { alpha: f64::NAN },
        ActivationMode::Elu {
            alpha: f64::INFINITY,
        },
        ActivationMode::Swish { beta: f64::NAN },
    ] {
        let r = ActivationDesc::new(bad);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "{bad:?}: {r:?}"
        );
    }
}

#[test]
fn descriptors_are_send() {
    assert_send::<PoolingDesc>();
    assert_send::<ActivationDesc>();
}

#[test]
fn pooling_descriptors_hold_what_was_asked() {
    let Some(l) = lib() else { return };
    let get = sys::sym!(l, cudnnGetPoolingNdDescriptor).unwrap();
    for (mode, raw_mode) in [
        (PoolingMode::Max, 0),
        (PoolingMode::AvgIncludePadding, 1),
        (PoolingMode::AvgExcludePadding, 2),
        (PoolingMode::MaxDeterministic, 3),
    ] {
        for (nan, raw_nan) in [
            (NanPropagation::NotPropagate, 0),
            (NanPropagation::Propagate, 1),
        ] {
            for case in &POOL_CASES {
                let pool = PoolingDesc::builder(mode, case.window)
                    .pads(case.pads)
                    .strides(case.strides)
                    .nan(nan)
                    .build()
                    .unwrap();
                assert_eq!(
                    (
                        pool.mode(),
                        pool.nan(),
                        pool.window(),
                        pool.pads(),
                        pool.strides()
                    ),
                    (mode, nan, case.window, case.pads, case.strides)
                );
                assert_eq!(pool.tensor_rank(), case.x.len());
                let (mut m, mut n, mut nb) = (
                    sys::cudnnPoolingMode_t(99),
                    sys::cudnnNanPropagation_t(99),
                    0 as c_int,
                );
                let (mut w, mut p, mut s) = ([0 as c_int; 3], [0 as c_int; 3], [0 as c_int; 3]);
                // SAFETY: live descriptor; every out-array holds the 3 values requested.
                let st = unsafe {
                    get(
                        pool.as_raw(),
                        3,
                        &mut m,
                        &mut n,
                        &mut nb,
                        w.as_mut_ptr(),
                        p.as_mut_ptr(),
                        s.as_mut_ptr(),
                    )
                };
                assert_eq!(st.0, 0);
                // cuDNN holds a 1-D pooling as a 2-D one over a unit height.
                let k = case.window.len().max(2);
                let unit = |v: &[i64], h: i64| -> Vec<i64> {
                    if v.len() == 1 {
                        vec![h, v[0]]
                    } else {
                        v.to_vec()
                    }
                };
                assert_eq!((m.0, n.0, nb as usize), (raw_mode, raw_nan, k));
                let widen = |v: &[c_int]| v[..k].iter().map(|&x| x as i64).collect::<Vec<_>>();
                assert_eq!(widen(&w), unit(case.window, 1));
                assert_eq!(widen(&p), unit(case.pads, 0));
                assert_eq!(widen(&s), unit(case.strides, 1));
            }
        }
    }
    // Strides default to the window.
    let pool = PoolingDesc::builder(PoolingMode::Max, &[3, 2])
        .build()
        .unwrap();
    assert_eq!(
        (pool.strides(), pool.pads()),
        (&[3i64, 2][..], &[0i64, 0][..])
    );
}

#[test]
fn activation_descriptors_hold_what_was_asked() {
    let Some(l) = lib() else { return };
    let get = sys::sym!(l, cudnnGetActivationDescriptor).unwrap();
    let get_beta = sys::sym!(l, cudnnGetActivationDescriptorSwishBeta).unwrap();
    let all = [
        (ActivationMode::Sigmoid, 0, 0.0),
        (ActivationMode::Relu, 1, 0.0),
        (ActivationMode::Tanh, 2, 0.0),
        (ActivationMode::ClippedRelu { ceiling: 6.0 }, 3, 6.0),
        (ActivationMode::Elu { alpha: 0.75 }, 4, 0.75),
        (ActivationMode::Identity, 5, 0.0),
        (ActivationMode::Swish { beta: 1.25 }, 6, 0.0),
    ];
    for (mode, raw_mode, coef) in all {
        for (nan, raw_nan) in [
            (NanPropagation::NotPropagate, 0),
            (NanPropagation::Propagate, 1),
        ] {
            let d = ActivationDesc::builder(mode).nan(nan).build().unwrap();
            assert_eq!((d.mode(), d.nan()), (mode, nan));
            let (mut m, mut n, mut c) = (
                sys::cudnnActivationMode_t(99),
                sys::cudnnNanPropagation_t(99),
                -1.0,
            );
            // SAFETY: live descriptor and valid out-pointers.
            let st = unsafe { get(d.as_raw(), &mut m, &mut n, &mut c) };
            assert_eq!(st.0, 0);
            assert_eq!((m.0, n.0, c), (raw_mode, raw_nan, coef), "{mode:?}");
            if let ActivationMode::Swish { beta } = mode {
                let mut b = 0.0;
                // SAFETY: live descriptor and a valid out-pointer.
                let st = unsafe { get_beta(d.as_raw(), &mut b) };
                assert_eq!((st.0, b), (0, beta));
            }
        }
    }
    assert_eq!(
        ActivationDesc::new(ActivationMode::Relu).unwrap().nan(),
        NanPropagation::Propagate
    );
}

#[test]
fn output_dims_reject_what_cannot_be_pooled() {
    let Some(_) = lib() else { return };
    let pool = POOL_CASES[1].desc(PoolingMode::Max); // 3×3, pad 1, stride 2
    assert_eq!(pool.output_dims(&[2, 3, 9, 11]).unwrap(), vec![2, 3, 5, 6]);
    assert_eq!(pool.output_dims(&[1, 1, 1, 1]).unwrap(), vec![1, 1, 1, 1]);
    for bad in [
        &[2i64, 3, 9][..],
        &[2, 3, 9, 11, 4],
        &[2, 0, 9, 11],
        &[2, 3, -1, 4],
    ] {
        let r = pool.output_dims(bad);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "{bad:?}: {r:?}"
        );
    }
    // 3×3 window over 1 + 2·0 rows: no padding case.
    let unpadded = PoolingDesc::builder(PoolingMode::Max, &[3, 3])
        .build()
        .unwrap();
    let r = unpadded.output_dims(&[1, 1, 2, 5]);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
}

/// cuDNN's own output size for `x_dims`, or its status when it refuses.
fn cudnn_output_dims(
    l: &sys::Library,
    pool: &PoolingDesc,
    x_dims: &[i64],
) -> Result<Vec<i64>, u32> {
    let x = TensorDesc::<f32>::nchw_nd(x_dims).unwrap();
    let get = sys::sym!(l, cudnnGetPoolingNdForwardOutputDim).unwrap();
    let mut out = vec![0 as c_int; x_dims.len()];
    // SAFETY: live descriptors; `out` holds `nbDims` values.
    let st = unsafe {
        get(
            pool.as_raw(),
            x.as_raw(),
            out.len() as c_int,
            out.as_mut_ptr(),
        )
    };
    if st.0 != 0 {
        return Err(st.0);
    }
    Ok(out.iter().map(|&v| v as i64).collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// `output_dims` agrees with `cudnnGetPoolingNdForwardOutputDim` on random problems, and
    /// refuses exactly where cuDNN does (window beyond the padded input).
    #[test]
    fn output_dims_match_cudnn(
        three_d in any::<bool>(),
        window in prop::collection::vec(1i64..7, 3),
        pad_seed in prop::collection::vec(0i64..7, 3),
        strides in prop::collection::vec(1i64..5, 3),
        n in 1i64..4,
        c in 1i64..5,
        spatial in prop::collection::vec(1i64..20, 3),
        mode in 0usize..4,
    ) {
        let Some(l) = lib() else { return Ok(()) };
        let k = if three_d { 3 } else { 2 };
        let pads: Vec<i64> = (0..k).map(|i| pad_seed[i] % window[i]).collect();
        let pool = PoolingDesc::builder(POOL_MODES[mode], &window[..k])
            .pads(&pads)
            .strides(&strides[..k])
            .build()
            .unwrap();
        let mut x = vec![n, c];
        x.extend_from_slice(&spatial[..k]);
        let ours = pool.output_dims(&x);
        let theirs = cudnn_output_dims(l, &pool, &x);
        match (&ours, &theirs) {
            (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
            (Err(_), Err(_)) => {}
            _ => prop_assert!(false, "x {:?}: ours {:?}, cuDNN {:?}", x, ours, theirs),
        }
        if ours.is_err() {
            prop_assert!(
                matches!(&ours, Err(cudnn_safe::Error::InvalidArgument { .. })),
                "{:?}",
                ours
            );
        }
    }
}

#[test]
fn layouts_used_here_are_what_they_claim() {
    let Some(_) = lib() else { return };
    // The test's own strides against the crate's constructors (a host-side cross-check).
    let dims = [2i64, 3, 4, 5];
    assert_eq!(
        Layout::nhwc(2, 3, 4, 5).unwrap().strides(),
        &strides_of(&dims, Fmt::Last)[..]
    );
    assert_eq!(
        Layout::nchw(2, 3, 4, 5).unwrap().strides(),
        &strides_of(&dims, Fmt::First)[..]
    );
    let t = Tensor::<f32>::new(&dims, Fmt::Padded);
    assert!(t.span() > t.len());
    assert_eq!(t.dims, dims);
}
