//! GPU integration tests for the cuBLAS layer ([`Blas`]): GEMM (plain, strided-batched,
//! pointer-array batched), GEMV, the row-major layer, math modes, reproducibility, and the
//! checks that refuse bad arguments before anything is enqueued.
//!
//! Every result is compared with a reference computed on the host in `f64` from the values as
//! stored (inputs rounded to the element type first), on random inputs from a seeded PRNG. The
//! error allowed for each output element is `tol · (|alpha|·Σ|op(A)ᵢₗ·op(B)ₗⱼ| + |beta·Cᵢⱼ|)`,
//! with `tol` per element type (f32 1e-5, TF32 5e-3, f64 1e-12, f16 1e-2, bf16 5e-2). Leading
//! dimensions are larger than the matrices, and batch strides larger than the matrix spans:
//! every element no logical index addresses holds a sentinel, which must survive. With
//! `beta = 0` the addressed output elements hold NaN before the call, so unwritten ones show.
//!
//! Without a GPU (no driver, no device, no cuBLAS) every test prints `skipping: <why>` and
//! passes, unless `CUDNN_SAFE_REQUIRE_GPU=1`, when it fails instead.
mod common;

use std::sync::Arc;

use common::{assert_send, assert_untouched, gpu_with, other_context, same, scalar, Rng, SENTINEL};
use cudnn_safe::blas::{Blas, BlasMath, GemmType, Transpose};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::{DType, DataType, Error, MAX_WORKSPACE_BYTES};

/// The device-0 default stream and a cuBLAS handle on it, or `None` (test skipped) without a
/// GPU or without cuBLAS.
fn gpu() -> Option<(Arc<CudaStream>, Blas)> {
    gpu_with(Blas::new)
}

// ---------------------------------------------------------------------------------------------
// Random numbers, layouts and references (independent of the crate under test)
// ---------------------------------------------------------------------------------------------

impl Rng {
    /// Uniform integer in `lo..=hi`.
    fn range_inclusive(&mut self, lo: i64, hi: i64) -> i64 {
        self.range(lo, hi + 1)
    }
    /// A value uniform in `[-2, 2]`, rounded to `T`.
    fn value<T: DataType>(&mut self) -> T {
        T::from_f64(self.uniform(-2.0, 2.0))
    }
    /// A scaling factor: magnitude in `[0.5, 1.5]`, random sign.
    fn factor(&mut self) -> f64 {
        let v = self.uniform(0.5, 1.5);
        if self.next_u64() & 1 == 0 {
            v
        } else {
            -v
        }
    }
}

