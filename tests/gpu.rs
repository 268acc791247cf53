//! GPU integration tests for the tensor operations, the handle and the workspace.
//!
//! Every result is compared with a reference computed on the host in `f64` from the values as
//! stored (inputs rounded to the tensor's type first), on random inputs from a seeded PRNG.
//! Outputs are filled before each call: padding elements (addressed by no logical index) with a
//! sentinel that must survive, and, where the old contents are not read (`beta = 0`, set), the
//! addressed elements with NaN (or a sentinel for integer types) so that unwritten elements show.
//!
//! Without a GPU (no driver, no device, no cuDNN) every test prints `skipping: <why>` and passes,
//! unless `CUDNN_SAFE_REQUIRE_GPU=1`, when it fails instead.
mod common;

use std::sync::Arc;

use common::{
    assert_send, assert_untouched, check_strided, download, for_each_index, gpu, image, offsets,
    other_context, poison, same, scalar, stored, tol, Rng, SENTINEL,
};
use cudnn_safe::cudarc::driver::{CudaContext, CudaStream};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::{
    Cudnn, DataType, Error, StatusFamily, TensorDesc, Workspace, MAX_WORKSPACE_BYTES,
};

// ---------------------------------------------------------------------------------------------
// Shapes, layouts and references (all independent of the crate under test)
// ---------------------------------------------------------------------------------------------

impl Rng {
    /// Random `[N, C, H, W]` with N in 1..4, C in 1..17, H and W in 1..9.
    fn dims(&mut self) -> [i64; 4] {
        [
            self.range(1, 4),
            self.range(1, 17),
            self.range(1, 9),
            self.range(1, 9),
        ]
    }
}

/// Memory layouts used by the tests.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fmt {
    Nchw,
    Nhwc,
    /// NCHW with padding after every row, every plane and every image.
    Padded,
    /// Strides given explicitly.
    Custom,
}

/// Dimensions and strides of a tensor, with the offsets computed here, not by the crate.
#[derive(Clone, Debug)]
struct Shape {
    fmt: Fmt,
    dims: Vec<i64>,
    strides: Vec<i64>,
}

impl Shape {
    fn new(fmt: Fmt, d: [i64; 4]) -> Shape {
        let [_, c, h, w] = d;
        let strides = match fmt {
            Fmt::Nchw => vec![c * h * w, h * w, w, 1],
            Fmt::Nhwc => vec![h * w * c, 1, w * c, c],
            Fmt::Padded => {
                let row = w + 3;
                let plane = (h + 1) * row + 2;
                vec![c * plane + 5, plane, row, 1]
            }
            Fmt::Custom => unreachable!("use Shape::custom"),
        };
        Shape {
            fmt,
            dims: d.to_vec(),
            strides,
        }
    }

    fn custom(dims: &[i64], strides: &[i64]) -> Shape {
        Shape {
            fmt: Fmt::Custom,
            dims: dims.to_vec(),
            strides: strides.to_vec(),
        }
    }

    fn span(&self) -> usize {
        let extent: i64 = self
            .dims
            .iter()
            .zip(&self.strides)
            .map(|(d, s)| (d - 1) * s)
            .sum();
        extent as usize + 1
    }

    fn offset(&self, idx: &[i64]) -> usize {
        idx.iter()
            .zip(&self.strides)
            .map(|(i, s)| i * s)
            .sum::<i64>() as usize
    }

    /// Offsets of every logical element, in row-major logical order.
    fn offsets(&self) -> Vec<usize> {
        offsets(&self.dims, &self.strides)
    }

    /// The descriptor, through the constructor matching the format; its strides and span are
    /// checked against the ones computed here.
    fn try_desc<T: DataType>(&self) -> Result<TensorDesc<T>, Error> {
        let d = &self.dims;
        let desc = match self.fmt {
            Fmt::Nchw => TensorDesc::nchw(d[0], d[1], d[2], d[3])?,
            Fmt::Nhwc => TensorDesc::nhwc(d[0], d[1], d[2], d[3])?,
            Fmt::Padded | Fmt::Custom => TensorDesc::strided(d, &self.strides)?,
        };
        assert_eq!(desc.layout().strides(), &self.strides[..], "{self:?}");
        assert_eq!(desc.span(), self.span(), "{self:?}");
        Ok(desc)
    }

    fn desc<T: DataType>(&self) -> TensorDesc<T> {
        self.try_desc()
            .unwrap_or_else(|e| panic!("descriptor {self:?}: {e}"))
    }
}

/// A cuDNN "not supported" or "bad parameter" status: acceptable for integer types only.
fn int_unsupported(e: &Error) -> bool {
    matches!(
        e,
        Error::Cudnn { status, .. }
            if matches!(status.family(), StatusFamily::NotSupported | StatusFamily::BadParam)
    )
}

// ---------------------------------------------------------------------------------------------
// Runners: one call checked against the host reference
// ---------------------------------------------------------------------------------------------

