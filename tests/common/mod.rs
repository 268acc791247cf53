//! Helpers shared by the integration-test crates (each crate uses a subset, hence the
//! `dead_code` allowance): GPU opening with skip/fail, a seeded PRNG, poison and sentinel values,
//! per-dtype tolerances, row-major index walking, host copies and comparisons, and the
//! convolution harness ([`conv`]).
//!
//! Everything here is independent of the crate under test except [`gpu`], which opens the
//! handle the tests exercise, [`have_cudnn`], which finalizes a tiny graph, and [`graph_io`],
//! the buffers of graph-API tensors.
#![allow(dead_code)]

pub mod conv;

use std::sync::Arc;

use cudnn_safe::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudnn_safe::graph::{Graph, PointwiseMode};
use cudnn_safe::{cuda_context, sys, Cudnn, DType, DataType, Error, Layout, Scalar};

/// Whether the runner demands a GPU (`CUDNN_SAFE_REQUIRE_GPU=1`): then a test that would skip
/// fails instead.
pub fn gpu_required() -> bool {
    std::env::var("CUDNN_SAFE_REQUIRE_GPU").as_deref() == Ok("1")
}

/// Whether the runner demands the cuDNN host library (`CUDNN_SAFE_REQUIRE_LIBRARY=1`, implied by
/// `CUDNN_SAFE_REQUIRE_GPU=1`): then a test that would skip for want of it fails instead.
pub fn library_required() -> bool {
    gpu_required() || std::env::var("CUDNN_SAFE_REQUIRE_LIBRARY").as_deref() == Ok("1")
}

/// Turns a failure to open the GPU into a skip (`None`), or a panic when the GPU is required.
pub fn skip_or_fail<T>(opened: Result<T, Error>) -> Option<T> {
    match opened {
        Ok(v) => Some(v),
        Err(e) if gpu_required() => panic!("CUDNN_SAFE_REQUIRE_GPU=1 but no usable GPU: {e}"),
        Err(e) => {
            eprintln!("skipping: {e}");
            None
        }
    }
}

/// The device-0 default stream and a cuDNN handle on it, or `None` (test skipped) without a GPU.
pub fn gpu() -> Option<(Arc<CudaStream>, Cudnn)> {
    gpu_with(Cudnn::new)
}

/// The device-0 default stream and the handle `open` makes on it, or `None` (test skipped)
/// without a GPU or when `open` fails.
pub fn gpu_with<H>(
    open: impl FnOnce(Arc<CudaStream>) -> Result<H, Error>,
) -> Option<(Arc<CudaStream>, H)> {
    skip_or_fail(cuda_context(0).and_then(|ctx| {
        let stream = ctx.default_stream();
        open(stream.clone()).map(|handle| (stream, handle))
    }))
}

/// A CUDA context other than `ours`, for tests that hand a call buffers of another context:
/// device 1 if there is one, otherwise a non-primary context on device 0 (a different CUDA
/// context on the same device, `cuCtxCreate`).
pub fn other_context(ours: &CudaContext) -> Arc<CudaContext> {
    let other = if CudaContext::device_count().unwrap() >= 2 {
        CudaContext::new(1).unwrap()
    } else {
        CudaContext::new_non_primary(0, 0).unwrap()
    };
    assert!(*other != *ours);
    other
}

/// Compiles only for `Send` types.
pub fn assert_send<T: Send>() {}

/// xorshift64* PRNG: deterministic, seeded per test.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, so that neighbouring seeds give unrelated streams.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    /// Uniform integer in `lo..hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo) as u64) as i64
    }
    /// `n` values uniform in `[lo, hi)`, rounded to `T`; never all zero.
    pub fn values_in<T: DataType>(&mut self, n: usize, lo: f64, hi: f64) -> Vec<T> {
        let v: Vec<T> = (0..n).map(|_| T::from_f64(self.uniform(lo, hi))).collect();
        assert!(
            n == 0 || v.iter().any(|x| x.to_f64() != 0.0),
            "PRNG produced all zeros"
        );
        v
    }
    /// `n` values uniform in `[-2, 2]`, rounded to `T`; never all zero.
    pub fn values<T: DataType>(&mut self, n: usize) -> Vec<T> {
        self.values_in(n, -2.0, 2.0)
    }
}