/// Error allowed relative to `|alpha|·Σ|terms| + |beta·c|` for results stored as `T`.
fn tol<T: GemmType>(math: BlasMath) -> f64 {
    match T::DTYPE {
        DType::F32 if math == BlasMath::Tf32 => 5e-3,
        DType::F32 => 1e-5,
        DType::F64 => 1e-12,
        DType::F16 => 1e-2,
        DType::BF16 => 5e-2,
        other => panic!("no tolerance for {other}"),
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Order {
    Col,
    Row,
}

/// A batch of stored matrices: element (b, i, j) at `b·stride + i + j·ld` (column-major) or
/// `b·stride + i·ld + j` (row-major).
#[derive(Clone, Copy, Debug)]
struct Lay {
    order: Order,
    rows: i64,
    cols: i64,
    ld: i64,
    stride: i64,
    batch: i64,
}

impl Lay {
    /// Leading dimension `pad` more than needed; batch stride `gap` more than the span
    /// (`gap < 0`: stride 0, one matrix shared by the batch).
    fn new(order: Order, rows: i64, cols: i64, pad: i64, gap: i64, batch: i64) -> Lay {
        let inner = match order {
            Order::Col => rows,
            Order::Row => cols,
        };
        let mut l = Lay {
            order,
            rows,
            cols,
            ld: inner.max(1) + pad,
            stride: 0,
            batch,
        };
        l.stride = if gap < 0 { 0 } else { l.span() + gap };
        l
    }
    fn span(&self) -> i64 {
        if self.rows == 0 || self.cols == 0 {
            return 0;
        }
        match self.order {
            Order::Col => self.ld * (self.cols - 1) + self.rows,
            Order::Row => self.ld * (self.rows - 1) + self.cols,
        }
    }
    /// Elements the whole batch addresses.
    fn len(&self) -> usize {
        if self.span() == 0 || self.batch == 0 {
            0
        } else {
            (self.stride * (self.batch - 1) + self.span()) as usize
        }
    }
    fn at(&self, b: i64, i: i64, j: i64) -> usize {
        (b * self.stride
            + match self.order {
                Order::Col => i + j * self.ld,
                Order::Row => i * self.ld + j,
            }) as usize
    }
    /// Offsets of every logical element, batch by batch, row by row.
    fn offsets(&self) -> Vec<usize> {
        let mut v = Vec::new();
        for b in 0..self.batch {
            for i in 0..self.rows {
                for j in 0..self.cols {
                    v.push(self.at(b, i, j));
                }
            }
        }
        v
    }
}

/// `(rows, cols)` stored for an operand whose `op` is `r × c`.
fn stored(t: Transpose, r: i64, c: i64) -> (i64, i64) {
    match t {
        Transpose::No => (r, c),
        Transpose::Yes => (c, r),
    }
}

/// A host image of `len` elements (at least 1, so that no buffer is empty): addressed elements
/// get `fill()`, the others [`SENTINEL`].
fn image<T: DataType>(len: usize, offs: &[usize], mut fill: impl FnMut() -> T) -> Vec<T> {
    let mut v = vec![T::from_f64(SENTINEL); len.max(1)];
    for &o in offs {
        v[o] = fill();
    }
    v
}

/// An input image with random addressed elements.
fn input<T: DataType>(rng: &mut Rng, lay: &Lay) -> Vec<T> {
    image(lay.len(), &lay.offsets(), || rng.value())
}

/// An output image: NaN where `beta = 0` (not read), random values otherwise.
fn output<T: DataType>(rng: &mut Rng, lay: &Lay, beta: f64) -> Vec<T> {
    if beta == 0.0 {
        image(lay.len(), &lay.offsets(), || T::from_f64(f64::NAN))
    } else {
        image(lay.len(), &lay.offsets(), || rng.value())
    }
}

/// What one GEMM problem (batched or not) must produce: per output element (in `c.offsets()`
/// order) the exact value and the error bound's scale `|alpha|·Σ|terms| + |beta·c|`.
#[allow(clippy::too_many_arguments)]
fn reference<T: DataType>(
    ta: Transpose,
    tb: Transpose,
    k: i64,
    alpha: f64,
    (a_lay, a): (&Lay, &[T]),
    (b_lay, b): (&Lay, &[T]),
    beta: f64,
    (c_lay, c): (&Lay, &[T]),
) -> (Vec<f64>, Vec<f64>) {
    let op_a = |bi: i64, i: i64, l: i64| match ta {
        Transpose::No => a[a_lay.at(bi, i, l)].to_f64(),
        Transpose::Yes => a[a_lay.at(bi, l, i)].to_f64(),
    };
    let op_b = |bi: i64, l: i64, j: i64| match tb {
        Transpose::No => b[b_lay.at(bi, l, j)].to_f64(),
        Transpose::Yes => b[b_lay.at(bi, j, l)].to_f64(),
    };
    let (mut want, mut scale) = (Vec::new(), Vec::new());
    for bi in 0..c_lay.batch {
        for i in 0..c_lay.rows {
            for j in 0..c_lay.cols {
                let (mut s, mut s_abs) = (0.0, 0.0);
                for l in 0..k {
                    let t = op_a(bi, i, l) * op_b(bi, l, j);
                    s += t;
                    s_abs += t.abs();
                }
                let old = if beta == 0.0 {
                    0.0
                } else {
                    c[c_lay.at(bi, i, j)].to_f64()
                };
                want.push(alpha * s + beta * old);
                scale.push(alpha.abs() * s_abs + (beta * old).abs());
            }
        }
    }
    (want, scale)
}

/// Checks every addressed element against `want` within `tol · scale`, and every other element
/// against `before`.
fn check<T: DataType>(
    what: &str,
    got: &[T],
    before: &[T],
    offs: &[usize],
    want: &[f64],
    scale: &[f64],
    tol: f64,
) {
    assert_eq!(got.len(), before.len(), "{what}");
    assert_eq!(offs.len(), want.len(), "{what}");
    let mut addressed = vec![false; got.len()];
    for (i, &o) in offs.iter().enumerate() {
        addressed[o] = true;
        let g = got[o].to_f64();
        let err = (g - want[i]).abs();
        assert!(
            g.is_finite() && err <= tol * scale[i],
            "{what}: element {i} (offset {o}): got {g}, want {} (error {err:e}, allowed {:e})",
            want[i],
            tol * scale[i]
        );
    }
    for (p, (&g, &b)) in got.iter().zip(before).enumerate() {
        if !addressed[p] {
            assert!(
                same(g, b),
                "{what}: unaddressed element {p} changed from {b:?} to {g:?}"
            );
        }
    }
}

/// Copies `dev` back once all work of the context (any stream the handle is on) is done.
fn download<T: DataType>(stream: &Arc<CudaStream>, dev: &CudaSlice<T>) -> Vec<T> {
    stream.context().synchronize().unwrap();
    stream.clone_dtoh(dev).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Runners
// ---------------------------------------------------------------------------------------------

/// One GEMM problem. `batch = None`: a plain `gemm` / `matmul_row_major` call; `Some(b)`: the
/// strided-batched call with `b` matrices.
#[derive(Clone, Copy, Debug)]
struct Problem {
    order: Order,
    ta: Transpose,
    tb: Transpose,
    m: i64,
    n: i64,
    k: i64,
    /// Extra leading-dimension padding of a, b, c.
    pads: [i64; 3],
    /// Extra stride beyond the span of a, b, c (negative: stride 0, for inputs only).
    gaps: [i64; 3],
    /// C's batch stride instead of the one `gaps` gives (matrices that interleave).
    c_stride: Option<i64>,
    batch: Option<i64>,
    alpha: f64,
    beta: f64,
}

impl Problem {
    fn random(rng: &mut Rng, order: Order, ta: Transpose, tb: Transpose, max: i64) -> Problem {
        Problem {
            order,
            ta,
            tb,
            m: rng.range_inclusive(1, max),
            n: rng.range_inclusive(1, max),
            k: rng.range_inclusive(1, max),
            pads: [
                rng.range_inclusive(1, 4),
                rng.range_inclusive(1, 4),
                rng.range_inclusive(1, 4),
            ],
            gaps: [0, 0, 0],
            c_stride: None,
            batch: None,
            alpha: rng.factor(),
            beta: 0.0,
        }
    }

    fn layouts(&self) -> [Lay; 3] {
        let batch = self.batch.unwrap_or(1);
        let (ar, ac) = stored(self.ta, self.m, self.k);
        let (br, bc) = stored(self.tb, self.k, self.n);
        let mut c = Lay::new(
            self.order,
            self.m,
            self.n,
            self.pads[2],
            self.gaps[2],
            batch,
        );
        if let Some(stride) = self.c_stride {
            c.stride = stride;
        }
        [
            Lay::new(self.order, ar, ac, self.pads[0], self.gaps[0], batch),
            Lay::new(self.order, br, bc, self.pads[1], self.gaps[1], batch),
            c,
        ]
    }
}

/// Runs `p` and returns the output as copied back, after checking it against the reference.
fn run_gemm<T: GemmType>(
    stream: &Arc<CudaStream>,
    blas: &Blas,
    rng: &mut Rng,
    p: &Problem,
) -> Vec<T> {
    let [a_lay, b_lay, c_lay] = p.layouts();
    let (alpha_s, alpha) = scalar::<T>(p.alpha);
    let (beta_s, beta) = scalar::<T>(p.beta);
    let a: Vec<T> = input(rng, &a_lay);
    let b: Vec<T> = input(rng, &b_lay);
    let c_before: Vec<T> = output(rng, &c_lay, beta);
    let (want, scale) = reference(
        p.ta,
        p.tb,
        p.k,
        alpha,
        (&a_lay, &a),
        (&b_lay, &b),
        beta,
        (&c_lay, &c_before),
    );
    let a_dev = stream.clone_htod(&a).unwrap();
    let b_dev = stream.clone_htod(&b).unwrap();
    let mut c_dev = stream.clone_htod(&c_before).unwrap();
    let (m, n, k) = (p.m, p.n, p.k);
    let r = match (p.order, p.batch) {
        (Order::Col, None) => blas.gemm(
            p.ta, p.tb, m, n, k, alpha_s, &a_dev, a_lay.ld, &b_dev, b_lay.ld, beta_s, &mut c_dev,
            c_lay.ld,
        ),
        (Order::Row, None) => blas.matmul_row_major(
            p.ta, p.tb, m, n, k, alpha_s, &a_dev, a_lay.ld, &b_dev, b_lay.ld, beta_s, &mut c_dev,
            c_lay.ld,
        ),
        (Order::Col, Some(batch)) => blas.gemm_strided_batched(
            p.ta,
            p.tb,
            m,
            n,
            k,
            alpha_s,
            &a_dev,
            a_lay.ld,
            a_lay.stride,
            &b_dev,
            b_lay.ld,
            b_lay.stride,
            beta_s,
            &mut c_dev,
            c_lay.ld,
            c_lay.stride,
            batch,
        ),
        (Order::Row, Some(batch)) => blas.matmul_row_major_strided_batched(
            p.ta,
            p.tb,
            m,
            n,
            k,
            alpha_s,
            &a_dev,
            a_lay.ld,
            a_lay.stride,
            &b_dev,
            b_lay.ld,
            b_lay.stride,
            beta_s,
            &mut c_dev,
            c_lay.ld,
            c_lay.stride,
            batch,
        ),
    };
    let what = format!("gemm<{}> {p:?} (math {:?})", T::DTYPE, blas.math());
    r.unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = download(stream, &c_dev);
    check(
        &what,
        &got,
        &c_before,
        &c_lay.offsets(),
        &want,
        &scale,
        tol::<T>(blas.math()),
    );
    got
}

/// All four transpose combinations, each with `beta = 0` (NaN-poisoned C) and `beta ≠ 0`, on
/// random shapes up to `max` with padded leading dimensions; then thin and single-element
/// shapes.
fn gemm_cases<T: GemmType>(seed: u64, order: Order) {
    let Some((stream, blas)) = gpu() else { return };
    let mut rng = Rng::new(seed);
    for ta in [Transpose::No, Transpose::Yes] {
        for tb in [Transpose::No, Transpose::Yes] {
            for beta_zero in [true, false] {
                let mut p = Problem::random(&mut rng, order, ta, tb, 48);
                p.beta = if beta_zero { 0.0 } else { rng.factor() };
                run_gemm::<T>(&stream, &blas, &mut rng, &p);
            }
        }
    }
    for (m, n, k) in [(1, 1, 1), (1, 37, 5), (29, 1, 17), (8, 8, 128), (128, 3, 2)] {
        let mut p = Problem::random(&mut rng, order, Transpose::Yes, Transpose::No, 2);
        (p.m, p.n, p.k) = (m, n, k);
        p.beta = rng.factor();
        run_gemm::<T>(&stream, &blas, &mut rng, &p);
    }
}

/// Strided batches with gaps between matrices, a shared (stride 0) A, and a single batch.
fn strided_cases<T: GemmType>(seed: u64, order: Order) {
    let Some((stream, blas)) = gpu() else { return };
    let mut rng = Rng::new(seed);
    for (ta, tb) in [
        (Transpose::No, Transpose::No),
        (Transpose::Yes, Transpose::No),
        (Transpose::No, Transpose::Yes),
        (Transpose::Yes, Transpose::Yes),
    ] {
        for beta_zero in [true, false] {
            let mut p = Problem::random(&mut rng, order, ta, tb, 24);
            p.batch = Some(rng.range_inclusive(2, 5));
            p.gaps = [
                rng.range_inclusive(0, 7),
                rng.range_inclusive(0, 7),
                rng.range_inclusive(0, 7),
            ];
            p.beta = if beta_zero { 0.0 } else { rng.factor() };
            run_gemm::<T>(&stream, &blas, &mut rng, &p);
        }
    }
    // One A for every batch (stride 0), C matrices back to back (stride = span).
    let mut p = Problem::random(&mut rng, order, Transpose::No, Transpose::Yes, 24);
    p.batch = Some(4);
    p.gaps = [-1, 3, 0];
    p.beta = rng.factor();
    run_gemm::<T>(&stream, &blas, &mut rng, &p);
    // A single batch.
    let mut p = Problem::random(&mut rng, order, Transpose::Yes, Transpose::No, 24);
    p.batch = Some(1);
    run_gemm::<T>(&stream, &blas, &mut rng, &p);
    // Output matrices that interleave without meeting: row-major C stored as [m, batch, n]
    // (ldc = batch·n, stride n), column-major as [n, batch, m]; beta 0 and beta ≠ 0.
    for beta_zero in [true, false] {
        let mut p = Problem::random(&mut rng, order, Transpose::No, Transpose::Yes, 24);
        let batch = 3;
        p.batch = Some(batch);
        let inner = match order {
            Order::Row => p.n,
            Order::Col => p.m,
        };
        p.pads[2] = inner * (batch - 1);
        p.c_stride = Some(inner);
        p.beta = if beta_zero { 0.0 } else { rng.factor() };
        run_gemm::<T>(&stream, &blas, &mut rng, &p);
    }
}

// ---------------------------------------------------------------------------------------------
// GEMM: every type, both layouts, plain and strided-batched
// ---------------------------------------------------------------------------------------------

#[test]
fn gemm_f32() {
    gemm_cases::<f32>(1, Order::Col);
}

#[test]
fn gemm_f64() {
    gemm_cases::<f64>(2, Order::Col);
}

#[test]
fn gemm_f16() {
    gemm_cases::<f16>(3, Order::Col);
}

#[test]
fn gemm_bf16() {
    gemm_cases::<bf16>(4, Order::Col);
}

#[test]
fn matmul_row_major_f32() {
    gemm_cases::<f32>(11, Order::Row);
}

#[test]
fn matmul_row_major_f64() {
    gemm_cases::<f64>(12, Order::Row);
}

#[test]
fn matmul_row_major_f16() {
    gemm_cases::<f16>(13, Order::Row);
}

#[test]
fn matmul_row_major_bf16() {
    gemm_cases::<bf16>(14, Order::Row);
}

#[test]
fn gemm_strided_batched_f32() {
    strided_cases::<f32>(21, Order::Col);
}

#[test]
fn gemm_strided_batched_f64() {
    strided_cases::<f64>(22, Order::Col);
}

#[test]
fn gemm_strided_batched_f16() {
    strided_cases::<f16>(23, Order::Col);
}

#[test]
fn gemm_strided_batched_bf16() {
    strided_cases::<bf16>(24, Order::Col);
}

#[test]
fn matmul_row_major_strided_batched_f32_and_bf16() {
    strided_cases::<f32>(25, Order::Row);
    strided_cases::<bf16>(26, Order::Row);
}

/// The row-major layer against a row-major reference written out by hand (no shared layout
/// code): `C = A·B` for A 2×3, B 3×2.
#[test]
fn matmul_row_major_small_exact() {
    let Some((stream, blas)) = gpu() else { return };
    let a = stream
        .clone_htod(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])
        .unwrap();
    let b = stream
        .clone_htod(&[7.0f32, 8.0, 9.0, 10.0, 11.0, 12.0])
        .unwrap();
    let mut c = stream.clone_htod(&[f32::NAN; 4]).unwrap();
    blas.matmul_row_major(
        Transpose::No,
        Transpose::No,
        2,
        2,
        3,
        1.0,
        &a,
        3,
        &b,
        2,
        0.0,
        &mut c,
        2,
    )
    .unwrap();
    assert_eq!(download(&stream, &c), [58.0, 64.0, 139.0, 154.0]);
    // Cᵀ = Bᵀ·Aᵀ through the transpose flags on the same buffers: B stored 3×2 read as
    // op(B) = Bᵀ (2×3), A stored 2×3 read as op(A) = Aᵀ (3×2).
    let mut ct = stream.clone_htod(&[f32::NAN; 4]).unwrap();
    blas.matmul_row_major(
        Transpose::Yes,
        Transpose::Yes,
        2,
        2,
        3,
        1.0,
        &b,
        2,
        &a,
        3,
        0.0,
        &mut ct,
        2,
    )
    .unwrap();
    assert_eq!(download(&stream, &ct), [58.0, 139.0, 64.0, 154.0]);
}

// ---------------------------------------------------------------------------------------------
// linear, pointer-array batched, GEMV
// ---------------------------------------------------------------------------------------------

fn linear_case<T: GemmType>(seed: u64) {
    let Some((stream, blas)) = gpu() else { return };
    let mut rng = Rng::new(seed);
    for (batch, fin, fout) in [(7, 33, 19), (1, 64, 128), (16, 1, 5)] {
        let x_lay = Lay::new(Order::Row, batch, fin, 0, 0, 1);
        let w_lay = Lay::new(Order::Row, fout, fin, 0, 0, 1);
        let y_lay = Lay::new(Order::Row, batch, fout, 0, 0, 1);
        let x: Vec<T> = input(&mut rng, &x_lay);
        let w: Vec<T> = input(&mut rng, &w_lay);
        let y_before: Vec<T> = output(&mut rng, &y_lay, 0.0);
        let (want, scale) = reference(
            Transpose::No,
            Transpose::Yes,
            fin,
            1.0,
            (&x_lay, &x),
            (&w_lay, &w),
            0.0,
            (&y_lay, &y_before),
        );
        let x_dev = stream.clone_htod(&x).unwrap();
        let w_dev = stream.clone_htod(&w).unwrap();
        let mut y_dev = stream.clone_htod(&y_before).unwrap();
        blas.linear(batch, fin, fout, &x_dev, &w_dev, &mut y_dev)
            .unwrap();
        let what = format!("linear<{}> {batch}×{fin} -> {fout}", T::DTYPE);
        let got = download(&stream, &y_dev);
        check(
            &what,
            &got,
            &y_before,
            &y_lay.offsets(),
            &want,
            &scale,
            tol::<T>(BlasMath::Default),
        );
    }
}

#[test]
fn linear_is_x_times_w_transposed() {
    linear_case::<f32>(31);
    linear_case::<bf16>(32);
    linear_case::<f16>(33);
}

/// `gemm_batched` over separate buffers (and over views of one buffer), all transposes.
fn batched_case<T: GemmType>(seed: u64) {
    let Some((stream, blas)) = gpu() else { return };
    let mut rng = Rng::new(seed);
    for (ta, tb) in [
        (Transpose::No, Transpose::No),
        (Transpose::Yes, Transpose::No),
        (Transpose::No, Transpose::Yes),
        (Transpose::Yes, Transpose::Yes),
    ] {
        for beta_zero in [true, false] {
            let p = Problem::random(&mut rng, Order::Col, ta, tb, 24);
            let beta = if beta_zero { 0.0 } else { rng.factor() };
            let (alpha_s, alpha) = scalar::<T>(p.alpha);
            let (beta_s, beta) = scalar::<T>(beta);
            let [a_lay, b_lay, c_lay] = p.layouts();
            let batch = rng.range_inclusive(1, 4) as usize;
            let a: Vec<Vec<T>> = (0..batch).map(|_| input(&mut rng, &a_lay)).collect();
            let b: Vec<Vec<T>> = (0..batch).map(|_| input(&mut rng, &b_lay)).collect();
            let c: Vec<Vec<T>> = (0..batch).map(|_| output(&mut rng, &c_lay, beta)).collect();
            let a_dev: Vec<_> = a.iter().map(|h| stream.clone_htod(h).unwrap()).collect();
            let b_dev: Vec<_> = b.iter().map(|h| stream.clone_htod(h).unwrap()).collect();
            let mut c_dev: Vec<_> = c.iter().map(|h| stream.clone_htod(h).unwrap()).collect();
            let a_refs: Vec<&CudaSlice<T>> = a_dev.iter().collect();
            let b_refs: Vec<&CudaSlice<T>> = b_dev.iter().collect();
            let mut c_refs: Vec<&mut CudaSlice<T>> = c_dev.iter_mut().collect();
            let what = format!("gemm_batched<{}> {p:?} beta {beta} batch {batch}", T::DTYPE);
            blas.gemm_batched(
                p.ta,
                p.tb,
                p.m,
                p.n,
                p.k,
                alpha_s,
                &a_refs,
                a_lay.ld,
                &b_refs,
                b_lay.ld,
                beta_s,
                &mut c_refs,
                c_lay.ld,
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            for i in 0..batch {
                let (want, scale) = reference(
                    p.ta,
                    p.tb,
                    p.k,
                    alpha,
                    (&a_lay, &a[i]),
                    (&b_lay, &b[i]),
                    beta,
                    (&c_lay, &c[i]),
                );
                let got = download(&stream, &c_dev[i]);
                check(
                    &format!("{what}: matrix {i}"),
                    &got,
                    &c[i],
                    &c_lay.offsets(),
                    &want,
                    &scale,
                    tol::<T>(BlasMath::Default),
                );
            }
        }
    }

    // Outputs as two disjoint views of one buffer, with a sentinel gap between them.
    let p = Problem::random(&mut rng, Order::Col, Transpose::No, Transpose::No, 16);
    let [a_lay, b_lay, c_lay] = p.layouts();
    let (alpha_s, alpha) = scalar::<T>(p.alpha);
    let (beta_s, beta) = scalar::<T>(0.5);
    let a: Vec<T> = input(&mut rng, &a_lay);
    let b0: Vec<T> = input(&mut rng, &b_lay);
    let b1: Vec<T> = input(&mut rng, &b_lay);
    let half = c_lay.len() + 3;
    let c0: Vec<T> = output(&mut rng, &c_lay, beta);
    let c1: Vec<T> = output(&mut rng, &c_lay, beta);
    let mut whole = vec![T::from_f64(SENTINEL); 2 * half];
    whole[..c0.len()].copy_from_slice(&c0);
    whole[half..half + c1.len()].copy_from_slice(&c1);
    let a_dev = stream.clone_htod(&a).unwrap();
    let b_dev = [
        stream.clone_htod(&b0).unwrap(),
        stream.clone_htod(&b1).unwrap(),
    ];
    let mut c_dev = stream.clone_htod(&whole).unwrap();
    {
        let (mut v0, mut v1) = c_dev.split_at_mut(half);
        blas.gemm_batched(
            p.ta,
            p.tb,
            p.m,
            p.n,
            p.k,
            alpha_s,
            &[&a_dev, &a_dev],
            a_lay.ld,
            &[&b_dev[0], &b_dev[1]],
            b_lay.ld,
            beta_s,
            &mut [&mut v0, &mut v1],
            c_lay.ld,
        )
        .unwrap();
    }
    let got = download(&stream, &c_dev);
    let mut offs = c_lay.offsets();
    offs.extend(c_lay.offsets().iter().map(|o| o + half));
    let (mut want, mut scale) = reference(
        p.ta,
        p.tb,
        p.k,
        alpha,
        (&a_lay, &a),
        (&b_lay, &b0),
        beta,
        (&c_lay, &c0),
    );
    let (w1, s1) = reference(
        p.ta,
        p.tb,
        p.k,
        alpha,
        (&a_lay, &a),
        (&b_lay, &b1),
        beta,
        (&c_lay, &c1),
    );
    want.extend(w1);
    scale.extend(s1);
    check(
        &format!("gemm_batched<{}> into views {p:?}", T::DTYPE),
        &got,
        &whole,
        &offs,
        &want,
        &scale,
        tol::<T>(BlasMath::Default),
    );
}

#[test]
fn gemm_batched_over_separate_buffers() {
    batched_case::<f32>(41);
    batched_case::<f64>(42);
    batched_case::<f16>(43);
    batched_case::<bf16>(44);
}

/// `y = alpha·op(A)·x + beta·y` with padded `lda` and increments > 1 (the gaps hold sentinels).
fn gemv_case<T: GemmType>(seed: u64) {
    let Some((stream, blas)) = gpu() else { return };
    let mut rng = Rng::new(seed);
    for trans in [Transpose::No, Transpose::Yes] {
        for (incx, incy) in [(1, 1), (2, 3), (3, 1)] {
            for beta_zero in [true, false] {
                let (m, n) = (rng.range_inclusive(1, 70), rng.range_inclusive(1, 70));
                let a_lay = Lay::new(Order::Col, m, n, rng.range_inclusive(1, 4), 0, 1);
                let (x_count, y_count) = match trans {
                    Transpose::No => (n, m),
                    Transpose::Yes => (m, n),
                };
                // A vector with increment `inc` is a 1×count column-major matrix with ld `inc`.
                let x_lay = Lay::new(Order::Col, 1, x_count, incx - 1, 0, 1);
                let y_lay = Lay::new(Order::Col, 1, y_count, incy - 1, 0, 1);
                let (alpha_s, alpha) = scalar::<T>(rng.factor());
                let beta = if beta_zero { 0.0 } else { rng.factor() };
                let (beta_s, beta) = scalar::<T>(beta);
                let a: Vec<T> = input(&mut rng, &a_lay);
                let x: Vec<T> = input(&mut rng, &x_lay);
                let y_before: Vec<T> = output(&mut rng, &y_lay, beta);
                // yᵀ = xᵀ·op(A)ᵀ: op(A)ᵀ is A itself when trans = Yes, Aᵀ when No.
                let (want, scale) = reference(
                    Transpose::No,
                    trans.flip(),
                    x_count,
                    alpha,
                    (&x_lay, &x),
                    (&a_lay, &a),
                    beta,
                    (&y_lay, &y_before),
                );
                let a_dev = stream.clone_htod(&a).unwrap();
                let x_dev = stream.clone_htod(&x).unwrap();
                let mut y_dev = stream.clone_htod(&y_before).unwrap();
                let what = format!(
                    "gemv<{}> {trans:?} {m}×{n} lda {} incx {incx} incy {incy} beta {beta}",
                    T::DTYPE,
                    a_lay.ld
                );
                blas.gemv(
                    trans, m, n, alpha_s, &a_dev, a_lay.ld, &x_dev, incx, beta_s, &mut y_dev, incy,
                )
                .unwrap_or_else(|e| panic!("{what}: {e}"));
                let got = download(&stream, &y_dev);
                check(
                    &what,
                    &got,
                    &y_before,
                    &y_lay.offsets(),
                    &want,
                    &scale,
                    tol::<T>(BlasMath::Default),
                );
            }
        }
    }
}

#[test]
fn gemv_all_types() {
    gemv_case::<f32>(51);
    gemv_case::<f64>(52);
    gemv_case::<f16>(53);
    gemv_case::<bf16>(54);
}

// ---------------------------------------------------------------------------------------------
// Math modes, reproducibility, empty shapes
// ---------------------------------------------------------------------------------------------

#[test]
fn math_modes() {
    let Some((stream, mut blas)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(61);
    assert_eq!(blas.math(), BlasMath::Default);
    for math in [
        BlasMath::Tf32,
        BlasMath::Pedantic,
        BlasMath::Default,
        BlasMath::Tf32,
    ] {
        blas.set_math(math).unwrap();
        assert_eq!(blas.math(), math);
        for (ta, tb) in [
            (Transpose::No, Transpose::No),
            (Transpose::Yes, Transpose::Yes),
        ] {
            let mut p = Problem::random(&mut rng, Order::Col, ta, tb, 64);
            p.k = 128;
            p.beta = rng.factor();
            // run_gemm uses tol::<T>(blas.math()): 5e-3 for f32 under TF32.
            run_gemm::<f32>(&stream, &blas, &mut rng, &p);
            run_gemm::<f64>(&stream, &blas, &mut rng, &p);
            run_gemm::<f16>(&stream, &blas, &mut rng, &p);
            run_gemm::<bf16>(&stream, &blas, &mut rng, &p);
            p.batch = Some(2);
            run_gemm::<f32>(&stream, &blas, &mut rng, &p);
        }
    }
}

/// The same call twice on the same handle, stream, workspace and math mode gives the same bits.
fn reproducible<T: GemmType>(stream: &Arc<CudaStream>, blas: &Blas, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut p = Problem::random(&mut rng, Order::Row, Transpose::No, Transpose::Yes, 2);
    (p.m, p.n, p.k) = (128, 96, 128);
    p.pads = [0, 0, 0];
    let mut q = p;
    q.batch = Some(3);
    for problem in [p, q] {
        let [a_lay, b_lay, c_lay] = problem.layouts();
        let a: Vec<T> = input(&mut rng, &a_lay);
        let b: Vec<T> = input(&mut rng, &b_lay);
        let poisoned: Vec<T> = output(&mut rng, &c_lay, 0.0);
        let (alpha, _) = scalar::<T>(problem.alpha);
        let (zero, _) = scalar::<T>(0.0);
        let a_dev = stream.clone_htod(&a).unwrap();
        let b_dev = stream.clone_htod(&b).unwrap();
        let mut runs = Vec::new();
        for _ in 0..2 {
            let mut c_dev = stream.clone_htod(&poisoned).unwrap();
            match problem.batch {
                None => blas.matmul_row_major(
                    problem.ta, problem.tb, problem.m, problem.n, problem.k, alpha, &a_dev,
                    a_lay.ld, &b_dev, b_lay.ld, zero, &mut c_dev, c_lay.ld,
                ),
                Some(batch) => blas.matmul_row_major_strided_batched(
                    problem.ta,
                    problem.tb,
                    problem.m,
                    problem.n,
                    problem.k,
                    alpha,
                    &a_dev,
                    a_lay.ld,
                    a_lay.stride,
                    &b_dev,
                    b_lay.ld,
                    b_lay.stride,
                    zero,
                    &mut c_dev,
                    c_lay.ld,
                    c_lay.stride,
                    batch,
                ),
            }
            .unwrap();
            runs.push(download(stream, &c_dev));
        }
        let bits = |v: &[T]| -> Vec<u64> { v.iter().map(|x| x.to_f64().to_bits()).collect() };
        assert!(
            runs[0].iter().all(|x| x.to_f64().is_finite()),
            "{}: non-finite output",
            T::DTYPE
        );
        assert_eq!(
            bits(&runs[0]),
            bits(&runs[1]),
            "{} {problem:?}: two identical calls differ",
            T::DTYPE
        );
    }
}

#[test]
fn results_are_bitwise_reproducible() {
    let Some((stream, mut blas)) = gpu() else {
        return;
    };
    reproducible::<f32>(&stream, &blas, 71);
    reproducible::<f64>(&stream, &blas, 72);
    reproducible::<f16>(&stream, &blas, 73);
    reproducible::<bf16>(&stream, &blas, 74);
    blas.set_math(BlasMath::Tf32).unwrap();
    reproducible::<f32>(&stream, &blas, 75);
}

#[test]
fn empty_shapes_and_k_zero() {
    let Some((stream, blas)) = gpu() else { return };
    let mut rng = Rng::new(81);
    // k = 0: C = beta·C (a sum over nothing), padding untouched.
    for beta in [0.0, 0.75] {
        let c_lay = Lay::new(Order::Col, 5, 7, 2, 0, 1);
        let c_before: Vec<f32> = output(&mut rng, &c_lay, beta);
        let a = stream.clone_htod(&[1.0f32]).unwrap();
        let b = stream.clone_htod(&[1.0f32]).unwrap();
        let mut c = stream.clone_htod(&c_before).unwrap();
        blas.gemm(
            Transpose::No,
            Transpose::No,
            5,
            7,
            0,
            1.5f32,
            &a,
            5,
            &b,
            1,
            beta as f32,
            &mut c,
            c_lay.ld,
        )
        .unwrap();
        let offs = c_lay.offsets();
        let want: Vec<f64> = offs
            .iter()
            .map(|&o| {
                if beta == 0.0 {
                    0.0
                } else {
                    beta * c_before[o] as f64
                }
            })
            .collect();
        let scale: Vec<f64> = want.iter().map(|w| w.abs()).collect();
        let got = download(&stream, &c);
        check(
            &format!("k = 0, beta {beta}"),
            &got,
            &c_before,
            &offs,
            &want,
            &scale,
            1e-6,
        );
    }
    // m = 0, n = 0, batch = 0: nothing happens.
    let before = vec![SENTINEL as f32; 16];
    let a = stream.clone_htod(&before).unwrap();
    let mut c = stream.clone_htod(&before).unwrap();
    let nn = Transpose::No;
    blas.gemm(nn, nn, 0, 4, 4, 1.0f32, &a, 1, &a, 4, 0.0, &mut c, 1)
        .unwrap();
    blas.gemm(nn, nn, 4, 0, 4, 1.0f32, &a, 4, &a, 4, 0.0, &mut c, 4)
        .unwrap();
    blas.gemm_strided_batched(
        nn, nn, 4, 4, 1, 1.0f32, &a, 4, 4, &a, 1, 4, 0.0, &mut c, 4, 16, 0,
    )
    .unwrap();
    blas.gemv(nn, 0, 3, 1.0f32, &a, 1, &a, 1, 0.0, &mut c, 1)
        .unwrap();
    let mut empty: Vec<&mut CudaSlice<f32>> = Vec::new();
    blas.gemm_batched::<f32, CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>>(
        nn,
        nn,
        4,
        4,
        4,
        1.0,
        &[],
        4,
        &[],
        4,
        0.0,
        &mut empty,
        4,
    )
    .unwrap();
    assert_untouched("empty problems", &stream, &c, &before);
}

/// A 1024³ product in bf16 and f16 (the sizes the targets are measured on, scaled down): every
/// output finite, 8 random rows and 8 random columns checked against the host reference.
fn large_case<T: GemmType>(stream: &Arc<CudaStream>, blas: &Blas, seed: u64) {
    const N: i64 = 1024;
    let mut rng = Rng::new(seed);
    let lay = Lay::new(Order::Row, N, N, 0, 0, 1);
    let a: Vec<T> = input(&mut rng, &lay);
    let b: Vec<T> = input(&mut rng, &lay);
    let a_dev = stream.clone_htod(&a).unwrap();
    let b_dev = stream.clone_htod(&b).unwrap();
    let mut c_dev = stream
        .clone_htod(&vec![T::from_f64(f64::NAN); (N * N) as usize])
        .unwrap();
    let (one, _) = scalar::<T>(1.0);
    let (zero, _) = scalar::<T>(0.0);
    blas.matmul_row_major(
        Transpose::No,
        Transpose::No,
        N,
        N,
        N,
        one,
        &a_dev,
        N,
        &b_dev,
        N,
        zero,
        &mut c_dev,
        N,
    )
    .unwrap();
    let got = download(stream, &c_dev);
    assert!(
        got.iter().all(|x| x.to_f64().is_finite()),
        "{}: non-finite output",
        T::DTYPE
    );
    let idx = |i: i64, j: i64| (i * N + j) as usize;
    let mut cells = Vec::new();
    for _ in 0..8 {
        let r = rng.range_inclusive(0, N - 1);
        let c = rng.range_inclusive(0, N - 1);
        cells.extend((0..N).map(|j| (r, j)));
        cells.extend((0..N).map(|i| (i, c)));
    }
    let tol = tol::<T>(BlasMath::Default);
    for (i, j) in cells {
        let (mut s, mut s_abs) = (0.0f64, 0.0f64);
        for l in 0..N {
            let t = a[idx(i, l)].to_f64() * b[idx(l, j)].to_f64();
            s += t;
            s_abs += t.abs();
        }
        let g = got[idx(i, j)].to_f64();
        assert!(
            (g - s).abs() <= tol * s_abs,
            "{} 1024³: C[{i}][{j}] = {g}, want {s} (allowed {:e})",
            T::DTYPE,
            tol * s_abs
        );
    }
}

#[test]
fn large_gemm_1024_half_types() {
    let Some((stream, blas)) = gpu() else { return };
    large_case::<bf16>(&stream, &blas, 91);
    large_case::<f16>(&stream, &blas, 92);
}

// ---------------------------------------------------------------------------------------------
// Rejections before launch
// ---------------------------------------------------------------------------------------------

fn is_invalid<T: std::fmt::Debug>(r: &Result<T, Error>, name: &str) -> bool {
    matches!(r, Err(Error::InvalidArgument { what, .. }) if *what == name)
}

fn is_short<T: std::fmt::Debug>(r: &Result<T, Error>, which: &str, want_required: usize) -> bool {
    matches!(r, Err(Error::BufferTooSmall { name, required, .. })
        if *name == which && *required == want_required)
}

fn is_overflow<T: std::fmt::Debug>(r: &Result<T, Error>, name: &str) -> bool {
    matches!(r, Err(Error::Overflow { what, .. }) if *what == name)
}

#[test]
fn bad_gemm_arguments_are_rejected_before_launch() {
    let Some((stream, blas)) = gpu() else { return };
    let mut rng = Rng::new(101);
    let nn = Transpose::No;
    let tt = Transpose::Yes;
    // A 6×4 (lda 6), B 4×5 (ldb 4), C 6×5 (ldc 6): spans 24, 20, 30.
    let (m, n, k) = (6i64, 5i64, 4i64);
    let a_host: Vec<f32> = (0..64).map(|_| rng.value()).collect();
    let b_host: Vec<f32> = (0..64).map(|_| rng.value()).collect();
    let a = stream.clone_htod(&a_host).unwrap();
    let b = stream.clone_htod(&b_host).unwrap();
    let before = vec![SENTINEL as f32; 64];
    let mut c = stream.clone_htod(&before).unwrap();

    let r = blas.gemm(nn, nn, m, n, k, 1.0f32, &a, 5, &b, 4, 0.0, &mut c, 6);
    assert!(is_invalid(&r, "lda"), "lda < m: {r:?}");
    let r = blas.gemm(tt, nn, m, n, k, 1.0f32, &a, 3, &b, 4, 0.0, &mut c, 6);
    assert!(
        is_invalid(&r, "lda"),
        "transposed A stored 4×6, lda 3: {r:?}"
    );
    let r = blas.gemm(nn, tt, m, n, k, 1.0f32, &a, 6, &b, 4, 0.0, &mut c, 6);
    assert!(
        is_invalid(&r, "ldb"),
        "transposed B stored 5×4, ldb 4: {r:?}"
    );
    let r = blas.gemm(nn, nn, m, n, k, 1.0f32, &a, 6, &b, 4, 0.0, &mut c, 5);
    assert!(is_invalid(&r, "ldc"), "ldc < m: {r:?}");
    let r = blas.gemm(nn, nn, m, -1, k, 1.0f32, &a, 6, &b, 4, 0.0, &mut c, 6);
    assert!(is_invalid(&r, "n"), "negative n: {r:?}");
    let big = i32::MAX as i64 + 1;
    let r = blas.gemm(nn, nn, big, n, k, 1.0f32, &a, big, &b, 4, 0.0, &mut c, big);
    assert!(is_overflow(&r, "m"), "m beyond int: {r:?}");
    let r = blas.gemm(nn, nn, m, n, k, 1.0f32, &a, big, &b, 4, 0.0, &mut c, 6);
    assert!(is_overflow(&r, "lda"), "lda beyond int: {r:?}");

    // Short buffers: each one element short of its span.
    let short_a = stream.clone_htod(&a_host[..23]).unwrap();
    let r = blas.gemm(nn, nn, m, n, k, 1.0f32, &short_a, 6, &b, 4, 0.0, &mut c, 6);
    assert!(is_short(&r, "a", 24), "short a: {r:?}");
    let short_b = stream.clone_htod(&b_host[..19]).unwrap();
    let r = blas.gemm(nn, nn, m, n, k, 1.0f32, &a, 6, &short_b, 4, 0.0, &mut c, 6);
    assert!(is_short(&r, "b", 20), "short b: {r:?}");
    let short_before = vec![SENTINEL as f32; 29];
    let mut short_c = stream.clone_htod(&short_before).unwrap();
    let r = blas.gemm(nn, nn, m, n, k, 1.0f32, &a, 6, &b, 4, 0.0, &mut short_c, 6);
    assert!(is_short(&r, "c", 30), "short c: {r:?}");
    // A padded ldc makes the span larger: 8·4 + 6 = 38 > 29.
    let r = blas.gemm(nn, nn, m, n, k, 1.0f32, &a, 6, &b, 4, 0.0, &mut short_c, 8);
    assert!(is_short(&r, "c", 38), "short c with ldc 8: {r:?}");
    assert_untouched("short c", &stream, &short_c, &short_before);

    // Row-major: lda covers columns; c's span is ldc·(m − 1) + n = 5·5 + 5 = 30.
    let r = blas.matmul_row_major(nn, nn, m, n, k, 1.0f32, &a, 3, &b, 5, 0.0, &mut c, 5);
    assert!(is_invalid(&r, "lda"), "row-major lda < k: {r:?}");
    let r = blas.matmul_row_major(nn, nn, m, n, k, 1.0f32, &a, 4, &b, 4, 0.0, &mut c, 5);
    assert!(is_invalid(&r, "ldb"), "row-major ldb < n: {r:?}");
    let r = blas.matmul_row_major(nn, nn, m, n, k, 1.0f32, &a, 4, &b, 5, 0.0, &mut short_c, 5);
    assert!(is_short(&r, "c", 30), "row-major short c: {r:?}");
    // linear names its operands x, w, y: w is out×in = 5×4 = 20 elements.
    let r = blas.linear(m, k, n, &a, &short_b, &mut c);
    assert!(is_short(&r, "w", 20), "linear short w: {r:?}");
    let r = blas.linear(m, k, n, &a, &b, &mut short_c);
    assert!(is_short(&r, "y", 30), "linear short y: {r:?}");
    let r = blas.linear(m, -4, n, &a, &b, &mut c);
    assert!(is_invalid(&r, "in_features"), "linear negative in: {r:?}");

    // Strided batched: C matrices (span 30) overlapping, negative strides, short batches,
    // overflowing stride arithmetic, negative batch.
    let sb = |c: &mut CudaSlice<f32>, sa: i64, sb_: i64, sc: i64, batch: i64| {
        blas.gemm_strided_batched(
            nn, nn, m, n, k, 1.0f32, &a, 6, sa, &b, 4, sb_, 0.0, c, 6, sc, batch,
        )
    };
    let r = sb(&mut c, 0, 0, 29, 2);
    assert!(
        matches!(r, Err(Error::OverlappingOutput { name: "c", .. })),
        "overlapping batch outputs: {r:?}"
    );
    let r = sb(&mut c, -1, 0, 30, 2);
    assert!(is_invalid(&r, "stride_a"), "negative stride_a: {r:?}");
    let r = sb(&mut c, 0, 0, 30, 3);
    assert!(is_short(&r, "c", 90), "batch of 3 needs 90: {r:?}");
    // Two A matrices 41 apart: 41 + 24 = 65 elements, a holds 64.
    let r = sb(&mut c, 41, 0, 30, 2);
    assert!(is_short(&r, "a", 65), "batch of 2 A needs 65: {r:?}");
    let r = sb(&mut c, i64::MAX / 2, 0, 30, 3);
    assert!(is_overflow(&r, "a"), "stride arithmetic overflow: {r:?}");
    let r = sb(&mut c, 0, 0, 30, -1);
    assert!(is_invalid(&r, "batch"), "negative batch: {r:?}");
    let r = sb(&mut c, 0, 0, 30, big);
    assert!(is_overflow(&r, "batch"), "batch beyond int: {r:?}");

    assert_untouched("c after rejected calls", &stream, &c, &before);
}

#[test]
fn bad_batched_and_gemv_arguments_are_rejected_before_launch() {
    let Some((stream, blas)) = gpu() else { return };
    let mut rng = Rng::new(102);
    let nn = Transpose::No;
    let host: Vec<f32> = (0..64).map(|_| rng.value()).collect();
    let a = stream.clone_htod(&host).unwrap();
    let short = stream.clone_htod(&host[..10]).unwrap();
    let before = vec![SENTINEL as f32; 64];
    let mut c0 = stream.clone_htod(&before).unwrap();
    let mut c1 = stream.clone_htod(&before).unwrap();
    let short_before = vec![SENTINEL as f32; 10];
    let mut c_short = stream.clone_htod(&short_before).unwrap();

    // 4×4 products: spans 16.
    let r = blas.gemm_batched(
        nn,
        nn,
        4,
        4,
        4,
        1.0f32,
        &[&a, &a],
        4,
        &[&a],
        4,
        0.0,
        &mut [&mut c0, &mut c1],
        4,
    );
    assert!(
        is_invalid(&r, "gemm_batched operands"),
        "batch sizes differ: {r:?}"
    );
    let r = blas.gemm_batched(
        nn,
        nn,
        4,
        4,
        4,
        1.0f32,
        &[&a, &short],
        4,
        &[&a, &a],
        4,
        0.0,
        &mut [&mut c0, &mut c1],
        4,
    );
    assert!(is_short(&r, "a", 16), "one short a: {r:?}");
    let r = blas.gemm_batched(
        nn,
        nn,
        4,
        4,
        4,
        1.0f32,
        &[&a, &a, &a],
        4,
        &[&a, &a, &a],
        4,
        0.0,
        &mut [&mut c0, &mut c_short, &mut c1],
        4,
    );
    assert!(is_short(&r, "c", 16), "one short c: {r:?}");
    let r = blas.gemm_batched(
        nn,
        nn,
        4,
        4,
        4,
        1.0f32,
        &[&a, &a],
        3,
        &[&a, &a],
        4,
        0.0,
        &mut [&mut c0, &mut c1],
        4,
    );
    assert!(is_invalid(&r, "lda"), "batched lda: {r:?}");

    // GEMV: A 5×4 (lda 5, span 20); x has 4 elements, y 5.
    let r = blas.gemv(nn, 5, 4, 1.0f32, &a, 5, &a, 0, 0.0, &mut c0, 1);
    assert!(is_invalid(&r, "incx"), "incx 0: {r:?}");
    let r = blas.gemv(nn, 5, 4, 1.0f32, &a, 5, &a, 1, 0.0, &mut c0, -1);
    assert!(is_invalid(&r, "incy"), "negative incy: {r:?}");
    let r = blas.gemv(nn, 5, 4, 1.0f32, &a, 4, &a, 1, 0.0, &mut c0, 1);
    assert!(is_invalid(&r, "lda"), "gemv lda < m: {r:?}");
    // x with increment 4: 1 + 3·4 = 13 > 10.
    let r = blas.gemv(nn, 5, 4, 1.0f32, &a, 5, &short, 4, 0.0, &mut c0, 1);
    assert!(is_short(&r, "x", 13), "short x: {r:?}");
    // y with increment 3: 1 + 4·3 = 13 > 10.
    let r = blas.gemv(nn, 5, 4, 1.0f32, &a, 5, &a, 1, 0.0, &mut c_short, 3);
    assert!(is_short(&r, "y", 13), "short y: {r:?}");
    // Transposed: y has n = 4 elements, x has m = 5.
    let r = blas.gemv(
        Transpose::Yes,
        5,
        4,
        1.0f32,
        &a,
        5,
        &a,
        1,
        0.0,
        &mut c_short,
        4,
    );
    assert!(is_short(&r, "y", 13), "transposed short y: {r:?}");
    let r = blas.gemv(nn, 5, 4, 1.0f32, &short, 5, &a, 1, 0.0, &mut c0, 1);
    assert!(is_short(&r, "a", 20), "short a: {r:?}");

    // Workspace requests beyond the crate's cap.
    let r = Blas::with_workspace(stream.clone(), MAX_WORKSPACE_BYTES + 1);
    assert!(
        matches!(r, Err(Error::WorkspaceLimit { .. })),
        "{:?}",
        r.map(|_| ())
    );

    assert_untouched("c0", &stream, &c0, &before);
    assert_untouched("c1", &stream, &c1, &before);
    assert_untouched("c_short", &stream, &c_short, &short_before);
}

// ---------------------------------------------------------------------------------------------
// Contexts, threads, streams, workspace
// ---------------------------------------------------------------------------------------------

#[test]
fn buffers_of_another_context_are_rejected() {
    let Some((stream, mut blas)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(111);
    let other = other_context(blas.context());
    let other_stream = other.default_stream();
    let nn = Transpose::No;
    let host: Vec<f32> = (0..16).map(|_| rng.value()).collect();
    let before = vec![SENTINEL as f32; 16];
    let local = stream.clone_htod(&host).unwrap();
    let foreign = other_stream.clone_htod(&host).unwrap();
    let mut local_c = stream.clone_htod(&before).unwrap();
    let mut foreign_c = other_stream.clone_htod(&before).unwrap();

    let r = blas.gemm(
        nn,
        nn,
        4,
        4,
        4,
        1.0f32,
        &foreign,
        4,
        &local,
        4,
        0.0,
        &mut local_c,
        4,
    );
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "a", .. })),
        "foreign a: {r:?}"
    );
    let r = blas.gemm(
        nn,
        nn,
        4,
        4,
        4,
        1.0f32,
        &local,
        4,
        &foreign,
        4,
        0.0,
        &mut local_c,
        4,
    );
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "b", .. })),
        "foreign b: {r:?}"
    );
    let r = blas.gemm(
        nn,
        nn,
        4,
        4,
        4,
        1.0f32,
        &local,
        4,
        &local,
        4,
        0.0,
        &mut foreign_c,
        4,
    );
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "c", .. })),
        "foreign c: {r:?}"
    );
    let r = blas.matmul_row_major(
        nn,
        nn,
        4,
        4,
        4,
        1.0f32,
        &local,
        4,
        &foreign,
        4,
        0.0,
        &mut local_c,
        4,
    );
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "b", .. })),
        "row-major foreign b: {r:?}"
    );
    let r = blas.gemm_strided_batched(
        nn,
        nn,
        2,
        2,
        2,
        1.0f32,
        &local,
        2,
        4,
        &local,
        2,
        4,
        0.0,
        &mut foreign_c,
        2,
        4,
        4,
    );
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "c", .. })),
        "strided foreign c: {r:?}"
    );
    let r = blas.gemm_batched(
        nn,
        nn,
        4,
        4,
        4,
        1.0f32,
        &[&local, &foreign],
        4,
        &[&local, &local],
        4,
        0.0,
        &mut [&mut local_c],
        4,
    );
    assert!(is_invalid(&r, "gemm_batched operands"), "{r:?}");
    let mut local_c2 = stream.clone_htod(&before).unwrap();
    let r = blas.gemm_batched(
        nn,
        nn,
        4,
        4,
        4,
        1.0f32,
        &[&local, &foreign],
        4,
        &[&local, &local],
        4,
        0.0,
        &mut [&mut local_c, &mut local_c2],
        4,
    );
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "a", .. })),
        "batched foreign a: {r:?}"
    );
    let r = blas.gemv(
        nn,
        4,
        4,
        1.0f32,
        &local,
        4,
        &foreign,
        1,
        0.0,
        &mut local_c,
        1,
    );
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "x", .. })),
        "gemv foreign x: {r:?}"
    );
    assert_untouched("local c", &stream, &local_c, &before);
    assert_untouched("local c2", &stream, &local_c2, &before);
    assert_untouched("foreign c", &other_stream, &foreign_c, &before);

    // A stream of the other context cannot be bound; the handle keeps working on its own.
    let r = blas.set_stream(other_stream.clone());
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "stream", .. })),
        "set_stream: {r:?}"
    );
    assert!(Arc::ptr_eq(blas.stream(), &stream));
    let mut p = Problem::random(&mut rng, Order::Col, nn, nn, 16);
    p.beta = 0.5;
    run_gemm::<f32>(&stream, &blas, &mut rng, &p);
}