/// `c = alpha·a + beta·c` with `a` the per-channel bias `[1, C, 1, 1]`.
fn run_add<T: DataType>(
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    rng: &mut Rng,
    c: &Shape,
    alpha: f64,
    beta: f64,
) {
    let a = Shape::new(Fmt::Nchw, [1, c.dims[1], 1, 1]);
    let (a_d, c_d) = (a.desc::<T>(), c.desc::<T>());
    let (alpha_s, alpha) = scalar::<T>(alpha);
    let (beta_s, beta) = scalar::<T>(beta);

    let a_host: Vec<T> = rng.values(a.span());
    let c_offs = c.offsets();
    let c_before: Vec<T> = if beta == 0.0 {
        image(c.span(), &c_offs, |_| poison::<T>())
    } else {
        let vals: Vec<T> = rng.values(c_offs.len());
        image(c.span(), &c_offs, |i| vals[i])
    };

    let mut want = Vec::with_capacity(c_offs.len());
    for_each_index(&c.dims, |idx| {
        let a_idx: Vec<i64> = idx
            .iter()
            .zip(&a.dims)
            .map(|(&i, &d)| if d == 1 { 0 } else { i })
            .collect();
        let av = a_host[a.offset(&a_idx)].to_f64();
        let old = if beta == 0.0 {
            0.0
        } else {
            c_before[c.offset(idx)].to_f64()
        };
        want.push(stored::<T>(alpha * av + beta * old));
    });

    let a_dev = stream.clone_htod(&a_host).unwrap();
    let mut c_dev = stream.clone_htod(&c_before).unwrap();
    cudnn
        .add_tensor(alpha_s, &a_d, &a_dev, beta_s, &c_d, &mut c_dev)
        .unwrap_or_else(|e| panic!("add_tensor<{}> c {c:?}: {e}", T::DTYPE));
    let got = download(stream, &c_dev);
    let what = format!("add_tensor<{}> alpha {alpha} beta {beta} c {c:?}", T::DTYPE);
    check_strided(&what, &got, &c_before, &c_offs, &want, tol::<T>());
}

/// Bias broadcast on random NCHW shapes, then NHWC, padded and explicitly strided outputs, then
/// `beta = 0` on a NaN-poisoned output.
fn add_cases<T: DataType>(seed: u64) {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(seed);
    for _ in 0..4 {
        let d = rng.dims();
        run_add::<T>(
            &stream,
            &cudnn,
            &mut rng,
            &Shape::new(Fmt::Nchw, d),
            0.7,
            1.3,
        );
    }
    for fmt in [Fmt::Nhwc, Fmt::Padded] {
        for _ in 0..2 {
            let d = rng.dims();
            run_add::<T>(&stream, &cudnn, &mut rng, &Shape::new(fmt, d), 0.7, 1.3);
        }
    }
    let strided = Shape::custom(&[2, 3, 4, 5], &[100, 25, 6, 1]);
    run_add::<T>(&stream, &cudnn, &mut rng, &strided, 0.7, 1.3);
    run_add::<T>(&stream, &cudnn, &mut rng, &strided, -1.5, 0.0);
    let d = rng.dims();
    run_add::<T>(
        &stream,
        &cudnn,
        &mut rng,
        &Shape::new(Fmt::Nhwc, d),
        1.0,
        0.0,
    );
}

/// `y = alpha·y` in place.
fn run_scale<T: DataType>(
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    rng: &mut Rng,
    y: &Shape,
    alpha: f64,
) {
    let y_d = y.desc::<T>();
    let (alpha_s, alpha) = scalar::<T>(alpha);
    let offs = y.offsets();
    let vals: Vec<T> = rng.values(offs.len());
    let before = image(y.span(), &offs, |i| vals[i]);
    let want: Vec<f64> = vals
        .iter()
        .map(|v| stored::<T>(alpha * v.to_f64()))
        .collect();

    let mut y_dev = stream.clone_htod(&before).unwrap();
    cudnn
        .scale_tensor(&y_d, &mut y_dev, alpha_s)
        .unwrap_or_else(|e| panic!("scale_tensor<{}> y {y:?}: {e}", T::DTYPE));
    let got = download(stream, &y_dev);
    let what = format!("scale_tensor<{}> alpha {alpha} y {y:?}", T::DTYPE);
    check_strided(&what, &got, &before, &offs, &want, tol::<T>());
}

fn scale_cases<T: DataType>(seed: u64) {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(seed);
    for fmt in [Fmt::Nchw, Fmt::Nhwc, Fmt::Padded] {
        for _ in 0..2 {
            let d = rng.dims();
            let alpha = rng.uniform(-3.0, 3.0);
            run_scale::<T>(&stream, &cudnn, &mut rng, &Shape::new(fmt, d), alpha);
        }
    }
    let strided = Shape::custom(&[2, 3, 4, 5], &[100, 25, 6, 1]);
    run_scale::<T>(&stream, &cudnn, &mut rng, &strided, 0.5);
}

