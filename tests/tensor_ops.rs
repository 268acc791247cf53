//! Element-wise op-tensor, reductions and dropout: GPU cases against f64 CPU references (skipped
//! cleanly without a GPU, see `common::gpu`) and host-side checks against the real cuDNN library.
//!
//! Every GPU case poisons its output with NaN before the call (so unwritten elements show), uses
//! random non-zero inputs, and every rejected call must leave a sentinel-filled output untouched.
mod common;

use std::sync::Arc;

use common::*;
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::dropout::Dropout;
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::ops::OpTensorOp;
use cudnn_safe::reduce::ReduceOp;
use cudnn_safe::{Cudnn, DataType, Error, Layout, TensorDesc, Workspace};

// ---------------------------------------------------------------------------------------------
// Layouts and host images
// ---------------------------------------------------------------------------------------------

/// The memory layouts exercised.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fmt {
    /// Packed channels-first.
    Nchw,
    /// Packed channels-last.
    Nhwc,
    /// Channels-first with every row padded by 2 elements and every plane by one row: the
    /// padding must survive every call.
    Padded,
}

fn layout(fmt: Fmt, dims: &[i64]) -> Layout {
    match fmt {
        Fmt::Nchw => Layout::nchw_nd(dims).unwrap(),
        Fmt::Nhwc => Layout::nhwc_nd(dims).unwrap(),
        Fmt::Padded => {
            let r = dims.len();
            let mut padded = dims.to_vec();
            padded[r - 1] += 2;
            padded[r - 2] += 1;
            Layout::strided(dims, &packed_strides(&padded)).unwrap()
        }
    }
}

/// A descriptor and the offsets of its logical elements (row-major logical order).
struct Tensor<T: DataType> {
    desc: TensorDesc<T>,
    offs: Vec<usize>,
}

impl<T: DataType> Tensor<T> {
    fn new(fmt: Fmt, dims: &[i64]) -> Self {
        let l = layout(fmt, dims);
        let offs = layout_offsets(&l);
        Tensor {
            desc: TensorDesc::new(l).unwrap(),
            offs,
        }
    }
    fn count(&self) -> usize {
        self.offs.len()
    }
    fn span(&self) -> usize {
        self.desc.span()
    }
    /// A host image holding `vals` (logical order) at the addressed elements, sentinels
    /// elsewhere, and its device copy.
    fn upload(&self, stream: &Arc<CudaStream>, vals: &[T]) -> (CudaSlice<T>, Vec<T>) {
        assert_eq!(vals.len(), self.count());
        let host = image(self.span(), &self.offs, |i| vals[i]);
        (stream.clone_htod(&host).unwrap(), host)
    }
    /// The logical elements of a downloaded buffer.
    fn pick(&self, buf: &[T]) -> Vec<T> {
        self.offs.iter().map(|&o| buf[o]).collect()
    }
}

/// Checks `got` against `want`: `|g − w| ≤ tol_out·(1 + |w|) + tol_compute·scale` and `g`
/// finite. `tol_out` covers the rounding of the result to its storage type; `tol_compute` the
/// accumulation in the compute type, which grows with `scale` (for a sum, the sum of the
/// absolute terms), not with the possibly cancelled result.
fn assert_scaled<T: DataType>(
    what: &str,
    got: &[T],
    want: &[f64],
    scale: &[f64],
    tol_out: f64,
    tol_compute: f64,
) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        let g = g.to_f64();
        let bound = tol_out * (1.0 + w.abs()) + tol_compute * s;
        assert!(
            g.is_finite() && (g - w).abs() <= bound,
            "{what}: element {i}: got {g}, want {w} (bound {bound})"
        );
    }
}

/// A cuDNN status of the "not supported" or "bad parameter" families.
fn cudnn_refused(e: &Error) -> bool {
    use cudnn_safe::StatusFamily as F;
    e.status()
        .is_some_and(|s| matches!(s.family(), F::NotSupported | F::BadParam))
}

// ---------------------------------------------------------------------------------------------
// op_tensor
// ---------------------------------------------------------------------------------------------

fn op_ref(op: OpTensorOp, a: f64, b: f64) -> f64 {
    match op {
        OpTensorOp::Add => a + b,
        OpTensorOp::Mul => a * b,
        OpTensorOp::Min => a.min(b),
        OpTensorOp::Max => a.max(b),
        OpTensorOp::Sqrt => a.sqrt(),
        OpTensorOp::Not => 1.0 - a,
        other => panic!("no reference for {other:?}"),
    }
}

/// One `op_tensor` call on random data, checked against the f64 reference.
#[allow(clippy::too_many_arguments)]
fn run_op<T: DataType>(
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    rng: &mut Rng,
    op: OpTensorOp,
    c_dims: &[i64],
    b_dims: &[i64],
    fmts: (Fmt, Fmt, Fmt),
    beta: f64,
) {
    let what = format!(
        "{:?} {op:?} c {c_dims:?} b {b_dims:?} {fmts:?} beta {beta}",
        T::DTYPE
    );
    let a = Tensor::<T>::new(fmts.0, c_dims);
    let b = Tensor::<T>::new(fmts.1, b_dims);
    let c = Tensor::<T>::new(fmts.2, c_dims);
    // sqrt needs alpha1·a ≥ 0.
    let (alpha1_s, alpha1) = scalar::<T>(1.5);
    let (alpha2_s, alpha2) = scalar::<T>(-0.75);
    let (beta_s, beta) = scalar::<T>(beta);
    let a_vals: Vec<T> = if op == OpTensorOp::Sqrt {
        rng.values_in(a.count(), 0.1, 2.0)
    } else {
        rng.values(a.count())
    };
    let b_vals: Vec<T> = rng.values(b.count());
    let c_old: Vec<T> = if beta == 0.0 {
        vec![poison::<T>(); c.count()]
    } else {
        rng.values(c.count())
    };
    let (a_dev, _) = a.upload(stream, &a_vals);
    let (b_dev, _) = b.upload(stream, &b_vals);
    let (mut c_dev, c_before) = c.upload(stream, &c_old);

    let mut want = Vec::with_capacity(c.count());
    let mut k = 0;
    for_each_index(c_dims, |idx| {
        let b_idx: Vec<i64> = idx
            .iter()
            .zip(b_dims)
            .map(|(&i, &d)| if d == 1 { 0 } else { i })
            .collect();
        let av = alpha1 * a_vals[k].to_f64();
        let bv = alpha2 * b_vals[linear(b_dims, &b_idx)].to_f64();
        let old = if beta == 0.0 { 0.0 } else { c_old[k].to_f64() };
        want.push(stored::<T>(op_ref(op, av, bv) + beta * old));
        k += 1;
    });

    cudnn
        .op_tensor(
            op, alpha1_s, &a.desc, &a_dev, alpha2_s, &b.desc, &b_dev, beta_s, &c.desc, &mut c_dev,
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = download(stream, &c_dev);
    check_strided(&what, &got, &c_before, &c.offs, &want, tol::<T>());
}

/// The broadcast shapes of `b` tried against `c = [2, 3, 4, 5]`.
const OP_B_SHAPES: [[i64; 4]; 5] = [
    [2, 3, 4, 5],
    [1, 3, 1, 1],
    [2, 1, 4, 5],
    [1, 1, 1, 1],
    [2, 3, 1, 5],
];

/// Every op × layout combination × broadcast shape × beta ∈ {0, 0.5} for one dtype.
fn op_tensor_cases<T: DataType>(seed: u64) {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(seed);
    let fmts = [
        (Fmt::Nchw, Fmt::Nchw, Fmt::Nchw),
        (Fmt::Nhwc, Fmt::Nhwc, Fmt::Nhwc),
        (Fmt::Nhwc, Fmt::Nchw, Fmt::Padded),
    ];
    for op in OpTensorOp::ALL {
        for f in fmts {
            for b in OP_B_SHAPES {
                for beta in [0.0, 0.5] {
                    run_op::<T>(&stream, &cudnn, &mut rng, op, &[2, 3, 4, 5], &b, f, beta);
                }
            }
        }
    }
}

#[test]
fn op_tensor_f32() {
    op_tensor_cases::<f32>(101);
}

#[test]
fn op_tensor_f64() {
    op_tensor_cases::<f64>(102);
}

#[test]
fn op_tensor_f16() {
    op_tensor_cases::<f16>(103);
}

#[test]
fn op_tensor_bf16() {
    op_tensor_cases::<bf16>(104);
}

/// Five dimensions, the most `cudnnOpTensor` takes, channels-first and channels-last.
#[test]
fn op_tensor_five_dims() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(105);
    let c = [2, 3, 2, 3, 4];
    for op in OpTensorOp::ALL {
        for (b, f) in [
            ([1, 3, 1, 1, 1], (Fmt::Nchw, Fmt::Nchw, Fmt::Nchw)),
            ([2, 1, 2, 3, 4], (Fmt::Nhwc, Fmt::Nhwc, Fmt::Nhwc)),
            ([2, 3, 2, 3, 4], (Fmt::Nchw, Fmt::Nhwc, Fmt::Padded)),
        ] {
            run_op::<f32>(&stream, &cudnn, &mut rng, op, &c, &b, f, 0.25);
            run_op::<f64>(&stream, &cudnn, &mut rng, op, &c, &b, f, 0.0);
        }
    }
}