/// What fills padding elements (those no logical index addresses) and outputs of rejected
/// calls; must stay as it is.
pub const SENTINEL: f64 = -999.0;

/// Whether `T` is a floating-point type.
pub fn is_float<T: DataType>() -> bool {
    matches!(T::DTYPE, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

/// What fills addressed elements the call must overwrite: NaN, or 111 for integer types.
pub fn poison<T: DataType>() -> T {
    T::from_f64(if is_float::<T>() { f64::NAN } else { 111.0 })
}

/// Relative-plus-absolute tolerance for results stored as `T` (fp32 1e-5, f64 1e-12, fp16 1e-2,
/// bf16 5e-2, exact for integers).
pub fn tol<T: DataType>() -> f64 {
    match T::DTYPE {
        DType::F32 => 1e-5,
        DType::F64 => 1e-12,
        DType::F16 => 1e-2,
        DType::BF16 => 5e-2,
        _ => 0.0,
    }
}

/// The same stored value (NaN equals NaN).
pub fn same<T: DataType>(a: T, b: T) -> bool {
    let (x, y) = (a.to_f64(), b.to_f64());
    x == y || (x.is_nan() && y.is_nan())
}

/// `v` rounded to `T`, as `f64`.
pub fn stored<T: DataType>(v: f64) -> f64 {
    T::from_f64(v).to_f64()
}

/// A scalar as cuDNN will read it for `T`, and its exact value.
pub fn scalar<T: DataType>(v: f64) -> (T::Scalar, f64) {
    let s = <T::Scalar as Scalar>::from_f64(v);
    (s, Scalar::to_f64(s))
}

/// The values as `f64`.
pub fn to_f64<T: DataType>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Calls `f` with every logical index of `dims`, in row-major order (once for rank 0).
pub fn for_each_index(dims: &[i64], mut f: impl FnMut(&[i64])) {
    if dims.contains(&0) {
        return;
    }
    let mut idx = vec![0i64; dims.len()];
    loop {
        f(&idx);
        let mut axis = dims.len();
        loop {
            if axis == 0 {
                return;
            }
            axis -= 1;
            idx[axis] += 1;
            if idx[axis] < dims[axis] {
                break;
            }
            idx[axis] = 0;
        }
    }
}

/// Offsets of every logical element of a strided tensor, in row-major logical order.
pub fn offsets(dims: &[i64], strides: &[i64]) -> Vec<usize> {
    let mut out = Vec::new();
    for_each_index(dims, |idx| {
        out.push(idx.iter().zip(strides).map(|(i, s)| i * s).sum::<i64>() as usize)
    });
    out
}

/// Offsets of every logical element of `layout`, in row-major logical order.
pub fn layout_offsets(layout: &Layout) -> Vec<usize> {
    layout.offsets().into_iter().map(|o| o as usize).collect()
}

/// Row-major linear index of `idx` in `dims`.
pub fn linear(dims: &[i64], idx: &[i64]) -> usize {
    idx.iter().zip(dims).fold(0i64, |acc, (&i, &d)| acc * d + i) as usize
}

/// Packed NCHW-order (row-major) strides of `dims`.
pub fn packed_strides(dims: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Channels-last strides of `[N, C, spatial...]` (NHWC for rank 4, NDHWC for rank 5).
pub fn channels_last_strides(dims: &[i64]) -> Vec<i64> {
    let r = dims.len();
    let mut s = vec![0i64; r];
    s[1] = 1;
    let mut acc = dims[1];
    for i in (2..r).rev() {
        s[i] = acc;
        acc *= dims[i];
    }
    s[0] = acc;
    s
}

/// A host image of a device buffer of `span` elements: logical element `i` (at `offs[i]`) gets
/// `fill(i)`, every other element [`SENTINEL`].
pub fn image<T: DataType>(span: usize, offs: &[usize], mut fill: impl FnMut(usize) -> T) -> Vec<T> {
    let mut v = vec![T::from_f64(SENTINEL); span];
    for (i, &o) in offs.iter().enumerate() {
        v[o] = fill(i);
    }
    v
}

/// Copies `dev` back after waiting for the stream.
pub fn download<T: DataType>(
    stream: &Arc<CudaStream>,
    dev: &impl cudnn_safe::DeviceBuffer<T>,
) -> Vec<T> {
    stream.synchronize().unwrap();
    stream.clone_dtoh(dev).unwrap()
}

/// `alpha·r + beta·prior`, not reading the prior when `beta == 0` (it may be NaN).
pub fn blend(alpha: f64, r: &[f64], beta: f64, prior: &[f64]) -> Vec<f64> {
    r.iter()
        .zip(prior)
        .map(|(&r, &p)| {
            if beta == 0.0 {
                alpha * r
            } else {
                alpha * r + beta * p
            }
        })
        .collect()
}

/// Checks `got` (dense, logical order) against `want` elementwise:
/// `|g - w| <= tol·(1 + |w|)` and finite; `tol == 0` means exactly.
pub fn assert_close<T: DataType>(what: &str, got: &[T], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f64();
        let ok = if tol == 0.0 {
            g == w
        } else {
            g.is_finite() && (g - w).abs() <= tol * (1.0 + w.abs())
        };
        assert!(ok, "{what}: element {i}: got {g}, want {w} (tol {tol})");
    }
}

/// Checks the addressed elements (`offs`, logical order) of a strided buffer against `want`
/// and every other element against `before` (padding must survive).
pub fn check_strided<T: DataType>(
    what: &str,
    got: &[T],
    before: &[T],
    offs: &[usize],
    want: &[f64],
    tol: f64,
) {
    assert_eq!(got.len(), before.len(), "{what}");
    assert_eq!(offs.len(), want.len(), "{what}");
    let picked: Vec<T> = offs.iter().map(|&o| got[o]).collect();
    assert_close(what, &picked, want, tol);
    assert_padding_kept(what, got, before, offs);
}

/// Every element outside `offs` must still hold what `before` held.
pub fn assert_padding_kept<T: DataType>(what: &str, got: &[T], before: &[T], offs: &[usize]) {
    let mut addressed = vec![false; got.len()];
    for &o in offs {
        addressed[o] = true;
    }
    for (p, (&g, &b)) in got.iter().zip(before).enumerate() {
        assert!(
            addressed[p] || same(g, b),
            "{what}: padding element {p} changed from {b:?} to {g:?}"
        );
    }
}

/// Waits for the stream, copies `dev` back and checks nothing changed.
pub fn assert_untouched<T: DataType>(
    what: &str,
    stream: &Arc<CudaStream>,
    dev: &CudaSlice<T>,
    before: &[T],
) {
    let got = download(stream, dev);
    assert_eq!(got.len(), before.len());
    for (p, (&g, &b)) in got.iter().zip(before).enumerate() {
        assert!(
            same(g, b),
            "{what}: element {p} changed from {b:?} to {g:?} although the call was rejected"
        );
    }
}

/// A device buffer of `n` elements filled with [`SENTINEL`], and its host image.
pub fn sentinel_buffer<T: DataType>(stream: &Arc<CudaStream>, n: usize) -> (CudaSlice<T>, Vec<T>) {
    let host = vec![T::from_f64(SENTINEL); n];
    (stream.clone_htod(&host).unwrap(), host)
}

/// A device buffer of `n` elements poisoned with NaN (or 111 for integer types).
pub fn poisoned_buffer<T: DataType>(stream: &Arc<CudaStream>, n: usize) -> CudaSlice<T> {
    stream.clone_htod(&vec![poison::<T>(); n]).unwrap()
}

/// The error a rejection test expects, as a compiler-checked variant of [`Error`]:
/// `kind!(BufferTooSmall)`.
pub type Kind = fn(&Error) -> bool;

/// A [`Kind`] matching one variant of [`Error`]: `kind!(BufferTooSmall)`.
#[macro_export]
macro_rules! kind {
    ($variant:ident) => {
        (|e: &cudnn_safe::Error| matches!(e, cudnn_safe::Error::$variant { .. }))
            as fn(&cudnn_safe::Error) -> bool
    };
}

/// The cuDNN host library, or `None` (printed as a skip) when it does not load; a panic when
/// the library is required ([`library_required`]).
pub fn lib() -> Option<&'static sys::Library> {
    match sys::library() {
        Ok(l) => Some(l),
        Err(e) if library_required() => {
            panic!("CUDNN_SAFE_REQUIRE_LIBRARY=1 but cuDNN did not load: {e}")
        }
        Err(e) => {
            eprintln!("skipping: {e}");
            None
        }
    }
}

/// Whether the cuDNN host library loads ([`lib`]: a skip or a panic when it does not).
pub fn library() -> bool {
    lib().is_some()
}

/// Whether the cuDNN library loads (host tests that finalize descriptors need it): `false`
/// (printed as a skip) when it does not, a panic when the library is required
/// ([`library_required`]).
pub fn have_cudnn() -> bool {
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let x = g.tensor_nchw("x", &[1, 1, 1, 4], DType::F32).unwrap();
    let y = g.pointwise(PointwiseMode::Relu, x, None).unwrap();
    g.mark_output(y).unwrap();
    match g.check() {
        Err(Error::Load(e)) => {
            if library_required() {
                panic!("CUDNN_SAFE_REQUIRE_LIBRARY=1 but cuDNN did not load: {e}");
            }
            eprintln!("skipping: {e}");
            false
        }
        _ => true,
    }
}

/// Device buffers of graph-API tensors in the layouts a built [`OperationGraph`] gives them:
/// values in logical row-major order at the addressed elements, [`SENTINEL`] in the gaps.
///
/// [`OperationGraph`]: cudnn_safe::graph::OperationGraph
pub mod graph_io {
    use std::sync::Arc;

    use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
    use cudnn_safe::graph::{OperationGraph, TensorId};
    use cudnn_safe::DataType;

    use super::{download, image, offsets, poison, SENTINEL};

    /// The span of `t`'s layout and the offsets of its logical elements.
    pub fn logical_offsets(og: &OperationGraph, t: TensorId) -> (usize, Vec<usize>) {
        let l = og.layout(t).unwrap().expect("a bound tensor");
        (l.span(), offsets(l.dims(), l.strides()))
    }

    /// A device buffer holding `logical` (row-major logical order) in `t`'s layout, sentinel in
    /// gaps.
    pub fn upload<T: DataType>(
        s: &Arc<CudaStream>,
        og: &OperationGraph,
        t: TensorId,
        logical: &[T],
    ) -> CudaSlice<T> {
        let (span, offs) = logical_offsets(og, t);
        assert_eq!(offs.len(), logical.len(), "`{}`", og.name(t).unwrap());
        s.clone_htod(&image(span, &offs, |i| logical[i])).unwrap()
    }

    /// An output buffer for `t`: NaN at addressed elements, sentinel in gaps.
    pub fn poisoned<T: DataType>(
        s: &Arc<CudaStream>,
        og: &OperationGraph,
        t: TensorId,
    ) -> CudaSlice<T> {
        let (span, offs) = logical_offsets(og, t);
        s.clone_htod(&image(span, &offs, |_| poison::<T>()))
            .unwrap()
    }

    /// The logical elements of an output, after checking its gaps kept the sentinel.
    pub fn fetch<T: DataType>(
        s: &Arc<CudaStream>,
        og: &OperationGraph,
        t: TensorId,
        buf: &CudaSlice<T>,
    ) -> Vec<T> {
        let host = download(s, buf);
        let (_, offs) = logical_offsets(og, t);
        let mut addressed = vec![false; host.len()];
        for &o in &offs {
            addressed[o] = true;
        }
        for (i, v) in host.iter().enumerate() {
            if !addressed[i] {
                assert_eq!(v.to_f64(), SENTINEL, "gap element {i} overwritten");
            }
        }
        offs.iter().map(|&o| host[o]).collect()
    }
}

/// Checks `g` with cuDNN ([`Graph::check`]) and also the graph read back from its JSON record
/// ([`Graph::to_json`], [`Graph::from_json`]): same signature, same record, accepted alike.
pub fn check_with_record(g: &Graph) -> Result<(), Error> {
    g.check()?;
    let line = g.to_json()?;
    let back = Graph::from_json(&line).unwrap_or_else(|e| panic!("{e}\n{line}"));
    assert_eq!(back.signature(), g.signature(), "{line}");
    assert_eq!(back.to_json()?, line);
    back.check()
}