/// Sets every addressed element of a poisoned output to `value`; padding must stay. A cuDNN
/// error is returned (after checking the output is untouched) for the caller to judge.
fn run_set<T: DataType>(
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    y: &Shape,
    value: T,
) -> Result<(), Error> {
    let y_d = y.try_desc::<T>()?;
    let offs = y.offsets();
    let before = image(y.span(), &offs, |_| poison::<T>());
    let mut y_dev = stream.clone_htod(&before).unwrap();
    let what = format!("set_tensor<{}> value {value:?} y {y:?}", T::DTYPE);
    if let Err(e) = cudnn.set_tensor(&y_d, &mut y_dev, value) {
        assert_untouched(&what, stream, &y_dev, &before);
        return Err(e);
    }
    let got = download(stream, &y_dev);
    let want = vec![value.to_f64(); offs.len()];
    check_strided(&what, &got, &before, &offs, &want, 0.0);
    Ok(())
}

fn set_float_cases<T: DataType>(seed: u64) {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(seed);
    let mut shapes: Vec<Shape> = [Fmt::Nchw, Fmt::Nhwc, Fmt::Padded]
        .into_iter()
        .map(|f| Shape::new(f, rng.dims()))
        .collect();
    shapes.push(Shape::custom(&[2, 3, 4, 5], &[100, 25, 6, 1]));
    for y in &shapes {
        let value = T::from_f64(rng.uniform(-2.0, 2.0));
        run_set(&stream, &cudnn, y, value)
            .unwrap_or_else(|e| panic!("set_tensor<{}> y {y:?}: {e}", T::DTYPE));
    }
}

/// Integer types: cuDNN may refuse them (not supported / bad parameter), which is accepted;
/// anything else must work exactly.
fn set_int_cases<T: DataType>(value: T) {
    let Some((stream, cudnn)) = gpu() else { return };
    let shapes = [
        Shape::new(Fmt::Nchw, [2, 5, 3, 7]),
        Shape::custom(&[2, 3, 4, 5], &[100, 25, 6, 1]),
    ];
    for y in &shapes {
        match run_set(&stream, &cudnn, y, value) {
            Ok(()) => {}
            Err(e) if int_unsupported(&e) => {
                eprintln!(
                    "set_tensor<{}> not supported by cuDNN (accepted): {e}",
                    T::DTYPE
                );
            }
            Err(e) => panic!("set_tensor<{}> y {y:?}: {e}", T::DTYPE),
        }
    }
}

/// `y = alpha·x + beta·y` from `x` (type `X`) to `y` (type `Y`, another layout).
#[allow(clippy::too_many_arguments)]
fn run_transform<X: DataType, Y: DataType<Scalar = X::Scalar>>(
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    rng: &mut Rng,
    x: &Shape,
    y: &Shape,
    alpha: f64,
    beta: f64,
    tol: f64,
) {
    assert_eq!(x.dims, y.dims);
    let (x_d, y_d) = (x.desc::<X>(), y.desc::<Y>());
    let (alpha_s, alpha) = scalar::<X>(alpha);
    let (beta_s, beta) = scalar::<X>(beta);

    let x_offs = x.offsets();
    let x_vals: Vec<X> = rng.values(x_offs.len());
    let x_host = image(x.span(), &x_offs, |i| x_vals[i]);
    let y_offs = y.offsets();
    let y_before: Vec<Y> = if beta == 0.0 {
        image(y.span(), &y_offs, |_| poison::<Y>())
    } else {
        let vals: Vec<Y> = rng.values(y_offs.len());
        image(y.span(), &y_offs, |i| vals[i])
    };
    let want: Vec<f64> = x_vals
        .iter()
        .zip(&y_offs)
        .map(|(xv, &yo)| {
            let old = if beta == 0.0 {
                0.0
            } else {
                y_before[yo].to_f64()
            };
            stored::<Y>(alpha * xv.to_f64() + beta * old)
        })
        .collect();

    let x_dev = stream.clone_htod(&x_host).unwrap();
    let mut y_dev = stream.clone_htod(&y_before).unwrap();
    let what = format!(
        "transform_tensor<{}, {}> alpha {alpha} beta {beta} x {x:?} y {y:?}",
        X::DTYPE,
        Y::DTYPE
    );
    cudnn
        .transform_tensor(alpha_s, &x_d, &x_dev, beta_s, &y_d, &mut y_dev)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = download(stream, &y_dev);
    check_strided(&what, &got, &y_before, &y_offs, &want, tol);
    // The input is only read.
    let x_after = stream.clone_dtoh(&x_dev).unwrap();
    assert!(
        x_after.iter().zip(&x_host).all(|(&a, &b)| same(a, b)),
        "{what}: input changed"
    );
}

/// Several random shapes from `x_fmt` to `y_fmt`.
fn transform_cases<X: DataType, Y: DataType<Scalar = X::Scalar>>(
    seed: u64,
    x_fmt: Fmt,
    y_fmt: Fmt,
    alpha: f64,
    beta: f64,
    tol: f64,
) {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(seed);
    for _ in 0..5 {
        let d = rng.dims();
        let (x, y) = (Shape::new(x_fmt, d), Shape::new(y_fmt, d));
        run_transform::<X, Y>(&stream, &cudnn, &mut rng, &x, &y, alpha, beta, tol);
    }
}

// ---------------------------------------------------------------------------------------------
// add_tensor
// ---------------------------------------------------------------------------------------------