/// `c = op(alpha1·c, alpha2·b) + beta·c` with `c` as both operand and destination.
fn op_inplace_cases<T: DataType>(seed: u64) {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(seed);
    let c_dims = [2, 3, 4, 5];
    for op in OpTensorOp::ALL {
        for (fmt, b_dims) in [(Fmt::Nchw, [1, 3, 1, 1]), (Fmt::Nhwc, [2, 3, 4, 5])] {
            let what = format!("{:?} in-place {op:?} {fmt:?} b {b_dims:?}", T::DTYPE);
            let b = Tensor::<T>::new(fmt, &b_dims);
            let c = Tensor::<T>::new(fmt, &c_dims);
            let (alpha1_s, alpha1) = scalar::<T>(0.5);
            let (alpha2_s, alpha2) = scalar::<T>(2.0);
            let (beta_s, beta) = scalar::<T>(0.25);
            let c_vals: Vec<T> = if op == OpTensorOp::Sqrt {
                rng.values_in(c.count(), 0.1, 2.0)
            } else {
                rng.values(c.count())
            };
            let b_vals: Vec<T> = rng.values(b.count());
            let (b_dev, _) = b.upload(&stream, &b_vals);
            let (mut c_dev, c_before) = c.upload(&stream, &c_vals);
            let mut want = Vec::new();
            let mut k = 0;
            for_each_index(&c_dims, |idx| {
                let b_idx: Vec<i64> = idx
                    .iter()
                    .zip(&b_dims)
                    .map(|(&i, &d)| if d == 1 { 0 } else { i })
                    .collect();
                let cv = c_vals[k].to_f64();
                let bv = alpha2 * b_vals[linear(&b_dims, &b_idx)].to_f64();
                want.push(stored::<T>(op_ref(op, alpha1 * cv, bv) + beta * cv));
                k += 1;
            });
            cudnn
                .op_tensor_inplace(
                    op, alpha1_s, alpha2_s, &b.desc, &b_dev, beta_s, &c.desc, &mut c_dev,
                )
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let got = download(&stream, &c_dev);
            check_strided(&what, &got, &c_before, &c.offs, &want, tol::<T>());
        }
    }
}

#[test]
fn op_tensor_inplace_f32() {
    op_inplace_cases::<f32>(111);
}

#[test]
fn op_tensor_inplace_f16() {
    op_inplace_cases::<f16>(112);
}

#[test]
fn op_tensor_inplace_f64() {
    op_inplace_cases::<f64>(113);
}

/// The unary form: sqrt and not, without a `b`.
fn op_unary_cases<T: DataType>(seed: u64) {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(seed);
    let dims = [3, 4, 5, 6];
    for op in [OpTensorOp::Sqrt, OpTensorOp::Not] {
        for (fa, fc) in [(Fmt::Nchw, Fmt::Nchw), (Fmt::Nhwc, Fmt::Padded)] {
            let what = format!("{:?} unary {op:?} {fa:?}->{fc:?}", T::DTYPE);
            let a = Tensor::<T>::new(fa, &dims);
            let c = Tensor::<T>::new(fc, &dims);
            let (alpha_s, alpha) = scalar::<T>(2.0);
            let (beta_s, _) = scalar::<T>(0.0);
            let a_vals: Vec<T> = rng.values_in(a.count(), 0.05, 1.0);
            let (a_dev, _) = a.upload(&stream, &a_vals);
            let (mut c_dev, c_before) = c.upload(&stream, &vec![poison::<T>(); c.count()]);
            let want: Vec<f64> = a_vals
                .iter()
                .map(|v| stored::<T>(op_ref(op, alpha * v.to_f64(), 0.0)))
                .collect();
            cudnn
                .op_tensor_unary(op, alpha_s, &a.desc, &a_dev, beta_s, &c.desc, &mut c_dev)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let got = download(&stream, &c_dev);
            check_strided(&what, &got, &c_before, &c.offs, &want, tol::<T>());
        }
    }
}

#[test]
fn op_tensor_unary_f32() {
    op_unary_cases::<f32>(121);
}

#[test]
fn op_tensor_unary_bf16() {
    op_unary_cases::<bf16>(122);
}

/// Rejected calls return a typed error and leave the sentinel-filled output untouched.
#[test]
fn op_tensor_rejections_leave_output_untouched() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(131);
    let c_d = TensorDesc::<f32>::nchw(2, 3, 4, 5).unwrap();
    let n = c_d.span();
    let a = stream.clone_htod(&rng.values::<f32>(n)).unwrap();
    let b = stream.clone_htod(&rng.values::<f32>(n)).unwrap();
    let (mut c, c_host) = sentinel_buffer::<f32>(&stream, n);
    let add = OpTensorOp::Add;

    // a broadcast: cuDNN only broadcasts b.
    let small = TensorDesc::<f32>::nchw(1, 3, 1, 1).unwrap();
    let r = cudnn.op_tensor(add, 1.0, &small, &a, 1.0, &c_d, &b, 0.0, &c_d, &mut c);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    // b with a dimension neither c's nor 1.
    let bad = TensorDesc::<f32>::nchw(2, 2, 4, 5).unwrap();
    let r = cudnn.op_tensor(add, 1.0, &c_d, &a, 1.0, &bad, &b, 0.0, &c_d, &mut c);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    // b of another rank.
    let r3 = TensorDesc::<f32>::nchw_nd(&[2, 3, 20]).unwrap();
    let r = cudnn.op_tensor(add, 1.0, &c_d, &a, 1.0, &r3, &b, 0.0, &c_d, &mut c);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    assert_untouched("c after shape mismatches", &stream, &c, &c_host);

    // Short inputs and a short output.
    let short = stream.clone_htod(&rng.values::<f32>(n - 1)).unwrap();
    let r = cudnn.op_tensor(add, 1.0, &c_d, &short, 1.0, &c_d, &b, 0.0, &c_d, &mut c);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    let r = cudnn.op_tensor(add, 1.0, &c_d, &a, 1.0, &c_d, &short, 0.0, &c_d, &mut c);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    assert_untouched("c after short inputs", &stream, &c, &c_host);
    let (mut c_short, c_short_host) = sentinel_buffer::<f32>(&stream, n - 1);
    let r = cudnn.op_tensor(add, 1.0, &c_d, &a, 1.0, &c_d, &b, 0.0, &c_d, &mut c_short);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    assert_untouched("short c", &stream, &c_short, &c_short_host);
    let r = cudnn.op_tensor_inplace(add, 1.0, 1.0, &c_d, &b, 0.0, &c_d, &mut c_short);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    assert_untouched("short in-place c", &stream, &c_short, &c_short_host);

    // An output whose layout addresses elements twice.
    let overlapping = TensorDesc::<f32>::strided(&[2, 3, 4, 5], &[1, 1, 1, 1]).unwrap();
    let a_o = TensorDesc::<f32>::strided(&[2, 3, 4, 5], &[60, 20, 5, 1]).unwrap();
    let r = cudnn.op_tensor(add, 1.0, &a_o, &a, 1.0, &a_o, &b, 0.0, &overlapping, &mut c);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::OverlappingOutput { .. })),
        "{r:?}"
    );

    // More than five dimensions.
    let d6 = TensorDesc::<f32>::nchw_nd(&[2, 3, 2, 5, 1, 2]).unwrap();
    let r = cudnn.op_tensor(add, 1.0, &d6, &a, 1.0, &d6, &b, 0.0, &d6, &mut c);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );

    // A binary op through the unary entry point.
    let r = cudnn.op_tensor_unary(OpTensorOp::Max, 1.0, &c_d, &a, 0.0, &c_d, &mut c);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );

    // Integer types other than i8.
    let ci = TensorDesc::<i32>::nchw(2, 3, 4, 5).unwrap();
    let ai = stream.clone_htod(&vec![3i32; n]).unwrap();
    let (mut cint, cint_host) = sentinel_buffer::<i32>(&stream, n);
    let r = cudnn.op_tensor(add, 1.0, &ci, &ai, 1.0, &ci, &ai, 0.0, &ci, &mut cint);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
        "{r:?}"
    );
    assert_untouched("i32 c", &stream, &cint, &cint_host);

    assert_untouched("c after every rejection", &stream, &c, &c_host);
}

// ---------------------------------------------------------------------------------------------
// reduce_tensor
// ---------------------------------------------------------------------------------------------

/// For each logical element of `a` (row-major): the row-major index of its output element in
/// `c`, and its row-major position among the reduced dimensions (the index cuDNN reports).
fn reduce_map(a_dims: &[i64], c_dims: &[i64]) -> (Vec<usize>, Vec<usize>) {
    let reduced: Vec<bool> = a_dims
        .iter()
        .zip(c_dims)
        .map(|(&a, &c)| c == 1 && a != 1)
        .collect();
    let (mut out, mut pos) = (Vec::new(), Vec::new());
    for_each_index(a_dims, |idx| {
        let c_idx: Vec<i64> = idx
            .iter()
            .zip(&reduced)
            .map(|(&i, &r)| if r { 0 } else { i })
            .collect();
        out.push(linear(c_dims, &c_idx));
        let mut p = 0usize;
        for ((&i, &d), &r) in idx.iter().zip(a_dims).zip(&reduced) {
            if r {
                p = p * d as usize + i as usize;
            }
        }
        pos.push(p);
    });
    (out, pos)
}