#[test]
fn blas_moves_to_another_thread_and_back() {
    assert_send::<Blas>();
    let Some((stream, blas)) = gpu() else { return };
    let worker_stream = stream.clone();
    let worker = std::thread::spawn(move || {
        let mut rng = Rng::new(121);
        let p = Problem::random(&mut rng, Order::Row, Transpose::Yes, Transpose::No, 32);
        run_gemm::<bf16>(&worker_stream, &blas, &mut rng, &p);
        blas
    });
    let blas = worker.join().unwrap();
    let mut rng = Rng::new(122);
    let p = Problem::random(&mut rng, Order::Col, Transpose::No, Transpose::Yes, 32);
    run_gemm::<f32>(&stream, &blas, &mut rng, &p);
    assert!(format!("{blas:?}").contains("Blas"));
}

#[test]
fn stream_and_workspace_changes() {
    let Some((stream, mut blas)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(131);
    assert_eq!(
        blas.workspace_size(),
        cudnn_safe::blas::DEFAULT_BLAS_WORKSPACE_BYTES
    );
    assert!(!blas.as_raw().is_null());

    // Another stream of the same context: inputs were made on the default stream.
    let second = blas.context().new_stream().unwrap();
    blas.set_stream(second.clone()).unwrap();
    assert!(Arc::ptr_eq(blas.stream(), &second));
    for _ in 0..2 {
        let mut p = Problem::random(&mut rng, Order::Col, Transpose::Yes, Transpose::No, 64);
        p.beta = rng.factor();
        run_gemm::<f32>(&stream, &blas, &mut rng, &p);
        run_gemm::<bf16>(&stream, &blas, &mut rng, &p);
    }

    // No workspace, then a small one, then back on the default stream.
    for bytes in [0usize, 1 << 20] {
        blas.set_workspace_size(bytes).unwrap();
        assert_eq!(blas.workspace_size(), bytes);
        let mut p = Problem::random(&mut rng, Order::Row, Transpose::No, Transpose::No, 96);
        p.beta = rng.factor();
        run_gemm::<f16>(&stream, &blas, &mut rng, &p);
        run_gemm::<f64>(&stream, &blas, &mut rng, &p);
    }
    blas.set_stream(stream.clone()).unwrap();
    assert_eq!(blas.workspace_size(), 1 << 20);
    let mut p = Problem::random(&mut rng, Order::Col, Transpose::No, Transpose::No, 64);
    p.batch = Some(3);
    run_gemm::<f32>(&stream, &blas, &mut rng, &p);

    // A handle made with an explicit workspace.
    let small = Blas::with_workspace(stream.clone(), 4 << 20).unwrap();
    assert_eq!(small.workspace_size(), 4 << 20);
    run_gemm::<bf16>(&stream, &small, &mut rng, &p);
    drop(small);
    drop(blas);
    stream.synchronize().unwrap();
}