#[test]
fn add_bias_broadcast_f32() {
    add_cases::<f32>(1);
}

#[test]
fn add_bias_broadcast_f64() {
    add_cases::<f64>(2);
}

#[test]
fn add_bias_broadcast_f16() {
    add_cases::<f16>(3);
}

#[test]
fn add_bias_broadcast_bf16() {
    add_cases::<bf16>(4);
}

// ---------------------------------------------------------------------------------------------
// scale_tensor
// ---------------------------------------------------------------------------------------------

#[test]
fn scale_f32() {
    scale_cases::<f32>(11);
}

#[test]
fn scale_f64() {
    scale_cases::<f64>(12);
}

#[test]
fn scale_f16() {
    scale_cases::<f16>(13);
}

// ---------------------------------------------------------------------------------------------
// set_tensor
// ---------------------------------------------------------------------------------------------

#[test]
fn set_f32() {
    set_float_cases::<f32>(21);
}

#[test]
fn set_f16() {
    set_float_cases::<f16>(22);
}

#[test]
fn set_bf16() {
    set_float_cases::<bf16>(23);
}

#[test]
fn set_f64() {
    set_float_cases::<f64>(24);
}

#[test]
fn set_i8_if_supported() {
    set_int_cases::<i8>(-5);
}

#[test]
fn set_i32_if_supported() {
    set_int_cases::<i32>(-123_456);
}

// ---------------------------------------------------------------------------------------------
// transform_tensor
// ---------------------------------------------------------------------------------------------

#[test]
fn transform_nchw_to_nhwc_f32_is_an_exact_permutation() {
    transform_cases::<f32, f32>(31, Fmt::Nchw, Fmt::Nhwc, 1.0, 0.0, 0.0);
}

#[test]
fn transform_nhwc_to_nchw_f32_is_an_exact_permutation() {
    transform_cases::<f32, f32>(32, Fmt::Nhwc, Fmt::Nchw, 1.0, 0.0, 0.0);
}

#[test]
fn transform_to_and_from_padded_f32_is_exact() {
    transform_cases::<f32, f32>(33, Fmt::Nchw, Fmt::Padded, 1.0, 0.0, 0.0);
    transform_cases::<f32, f32>(34, Fmt::Padded, Fmt::Nhwc, 1.0, 0.0, 0.0);
}

#[test]
fn transform_nchw_f32_to_nhwc_f16() {
    transform_cases::<f32, f16>(35, Fmt::Nchw, Fmt::Nhwc, 1.0, 0.0, tol::<f16>());
}

#[test]
fn transform_f16_to_f32() {
    transform_cases::<f16, f32>(36, Fmt::Nhwc, Fmt::Nchw, 1.0, 0.0, tol::<f32>());
    transform_cases::<f16, f32>(37, Fmt::Nchw, Fmt::Nchw, 1.0, 0.0, tol::<f32>());
}

#[test]
fn transform_with_alpha_and_beta() {
    transform_cases::<f32, f32>(38, Fmt::Nchw, Fmt::Nhwc, 2.0, 0.5, tol::<f32>());
    transform_cases::<f32, f16>(39, Fmt::Nchw, Fmt::Nhwc, 2.0, 0.5, tol::<f16>());
    transform_cases::<f64, f64>(40, Fmt::Nhwc, Fmt::Padded, 2.0, 0.5, tol::<f64>());
}

// ---------------------------------------------------------------------------------------------
// Bad arguments are rejected before launch, output untouched
// ---------------------------------------------------------------------------------------------

#[test]
fn add_rejects_short_output() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(51);
    let c = Shape::new(Fmt::Nchw, [2, 4, 3, 5]);
    let a = Shape::new(Fmt::Nchw, [1, 4, 1, 1]);
    let (a_d, c_d) = (a.desc::<f32>(), c.desc::<f32>());
    let a_dev = stream.clone_htod(&rng.values::<f32>(a.span())).unwrap();
    let before = vec![SENTINEL as f32; c.span() - 1];
    let mut c_dev = stream.clone_htod(&before).unwrap();
    let r = cudnn.add_tensor(1.0, &a_d, &a_dev, 0.0, &c_d, &mut c_dev);
    let (len, required) = (c.span() - 1, c.span());
    assert!(
        matches!(r, Err(Error::BufferTooSmall { name: "c", len: l, required: q }) if l == len && q == required),
        "{r:?}"
    );
    assert_untouched("add short c", &stream, &c_dev, &before);
}

#[test]
fn add_rejects_short_input() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(52);
    let c = Shape::new(Fmt::Nchw, [2, 4, 3, 5]);
    let a = Shape::new(Fmt::Nchw, [1, 4, 1, 1]);
    let (a_d, c_d) = (a.desc::<f32>(), c.desc::<f32>());
    let a_dev = stream.clone_htod(&rng.values::<f32>(a.span() - 1)).unwrap();
    let before = vec![SENTINEL as f32; c.span()];
    let mut c_dev = stream.clone_htod(&before).unwrap();
    let r = cudnn.add_tensor(1.0, &a_d, &a_dev, 1.0, &c_d, &mut c_dev);
    assert!(
        matches!(r, Err(Error::BufferTooSmall { name: "a", .. })),
        "{r:?}"
    );
    assert_untouched("add short a", &stream, &c_dev, &before);
}