/// The f64 reduction of one slice, the scale its rounding error grows with, and (for min, max,
/// absolute max) the position of the selected element, `None` when it is not unique.
fn reduce_ref(op: ReduceOp, v: &[f64]) -> (f64, f64, Option<usize>) {
    let abs_sum: f64 = v.iter().map(|x| x.abs()).sum();
    let pick = |key: &dyn Fn(f64) -> f64, better: &dyn Fn(f64, f64) -> bool| {
        let mut best = 0;
        for i in 1..v.len() {
            if better(key(v[i]), key(v[best])) {
                best = i;
            }
        }
        let unique = v.iter().filter(|&&x| key(x) == key(v[best])).count() == 1;
        (key(v[best]), unique.then_some(best))
    };
    match op {
        ReduceOp::Add => (v.iter().sum(), abs_sum, None),
        ReduceOp::Avg => (
            v.iter().sum::<f64>() / v.len() as f64,
            abs_sum / v.len() as f64,
            None,
        ),
        ReduceOp::Norm1 => (abs_sum, abs_sum, None),
        ReduceOp::Norm2 => {
            let r = v.iter().map(|x| x * x).sum::<f64>().sqrt();
            (r, r, None)
        }
        ReduceOp::Mul => {
            let r: f64 = v.iter().product();
            (r, r.abs(), None)
        }
        ReduceOp::MulNoZeros => {
            let r: f64 = v.iter().filter(|&&x| x != 0.0).product();
            (r, r.abs(), None)
        }
        ReduceOp::Min => {
            let (r, i) = pick(&|x| x, &|a, b| a < b);
            (r, r.abs(), i)
        }
        ReduceOp::Max => {
            let (r, i) = pick(&|x| x, &|a, b| a > b);
            (r, r.abs(), i)
        }
        ReduceOp::AMax => {
            let (r, i) = pick(&|x: f64| x.abs(), &|a, b| a > b);
            (r, r, i)
        }
        other => panic!("no reference for {other:?}"),
    }
}

/// Random inputs suited to `op` for slices of the given map: products get magnitudes near 1
/// (so a product of 120 values stays well inside f16's range); `MulNoZeros` gets some exact
/// zeros but never a slice of zeros only.
fn reduce_inputs<T: DataType>(rng: &mut Rng, op: ReduceOp, out: &[usize]) -> Vec<T> {
    let n = out.len();
    match op {
        ReduceOp::Mul | ReduceOp::MulNoZeros => {
            let mut v: Vec<T> = (0..n)
                .map(|_| {
                    let m = rng.uniform(0.95, 1.05);
                    let s = if rng.unit() < 0.5 { -1.0 } else { 1.0 };
                    let zero = op == ReduceOp::MulNoZeros && rng.unit() < 0.2;
                    T::from_f64(if zero { 0.0 } else { s * m })
                })
                .collect();
            let slices = out.iter().max().map_or(0, |&m| m + 1);
            for o in 0..slices {
                if out
                    .iter()
                    .zip(&v)
                    .all(|(&oo, x)| oo != o || x.to_f64() == 0.0)
                {
                    let first = out.iter().position(|&oo| oo == o).unwrap();
                    v[first] = T::from_f64(1.0);
                }
            }
            v
        }
        _ => rng.values(n),
    }
}

/// The reduction axes tried on a `[2, 3, 4, 5]` input: over N, over C, spatial, all but C,
/// everything, the last dimension only.
const REDUCE_C_SHAPES: [[i64; 4]; 6] = [
    [1, 3, 4, 5],
    [2, 1, 4, 5],
    [2, 3, 1, 1],
    [1, 3, 1, 1],
    [1, 1, 1, 1],
    [2, 3, 4, 1],
];

/// One reduction problem on random data with its f64 reference, built before the launch.
struct ReduceCase<A: DataType, C: DataType> {
    what: String,
    a: Tensor<A>,
    c: Tensor<C>,
    a_dev: CudaSlice<A>,
    c_dev: CudaSlice<C>,
    c_before: Vec<C>,
    alpha: A::Scalar,
    beta: A::Scalar,
    want: Vec<f64>,
    scale: Vec<f64>,
    /// Per output: the extremum, the position of the selected element if unique, the slice.
    picks: Vec<(f64, Option<usize>, Vec<f64>)>,
}

impl<A: DataType, C: DataType<Scalar = A::Scalar>> ReduceCase<A, C> {
    /// A case with alpha = 1.25.
    #[allow(clippy::too_many_arguments)]
    fn new(
        stream: &Arc<CudaStream>,
        rng: &mut Rng,
        op: ReduceOp,
        a_dims: &[i64],
        c_dims: &[i64],
        fmts: (Fmt, Fmt),
        beta: f64,
        tag: &str,
    ) -> Self {
        Self::scaled(stream, rng, op, a_dims, c_dims, fmts, 1.25, beta, tag)
    }

    #[allow(clippy::too_many_arguments)]
    fn scaled(
        stream: &Arc<CudaStream>,
        rng: &mut Rng,
        op: ReduceOp,
        a_dims: &[i64],
        c_dims: &[i64],
        fmts: (Fmt, Fmt),
        alpha: f64,
        beta: f64,
        tag: &str,
    ) -> Self {
        let what = format!(
            "{:?}->{:?} {op:?} a {a_dims:?} c {c_dims:?} {fmts:?} alpha {alpha} beta {beta} {tag}",
            A::DTYPE,
            C::DTYPE
        );
        let a = Tensor::<A>::new(fmts.0, a_dims);
        let c = Tensor::<C>::new(fmts.1, c_dims);
        let (out, pos) = reduce_map(a_dims, c_dims);
        let a_vals: Vec<A> = reduce_inputs(rng, op, &out);
        let (alpha_s, alpha) = scalar::<A>(alpha);
        let (beta_s, beta) = scalar::<A>(beta);
        let c_old: Vec<C> = if beta == 0.0 {
            vec![poison::<C>(); c.count()]
        } else {
            rng.values(c.count())
        };
        let (a_dev, _) = a.upload(stream, &a_vals);
        let (c_dev, c_before) = c.upload(stream, &c_old);

        // Each output's slice, in position order.
        let mut slices: Vec<Vec<(usize, f64)>> = vec![Vec::new(); c.count()];
        for (i, (&o, &p)) in out.iter().zip(&pos).enumerate() {
            slices[o].push((p, a_vals[i].to_f64()));
        }
        let (mut want, mut scale, mut picks) = (Vec::new(), Vec::new(), Vec::new());
        for (o, s) in slices.iter_mut().enumerate() {
            s.sort_by_key(|&(p, _)| p);
            let vals: Vec<f64> = s.iter().map(|&(_, v)| v).collect();
            let (r, sc, pick) = reduce_ref(op, &vals);
            let old = if beta == 0.0 { 0.0 } else { c_old[o].to_f64() };
            want.push(alpha * r + beta * old);
            scale.push(alpha.abs() * sc + (beta * old).abs());
            picks.push((r, pick, vals));
        }
        ReduceCase {
            what,
            a,
            c,
            a_dev,
            c_dev,
            c_before,
            alpha: alpha_s,
            beta: beta_s,
            want,
            scale,
            picks,
        }
    }

    /// Checks the output (and the padding around it) after the launch.
    fn check(&self, stream: &Arc<CudaStream>) {
        let got = download(stream, &self.c_dev);
        // The reference starts from the stored inputs, so only the result's rounding to C and
        // the accumulation in the compute type (f64 for f64, else f32) remain.
        let compute = if A::DTYPE == cudnn_safe::DType::F64 {
            tol::<f64>()
        } else {
            tol::<f32>()
        };
        let got_c = self.c.pick(&got);
        assert_scaled(
            &self.what,
            &got_c,
            &self.want,
            &self.scale,
            tol::<C>(),
            compute,
        );
        assert_padding_kept(&self.what, &got, &self.c_before, &self.c.offs);
    }

    /// Checks reported indices: each in range and selecting an element equal to the extremum
    /// (|x| for AMax); the reference position itself where the extremum is unique.
    fn check_indices(&self, stream: &Arc<CudaStream>, op: ReduceOp, idx_dev: &CudaSlice<u32>) {
        stream.synchronize().unwrap();
        let idx = stream.clone_dtoh(idx_dev).unwrap();
        let what = &self.what;
        for (o, (r, unique, vals)) in self.picks.iter().enumerate() {
            let i = idx[o] as usize;
            assert!(
                i < vals.len(),
                "{what}: output {o}: index {i} of {}",
                vals.len()
            );
            let v = if op == ReduceOp::AMax {
                vals[i].abs()
            } else {
                vals[i]
            };
            assert_eq!(v, *r, "{what}: output {o}: index {i} selects {v}, not {r}");
            if let Some(u) = unique {
                assert_eq!(i, *u, "{what}: output {o}: index");
            }
        }
    }
}