#[test]
fn add_rejects_shape_mismatch() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(53);
    let c = Shape::new(Fmt::Nchw, [2, 4, 3, 5]);
    let a = Shape::new(Fmt::Nchw, [1, 5, 1, 1]);
    let (a_d, c_d) = (a.desc::<f32>(), c.desc::<f32>());
    let a_dev = stream.clone_htod(&rng.values::<f32>(a.span())).unwrap();
    let before = vec![SENTINEL as f32; c.span()];
    let mut c_dev = stream.clone_htod(&before).unwrap();
    let r = cudnn.add_tensor(1.0, &a_d, &a_dev, 1.0, &c_d, &mut c_dev);
    assert!(
        matches!(r, Err(Error::ShapeMismatch { a: "a", b: "c", .. })),
        "{r:?}"
    );
    assert_untouched("add shape mismatch", &stream, &c_dev, &before);
}

#[test]
fn transform_rejects_short_buffers() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(54);
    let x = Shape::new(Fmt::Nchw, [2, 3, 4, 5]);
    let y = Shape::new(Fmt::Nhwc, [2, 3, 4, 5]);
    let (x_d, y_d) = (x.desc::<f32>(), y.desc::<f32>());

    // Output: a view one element short of the span, into a buffer one longer than the span (the
    // last element, just past the view, must survive too).
    let x_dev = stream.clone_htod(&rng.values::<f32>(x.span())).unwrap();
    let before = vec![SENTINEL as f32; y.span() + 1];
    let mut y_dev = stream.clone_htod(&before).unwrap();
    {
        let mut view = y_dev.slice_mut(..y.span() - 1);
        let r = cudnn.transform_tensor(1.0, &x_d, &x_dev, 0.0, &y_d, &mut view);
        assert!(
            matches!(r, Err(Error::BufferTooSmall { name: "y", .. })),
            "{r:?}"
        );
    }
    assert_untouched("transform short y", &stream, &y_dev, &before);

    // Input one element short.
    let x_short = stream.clone_htod(&rng.values::<f32>(x.span() - 1)).unwrap();
    let r = cudnn.transform_tensor(1.0, &x_d, &x_short, 0.0, &y_d, &mut y_dev);
    assert!(
        matches!(r, Err(Error::BufferTooSmall { name: "x", .. })),
        "{r:?}"
    );
    assert_untouched("transform short x", &stream, &y_dev, &before);
}

#[test]
fn transform_rejects_shape_mismatch() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(55);
    let x = Shape::new(Fmt::Nchw, [2, 3, 4, 5]);
    let y = Shape::new(Fmt::Nhwc, [2, 3, 5, 4]);
    let (x_d, y_d) = (x.desc::<f32>(), y.desc::<f16>());
    let x_dev = stream.clone_htod(&rng.values::<f32>(x.span())).unwrap();
    let before = vec![f16::from_f64(SENTINEL); y.span()];
    let mut y_dev = stream.clone_htod(&before).unwrap();
    let r = cudnn.transform_tensor(1.0, &x_d, &x_dev, 0.0, &y_d, &mut y_dev);
    assert!(
        matches!(r, Err(Error::ShapeMismatch { a: "x", b: "y", .. })),
        "{r:?}"
    );
    assert_untouched("transform shape mismatch", &stream, &y_dev, &before);
}

#[test]
fn overlapping_outputs_are_rejected() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(56);
    let dims = [2i64, 3, 4, 5];
    let over = Shape::custom(&dims, &[1, 1, 1, 1]);
    let y_d = match over.try_desc::<f32>() {
        Ok(d) => d,
        // If cuDNN itself refuses such a descriptor, no launch can be reached with it.
        Err(e) => {
            eprintln!("cuDNN refuses an overlapping descriptor ({e}); nothing to launch");
            return;
        }
    };
    let packed = Shape::new(Fmt::Nchw, dims);
    let x_d = packed.desc::<f32>();
    let bias = Shape::new(Fmt::Nchw, [1, 3, 1, 1]);
    let bias_d = bias.desc::<f32>();
    let x_dev = stream
        .clone_htod(&rng.values::<f32>(packed.span()))
        .unwrap();
    let bias_dev = stream.clone_htod(&rng.values::<f32>(bias.span())).unwrap();
    let before = vec![SENTINEL as f32; packed.span()]; // far more than the span (11)
    let mut y_dev = stream.clone_htod(&before).unwrap();

    let r = cudnn.set_tensor(&y_d, &mut y_dev, 1.0);
    assert!(
        matches!(&r, Err(Error::OverlappingOutput { name: "y", dims: d, strides: s })
            if d == &dims && s == &[1, 1, 1, 1]),
        "set: {r:?}"
    );
    let r = cudnn.scale_tensor(&y_d, &mut y_dev, 2.0);
    assert!(
        matches!(r, Err(Error::OverlappingOutput { name: "y", .. })),
        "scale: {r:?}"
    );
    let r = cudnn.add_tensor(1.0, &bias_d, &bias_dev, 1.0, &y_d, &mut y_dev);
    assert!(
        matches!(r, Err(Error::OverlappingOutput { name: "c", .. })),
        "add: {r:?}"
    );
    let r = cudnn.transform_tensor(1.0, &x_d, &x_dev, 0.0, &y_d, &mut y_dev);
    assert!(
        matches!(r, Err(Error::OverlappingOutput { name: "y", .. })),
        "transform: {r:?}"
    );
    assert_untouched("overlapping output", &stream, &y_dev, &before);
}

// ---------------------------------------------------------------------------------------------
// Contexts, threads, streams
// ---------------------------------------------------------------------------------------------

#[test]
fn buffers_of_another_context_are_rejected() {
    let Some((stream, mut cudnn)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(61);
    let other = other_context(cudnn.context());
    let other_stream = other.default_stream();

    let y = Shape::new(Fmt::Nchw, [2, 3, 4, 5]);
    let bias = Shape::new(Fmt::Nchw, [1, 3, 1, 1]);
    let (y_d, bias_d) = (y.desc::<f32>(), bias.desc::<f32>());
    let before = vec![SENTINEL as f32; y.span()];

    // Foreign output.
    let mut foreign_y = other_stream.clone_htod(&before).unwrap();
    let r = cudnn.set_tensor(&y_d, &mut foreign_y, 1.0);
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "y", .. })),
        "set: {r:?}"
    );
    let r = cudnn.scale_tensor(&y_d, &mut foreign_y, 2.0);
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "y", .. })),
        "scale: {r:?}"
    );
    assert_untouched("foreign y", &other_stream, &foreign_y, &before);

    // Foreign input, local output.
    let foreign_bias = other_stream
        .clone_htod(&rng.values::<f32>(bias.span()))
        .unwrap();
    let mut local_y = stream.clone_htod(&before).unwrap();
    let r = cudnn.add_tensor(1.0, &bias_d, &foreign_bias, 1.0, &y_d, &mut local_y);
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "a", .. })),
        "add: {r:?}"
    );
    assert_untouched("local c with foreign a", &stream, &local_y, &before);

    // A stream of the other context cannot be bound; the handle keeps working on its own.
    let r = cudnn.set_stream(other_stream.clone());
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "stream", .. })),
        "set_stream: {r:?}"
    );
    assert!(Arc::ptr_eq(cudnn.stream(), &stream));
    run_set(&stream, &cudnn, &y, 4.25f32).unwrap();
}

#[test]
fn handle_moves_to_another_thread_and_back() {
    assert_send::<Cudnn>();
    assert_send::<TensorDesc<f32>>();
    let Some((stream, cudnn)) = gpu() else { return };
    let y = Shape::new(Fmt::Padded, [2, 3, 4, 5]);
    let y_d = y.desc::<f32>();
    let offs = y.offsets();
    let before = image(y.span(), &offs, |_| f32::NAN);
    let mut y_dev = stream.clone_htod(&before).unwrap();

    let worker = std::thread::spawn(move || {
        cudnn.set_tensor(&y_d, &mut y_dev, 3.5f32).unwrap();
        cudnn.stream().synchronize().unwrap();
        (cudnn, y_d, y_dev)
    });
    let (cudnn, y_d, mut y_dev) = worker.join().unwrap();
    let got = stream.clone_dtoh(&y_dev).unwrap();
    check_strided(
        "set on another thread",
        &got,
        &before,
        &offs,
        &vec![3.5; offs.len()],
        0.0,
    );

    // Back on this thread, the same handle still works.
    cudnn.scale_tensor(&y_d, &mut y_dev, 2.0).unwrap();
    let got = download(&stream, &y_dev);
    check_strided(
        "scale after moving back",
        &got,
        &before,
        &offs,
        &vec![7.0; offs.len()],
        0.0,
    );
}