/// Every op × reduction axes × layouts for one dtype; `beta` alternates between 0 and 0.5.
fn reduce_cases<T: DataType>(seed: u64) {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut ws = Workspace::new(stream.clone());
    let mut rng = Rng::new(seed);
    let fmts = [
        (Fmt::Nchw, Fmt::Nchw),
        (Fmt::Nhwc, Fmt::Nhwc),
        (Fmt::Padded, Fmt::Nchw),
        (Fmt::Nchw, Fmt::Padded),
    ];
    let mut k = 0;
    for op in ReduceOp::ALL {
        for c_dims in REDUCE_C_SHAPES {
            for f in fmts {
                k += 1;
                let beta = if k % 2 == 0 { 0.5 } else { 0.0 };
                let mut case = ReduceCase::<T, T>::new(
                    &stream,
                    &mut rng,
                    op,
                    &[2, 3, 4, 5],
                    &c_dims,
                    f,
                    beta,
                    "",
                );
                cudnn
                    .reduce_tensor(
                        op,
                        case.alpha,
                        &case.a.desc,
                        &case.a_dev,
                        case.beta,
                        &case.c.desc,
                        &mut case.c_dev,
                        &mut ws,
                    )
                    .unwrap_or_else(|e| panic!("{}: {e}", case.what));
                case.check(&stream);
            }
        }
    }
}

#[test]
fn reduce_f32() {
    reduce_cases::<f32>(201);
}

#[test]
fn reduce_f64() {
    reduce_cases::<f64>(202);
}

#[test]
fn reduce_f16() {
    reduce_cases::<f16>(203);
}

#[test]
fn reduce_bf16() {
    reduce_cases::<bf16>(204);
}

/// Five dimensions, reduced over various axis sets, both layouts.
#[test]
fn reduce_five_dims() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut ws = Workspace::new(stream.clone());
    let mut rng = Rng::new(205);
    let a = [2, 3, 2, 3, 4];
    for op in [ReduceOp::Add, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Norm2] {
        for c in [[1, 3, 1, 1, 1], [2, 1, 2, 1, 4], [1, 1, 1, 1, 1]] {
            for f in [(Fmt::Nchw, Fmt::Nchw), (Fmt::Nhwc, Fmt::Nhwc)] {
                let mut case =
                    ReduceCase::<f32, f32>::new(&stream, &mut rng, op, &a, &c, f, 0.0, "");
                cudnn
                    .reduce_tensor(
                        op,
                        case.alpha,
                        &case.a.desc,
                        &case.a_dev,
                        case.beta,
                        &case.c.desc,
                        &mut case.c_dev,
                        &mut ws,
                    )
                    .unwrap_or_else(|e| panic!("{}: {e}", case.what));
                case.check(&stream);
            }
        }
    }
}

/// Half-precision input into f32 statistics (computed in f32), as a normalization layer does.
#[test]
fn reduce_half_into_f32() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut ws = Workspace::new(stream.clone());
    let mut rng = Rng::new(206);
    for op in [
        ReduceOp::Add,
        ReduceOp::Avg,
        ReduceOp::Norm2,
        ReduceOp::AMax,
    ] {
        for c in [[1, 3, 1, 1], [2, 1, 1, 1]] {
            for f in [(Fmt::Nchw, Fmt::Nchw), (Fmt::Nhwc, Fmt::Nchw)] {
                let mut h = ReduceCase::<f16, f32>::new(
                    &stream,
                    &mut rng,
                    op,
                    &[2, 3, 4, 5],
                    &c,
                    f,
                    0.5,
                    "",
                );
                cudnn
                    .reduce_tensor_into(
                        op,
                        h.alpha,
                        &h.a.desc,
                        &h.a_dev,
                        h.beta,
                        &h.c.desc,
                        &mut h.c_dev,
                        &mut ws,
                    )
                    .unwrap_or_else(|e| panic!("{}: {e}", h.what));
                h.check(&stream);
                let mut b = ReduceCase::<bf16, f32>::new(
                    &stream,
                    &mut rng,
                    op,
                    &[2, 3, 4, 5],
                    &c,
                    f,
                    0.0,
                    "",
                );
                cudnn
                    .reduce_tensor_into(
                        op,
                        b.alpha,
                        &b.a.desc,
                        &b.a_dev,
                        b.beta,
                        &b.c.desc,
                        &mut b.c_dev,
                        &mut ws,
                    )
                    .unwrap_or_else(|e| panic!("{}: {e}", b.what));
                b.check(&stream);
            }
        }
    }
}

/// Converting bf16 to f32 and back through `cudnnTransformTensor`, across layouts: the first
/// step of the f32 detour bf16 reductions take, checked on its own so a failure there is
/// named. bf16 → f32 is exact; f32 → bf16 rounds once.
#[test]
fn transform_bf16_f32_both_ways() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(207);
    let dims = [2, 3, 4, 5];
    for (fx, fy) in [
        (Fmt::Nchw, Fmt::Nchw),
        (Fmt::Nhwc, Fmt::Nchw),
        (Fmt::Padded, Fmt::Nhwc),
    ] {
        let what = format!("bf16 -> f32 {fx:?} -> {fy:?}");
        let b = Tensor::<bf16>::new(fx, &dims);
        let f = Tensor::<f32>::new(fy, &dims);
        let vals: Vec<bf16> = rng.values(b.count());
        let (b_dev, _) = b.upload(&stream, &vals);
        let (mut f_dev, f_before) = f.upload(&stream, &vec![poison::<f32>(); f.count()]);
        cudnn
            .transform_tensor(1.0, &b.desc, &b_dev, 0.0, &f.desc, &mut f_dev)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let want: Vec<f64> = vals.iter().map(|v| v.to_f64()).collect();
        check_strided(
            &what,
            &download(&stream, &f_dev),
            &f_before,
            &f.offs,
            &want,
            0.0,
        );

        let what = format!("f32 -> bf16 {fy:?} -> {fx:?}, alpha 1.5, beta 0.5");
        let f_vals: Vec<f32> = rng.values(f.count());
        let (f_dev, _) = f.upload(&stream, &f_vals);
        let old: Vec<bf16> = rng.values(b.count());
        let (mut b_dev, b_before) = b.upload(&stream, &old);
        cudnn
            .transform_tensor(1.5, &f.desc, &f_dev, 0.5, &b.desc, &mut b_dev)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let want: Vec<f64> = f_vals
            .iter()
            .zip(&old)
            .map(|(x, o)| 1.5 * f64::from(*x) + 0.5 * o.to_f64())
            .collect();
        check_strided(
            &what,
            &download(&stream, &b_dev),
            &b_before,
            &b.offs,
            &want,
            tol::<bf16>(),
        );
    }
}

/// One mixed-type reduction case run through `reduce_tensor_into` and checked.
#[allow(clippy::too_many_arguments)]
fn reduce_into_case<A: DataType, C: DataType<Scalar = A::Scalar>>(
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    ws: &mut Workspace,
    rng: &mut Rng,
    op: ReduceOp,
    c_dims: &[i64],
    fmts: (Fmt, Fmt),
    beta: f64,
) {
    let mut case = ReduceCase::<A, C>::new(stream, rng, op, &[2, 3, 4, 5], c_dims, fmts, beta, "");
    cudnn
        .reduce_tensor_into(
            op,
            case.alpha,
            &case.a.desc,
            &case.a_dev,
            case.beta,
            &case.c.desc,
            &mut case.c_dev,
            ws,
        )
        .unwrap_or_else(|e| panic!("{}: {e}", case.what));
    case.check(stream);
}

/// Every pair with bf16 on one side or both (cuDNN reduces none of them itself: they take the
/// f32 detour), with and without the beta blend, packed and padded layouts.
#[test]
fn reduce_bf16_pairs() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut ws = Workspace::new(stream.clone());
    let mut rng = Rng::new(208);
    for op in [ReduceOp::Add, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Norm2] {
        for c in [[1, 3, 1, 1], [2, 1, 4, 5]] {
            for (f, beta) in [
                ((Fmt::Nchw, Fmt::Nchw), 0.0),
                ((Fmt::Nhwc, Fmt::Padded), 0.5),
                ((Fmt::Padded, Fmt::Nhwc), 0.5),
            ] {
                let (s, w, r) = (&stream, &cudnn, &mut rng);
                reduce_into_case::<bf16, f32>(s, w, &mut ws, r, op, &c, f, beta);
                reduce_into_case::<bf16, bf16>(s, w, &mut ws, r, op, &c, f, beta);
                reduce_into_case::<f32, bf16>(s, w, &mut ws, r, op, &c, f, beta);
                reduce_into_case::<f16, bf16>(s, w, &mut ws, r, op, &c, f, beta);
                reduce_into_case::<bf16, f16>(s, w, &mut ws, r, op, &c, f, beta);
            }
        }
    }
}

/// bf16 reductions keep their f32 scratch in the caller's workspace: the size reported covers
/// the f32 copies of `a` and of the result, a workspace limited below it is refused before
/// anything is enqueued (`c` untouched), and one limited to exactly it works.
#[test]
fn reduce_bf16_workspace_holds_the_scratch() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(209);
    let op = ReduceOp::Add;
    let a_dims = [2, 3, 4, 5];
    let c_dims = [1, 3, 1, 1];
    let a = Tensor::<bf16>::new(Fmt::Nhwc, &a_dims);
    let c = Tensor::<bf16>::new(Fmt::Nchw, &c_dims);
    let need = cudnn.reduce_workspace_size(op, &a.desc, &c.desc).unwrap();
    assert!(
        need >= 4 * (a.count() + c.count()),
        "{need} bytes for {} + {} f32 scratch elements",
        a.count(),
        c.count()
    );
    let a_f32 = TensorDesc::<f32>::nhwc_nd(&a_dims).unwrap();
    let c_f32 = TensorDesc::<f32>::nchw_nd(&c_dims).unwrap();
    let f32_need = cudnn.reduce_workspace_size(op, &a_f32, &c_f32).unwrap();
    assert!(need >= f32_need, "bf16 {need} < f32 {f32_need}");
    // bf16 into f32 needs the copy of `a` only.
    let into = cudnn
        .reduce_workspace_size_into(op, &a.desc, &c_f32)
        .unwrap();
    assert!(into >= 4 * a.count() && into <= need, "{into} vs {need}");
    // Nothing reduced: a copy, no workspace.
    assert_eq!(
        cudnn.reduce_workspace_size(op, &a.desc, &a.desc).unwrap(),
        0
    );

    let vals: Vec<bf16> = rng.values(a.count());
    let (a_dev, _) = a.upload(&stream, &vals);
    let (mut c_dev, c_host) = sentinel_buffer::<bf16>(&stream, c.span());
    let mut small = Workspace::new(stream.clone()).with_limit(need - 1);
    let r = cudnn.reduce_tensor(
        op, 1.0, &a.desc, &a_dev, 0.0, &c.desc, &mut c_dev, &mut small,
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::WorkspaceLimit { .. })),
        "{r:?}"
    );
    assert_untouched("bf16 c after the workspace limit", &stream, &c_dev, &c_host);
    assert_eq!(small.capacity(), 0, "a refused call grew the workspace");

    let mut exact = Workspace::new(stream.clone()).with_limit(need);
    cudnn
        .reduce_tensor(
            op, 1.0, &a.desc, &a_dev, 0.0, &c.desc, &mut c_dev, &mut exact,
        )
        .unwrap();
    let (out, _) = reduce_map(&a_dims, &c_dims);
    let mut want = vec![0.0f64; c.count()];
    let mut scale = vec![0.0f64; c.count()];
    for (&o, v) in out.iter().zip(&vals) {
        want[o] += v.to_f64();
        scale[o] += v.to_f64().abs();
    }
    let got = download(&stream, &c_dev);
    assert_scaled(
        "bf16 sum with an exact workspace",
        &c.pick(&got),
        &want,
        &scale,
        tol::<bf16>(),
        tol::<f32>(),
    );
}

/// A bf16 "reduction" over single elements: a scaled copy or absolute value (no f32 detour
/// needed); `MulNoZeros` may be refused by cuDNN, with `c` untouched.
#[test]
fn reduce_bf16_nothing_reduced() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut ws = Workspace::new(stream.clone());
    let mut rng = Rng::new(210);
    let dims = [2, 3, 4, 5];
    for op in ReduceOp::ALL {
        let mut case = ReduceCase::<bf16, bf16>::scaled(
            &stream,
            &mut rng,
            op,
            &dims,
            &dims,
            (Fmt::Nhwc, Fmt::Padded),
            -0.75,
            0.5,
            "nothing reduced",
        );
        let r = cudnn.reduce_tensor(
            op,
            case.alpha,
            &case.a.desc,
            &case.a_dev,
            case.beta,
            &case.c.desc,
            &mut case.c_dev,
            &mut ws,
        );
        match r {
            Ok(()) => case.check(&stream),
            Err(e) if op == ReduceOp::MulNoZeros && cudnn_refused(&e) => {
                assert_untouched(&case.what, &stream, &case.c_dev, &case.c_before)
            }
            Err(e) => panic!("{}: {e}", case.what),
        }
    }
}

/// Min, max and absolute max with indices: values and every index checked, `a` in `a_fmt`,
/// `c` packed channels-first (so the indices buffer is in `c`'s logical order).
fn reduce_indices_cases<T: DataType>(seed: u64, a_fmt: Fmt) {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut ws = Workspace::new(stream.clone());
    let mut rng = Rng::new(seed);
    for op in [ReduceOp::Min, ReduceOp::Max, ReduceOp::AMax] {
        for c_dims in REDUCE_C_SHAPES {
            let mut case = ReduceCase::<T, T>::new(
                &stream,
                &mut rng,
                op,
                &[2, 3, 4, 5],
                &c_dims,
                (a_fmt, Fmt::Nchw),
                0.0,
                "with indices",
            );
            let n = cudnn
                .reduce_indices_len(op, &case.a.desc, &case.c.desc)
                .unwrap_or_else(|e| panic!("{}: {e}", case.what));
            assert!(n >= case.c.count(), "{}: {n} indices", case.what);
            let mut idx = stream.clone_htod(&vec![u32::MAX; n]).unwrap();
            cudnn
                .reduce_tensor_with_indices(
                    op,
                    case.alpha,
                    &case.a.desc,
                    &case.a_dev,
                    case.beta,
                    &case.c.desc,
                    &mut case.c_dev,
                    &mut idx,
                    &mut ws,
                )
                .unwrap_or_else(|e| panic!("{}: {e}", case.what));
            case.check(&stream);
            case.check_indices(&stream, op, &idx);
        }
    }
}

#[test]
fn reduce_indices_f32() {
    reduce_indices_cases::<f32>(211, Fmt::Nchw);
}

#[test]
fn reduce_indices_f64() {
    reduce_indices_cases::<f64>(212, Fmt::Nchw);
}

/// cuDNN computes no indices for half types: rejected before anything is enqueued.
#[test]
fn reduce_indices_reject_half_types() {
    fn reject<T: DataType>(stream: &Arc<CudaStream>, cudnn: &Cudnn, ws: &mut Workspace) {
        let a_d = TensorDesc::<T>::nchw(2, 3, 4, 5).unwrap();
        let c_d = TensorDesc::<T>::nchw(2, 3, 1, 1).unwrap();
        let mut rng = Rng::new(213);
        let a = stream.clone_htod(&rng.values::<T>(a_d.span())).unwrap();
        let (mut c, c_host) = sentinel_buffer::<T>(stream, c_d.span());
        let mut idx = stream.clone_htod(&vec![0xDEAD_BEEFu32; 6]).unwrap();
        let (one, zero) = (scalar::<T>(1.0).0, scalar::<T>(0.0).0);
        let r = cudnn.reduce_tensor_with_indices(
            ReduceOp::Max,
            one,
            &a_d,
            &a,
            zero,
            &c_d,
            &mut c,
            &mut idx,
            ws,
        );
        assert!(
            matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
            "{r:?}"
        );
        let r = cudnn.reduce_indices_len(ReduceOp::Max, &a_d, &c_d);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
            "{r:?}"
        );
        assert_untouched("c", stream, &c, &c_host);
        stream.synchronize().unwrap();
        assert!(stream
            .clone_dtoh(&idx)
            .unwrap()
            .iter()
            .all(|&v| v == 0xDEAD_BEEF));
    }
    let Some((stream, cudnn)) = gpu() else { return };
    let mut ws = Workspace::new(stream.clone());
    reject::<f16>(&stream, &cudnn, &mut ws);
    reject::<bf16>(&stream, &cudnn, &mut ws);
}

/// Indices count positions in logical (row-major) order over the reduced dimensions whatever
/// `a`'s memory order: channels-last and padded inputs.
#[test]
fn reduce_indices_follow_logical_order() {
    reduce_indices_cases::<f32>(215, Fmt::Nhwc);
    reduce_indices_cases::<f32>(216, Fmt::Padded);
}