#[test]
fn set_stream_to_another_stream_of_the_context() {
    let Some((stream, mut cudnn)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(63);
    let s2 = stream.context().new_stream().unwrap();
    cudnn.set_stream(s2.clone()).unwrap();
    assert!(Arc::ptr_eq(cudnn.stream(), &s2));

    // Buffers made on the old stream, work enqueued on the new one.
    let d = rng.dims();
    let (x, y) = (Shape::new(Fmt::Nchw, d), Shape::new(Fmt::Nhwc, d));
    run_transform::<f32, f32>(&s2, &cudnn, &mut rng, &x, &y, 1.0, 0.0, 0.0);
    let d = rng.dims();
    run_add::<f32>(
        &stream,
        &cudnn,
        &mut rng,
        &Shape::new(Fmt::Nchw, d),
        0.7,
        1.3,
    );
    s2.synchronize().unwrap();

    // And back to the default stream.
    cudnn.set_stream(stream.clone()).unwrap();
    assert!(Arc::ptr_eq(cudnn.stream(), &stream));
    run_scale::<f32>(&stream, &cudnn, &mut rng, &Shape::new(Fmt::Nchw, d), 1.5);
}

// ---------------------------------------------------------------------------------------------
// Workspace
// ---------------------------------------------------------------------------------------------

#[test]
fn workspace_grows_is_reused_and_is_limited() {
    let Some((stream, _cudnn)) = gpu() else {
        return;
    };
    let limit = 1usize << 20;
    let mut ws = Workspace::new(stream.clone()).with_limit(limit);
    assert_eq!(ws.limit(), limit);
    assert_eq!(ws.capacity(), 0);
    assert!(Arc::ptr_eq(ws.stream(), &stream));
    ws.check(0).unwrap();
    let r = ws.check(1);
    assert!(
        matches!(
            r,
            Err(Error::WorkspaceTooSmall {
                available: 0,
                required: 1
            })
        ),
        "{r:?}"
    );

    ws.reserve(1024).unwrap();
    assert_eq!(ws.capacity(), 1024);
    ws.reserve(512).unwrap();
    assert_eq!(ws.capacity(), 1024, "a smaller request keeps the buffer");
    ws.check(1024).unwrap();
    ws.check(100).unwrap();
    let r = ws.check(1025);
    assert!(
        matches!(
            r,
            Err(Error::WorkspaceTooSmall {
                available: 1024,
                required: 1025
            })
        ),
        "{r:?}"
    );

    ws.reserve(64 << 10).unwrap();
    assert_eq!(ws.capacity(), 64 << 10);
    assert!(ws.allows(limit) && !ws.allows(limit + 1));
    let r = ws.reserve(limit + 1);
    assert!(
        matches!(r, Err(Error::WorkspaceLimit { requested, limit: l }) if requested == limit + 1 && l == limit),
        "{r:?}"
    );
    assert_eq!(
        ws.capacity(),
        64 << 10,
        "a refused request keeps the buffer"
    );

    ws.prepare(limit).unwrap();
    assert_eq!(ws.capacity(), limit);
    let r = ws.prepare(2 * limit);
    assert!(matches!(r, Err(Error::WorkspaceLimit { .. })), "{r:?}");
    assert_eq!(ws.capacity(), limit);

    ws.release();
    assert_eq!(ws.capacity(), 0);
    assert!(matches!(ws.check(1), Err(Error::WorkspaceTooSmall { .. })));
    ws.prepare(4096).unwrap();
    assert_eq!(ws.capacity(), 4096);

    let unlimited = Workspace::new(stream.clone()).with_limit(usize::MAX);
    assert_eq!(unlimited.limit(), MAX_WORKSPACE_BYTES);
    assert_eq!(Workspace::new(stream).limit(), MAX_WORKSPACE_BYTES);
}

// ---------------------------------------------------------------------------------------------
// The crate's own memory across streams, without cudarc's event tracking
// ---------------------------------------------------------------------------------------------

/// Turns cudarc's event tracking off for buffers created while it lives (the `unsafe` contract:
/// the test orders its own buffers, here by synchronizing), and back on when dropped, panics
/// included, so that later tests in this process are not affected.
struct NoEventTracking(Arc<CudaContext>);

impl NoEventTracking {
    fn new(ctx: &Arc<CudaContext>) -> Self {
        ctx.synchronize().unwrap();
        // SAFETY: every buffer this test creates while tracking is off is used on the streams
        // the test orders by hand (each check synchronizes before the next step) and dropped
        // after a synchronization; the crate's own memory is what the test checks.
        unsafe { ctx.disable_event_tracking() };
        NoEventTracking(ctx.clone())
    }
}

impl Drop for NoEventTracking {
    fn drop(&mut self) {
        let _ = self.0.synchronize();
        // SAFETY: see `new`; buffers made while it was off are dropped by now or synchronized.
        unsafe { self.0.enable_event_tracking() };
    }
}

/// About `ms` of work on `stream` (repeated 64 MiB f32 transforms), returning the buffers so
/// that they outlive the work.
fn busy(
    cudnn: &Cudnn,
    ms: f64,
) -> (
    cudnn_safe::cudarc::driver::CudaSlice<f32>,
    cudnn_safe::cudarc::driver::CudaSlice<f32>,
) {
    let n = 16 << 20;
    let d = TensorDesc::<f32>::nchw(1, 1, 4096, (n / 4096) as i64).unwrap();
    let stream = cudnn.stream();
    let a = stream.alloc_zeros::<f32>(n).unwrap();
    let mut b = stream.alloc_zeros::<f32>(n).unwrap();
    // ~0.04 ms per 128 MiB of traffic at H200 bandwidth; round generously up.
    let reps = (ms / 0.02).ceil() as usize;
    for _ in 0..reps {
        cudnn
            .transform_tensor(1.0, &d, &a, 0.0, &d, &mut b)
            .unwrap();
    }
    (a, b)
}

/// A workspace allocated on one stream and used by a handle on another, in a context whose
/// buffers carry no cudarc events: growing it frees the old buffer on its allocating stream only
/// after the other stream's work with it (checked: once an event recorded on the allocating
/// stream after the growth has completed, the other stream's earlier work has too).
#[test]
fn gpu_workspace_growth_waits_for_its_use_on_another_stream() {
    let Some((_s, first)) = gpu() else { return };
    let ctx = first.context().clone();
    drop(first);
    let tracking = NoEventTracking::new(&ctx);
    let s_alloc = ctx.new_stream().unwrap();
    let s_use = ctx.new_stream().unwrap();
    let cudnn = Cudnn::new(s_use.clone()).unwrap();
    let mut ws = Workspace::new(s_alloc.clone());
    ws.reserve(1 << 20).unwrap();
    s_alloc.synchronize().unwrap();

    // Long work on the handle's stream, then a launch that uses the workspace there.
    let keep = busy(&cudnn, 40.0);
    let x_d = TensorDesc::<f32>::nchw(2, 4, 16, 16).unwrap();
    let w_d =
        cudnn_safe::FilterDesc::<f32>::new(&[8, 4, 3, 3], cudnn_safe::TensorFormat::Nchw).unwrap();
    let conv = cudnn_safe::conv::ConvDesc::builder(2)
        .pads(&[1, 1])
        .build::<f32>()
        .unwrap();
    let y_d = TensorDesc::<f32>::nchw(2, 8, 16, 16).unwrap();
    let mut rng = Rng::new(77);
    let x = s_use.clone_htod(&rng.values::<f32>(x_d.span())).unwrap();
    let w = s_use.clone_htod(&rng.values::<f32>(w_d.span())).unwrap();
    let mut y = s_use.alloc_zeros::<f32>(y_d.span()).unwrap();
    cudnn
        .conv_forward(
            1.0,
            &x_d,
            &x,
            &w_d,
            &w,
            &conv,
            cudnn_safe::conv::ConvFwdAlgo::ImplicitGemm,
            &mut ws,
            0.0,
            &y_d,
            &mut y,
        )
        .unwrap();
    let used = s_use.record_event(None).unwrap();
    // Growing frees the old buffer on the allocating stream.
    ws.reserve(64 << 20).unwrap();
    let after = s_alloc.record_event(None).unwrap();
    after.synchronize().unwrap();
    assert!(
        used.is_complete(),
        "the workspace was freed on its stream before the other stream's work with it ended"
    );
    ctx.synchronize().unwrap();
    drop((keep, x, w, y, ws, cudnn));
    drop(tracking);
}

/// Saved batch-norm statistics made on one stream and read by a backward call on another: the
/// statistics' free on their stream waits for that backward (and its stream's earlier work),
/// and the backward reads them only after the forward wrote them.
#[test]
fn gpu_saved_values_used_on_another_stream_are_freed_after_the_use() {
    use cudnn_safe::{BatchNorm, Layout};
    let Some((_s, first)) = gpu() else { return };
    let ctx = first.context().clone();
    drop(first);
    let tracking = NoEventTracking::new(&ctx);
    let s_fwd = ctx.new_stream().unwrap();
    let s_bwd = ctx.new_stream().unwrap();
    let fwd = Cudnn::new(s_fwd.clone()).unwrap();
    let bwd = Cudnn::new(s_bwd.clone()).unwrap();
    let layout = Layout::nchw(4, 8, 6, 6).unwrap();
    let bn = BatchNorm::builder().build::<f32>(&layout).unwrap();
    let n = layout.span();
    let mut rng = Rng::new(78);
    let x = s_fwd.clone_htod(&rng.values::<f32>(n)).unwrap();
    let scale = s_fwd
        .clone_htod(&rng.values_in::<f32>(8, 0.5, 1.5))
        .unwrap();
    let bias = s_fwd.clone_htod(&rng.values::<f32>(8)).unwrap();
    let mut y = s_fwd.alloc_zeros::<f32>(n).unwrap();
    let dy = s_fwd.clone_htod(&rng.values::<f32>(n)).unwrap();
    let (mut dx, mut ds, mut db) = (
        s_fwd.alloc_zeros::<f32>(n).unwrap(),
        s_fwd.alloc_zeros::<f32>(8).unwrap(),
        s_fwd.alloc_zeros::<f32>(8).unwrap(),
    );
    s_fwd.synchronize().unwrap();
    let saved = fwd
        .batch_norm_forward_training(&bn, 1.0, 0.0, &x, &mut y, &scale, &bias, None)
        .unwrap();
    // The host orders the user's buffers (tracking is off): forward done before the backward.
    s_fwd.synchronize().unwrap();
    let keep = busy(&bwd, 40.0);
    bwd.batch_norm_backward(
        &bn, &saved, 1.0, 0.0, 1.0, 0.0, &x, &dy, &mut dx, &scale, &mut ds, &mut db,
    )
    .unwrap();
    let used = s_bwd.record_event(None).unwrap();
    drop(saved);
    let after = s_fwd.record_event(None).unwrap();
    after.synchronize().unwrap();
    assert!(
        used.is_complete(),
        "saved statistics were freed on their stream before the other stream's backward ended"
    );
    ctx.synchronize().unwrap();
    drop((keep, x, y, dy, dx, ds, db, scale, bias, fwd, bwd));
    drop(tracking);
}