/// Rejected reductions return a typed error and leave `c` (and `indices`) untouched.
#[test]
fn reduce_rejections_leave_output_untouched() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut ws = Workspace::new(stream.clone());
    let mut rng = Rng::new(221);
    let a_d = TensorDesc::<f32>::nchw(2, 3, 4, 5).unwrap();
    let c_d = TensorDesc::<f32>::nchw(1, 3, 1, 1).unwrap();
    let a = stream.clone_htod(&rng.values::<f32>(a_d.span())).unwrap();
    let (mut c, c_host) = sentinel_buffer::<f32>(&stream, c_d.span());
    let add = ReduceOp::Add;

    // c with a dimension neither a's nor 1, or of another rank.
    let bad = TensorDesc::<f32>::nchw(1, 2, 1, 1).unwrap();
    let r = cudnn.reduce_tensor(add, 1.0, &a_d, &a, 0.0, &bad, &mut c, &mut ws);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    let r3 = TensorDesc::<f32>::nchw_nd(&[1, 3, 1]).unwrap();
    let r = cudnn.reduce_tensor(add, 1.0, &a_d, &a, 0.0, &r3, &mut c, &mut ws);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    assert!(matches!(
        &cudnn.reduce_workspace_size(add, &a_d, &bad),
        Err(cudnn_safe::Error::ShapeMismatch { .. })
    ));

    // Short input, short output.
    let short = stream
        .clone_htod(&rng.values::<f32>(a_d.span() - 1))
        .unwrap();
    let r = cudnn.reduce_tensor(add, 1.0, &a_d, &short, 0.0, &c_d, &mut c, &mut ws);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    let (mut c_short, c_short_host) = sentinel_buffer::<f32>(&stream, 2);
    let r = cudnn.reduce_tensor(add, 1.0, &a_d, &a, 0.0, &c_d, &mut c_short, &mut ws);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    assert_untouched("short c", &stream, &c_short, &c_short_host);

    // A self-overlapping output.
    let a_over = TensorDesc::<f32>::strided(&[1, 3, 4, 5], &[60, 20, 5, 1]).unwrap();
    let c_over = TensorDesc::<f32>::strided(&[1, 3, 1, 5], &[15, 1, 5, 1]).unwrap();
    assert!(!c_over.layout().is_non_overlapping());
    let r = cudnn.reduce_tensor(add, 1.0, &a_over, &a, 0.0, &c_over, &mut c, &mut ws);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::OverlappingOutput { .. })),
        "{r:?}"
    );

    // Indices for a reduction that has none.
    let (mut idx, idx_host) = {
        let host = vec![0xDEAD_BEEFu32; 16];
        (stream.clone_htod(&host).unwrap(), host)
    };
    let r =
        cudnn.reduce_tensor_with_indices(add, 1.0, &a_d, &a, 0.0, &c_d, &mut c, &mut idx, &mut ws);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    assert!(matches!(
        &cudnn.reduce_indices_len(add, &a_d, &c_d),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
    // A short indices buffer: c = [2, 3, 1, 1] needs 6 indices.
    let c6_d = TensorDesc::<f32>::nchw(2, 3, 1, 1).unwrap();
    let (mut c6, c6_host) = sentinel_buffer::<f32>(&stream, 6);
    let need = cudnn
        .reduce_indices_len(ReduceOp::Max, &a_d, &c6_d)
        .unwrap();
    assert!(need >= 6, "{need}");
    let mut idx_short = stream.clone_htod(&vec![0xDEAD_BEEFu32; need - 1]).unwrap();
    let r = cudnn.reduce_tensor_with_indices(
        ReduceOp::Max,
        1.0,
        &a_d,
        &a,
        0.0,
        &c6_d,
        &mut c6,
        &mut idx_short,
        &mut ws,
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    assert_untouched("c after short indices", &stream, &c6, &c6_host);
    stream.synchronize().unwrap();
    assert!(stream
        .clone_dtoh(&idx_short)
        .unwrap()
        .iter()
        .all(|&v| v == 0xDEAD_BEEF));
    assert_eq!(stream.clone_dtoh(&idx).unwrap(), idx_host);

    // Unsupported element types.
    let ci = TensorDesc::<i8>::nchw(1, 3, 1, 1).unwrap();
    let (mut c_i8, c_i8_host) = sentinel_buffer::<i8>(&stream, 3);
    let r = cudnn.reduce_tensor_into(add, 1.0, &a_d, &a, 0.0, &ci, &mut c_i8, &mut ws);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
        "{r:?}"
    );
    assert_untouched("i8 c", &stream, &c_i8, &c_i8_host);

    // A workspace limit below what the reduction asks for.
    let big_d = TensorDesc::<f32>::nchw(64, 64, 32, 32).unwrap();
    let one_d = TensorDesc::<f32>::nchw(1, 1, 1, 1).unwrap();
    let big = stream.alloc_zeros::<f32>(big_d.span()).unwrap();
    let need = cudnn.reduce_workspace_size(add, &big_d, &one_d).unwrap();
    let mut tiny_ws = Workspace::new(stream.clone()).with_limit(need.saturating_sub(1));
    let (mut one, one_host) = sentinel_buffer::<f32>(&stream, 1);
    let r = cudnn.reduce_tensor(add, 1.0, &big_d, &big, 0.0, &one_d, &mut one, &mut tiny_ws);
    if need > 0 {
        assert!(
            matches!(&r, Err(cudnn_safe::Error::WorkspaceLimit { .. })),
            "{r:?}"
        );
        assert_untouched("c after the workspace limit", &stream, &one, &one_host);
    } else {
        // Nothing to limit: the call runs (a sum of zeros).
        r.unwrap();
        assert_eq!(download(&stream, &one), vec![0.0f32]);
    }

    assert_untouched("c after every rejection", &stream, &c, &c_host);
}

/// A "reduction" that reduces nothing (which cuDNN refuses) is computed without it: a scaled
/// copy or absolute value, index 0; `MulNoZeros` is left to cuDNN, which either computes it or
/// refuses it with `c` untouched.
#[test]
fn reduce_nothing_reduced() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut ws = Workspace::new(stream.clone());
    let mut rng = Rng::new(222);
    let dims = [2, 3, 4, 5];
    for op in ReduceOp::ALL {
        for (f, alpha, beta) in [
            ((Fmt::Nchw, Fmt::Nchw), 1.25, 0.0),
            ((Fmt::Nhwc, Fmt::Padded), -0.75, 0.5),
        ] {
            let mut case = ReduceCase::<f32, f32>::scaled(
                &stream,
                &mut rng,
                op,
                &dims,
                &dims,
                f,
                alpha,
                beta,
                "nothing reduced",
            );
            let r = cudnn.reduce_tensor(
                op,
                case.alpha,
                &case.a.desc,
                &case.a_dev,
                case.beta,
                &case.c.desc,
                &mut case.c_dev,
                &mut ws,
            );
            match r {
                Ok(()) => case.check(&stream),
                Err(e) if op == ReduceOp::MulNoZeros && cudnn_refused(&e) => {
                    assert_untouched(&case.what, &stream, &case.c_dev, &case.c_before)
                }
                Err(e) => panic!("{}: {e}", case.what),
            }
        }
    }
    // With indices: all 0.
    for op in [ReduceOp::Min, ReduceOp::Max, ReduceOp::AMax] {
        for t in [Fmt::Nchw, Fmt::Nhwc] {
            let mut case = ReduceCase::<f64, f64>::scaled(
                &stream,
                &mut rng,
                op,
                &dims,
                &dims,
                (t, Fmt::Nchw),
                -1.5,
                0.0,
                "nothing reduced, indices",
            );
            let mut idx = stream.clone_htod(&vec![u32::MAX; case.c.count()]).unwrap();
            cudnn
                .reduce_tensor_with_indices(
                    op,
                    case.alpha,
                    &case.a.desc,
                    &case.a_dev,
                    case.beta,
                    &case.c.desc,
                    &mut case.c_dev,
                    &mut idx,
                    &mut ws,
                )
                .unwrap_or_else(|e| panic!("{}: {e}", case.what));
            case.check(&stream);
            case.check_indices(&stream, op, &idx);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// dropout
// ---------------------------------------------------------------------------------------------

/// Random values of magnitude in `[0.5, 2)` with random signs: never zero, so a kept element
/// can never be mistaken for a dropped one.
fn nonzero<T: DataType>(rng: &mut Rng, n: usize) -> Vec<T> {
    (0..n)
        .map(|_| {
            let m = rng.uniform(0.5, 2.0);
            T::from_f64(if rng.unit() < 0.5 { -m } else { m })
        })
        .collect()
}

/// The tolerance of dropout results: the dtype's, but at least 1e-6 because cuDNN derives the
/// scale `1 / (1 − p)` from the f32 probability and may compute it in f32 (a relative error of
/// about 1e-7 that the f64 tolerance would reject).
fn dropout_tol<T: DataType>() -> f64 {
    tol::<T>().max(1e-6)
}

/// Which logical elements a forward kept, checking every element on the way: dropped ones are
/// exactly 0, kept ones `x / (1 − p)`.
fn kept_mask<T: DataType>(what: &str, x: &[T], y: &[T], p: f32) -> Vec<bool> {
    let scale = 1.0 / (1.0 - f64::from(p));
    x.iter()
        .zip(y)
        .enumerate()
        .map(|(i, (&x, &y))| {
            let (x, y) = (x.to_f64(), y.to_f64());
            if y == 0.0 {
                false
            } else {
                let w = stored::<T>(x * scale);
                assert!(
                    (y - w).abs() <= dropout_tol::<T>() * (1.0 + w.abs()),
                    "{what}: element {i}: got {y}, want 0 or {w}"
                );
                true
            }
        })
        .collect()
}

/// The kept fraction of `n` Bernoulli(1 − p) draws lies within 6 standard deviations of 1 − p
/// (a false alarm about once in 10⁹ runs).
fn assert_kept_fraction(what: &str, mask: &[bool], p: f32) {
    let n = mask.len() as f64;
    let q = 1.0 - f64::from(p);
    let frac = mask.iter().filter(|&&k| k).count() as f64 / n;
    let bound = 6.0 * (q * (1.0 - q) / n).sqrt();
    assert!(
        (frac - q).abs() <= bound,
        "{what}: kept {frac}, expected {q} ± {bound}"
    );
}

const DROPOUT_DIMS: [i64; 4] = [8, 16, 16, 16];

/// Forward then backward: values, kept fraction, the same mask in both directions, with the
/// four tensors in different layouts (the mask pairs elements by logical index).
fn dropout_cases<T: DataType>(seed: u64) {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(seed);
    for (p, fx, fy, fdy, fdx) in [
        (0.3f32, Fmt::Nchw, Fmt::Nchw, Fmt::Nchw, Fmt::Nchw),
        (0.5, Fmt::Nhwc, Fmt::Nhwc, Fmt::Nhwc, Fmt::Nhwc),
        (0.1, Fmt::Nchw, Fmt::Nhwc, Fmt::Padded, Fmt::Nhwc),
    ] {
        let what = format!(
            "{:?} dropout p {p} x {fx:?} y {fy:?} dy {fdy:?} dx {fdx:?}",
            T::DTYPE
        );
        let mut dropout = Dropout::new(&cudnn, p, seed).unwrap();
        assert_eq!((dropout.probability(), dropout.seed()), (p, seed));
        let x = Tensor::<T>::new(fx, &DROPOUT_DIMS);
        let y = Tensor::<T>::new(fy, &DROPOUT_DIMS);
        let x_vals: Vec<T> = nonzero(&mut rng, x.count());
        let (x_dev, _) = x.upload(&stream, &x_vals);
        let (mut y_dev, y_before) = y.upload(&stream, &vec![poison::<T>(); y.count()]);
        let reserve = cudnn
            .dropout_forward(&mut dropout, &x.desc, &x_dev, &y.desc, &mut y_dev)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(reserve.dims(), &DROPOUT_DIMS);
        assert_eq!(reserve.dtype(), T::DTYPE);
        assert_eq!(reserve.call(), 1);
        assert_eq!(dropout.forwards(), 1);
        assert_eq!(
            reserve.size_in_bytes(),
            Dropout::reserve_size(&x.desc).unwrap().max(1)
        );
        let y_got = download(&stream, &y_dev);
        assert_padding_kept(&what, &y_got, &y_before, &y.offs);
        let mask = kept_mask(&what, &x_vals, &y.pick(&y_got), p);
        assert_kept_fraction(&what, &mask, p);

        let dy = Tensor::<T>::new(fdy, &DROPOUT_DIMS);
        let dx = Tensor::<T>::new(fdx, &DROPOUT_DIMS);
        let dy_vals: Vec<T> = nonzero(&mut rng, dy.count());
        let (dy_dev, _) = dy.upload(&stream, &dy_vals);
        let (mut dx_dev, dx_before) = dx.upload(&stream, &vec![poison::<T>(); dx.count()]);
        cudnn
            .dropout_backward(&dropout, &reserve, &dy.desc, &dy_dev, &dx.desc, &mut dx_dev)
            .unwrap_or_else(|e| panic!("{what} backward: {e}"));
        let scale = 1.0 / (1.0 - f64::from(p));
        let want: Vec<f64> = dy_vals
            .iter()
            .zip(&mask)
            .map(|(&g, &k)| {
                if k {
                    stored::<T>(g.to_f64() * scale)
                } else {
                    0.0
                }
            })
            .collect();
        let dx_got = download(&stream, &dx_dev);
        check_strided(
            &format!("{what} backward"),
            &dx_got,
            &dx_before,
            &dx.offs,
            &want,
            dropout_tol::<T>(),
        );
    }
}

#[test]
fn dropout_f32() {
    dropout_cases::<f32>(301);
}

#[test]
fn dropout_f64() {
    dropout_cases::<f64>(302);
}

#[test]
fn dropout_f16() {
    dropout_cases::<f16>(303);
}

/// cuDNN's dropout refuses bfloat16 (`CUDNN_STATUS_NOT_SUPPORTED` on the H200 with 9.14):
/// forward and backward reject bf16 with a typed error before anything is enqueued, the
/// outputs untouched and the generator not advanced.
#[test]
fn dropout_bf16_is_rejected() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(304);
    let mut d = Dropout::new(&cudnn, 0.3, 304).unwrap();
    for (fx, fy) in [(Fmt::Nchw, Fmt::Nchw), (Fmt::Nhwc, Fmt::Padded)] {
        let x = Tensor::<bf16>::new(fx, &DROPOUT_DIMS);
        let y = Tensor::<bf16>::new(fy, &DROPOUT_DIMS);
        let (x_dev, _) = x.upload(&stream, &nonzero::<bf16>(&mut rng, x.count()));
        let (mut y_dev, y_host) = sentinel_buffer::<bf16>(&stream, y.span());
        let r = cudnn.dropout_forward(&mut d, &x.desc, &x_dev, &y.desc, &mut y_dev);
        match &r {
            Err(Error::UnsupportedDataType { op, detail }) => {
                assert_eq!(*op, "dropout forward");
                assert!(detail.contains("bf16"), "{detail}");
            }
            other => panic!("bf16 dropout forward {fx:?} -> {fy:?}: {other:?}"),
        }
        assert_untouched("bf16 dropout y", &stream, &y_dev, &y_host);
    }
    assert_eq!(d.forwards(), 0, "a rejected forward advanced the generator");

    // Backward with a valid (f32) reserve of the same shape: the dtype is refused first.
    let xf = Tensor::<f32>::new(Fmt::Nchw, &DROPOUT_DIMS);
    let (xf_dev, _) = xf.upload(&stream, &nonzero::<f32>(&mut rng, xf.count()));
    let mut yf = poisoned_buffer::<f32>(&stream, xf.span());
    let reserve = cudnn
        .dropout_forward(&mut d, &xf.desc, &xf_dev, &xf.desc, &mut yf)
        .unwrap();
    let g = Tensor::<bf16>::new(Fmt::Nchw, &DROPOUT_DIMS);
    let (dy_dev, _) = g.upload(&stream, &nonzero::<bf16>(&mut rng, g.count()));
    let (mut dx_dev, dx_host) = sentinel_buffer::<bf16>(&stream, g.span());
    let r = cudnn.dropout_backward(&d, &reserve, &g.desc, &dy_dev, &g.desc, &mut dx_dev);
    match &r {
        Err(Error::UnsupportedDataType { op, .. }) => assert_eq!(*op, "dropout backward"),
        other => panic!("bf16 dropout backward: {other:?}"),
    }
    assert_untouched("bf16 dropout dx", &stream, &dx_dev, &dx_host);
}

/// The zero-pattern of one forward on `x` (packed NCHW f32).
fn draw_mask(
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    dropout: &mut Dropout,
    x: &Tensor<f32>,
    x_vals: &[f32],
    x_dev: &CudaSlice<f32>,
) -> Vec<bool> {
    let mut y_dev = poisoned_buffer::<f32>(stream, x.span());
    let reserve = cudnn
        .dropout_forward(dropout, &x.desc, x_dev, &x.desc, &mut y_dev)
        .unwrap();
    assert_eq!(reserve.call(), dropout.forwards());
    let y = download(stream, &y_dev);
    kept_mask("draw", x_vals, &x.pick(&y), dropout.probability())
}

/// Same seed, same masks; successive forwards draw fresh masks; re-seeding restarts the
/// sequence; another seed gives another mask.
#[test]
fn dropout_seed_reproducibility() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(311);
    let x = Tensor::<f32>::new(Fmt::Nchw, &DROPOUT_DIMS);
    let x_vals: Vec<f32> = nonzero(&mut rng, x.count());
    let (x_dev, _) = x.upload(&stream, &x_vals);

    let mut d1 = Dropout::new(&cudnn, 0.5, 1234).unwrap();
    let mut d2 = Dropout::new(&cudnn, 0.5, 1234).unwrap();
    let mut d3 = Dropout::new(&cudnn, 0.5, 4321).unwrap();
    let first = draw_mask(&stream, &cudnn, &mut d1, &x, &x_vals, &x_dev);
    assert_kept_fraction("first", &first, 0.5);
    let same_seed = draw_mask(&stream, &cudnn, &mut d2, &x, &x_vals, &x_dev);
    assert_eq!(
        first, same_seed,
        "two Dropouts with one seed drew different first masks"
    );
    let second = draw_mask(&stream, &cudnn, &mut d1, &x, &x_vals, &x_dev);
    assert_ne!(first, second, "the second forward repeated the first mask");
    assert_eq!(d1.forwards(), 2);
    let same_seed_second = draw_mask(&stream, &cudnn, &mut d2, &x, &x_vals, &x_dev);
    assert_eq!(second, same_seed_second, "the sequences of masks differ");
    let other_seed = draw_mask(&stream, &cudnn, &mut d3, &x, &x_vals, &x_dev);
    assert_ne!(first, other_seed, "another seed drew the same mask");

    d1.reseed(&cudnn, 1234).unwrap();
    assert_eq!((d1.seed(), d1.forwards()), (1234, 0));
    let again = draw_mask(&stream, &cudnn, &mut d1, &x, &x_vals, &x_dev);
    assert_eq!(first, again, "re-seeding did not restart the sequence");
}

/// p = 0 keeps every element unscaled.
#[test]
fn dropout_probability_zero_is_identity() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(312);
    let x = Tensor::<f32>::new(Fmt::Nhwc, &[2, 3, 4, 5]);
    let x_vals: Vec<f32> = nonzero(&mut rng, x.count());
    let (x_dev, _) = x.upload(&stream, &x_vals);
    let mut d = Dropout::new(&cudnn, 0.0, 9).unwrap();
    let mask = draw_mask(&stream, &cudnn, &mut d, &x, &x_vals, &x_dev);
    assert!(mask.iter().all(|&k| k));
}

/// Rejected dropout calls return typed errors and leave outputs untouched.
#[test]
fn dropout_rejections_leave_output_untouched() {
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(321);
    for p in [1.0f32, 1.5, -0.1, f32::NAN, f32::INFINITY] {
        let r = Dropout::new(&cudnn, p, 1);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "p = {p}: {r:?}"
        );
    }
    let mut d = Dropout::new(&cudnn, 0.25, 5).unwrap();
    let x_d = TensorDesc::<f32>::nchw(2, 3, 4, 5).unwrap();
    let n = x_d.span();
    let x = stream.clone_htod(&nonzero::<f32>(&mut rng, n)).unwrap();
    let (mut y, y_host) = sentinel_buffer::<f32>(&stream, n);

    // Forward: another shape, short buffers, an integer type.
    let other_d = TensorDesc::<f32>::nchw(2, 3, 5, 4).unwrap();
    let r = cudnn.dropout_forward(&mut d, &x_d, &x, &other_d, &mut y);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    let short = stream.clone_htod(&nonzero::<f32>(&mut rng, n - 1)).unwrap();
    let r = cudnn.dropout_forward(&mut d, &x_d, &short, &x_d, &mut y);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    let (mut y_short, y_short_host) = sentinel_buffer::<f32>(&stream, n - 1);
    let r = cudnn.dropout_forward(&mut d, &x_d, &x, &x_d, &mut y_short);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    assert_untouched("short y", &stream, &y_short, &y_short_host);
    let xi_d = TensorDesc::<i32>::nchw(2, 3, 4, 5).unwrap();
    let xi = stream.clone_htod(&vec![7i32; n]).unwrap();
    let (mut yi, yi_host) = sentinel_buffer::<i32>(&stream, n);
    let r = cudnn.dropout_forward(&mut d, &xi_d, &xi, &xi_d, &mut yi);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
        "{r:?}"
    );
    assert_untouched("i32 y", &stream, &yi, &yi_host);
    assert_untouched("y after rejected forwards", &stream, &y, &y_host);
    assert_eq!(
        d.forwards(),
        0,
        "a rejected forward advanced the generator count"
    );

    // A valid forward to have a reserve.
    let reserve = cudnn
        .dropout_forward(&mut d, &x_d, &x, &x_d, &mut y)
        .unwrap();
    let dy = stream.clone_htod(&nonzero::<f32>(&mut rng, n)).unwrap();
    let (mut dx, dx_host) = sentinel_buffer::<f32>(&stream, n);

    // Backward: a reserve of another shape, of another dropout, of another dtype; dx of another
    // shape; a short dx.
    let r = cudnn.dropout_backward(&d, &reserve, &other_d, &dy, &other_d, &mut dx);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    let other = Dropout::new(&cudnn, 0.25, 5).unwrap();
    let r = cudnn.dropout_backward(&other, &reserve, &x_d, &dy, &x_d, &mut dx);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    let h_d = TensorDesc::<f16>::nchw(2, 3, 4, 5).unwrap();
    let dyh = stream.clone_htod(&nonzero::<f16>(&mut rng, n)).unwrap();
    let (mut dxh, dxh_host) = sentinel_buffer::<f16>(&stream, n);
    let r = cudnn.dropout_backward(&d, &reserve, &h_d, &dyh, &h_d, &mut dxh);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
        "{r:?}"
    );
    assert_untouched("f16 dx", &stream, &dxh, &dxh_host);
    let r = cudnn.dropout_backward(&d, &reserve, &x_d, &dy, &other_d, &mut dx);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    let (mut dx_short, dx_short_host) = sentinel_buffer::<f32>(&stream, n - 1);
    let r = cudnn.dropout_backward(&d, &reserve, &x_d, &dy, &x_d, &mut dx_short);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
    assert_untouched("short dx", &stream, &dx_short, &dx_short_host);
    // A reserve drawn for another shape with the same element count is still another shape.
    let mut y2 = poisoned_buffer::<f32>(&stream, n);
    let reserve2 = cudnn
        .dropout_forward(&mut d, &other_d, &x, &other_d, &mut y2)
        .unwrap();
    let r = cudnn.dropout_backward(&d, &reserve2, &x_d, &dy, &x_d, &mut dx);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    assert_untouched("dx after rejected backwards", &stream, &dx, &dx_host);
}

// ---------------------------------------------------------------------------------------------
// Host-only checks (real cuDNN library, no GPU)
// ---------------------------------------------------------------------------------------------

/// cuDNN sizes the dropout mask from the element count alone (one bit per element, rounded
/// up): layouts and dtypes do not change it. This is what lets the backward pair elements by
/// logical index whatever the layouts.
#[test]
fn dropout_reserve_is_sized_by_element_count() {
    let Some(_) = lib() else { return };
    fn size<T: DataType>(fmt: Fmt, dims: &[i64]) -> usize {
        Dropout::reserve_size(&TensorDesc::<T>::new(layout(fmt, dims)).unwrap()).unwrap()
    }
    for dims in [
        vec![2i64, 3, 4, 5],
        vec![8, 16, 16, 16],
        vec![1, 1, 1, 1],
        vec![3, 5, 7, 11],
        vec![2, 3, 2, 3, 4],
    ] {
        let count: i64 = dims.iter().product();
        let s = size::<f32>(Fmt::Nchw, &dims);
        assert!(
            s as i64 * 8 >= count,
            "{dims:?}: {s} bytes for {count} elements"
        );
        for fmt in [Fmt::Nchw, Fmt::Nhwc, Fmt::Padded] {
            assert_eq!(size::<f32>(fmt, &dims), s, "{dims:?} {fmt:?}");
            assert_eq!(size::<f64>(fmt, &dims), s, "{dims:?} {fmt:?}");
            assert_eq!(size::<f16>(fmt, &dims), s, "{dims:?} {fmt:?}");
            assert_eq!(size::<bf16>(fmt, &dims), s, "{dims:?} {fmt:?}");
        }
    }
    // Larger tensors never need less.
    assert!(size::<f32>(Fmt::Nchw, &[4, 16, 16, 16]) <= size::<f32>(Fmt::Nchw, &[8, 16, 16, 16]));
}

/// The handle-less parts of the API work without a GPU: descriptors for every layout the GPU
/// tests use are accepted by cuDNN with the span computed here.
#[test]
fn test_layouts_are_accepted_by_cudnn() {
    let Some(_) = lib() else { return };
    for dims in [
        vec![2i64, 3, 4, 5],
        vec![2, 3, 2, 3, 4],
        vec![8, 16, 16, 16],
    ] {
        for fmt in [Fmt::Nchw, Fmt::Nhwc, Fmt::Padded] {
            let t = Tensor::<f32>::new(fmt, &dims);
            assert_eq!(
                t.desc.size_in_bytes().unwrap(),
                t.span() * 4,
                "{dims:?} {fmt:?}"
            );
            assert_eq!(t.count() as i64, dims.iter().product::<i64>());
        }
    }
}

/// The test's own references, on hand-computed cases (no library needed).
#[test]
fn references_are_right() {
    // [2, 3] reduced over the first dimension: outputs by column, positions by row.
    let (out, pos) = reduce_map(&[2, 3], &[1, 3]);
    assert_eq!((out, pos), (vec![0, 1, 2, 0, 1, 2], vec![0, 0, 0, 1, 1, 1]));
    // [2, 3, 2] reduced over the last two: row-major positions within each slice.
    let (out, pos) = reduce_map(&[2, 3, 2], &[2, 1, 1]);
    assert_eq!(out, [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]);
    assert_eq!(pos, [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]);
    // Dimensions of size 1 in both are not reduced.
    let (out, pos) = reduce_map(&[2, 1, 3], &[2, 1, 1]);
    assert_eq!((out, pos), (vec![0, 0, 0, 1, 1, 1], vec![0, 1, 2, 0, 1, 2]));
    assert_eq!(linear(&[2, 3, 4], &[1, 2, 3]), 23);

    let v = [1.0, -4.0, 3.0, 0.0];
    assert_eq!(reduce_ref(ReduceOp::Add, &v), (0.0, 8.0, None));
    assert_eq!(reduce_ref(ReduceOp::Avg, &v), (0.0, 2.0, None));
    assert_eq!(reduce_ref(ReduceOp::Norm1, &v).0, 8.0);
    assert_eq!(reduce_ref(ReduceOp::Norm2, &v).0, 26f64.sqrt());
    assert_eq!(reduce_ref(ReduceOp::Mul, &v).0, 0.0);
    assert_eq!(reduce_ref(ReduceOp::MulNoZeros, &v).0, -12.0);
    assert_eq!(reduce_ref(ReduceOp::Min, &v), (-4.0, 4.0, Some(1)));
    assert_eq!(reduce_ref(ReduceOp::Max, &v), (3.0, 3.0, Some(2)));
    assert_eq!(reduce_ref(ReduceOp::AMax, &v), (4.0, 4.0, Some(1)));
    // Ties report no unique position.
    assert_eq!(reduce_ref(ReduceOp::AMax, &[2.0, -2.0]).2, None);

    assert_eq!(op_ref(OpTensorOp::Not, 0.25, 9.0), 0.75);
    assert_eq!(op_ref(OpTensorOp::Sqrt, 4.0, 9.0), 2.0);
    assert_eq!(op_ref(OpTensorOp::Min, 4.0, -9.0), -9.0);

    // The padded layout: rows padded by 2, planes by one row.
    let l = layout(Fmt::Padded, &[1, 2, 2, 3]);
    assert_eq!(l.strides(), &[30, 15, 5, 1]);
    assert_eq!(l.offsets(), [0, 1, 2, 5, 6, 7, 15, 16, 17, 20, 21, 22]);

    // MulNoZeros inputs never leave a slice of zeros only.
    let mut rng = Rng::new(7);
    let (out, _) = reduce_map(&[2, 3, 4, 5], &[2, 3, 4, 1]);
    for _ in 0..20 {
        let v: Vec<f32> = reduce_inputs(&mut rng, ReduceOp::MulNoZeros, &out);
        for o in 0..24 {
            assert!(out.iter().zip(&v).any(|(&oo, x)| oo == o && *x != 0.0));
        }
    }
}
