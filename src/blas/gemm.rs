//! cuBLAS GEMM family: [`Blas`], a cuBLAS handle bound to a stream, with checked GEMM (plain,
//! strided-batched, pointer-array batched), GEMV, and a row-major layer.
//!
//! Every launch checks first, in checked `i64` arithmetic, and returns an error before anything
//! is enqueued: dimensions are non-negative and fit cuBLAS's 32-bit `int`; each leading dimension
//! covers its matrix's stored rows (column-major) or columns (row-major); each buffer lives on the
//! handle's CUDA context and holds the span its matrix (or batch of matrices) addresses; batched
//! outputs do not overlap one another.
use std::ffi::{c_int, c_longlong, c_void};
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::cublas::{result, sys};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice};

use super::{cublas_error, require_cublas};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::error::{Error, Result};
use crate::workspace::MAX_WORKSPACE_BYTES;

/// Workspace a [`Blas`] handle owns unless told otherwise: 32 MiB, what NVIDIA recommends for
/// Hopper (4 MiB suffices on older GPUs).
pub const DEFAULT_BLAS_WORKSPACE_BYTES: usize = 32 << 20;

// ---------------------------------------------------------------------------------------------
// Enums and the element-type trait
// ---------------------------------------------------------------------------------------------

/// Whether an operand is used as stored or transposed (`cublasOperation_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[doc(alias = "cublasOperation_t")]
pub enum Transpose {
    /// `CUBLAS_OP_N`: the operand as stored.
    #[default]
    No,
    /// `CUBLAS_OP_T`: the operand transposed.
    Yes,
}

impl Transpose {
    fn raw(self) -> sys::cublasOperation_t {
        match self {
            Transpose::No => sys::cublasOperation_t::CUBLAS_OP_N,
            Transpose::Yes => sys::cublasOperation_t::CUBLAS_OP_T,
        }
    }

    /// The other value.
    #[must_use]
    pub fn flip(self) -> Transpose {
        match self {
            Transpose::No => Transpose::Yes,
            Transpose::Yes => Transpose::No,
        }
    }

    /// `(rows, cols)` of the stored operand whose `op` is `rows_op × cols_op`.
    fn stored(self, rows_op: i64, cols_op: i64) -> (i64, i64) {
        match self {
            Transpose::No => (rows_op, cols_op),
            Transpose::Yes => (cols_op, rows_op),
        }
    }
}

/// The precision a [`Blas`] handle computes in (`cublasSetMathMode`, and the compute type passed
/// to `cublasGemmEx`).
///
/// | mode | f32 | f16, bf16 | f64 |
/// |---|---|---|---|
/// | `Default` | `CUBLAS_COMPUTE_32F`: full f32, never TF32 | f32 accumulation (`COMPUTE_32F`) | `COMPUTE_64F` |
/// | `Tf32` | `CUBLAS_COMPUTE_32F_FAST_TF32`: inputs rounded to TF32 (10-bit mantissa) on tensor cores, f32 accumulation | as `Default` | as `Default` |
/// | `Pedantic` | `COMPUTE_32F_PEDANTIC` | `COMPUTE_32F_PEDANTIC` | `COMPUTE_64F_PEDANTIC` |
///
/// `CUBLAS_DEFAULT_MATH` only uses compute paths with at least the requested precision, so f32
/// GEMMs are never done in TF32 unless [`BlasMath::Tf32`] is chosen; conversely
/// `NVIDIA_TF32_OVERRIDE=0` in the environment makes cuBLAS ignore a TF32 request (results are
/// then full f32). In `Default` and `Tf32` mode, cuBLAS may reduce split-K partial sums of f16
/// and bf16 outputs in the output type ("reduced-precision reduction", as PyTorch allows by
/// default); `Pedantic` uses the prescribed precision everywhere and is slower.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
#[doc(alias = "cublasMath_t")]
#[doc(alias = "cublasSetMathMode")]
pub enum BlasMath {
    /// `CUBLAS_DEFAULT_MATH`: fastest mode that keeps at least the requested precision.
    #[default]
    Default,
    /// `CUBLAS_TF32_TENSOR_OP_MATH`: f32 GEMMs on TF32 tensor cores (about 1e-3 relative error).
    Tf32,
    /// `CUBLAS_PEDANTIC_MATH`: prescribed precision, no reduced-precision shortcuts.
    Pedantic,
}

impl BlasMath {
    fn raw(self) -> sys::cublasMath_t {
        match self {
            BlasMath::Default => sys::cublasMath_t::CUBLAS_DEFAULT_MATH,
            BlasMath::Tf32 => sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
            BlasMath::Pedantic => sys::cublasMath_t::CUBLAS_PEDANTIC_MATH,
        }
    }
}

mod sealed {
    use super::BlasMath;
    use cudarc::cublas::{result, sys};
    use std::ffi::c_int;

    /// What cuBLAS needs to know about an element type; private, so that [`super::GemmType`]
    /// stays sealed and no `sys` type reaches the public API.
    pub trait Sealed: crate::dtype::DataType {
        /// `cudaDataType` of A, B and C.
        const CUDA_TYPE: sys::cudaDataType;
        /// The compute type for `cublasGemmEx` under a math mode. Its scale type is `f64` for
        /// the f64 compute types and `f32` for the f32 ones, which is `Self::Scalar`.
        fn compute_type(math: BlasMath) -> sys::cublasComputeType_t;

        /// cuBLAS's own GEMV for this type (`cublasSgemv`, `cublasDgemv`), or `None` where there
        /// is none (half types go through `cublasGemmEx`).
        ///
        /// # Safety
        ///
        /// `handle` is live with its context current; `a`, `x`, `y` are device addresses on that
        /// context holding the spans the arguments address; `alpha`, `beta` point to host values.
        #[allow(clippy::too_many_arguments)]
        unsafe fn native_gemv(
            _handle: sys::cublasHandle_t,
            _trans: sys::cublasOperation_t,
            _m: c_int,
            _n: c_int,
            _alpha: *const Self::Scalar,
            _a: u64,
            _lda: c_int,
            _x: u64,
            _incx: c_int,
            _beta: *const Self::Scalar,
            _y: u64,
            _incy: c_int,
        ) -> Option<Result<(), result::CublasError>> {
            None
        }
    }

    impl Sealed for f32 {
        const CUDA_TYPE: sys::cudaDataType = sys::cudaDataType::CUDA_R_32F;
        fn compute_type(math: BlasMath) -> sys::cublasComputeType_t {
            match math {
                BlasMath::Default => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                BlasMath::Tf32 => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
                BlasMath::Pedantic => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC,
            }
        }
        unsafe fn native_gemv(
            handle: sys::cublasHandle_t,
            trans: sys::cublasOperation_t,
            m: c_int,
            n: c_int,
            alpha: *const f32,
            a: u64,
            lda: c_int,
            x: u64,
            incx: c_int,
            beta: *const f32,
            y: u64,
            incy: c_int,
        ) -> Option<Result<(), result::CublasError>> {
            // SAFETY: the caller's contract (see the trait method).
            Some(unsafe {
                result::sgemv(
                    handle,
                    trans,
                    m,
                    n,
                    alpha,
                    a as *const f32,
                    lda,
                    x as *const f32,
                    incx,
                    beta,
                    y as *mut f32,
                    incy,
                )
            })
        }
    }

    impl Sealed for f64 {
        const CUDA_TYPE: sys::cudaDataType = sys::cudaDataType::CUDA_R_64F;
        fn compute_type(math: BlasMath) -> sys::cublasComputeType_t {
            match math {
                BlasMath::Default | BlasMath::Tf32 => sys::cublasComputeType_t::CUBLAS_COMPUTE_64F,
                BlasMath::Pedantic => sys::cublasComputeType_t::CUBLAS_COMPUTE_64F_PEDANTIC,
            }
        }
        unsafe fn native_gemv(
            handle: sys::cublasHandle_t,
            trans: sys::cublasOperation_t,
            m: c_int,
            n: c_int,
            alpha: *const f64,
            a: u64,
            lda: c_int,
            x: u64,
            incx: c_int,
            beta: *const f64,
            y: u64,
            incy: c_int,
        ) -> Option<Result<(), result::CublasError>> {
            // SAFETY: the caller's contract (see the trait method).
            Some(unsafe {
                result::dgemv(
                    handle,
                    trans,
                    m,
                    n,
                    alpha,
                    a as *const f64,
                    lda,
                    x as *const f64,
                    incx,
                    beta,
                    y as *mut f64,
                    incy,
                )
            })
        }
    }

    fn half_compute(math: BlasMath) -> sys::cublasComputeType_t {
        match math {
            BlasMath::Default | BlasMath::Tf32 => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            BlasMath::Pedantic => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC,
        }
    }

    impl Sealed for half::f16 {
        const CUDA_TYPE: sys::cudaDataType = sys::cudaDataType::CUDA_R_16F;
        fn compute_type(math: BlasMath) -> sys::cublasComputeType_t {
            half_compute(math)
        }
    }

    impl Sealed for half::bf16 {
        const CUDA_TYPE: sys::cudaDataType = sys::cudaDataType::CUDA_R_16BF;
        fn compute_type(math: BlasMath) -> sys::cublasComputeType_t {
            half_compute(math)
        }
    }
}

/// An element type cuBLAS multiplies: `f32`, `f64`, [`half::f16`] and [`half::bf16`]. Sealed.
///
/// A, B and C share the type; f16 and bf16 accumulate in f32. alpha and beta are
/// [`DataType::Scalar`](crate::DataType::Scalar): `f64` for `f64`, `f32` for the others (half types included), the type
/// cuBLAS reads for the compute type this crate picks.
pub trait GemmType: sealed::Sealed {}
impl GemmType for f32 {}
impl GemmType for f64 {}
impl GemmType for half::f16 {}
impl GemmType for half::bf16 {}

// ---------------------------------------------------------------------------------------------
// Argument checks (pure functions; nothing here touches the GPU)
// ---------------------------------------------------------------------------------------------

/// How a matrix is laid out in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// BLAS convention: element (i, j) at `i + j·ld`.
    Col,
    /// C convention: element (i, j) at `i·ld + j`.
    Row,
}

/// A dimension: non-negative and within cuBLAS's 32-bit `int`.
fn dim(what: &'static str, v: i64) -> Result<c_int> {
    if v < 0 {
        return Err(Error::invalid(what, "a dimension ≥ 0", v));
    }
    c_int::try_from(v).map_err(|_| Error::Overflow {
        what,
        detail: format!("{v} does not fit cuBLAS's 32-bit int (max {})", c_int::MAX),
    })
}

fn overflow(what: &'static str, detail: String) -> Error {
    Error::Overflow { what, detail }
}

/// A stored matrix operand: its stored shape, leading dimension and span.
#[derive(Debug, Clone, Copy)]
struct Mat {
    name: &'static str,
    rows: i64,
    cols: i64,
    ld: c_int,
    order: Order,
    /// Elements from the first addressed to the last, plus one (0 for an empty matrix).
    span: i64,
}

impl Mat {
    /// Checks `ld` against the stored `rows × cols` matrix (which `dim` already checked).
    fn new(
        name: &'static str,
        ld_name: &'static str,
        rows: i64,
        cols: i64,
        ld: i64,
        order: Order,
    ) -> Result<Mat> {
        let (inner, outer, word) = match order {
            Order::Col => (rows, cols, "row count (column-major)"),
            Order::Row => (cols, rows, "column count (row-major)"),
        };
        let min = inner.max(1);
        if ld < min {
            return Err(Error::invalid(
                ld_name,
                format!("≥ {min}: `{name}` is stored as {rows}×{cols}, so {ld_name} must cover its {word}"),
                ld,
            ));
        }
        let ld_c = c_int::try_from(ld).map_err(|_| {
            overflow(
                ld_name,
                format!("{ld} does not fit cuBLAS's 32-bit int (max {})", c_int::MAX),
            )
        })?;
        let span = if rows == 0 || cols == 0 {
            0
        } else {
            (outer - 1)
                .checked_mul(ld)
                .and_then(|v| v.checked_add(inner))
                .ok_or_else(|| {
                    overflow(
                        name,
                        format!("span of a {rows}×{cols} matrix with {ld_name} {ld}"),
                    )
                })?
        };
        Ok(Mat {
            name,
            rows,
            cols,
            ld: ld_c,
            order,
            span,
        })
    }

    /// Elements `batch` matrices `stride` apart address: `stride·(batch − 1) + span`.
    fn batched_span(&self, stride_name: &'static str, stride: i64, batch: i64) -> Result<i64> {
        if stride < 0 {
            return Err(Error::invalid(stride_name, "a stride ≥ 0", stride));
        }
        if batch == 0 || self.span == 0 {
            return Ok(0);
        }
        (batch - 1)
            .checked_mul(stride)
            .and_then(|v| v.checked_add(self.span))
            .ok_or_else(|| {
                overflow(
                    self.name,
                    format!("span of {batch} matrices {stride_name} {stride} apart"),
                )
            })
    }

    /// The output rule for a strided batch: matrix `i + 1` starts after matrix `i` ends.
    fn check_output_stride(&self, stride: i64, batch: i64) -> Result<()> {
        if batch <= 1 || self.span == 0 || stride >= self.span {
            return Ok(());
        }
        let (outer, inner) = match self.order {
            Order::Col => (self.cols, self.rows),
            Order::Row => (self.rows, self.cols),
        };
        Err(Error::OverlappingOutput {
            name: self.name,
            dims: vec![batch, outer, inner],
            strides: vec![stride, self.ld as i64, 1],
        })
    }
}

/// A span (already non-negative) as a buffer length.
fn span_len(name: &'static str, span: i64) -> Result<usize> {
    usize::try_from(span).map_err(|_| overflow(name, format!("span {span} elements")))
}

/// The arguments of one column-major `cublasGemmEx`-family call, checked and narrowed.
#[derive(Debug, Clone, Copy)]
struct ColCall {
    transa: sys::cublasOperation_t,
    transb: sys::cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    lda: c_int,
    ldb: c_int,
    ldc: c_int,
    /// Row-major problem: the caller's `b` is cuBLAS's first operand and `a` its second.
    swapped: bool,
}

/// A checked GEMM problem, in the caller's layout.
#[derive(Debug, Clone, Copy)]
struct GemmShape {
    a: Mat,
    b: Mat,
    c: Mat,
    call: ColCall,
    empty: bool,
}

impl GemmShape {
    #[allow(clippy::too_many_arguments)]
    fn new(
        order: Order,
        transa: Transpose,
        transb: Transpose,
        m: i64,
        n: i64,
        k: i64,
        lda: i64,
        ldb: i64,
        ldc: i64,
    ) -> Result<GemmShape> {
        let (mc, nc, kc) = (dim("m", m)?, dim("n", n)?, dim("k", k)?);
        let (ar, ac) = transa.stored(m, k);
        let (br, bc) = transb.stored(k, n);
        let a = Mat::new("a", "lda", ar, ac, lda, order)?;
        let b = Mat::new("b", "ldb", br, bc, ldb, order)?;
        let c = Mat::new("c", "ldc", m, n, ldc, order)?;
        // A row-major X is the column-major Xᵀ with the same leading dimension, so
        // C = op(A)·op(B) in row-major is Cᵀ = op(B)ᵀ·op(A)ᵀ in column-major: swap the operands
        // and m with n; each operand keeps its own transpose flag.
        let call = match order {
            Order::Col => ColCall {
                transa: transa.raw(),
                transb: transb.raw(),
                m: mc,
                n: nc,
                k: kc,
                lda: a.ld,
                ldb: b.ld,
                ldc: c.ld,
                swapped: false,
            },
            Order::Row => ColCall {
                transa: transb.raw(),
                transb: transa.raw(),
                m: nc,
                n: mc,
                k: kc,
                lda: b.ld,
                ldb: a.ld,
                ldc: c.ld,
                swapped: true,
            },
        };
        Ok(GemmShape {
            a,
            b,
            c,
            call,
            empty: m == 0 || n == 0,
        })
    }
}

/// A checked GEMV problem.
#[derive(Debug, Clone, Copy)]
struct GemvShape {
    a: Mat,
    m: c_int,
    n: c_int,
    /// Elements of x and y.
    x_count: i64,
    y_count: i64,
    incx: c_int,
    incy: c_int,
    x_span: i64,
    y_span: i64,
}

fn inc(what: &'static str, v: i64) -> Result<c_int> {
    if v < 1 {
        return Err(Error::invalid(what, "an increment ≥ 1", v));
    }
    c_int::try_from(v).map_err(|_| {
        overflow(
            what,
            format!("{v} does not fit cuBLAS's 32-bit int (max {})", c_int::MAX),
        )
    })
}

/// `1 + (count − 1)·inc` elements (0 when `count` is 0).
fn vec_span(name: &'static str, count: i64, inc: c_int) -> Result<i64> {
    if count == 0 {
        return Ok(0);
    }
    (count - 1)
        .checked_mul(inc as i64)
        .and_then(|v| v.checked_add(1))
        .ok_or_else(|| overflow(name, format!("span of {count} elements {inc} apart")))
}

impl GemvShape {
    fn new(trans: Transpose, m: i64, n: i64, lda: i64, incx: i64, incy: i64) -> Result<Self> {
        let (mc, nc) = (dim("m", m)?, dim("n", n)?);
        let a = Mat::new("a", "lda", m, n, lda, Order::Col)?;
        let (incx, incy) = (inc("incx", incx)?, inc("incy", incy)?);
        let (x_count, y_count) = match trans {
            Transpose::No => (n, m),
            Transpose::Yes => (m, n),
        };
        Ok(GemvShape {
            a,
            m: mc,
            n: nc,
            x_count,
            y_count,
            incx,
            incy,
            x_span: vec_span("x", x_count, incx)?,
            y_span: vec_span("y", y_count, incy)?,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The handle
// ---------------------------------------------------------------------------------------------

/// A cuBLAS handle (`cublasHandle_t`) bound to one CUDA stream, owning its own workspace.
///
/// Every operation is enqueued on that stream and checked before launch (see the [module
/// documentation](crate::blas)). Matrices follow the BLAS convention (column-major, element
/// `(i, j)` at `i + j·ld`); the `matmul_row_major*` methods and [`Blas::linear`] take row-major
/// matrices instead.
///
/// **Threads.** A cuBLAS handle must not be used by two threads at once, so `Blas` is `Send` but
/// not `Sync`; changing the stream, workspace or math mode takes `&mut self`.
///
/// **Reproducibility.** cuBLAS picks its algorithm deterministically from the problem, the data
/// type, the math mode and the workspace it is given, and the GEMM/GEMV routines wrapped here use
/// no atomics (the atomics mode stays at its default, not allowed). The handle owns its workspace
/// (`cublasSetWorkspace`) instead of drawing from cuBLAS's default pool, which NVIDIA documents
/// as reproducible only with one stream per handle. So the same call, with the same inputs, on the
/// same handle configuration (stream, workspace size, math mode), GPU model and cuBLAS version
/// gives bitwise-identical results. Not guaranteed bitwise identical: results after
/// [`Blas::set_stream`] (NVIDIA's guarantee is per stream), across workspace sizes or math modes
/// (another algorithm or split-K factor may be chosen; [`BlasMath::Tf32`] rounds inputs), across
/// GPU models / SM counts, and across cuBLAS versions.
///
/// ```no_run
/// use cudnn_safe::blas::{Blas, Transpose};
/// # fn main() -> cudnn_safe::Result<()> {
/// let ctx = cudnn_safe::cuda_context(0)?;
/// let stream = ctx.default_stream();
/// let blas = Blas::new(stream.clone())?;
///
/// // C (2×2) = A (2×3) · B (3×2), column-major: A = [1 2 3; 4 5 6].
/// let a = stream.clone_htod(&[1.0f32, 4.0, 2.0, 5.0, 3.0, 6.0])?;
/// let b = stream.clone_htod(&[1.0f32, 0.0, 1.0, 0.0, 1.0, 0.0])?;
/// let mut c = stream.alloc_zeros::<f32>(4)?;
/// blas.gemm(Transpose::No, Transpose::No, 2, 2, 3, 1.0, &a, 2, &b, 3, 0.0, &mut c, 2)?;
/// assert_eq!(stream.clone_dtoh(&c)?, [4.0, 10.0, 2.0, 5.0]);
/// # Ok(()) }
/// ```
///
/// `Blas` is not `Sync`:
///
/// ```compile_fail
/// fn assert_sync<T: Sync>() {}
/// assert_sync::<cudnn_safe::blas::Blas>();
/// ```
pub struct Blas {
    raw: NonNull<sys::cublasContext>,
    stream: Arc<CudaStream>,
    /// The workspace cuBLAS uses on `stream` (`None`: no workspace).
    workspace: Option<CudaSlice<u8>>,
    math: BlasMath,
}

// SAFETY: a cuBLAS handle may be used from any thread as long as no two threads use it at the
// same time (NVIDIA's rule); `Blas` is not `Sync` (it holds a raw pointer), so moving it is the
// only way to share it, and every call binds the handle's CUDA context to the calling thread
// first. The workspace and the stream are cudarc types that are `Send` themselves.
unsafe impl Send for Blas {}

impl fmt::Debug for Blas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blas")
            .field("device", &self.stream.context().ordinal())
            .field("math", &self.math)
            .field("workspace_bytes", &self.workspace_size())
            .finish()
    }
}

impl Blas {
    /// Creates a cuBLAS handle on the stream's context, binds it to the stream and gives it a
    /// workspace of [`DEFAULT_BLAS_WORKSPACE_BYTES`].
    ///
    /// Without cuBLAS this returns [`Error::LibraryMissing`] (checked before cudarc touches the
    /// library, which would panic).
    #[doc(alias = "cublasCreate")]
    #[doc(alias = "cublasCreate_v2")]
    pub fn new(stream: Arc<CudaStream>) -> Result<Self> {
        Self::with_workspace(stream, DEFAULT_BLAS_WORKSPACE_BYTES)
    }

    /// [`Blas::new`] with a workspace of `bytes` (0: none; cuBLAS then runs only algorithms that
    /// need no workspace). At most [`MAX_WORKSPACE_BYTES`](crate::MAX_WORKSPACE_BYTES).
    #[doc(alias = "cublasSetWorkspace")]
    pub fn with_workspace(stream: Arc<CudaStream>, bytes: usize) -> Result<Self> {
        require_cublas()?;
        check_workspace_bytes(bytes)?;
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| Error::driver("binding the CUDA context", e))?;
        let h = result::create_handle().map_err(|e| cublas_error("cublasCreate_v2", e))?;
        let raw = NonNull::new(h).ok_or_else(|| Error::Blas {
            library: "cuBLAS",
            function: "cublasCreate_v2",
            status: "a null handle".into(),
        })?;
        // From here on, `Drop` destroys the handle if anything fails.
        let mut blas = Blas {
            raw,
            stream,
            workspace: None,
            math: BlasMath::Default,
        };
        // SAFETY: live handle created on the stream's context (current on this thread); we keep
        // the Arc to the stream for as long as the handle may use it.
        unsafe { result::set_stream(blas.as_raw(), blas.cu_stream()) }
            .map_err(|e| cublas_error("cublasSetStream_v2", e))?;
        blas.set_workspace_size(bytes)?;
        Ok(blas)
    }

    fn cu_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    /// Makes the handle's context current on this thread (the handle may have moved threads).
    fn bind(&self) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| Error::driver("binding the CUDA context", e))
    }

    /// The stream operations are enqueued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The CUDA context the handle was created on.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }

    /// The raw handle, for cuBLAS functions this crate does not wrap. It stays owned by `self`;
    /// changing its stream, workspace or math mode behind `self`'s back voids the guarantees
    /// documented on [`Blas`].
    pub fn as_raw(&self) -> sys::cublasHandle_t {
        self.raw.as_ptr()
    }

    /// The current math mode.
    pub fn math(&self) -> BlasMath {
        self.math
    }

    /// Bytes of workspace the handle owns and lends cuBLAS.
    pub fn workspace_size(&self) -> usize {
        self.workspace.as_ref().map_or(0, |w| w.len())
    }

    /// Sets the math mode (`cublasSetMathMode`), which also picks the compute type of the GEMMs
    /// (see [`BlasMath`]).
    #[doc(alias = "cublasSetMathMode")]
    pub fn set_math(&mut self, math: BlasMath) -> Result<()> {
        self.bind()?;
        // SAFETY: live handle; `math.raw()` is a value of the C enum.
        unsafe { sys::cublasSetMathMode(self.as_raw(), math.raw()) }
            .result()
            .map_err(|e| cublas_error("cublasSetMathMode", e))?;
        self.math = math;
        Ok(())
    }

    /// Moves the handle to another stream of the same CUDA context.
    ///
    /// The new stream first waits for the work already enqueued on the old one (the workspace is
    /// shared), and the handle's workspace is handed to cuBLAS again (`cublasSetStream` resets
    /// it to cuBLAS's default pool). Should that fail, the error is returned and the handle stays
    /// on the new stream with cuBLAS's default workspace pool.
    #[doc(alias = "cublasSetStream")]
    #[doc(alias = "cublasSetStream_v2")]
    pub fn set_stream(&mut self, stream: Arc<CudaStream>) -> Result<()> {
        if **stream.context() != **self.stream.context() {
            return Err(Error::ForeignContext {
                name: "stream",
                expected: self.stream.context().ordinal(),
                found: stream.context().ordinal(),
            });
        }
        self.bind()?;
        stream
            .join(&self.stream)
            .map_err(|e| Error::driver("ordering the new stream after the old one", e))?;
        // SAFETY: live handle; the stream belongs to the handle's context (checked above) and we
        // keep the Arc to it.
        unsafe { result::set_stream(self.as_raw(), stream.cu_stream() as sys::cudaStream_t) }
            .map_err(|e| cublas_error("cublasSetStream_v2", e))?;
        self.stream = stream;
        self.apply_workspace()
    }

    /// Replaces the workspace by one of `bytes` (0: none), allocated on the handle's stream.
    #[doc(alias = "cublasSetWorkspace")]
    #[doc(alias = "cublasSetWorkspace_v2")]
    pub fn set_workspace_size(&mut self, bytes: usize) -> Result<()> {
        check_workspace_bytes(bytes)?;
        self.bind()?;
        let new = if bytes == 0 {
            None
        } else {
            Some(
                self.stream
                    .alloc_zeros::<u8>(bytes)
                    .map_err(|e| Error::driver("allocating the cuBLAS workspace", e))?,
            )
        };
        let old = std::mem::replace(&mut self.workspace, new);
        match self.apply_workspace() {
            Ok(()) => {
                if let Some(old) = old {
                    self.release_after_stream(old);
                }
                Ok(())
            }
            Err(e) => {
                // cuBLAS refused the new buffer and keeps the old one: keep the old one alive
                // (the new one was never handed over and is released).
                if let Some(new) = std::mem::replace(&mut self.workspace, old) {
                    self.release_after_stream(new);
                }
                Err(e)
            }
        }
    }

    /// Drops a buffer the handle's stream may still be using: its free (stream-ordered on the
    /// stream it was allocated on) is ordered after the work enqueued on the handle's stream.
    fn release_after_stream(&self, buf: CudaSlice<u8>) {
        if buf.stream().cu_stream() != self.stream.cu_stream() {
            if let Err(e) = buf.stream().join(&self.stream) {
                log::warn!("ordering the release of a cuBLAS workspace: {e}; synchronizing");
                if let Err(e) = self.stream.synchronize() {
                    log::warn!("synchronizing before releasing a cuBLAS workspace: {e}");
                }
            }
        }
        drop(buf);
    }

    /// Hands the owned workspace (or none) to cuBLAS for the current stream.
    fn apply_workspace(&mut self) -> Result<()> {
        let raw = self.raw.as_ptr();
        let stream: &CudaStream = &self.stream;
        let (ptr, bytes, _guard) = match self.workspace.as_mut() {
            Some(w) => {
                let bytes = w.len();
                let (p, g) = w.device_ptr_mut(stream);
                (p as *mut c_void, bytes, Some(g))
            }
            None => (std::ptr::null_mut(), 0, None),
        };
        // SAFETY: live handle with its context current; `ptr` is a device allocation of `bytes`
        // bytes on the handle's context (from cuMemAlloc*, so 256-byte aligned as cuBLAS
        // requires), owned by `self` and released only after the handle stops using it
        // (`set_workspace_size`, `Drop`); or null with size 0.
        unsafe { sys::cublasSetWorkspace_v2(raw, ptr, bytes) }
            .result()
            .map_err(|e| cublas_error("cublasSetWorkspace_v2", e))
    }

    /// Checks that `buf` lives on this handle's context and holds at least `span` elements.
    fn check_buf<T>(&self, name: &'static str, buf: &impl DeviceSlice<T>, span: i64) -> Result<()> {
        let ctx = buf.stream().context();
        if **ctx != **self.stream.context() {
            return Err(Error::ForeignContext {
                name,
                expected: self.stream.context().ordinal(),
                found: ctx.ordinal(),
            });
        }
        let required = span_len(name, span)?;
        if buf.len() < required {
            return Err(Error::BufferTooSmall {
                name,
                len: buf.len(),
                required,
            });
        }
        Ok(())
    }

    // ----- GEMM -------------------------------------------------------------------------------

    /// `C = alpha·op(A)·op(B) + beta·C`, column-major (`cublasGemmEx`).
    ///
    /// `op(A)` is `m×k`: A is stored `m×k` (`transa = No`) or `k×m` (`Yes`), with
    /// `lda ≥ max(1, stored rows)`; likewise B (`k×n` or `n×k`, `ldb`) and C (`m×n`,
    /// `ldc ≥ max(1, m)`). Each buffer must hold `ld·(cols − 1) + rows` elements. With `beta = 0`
    /// C is not read (it may hold NaN). `m = 0` or `n = 0` does nothing; `k = 0` makes
    /// `C = beta·C`. f16 and bf16 accumulate in f32; f32 follows the [math mode](BlasMath).
    ///
    /// Errors (before anything is enqueued): [`Error::InvalidArgument`] for a negative
    /// dimension or a leading dimension that is too small, [`Error::Overflow`] for values beyond
    /// cuBLAS's 32-bit `int`, [`Error::ForeignContext`], [`Error::BufferTooSmall`].
    #[doc(alias = "cublasGemmEx")]
    #[doc(alias = "cublasSgemm")]
    #[doc(alias = "cublasDgemm")]
    #[doc(alias = "cublasHgemm")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn gemm<T: GemmType>(
        &self,
        transa: Transpose,
        transb: Transpose,
        m: i64,
        n: i64,
        k: i64,
        alpha: T::Scalar,
        a: &impl DeviceBuffer<T>,
        lda: i64,
        b: &impl DeviceBuffer<T>,
        ldb: i64,
        beta: T::Scalar,
        c: &mut impl DeviceBufferMut<T>,
        ldc: i64,
    ) -> Result<()> {
        let shape = GemmShape::new(Order::Col, transa, transb, m, n, k, lda, ldb, ldc)?;
        self.gemm_checked(&shape, alpha, a, b, beta, c)
    }

    /// Row-major `C = alpha·op(A)·op(B) + beta·C`: what `numpy.matmul` / `torch.matmul` compute
    /// on C-ordered arrays.
    ///
    /// C is `m×n` with rows `ldc ≥ max(1, n)` elements apart; A is `m×k` (`transa = No`) or
    /// `k×m` (`Yes`) with `lda ≥ max(1, its column count)`; B is `k×n` or `n×k` with `ldb`
    /// likewise. Each buffer must hold `ld·(rows − 1) + cols` elements. Everything else is as in
    /// [`Blas::gemm`]; the call runs as the column-major `Cᵀ = op(B)ᵀ·op(A)ᵀ`, with no copy.
    ///
    /// ```no_run
    /// use cudnn_safe::blas::{Blas, Transpose};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cudnn_safe::cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let blas = Blas::new(stream.clone())?;
    ///
    /// // C (2×2) = A (2×3) · B (3×2), all row-major.
    /// let a = stream.clone_htod(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?;
    /// let b = stream.clone_htod(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0])?;
    /// let mut c = stream.alloc_zeros::<f32>(4)?;
    /// blas.matmul_row_major(Transpose::No, Transpose::No, 2, 2, 3, 1.0, &a, 3, &b, 2, 0.0, &mut c, 2)?;
    /// assert_eq!(stream.clone_dtoh(&c)?, [4.0, 5.0, 10.0, 11.0]);
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cublasGemmEx")]
    #[doc(alias = "matmul")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn matmul_row_major<T: GemmType>(
        &self,
        transa: Transpose,
        transb: Transpose,
        m: i64,
        n: i64,
        k: i64,
        alpha: T::Scalar,
        a: &impl DeviceBuffer<T>,
        lda: i64,
        b: &impl DeviceBuffer<T>,
        ldb: i64,
        beta: T::Scalar,
        c: &mut impl DeviceBufferMut<T>,
        ldc: i64,
    ) -> Result<()> {
        let shape = GemmShape::new(Order::Row, transa, transb, m, n, k, lda, ldb, ldc)?;
        self.gemm_checked(&shape, alpha, a, b, beta, c)
    }

    /// The fully connected layer's product, row-major and contiguous: `y = x·wᵀ`, with `x`
    /// `[batch × in_features]`, `w` `[out_features × in_features]` (PyTorch's `nn.Linear`
    /// weight) and `y` `[batch × out_features]` (overwritten; it may hold NaN).
    ///
    /// ```no_run
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cudnn_safe::cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let blas = cudnn_safe::blas::Blas::new(stream.clone())?;
    /// let x = stream.clone_htod(&vec![cudnn_safe::half::bf16::ONE; 8 * 64])?;
    /// let w = stream.clone_htod(&vec![cudnn_safe::half::bf16::ONE; 32 * 64])?;
    /// let mut y = stream.alloc_zeros(8 * 32)?;
    /// blas.linear(8, 64, 32, &x, &w, &mut y)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cublasGemmEx")]
    pub fn linear<T: GemmType>(
        &self,
        batch: i64,
        in_features: i64,
        out_features: i64,
        x: &impl DeviceBuffer<T>,
        w: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        // Contiguous rows: the leading dimensions are the feature counts (at least 1, as cuBLAS
        // requires even for empty matrices).
        let mut shape = GemmShape::new(
            Order::Row,
            Transpose::No,
            Transpose::Yes,
            batch,
            out_features,
            in_features,
            in_features.max(1),
            in_features.max(1),
            out_features.max(1),
        )
        .map_err(|e| rename_linear(e, batch, in_features, out_features))?;
        // Name the operands as the caller knows them.
        shape.a.name = "x";
        shape.b.name = "w";
        shape.c.name = "y";
        let one = <T::Scalar as crate::dtype::Scalar>::from_f64(1.0);
        let zero = <T::Scalar as crate::dtype::Scalar>::from_f64(0.0);
        self.gemm_checked(&shape, one, x, w, zero, y)
    }

    fn gemm_checked<T: GemmType>(
        &self,
        shape: &GemmShape,
        alpha: T::Scalar,
        a: &impl DeviceBuffer<T>,
        b: &impl DeviceBuffer<T>,
        beta: T::Scalar,
        c: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        self.check_buf(shape.a.name, a, shape.a.span)?;
        self.check_buf(shape.b.name, b, shape.b.span)?;
        self.check_buf(shape.c.name, c, shape.c.span)?;
        if shape.empty {
            return Ok(());
        }
        self.bind()?;
        let stream: &CudaStream = &self.stream;
        let (ap, _ga) = a.device_ptr(stream);
        let (bp, _gb) = b.device_ptr(stream);
        let (cp, _gc) = c.device_ptr_mut(stream);
        let (first, second) = if shape.call.swapped {
            (bp, ap)
        } else {
            (ap, bp)
        };
        let call = &shape.call;
        // SAFETY: live handle with its context current; every dimension and leading dimension
        // was checked non-negative, within c_int and consistent with the stored shapes; a, b, c
        // live on the handle's context and hold the spans their shapes address (checked above);
        // their cudarc guards stay alive until the call is enqueued; c cannot alias a or b
        // (`&mut`); alpha/beta are host values of the scale type of `T`'s compute type; A, B, C
        // types and the compute type form a combination cuBLAS documents for cublasGemmEx.
        unsafe {
            sys::cublasGemmEx(
                self.as_raw(),
                call.transa,
                call.transb,
                call.m,
                call.n,
                call.k,
                (&alpha as *const T::Scalar).cast::<c_void>(),
                first as *const c_void,
                T::CUDA_TYPE,
                call.lda,
                second as *const c_void,
                T::CUDA_TYPE,
                call.ldb,
                (&beta as *const T::Scalar).cast::<c_void>(),
                cp as *mut c_void,
                T::CUDA_TYPE,
                call.ldc,
                T::compute_type(self.math),
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .result()
        .map_err(|e| cublas_error("cublasGemmEx", e))
    }

    // ----- strided batched --------------------------------------------------------------------

    /// `batch` independent column-major GEMMs, matrix `i` of each operand `stride` elements after
    /// matrix `i − 1` (`cublasGemmStridedBatchedEx`).
    ///
    /// Shapes and leading dimensions are as in [`Blas::gemm`]. Strides are ≥ 0 (0 reuses one
    /// input matrix for every batch); each buffer must hold `stride·(batch − 1) + span`
    /// elements; C's matrices must not overlap one another: `stride_c ≥ ldc·(n − 1) + m` unless
    /// `batch ≤ 1` (else [`Error::OverlappingOutput`]). `batch = 0` does nothing.
    #[doc(alias = "cublasGemmStridedBatchedEx")]
    #[doc(alias = "cublasSgemmStridedBatched")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn gemm_strided_batched<T: GemmType>(
        &self,
        transa: Transpose,
        transb: Transpose,
        m: i64,
        n: i64,
        k: i64,
        alpha: T::Scalar,
        a: &impl DeviceBuffer<T>,
        lda: i64,
        stride_a: i64,
        b: &impl DeviceBuffer<T>,
        ldb: i64,
        stride_b: i64,
        beta: T::Scalar,
        c: &mut impl DeviceBufferMut<T>,
        ldc: i64,
        stride_c: i64,
        batch: i64,
    ) -> Result<()> {
        let shape = GemmShape::new(Order::Col, transa, transb, m, n, k, lda, ldb, ldc)?;
        self.strided_checked(
            &shape, alpha, a, stride_a, b, stride_b, beta, c, stride_c, batch,
        )
    }

    /// Row-major [`Blas::gemm_strided_batched`]: `batch` products as in
    /// [`Blas::matmul_row_major`] (`torch.bmm` on C-ordered arrays when the strides are the
    /// matrix sizes). C's matrices must not overlap: `stride_c ≥ ldc·(m − 1) + n` unless
    /// `batch ≤ 1`.
    #[doc(alias = "cublasGemmStridedBatchedEx")]
    #[doc(alias = "bmm")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn matmul_row_major_strided_batched<T: GemmType>(
        &self,
        transa: Transpose,
        transb: Transpose,
        m: i64,
        n: i64,
        k: i64,
        alpha: T::Scalar,
        a: &impl DeviceBuffer<T>,
        lda: i64,
        stride_a: i64,
        b: &impl DeviceBuffer<T>,
        ldb: i64,
        stride_b: i64,
        beta: T::Scalar,
        c: &mut impl DeviceBufferMut<T>,
        ldc: i64,
        stride_c: i64,
        batch: i64,
    ) -> Result<()> {
        let shape = GemmShape::new(Order::Row, transa, transb, m, n, k, lda, ldb, ldc)?;
        self.strided_checked(
            &shape, alpha, a, stride_a, b, stride_b, beta, c, stride_c, batch,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn strided_checked<T: GemmType>(
        &self,
        shape: &GemmShape,
        alpha: T::Scalar,
        a: &impl DeviceBuffer<T>,
        stride_a: i64,
        b: &impl DeviceBuffer<T>,
        stride_b: i64,
        beta: T::Scalar,
        c: &mut impl DeviceBufferMut<T>,
        stride_c: i64,
        batch: i64,
    ) -> Result<()> {
        let batch_c = dim("batch", batch)?;
        let span_a = shape.a.batched_span("stride_a", stride_a, batch)?;
        let span_b = shape.b.batched_span("stride_b", stride_b, batch)?;
        let span_c = shape.c.batched_span("stride_c", stride_c, batch)?;
        shape.c.check_output_stride(stride_c, batch)?;
        self.check_buf(shape.a.name, a, span_a)?;
        self.check_buf(shape.b.name, b, span_b)?;
        self.check_buf(shape.c.name, c, span_c)?;
        if shape.empty || batch == 0 {
            return Ok(());
        }
        self.bind()?;
        let stream: &CudaStream = &self.stream;
        let (ap, _ga) = a.device_ptr(stream);
        let (bp, _gb) = b.device_ptr(stream);
        let (cp, _gc) = c.device_ptr_mut(stream);
        let ((first, stride_1), (second, stride_2)) = if shape.call.swapped {
            ((bp, stride_b), (ap, stride_a))
        } else {
            ((ap, stride_a), (bp, stride_b))
        };
        let call = &shape.call;
        // SAFETY: as in `gemm_checked`, plus: strides are ≥ 0 and every buffer holds
        // `stride·(batch − 1) + span` elements (checked), so every matrix of every batch lies
        // inside its buffer; C's matrices do not overlap (stride_c ≥ span of one C, or a single
        // batch).
        unsafe {
            sys::cublasGemmStridedBatchedEx(
                self.as_raw(),
                call.transa,
                call.transb,
                call.m,
                call.n,
                call.k,
                (&alpha as *const T::Scalar).cast::<c_void>(),
                first as *const c_void,
                T::CUDA_TYPE,
                call.lda,
                stride_1 as c_longlong,
                second as *const c_void,
                T::CUDA_TYPE,
                call.ldb,
                stride_2 as c_longlong,
                (&beta as *const T::Scalar).cast::<c_void>(),
                cp as *mut c_void,
                T::CUDA_TYPE,
                call.ldc,
                stride_c as c_longlong,
                batch_c,
                T::compute_type(self.math),
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .result()
        .map_err(|e| cublas_error("cublasGemmStridedBatchedEx", e))
    }

    // ----- pointer-array batched --------------------------------------------------------------

    /// Independent column-major GEMMs over separate buffers (`cublasGemmBatchedEx`):
    /// `c[i] = alpha·op(a[i])·op(b[i]) + beta·c[i]`, all with the same shape and leading
    /// dimensions (as in [`Blas::gemm`]).
    ///
    /// `a`, `b` and `c` have the same length (the batch). Every matrix is checked like a single
    /// GEMM's; the output matrices must not overlap one another (their device address ranges are
    /// compared). The arrays of device pointers cuBLAS reads are uploaded to a small device
    /// buffer on the handle's stream for each call.
    #[doc(alias = "cublasGemmBatchedEx")]
    #[doc(alias = "cublasSgemmBatched")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn gemm_batched<
        T: GemmType,
        A: DeviceBuffer<T>,
        B: DeviceBuffer<T>,
        C: DeviceBufferMut<T>,
    >(
        &self,
        transa: Transpose,
        transb: Transpose,
        m: i64,
        n: i64,
        k: i64,
        alpha: T::Scalar,
        a: &[&A],
        lda: i64,
        b: &[&B],
        ldb: i64,
        beta: T::Scalar,
        c: &mut [&mut C],
        ldc: i64,
    ) -> Result<()> {
        let shape = GemmShape::new(Order::Col, transa, transb, m, n, k, lda, ldb, ldc)?;
        if a.len() != c.len() || b.len() != c.len() {
            return Err(Error::invalid(
                "gemm_batched operands",
                format!("as many a and b matrices as c matrices ({})", c.len()),
                format!("{} a, {} b", a.len(), b.len()),
            ));
        }
        let len = c.len();
        let batch = dim("batch", len as i64)?;
        for x in a {
            self.check_buf("a", *x, shape.a.span)?;
        }
        for x in b {
            self.check_buf("b", *x, shape.b.span)?;
        }
        for x in c.iter() {
            self.check_buf("c", &**x, shape.c.span)?;
        }
        if shape.empty || batch == 0 {
            return Ok(());
        }
        self.bind()?;
        let stream: &CudaStream = &self.stream;
        let mut guards = Vec::with_capacity(3 * len);
        let mut ptrs: Vec<u64> = Vec::with_capacity(3 * len);
        for x in a {
            let (p, g) = x.device_ptr(stream);
            ptrs.push(p);
            guards.push(g);
        }
        for x in b {
            let (p, g) = x.device_ptr(stream);
            ptrs.push(p);
            guards.push(g);
        }
        let mut outputs = Vec::with_capacity(len);
        for x in c.iter_mut() {
            let (p, g) = x.device_ptr_mut(stream);
            ptrs.push(p);
            outputs.push(p);
            guards.push(g);
        }
        check_disjoint_outputs(
            &outputs,
            shape.c.span as u64 * std::mem::size_of::<T>() as u64,
        )?;
        let table = self
            .stream
            .clone_htod(&ptrs)
            .map_err(|e| Error::driver("uploading the gemm_batched pointer arrays", e))?;
        let (tp, _gt) = table.device_ptr(stream);
        let word = std::mem::size_of::<u64>() as u64;
        let (a_arr, b_arr, c_arr) = (tp, tp + word * len as u64, tp + 2 * word * len as u64);
        let (first, second) = if shape.call.swapped {
            (b_arr, a_arr)
        } else {
            (a_arr, b_arr)
        };
        let call = &shape.call;
        // SAFETY: as in `gemm_checked` for every matrix (each checked above against its
        // shape, on this context); the pointer table is a device buffer of 3·batch addresses on
        // the handle's stream, filled (stream-ordered) with exactly those matrices' addresses,
        // freed stream-ordered after this call; every guard (matrices and table) lives until
        // the call is enqueued; the C matrices are pairwise disjoint (checked).
        let status = unsafe {
            sys::cublasGemmBatchedEx(
                self.as_raw(),
                call.transa,
                call.transb,
                call.m,
                call.n,
                call.k,
                (&alpha as *const T::Scalar).cast::<c_void>(),
                first as *const *const c_void,
                T::CUDA_TYPE,
                call.lda,
                second as *const *const c_void,
                T::CUDA_TYPE,
                call.ldb,
                (&beta as *const T::Scalar).cast::<c_void>(),
                c_arr as *const *mut c_void,
                T::CUDA_TYPE,
                call.ldc,
                batch,
                T::compute_type(self.math),
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        drop(guards);
        status
            .result()
            .map_err(|e| cublas_error("cublasGemmBatchedEx", e))
    }

    // ----- GEMV -------------------------------------------------------------------------------

    /// `y = alpha·op(A)·x + beta·y`, column-major A stored `m×n` with `lda ≥ max(1, m)`
    /// (`cublasSgemv`, `cublasDgemv`; f16 and bf16 run as a one-row `cublasGemmEx` with f32
    /// accumulation).
    ///
    /// x has `n` elements (`m` when transposed) `incx ≥ 1` apart; y has `m` (`n` when transposed)
    /// `incy ≥ 1` apart; each buffer must hold `1 + (count − 1)·inc` elements. With `beta = 0` y
    /// is not read. `m = 0` or `n = 0` does nothing (BLAS's quick return, y untouched).
    #[doc(alias = "cublasSgemv")]
    #[doc(alias = "cublasDgemv")]
    #[doc(alias = "cublasSgemv_v2")]
    #[doc(alias = "cublasDgemv_v2")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn gemv<T: GemmType>(
        &self,
        trans: Transpose,
        m: i64,
        n: i64,
        alpha: T::Scalar,
        a: &impl DeviceBuffer<T>,
        lda: i64,
        x: &impl DeviceBuffer<T>,
        incx: i64,
        beta: T::Scalar,
        y: &mut impl DeviceBufferMut<T>,
        incy: i64,
    ) -> Result<()> {
        let s = GemvShape::new(trans, m, n, lda, incx, incy)?;
        self.check_buf("a", a, s.a.span)?;
        self.check_buf("x", x, s.x_span)?;
        self.check_buf("y", y, s.y_span)?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        self.bind()?;
        let stream: &CudaStream = &self.stream;
        let (ap, _ga) = a.device_ptr(stream);
        let (xp, _gx) = x.device_ptr(stream);
        let (yp, _gy) = y.device_ptr_mut(stream);
        // SAFETY: live handle with its context current; m, n, lda, incx, incy checked (≥ 0, ≥ 1,
        // within c_int, lda ≥ max(1, m)); a, x, y on this context holding the spans addressed
        // (checked); guards alive until enqueued; y cannot alias a or x (`&mut`); alpha/beta are
        // host values of the type cuBLAS reads.
        let native = unsafe {
            T::native_gemv(
                self.as_raw(),
                trans.raw(),
                s.m,
                s.n,
                &alpha,
                ap,
                s.a.ld,
                xp,
                s.incx,
                &beta,
                yp,
                s.incy,
            )
        };
        if let Some(status) = native {
            return status.map_err(|e| {
                cublas_error(
                    if T::DTYPE == crate::DType::F64 {
                        "cublasDgemv_v2"
                    } else {
                        "cublasSgemv_v2"
                    },
                    e,
                )
            });
        }
        // yᵀ (1×ny, ld incy) = xᵀ (1×nx, ld incx) · op(A)ᵀ: a column-major GEMM with M = 1 where
        // x and y are one-row matrices whose columns are `inc` apart.
        let (nx, ny) = (s.x_count as c_int, s.y_count as c_int);
        // SAFETY: the same buffers and checks as above, read as GEMM operands: xᵀ is 1×nx with
        // ld = incx ≥ 1 = max(1, rows) and span 1 + (nx − 1)·incx; op(A)ᵀ is nx×ny taken from
        // the stored m×n A with lda ≥ max(1, m) (transposed iff `trans` is No); yᵀ is 1×ny with
        // ld = incy and span 1 + (ny − 1)·incy. A, B, C of type T with T's compute type form a
        // combination cuBLAS documents.
        unsafe {
            sys::cublasGemmEx(
                self.as_raw(),
                sys::cublasOperation_t::CUBLAS_OP_N,
                trans.flip().raw(),
                1,
                ny,
                nx,
                (&alpha as *const T::Scalar).cast::<c_void>(),
                xp as *const c_void,
                T::CUDA_TYPE,
                s.incx,
                ap as *const c_void,
                T::CUDA_TYPE,
                s.a.ld,
                (&beta as *const T::Scalar).cast::<c_void>(),
                yp as *mut c_void,
                T::CUDA_TYPE,
                s.incy,
                T::compute_type(self.math),
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .result()
        .map_err(|e| cublas_error("cublasGemmEx", e))
    }
}

/// Errors of `linear`'s shape check speak of x, w, y and the features, not of a, b, c.
fn rename_linear(e: Error, batch: i64, in_features: i64, out_features: i64) -> Error {
    let rename = |what: &'static str| match what {
        "m" => "batch",
        "n" => "out_features",
        "k" => "in_features",
        other => other,
    };
    match e {
        Error::InvalidArgument {
            what,
            expected,
            got,
        } => Error::InvalidArgument {
            what: rename(what),
            expected,
            got,
        },
        Error::Overflow { what, detail } => Error::Overflow {
            what: rename(what),
            detail: format!(
                "{detail} (batch {batch}, in_features {in_features}, out_features {out_features})"
            ),
        },
        other => other,
    }
}

fn check_workspace_bytes(bytes: usize) -> Result<()> {
    if bytes > MAX_WORKSPACE_BYTES {
        return Err(Error::WorkspaceLimit {
            requested: bytes,
            limit: MAX_WORKSPACE_BYTES,
        });
    }
    Ok(())
}

/// Output matrices starting at `starts`, each `bytes` long, must not overlap.
fn check_disjoint_outputs(starts: &[u64], bytes: u64) -> Result<()> {
    let mut order: Vec<usize> = (0..starts.len()).collect();
    order.sort_by_key(|&i| starts[i]);
    for w in order.windows(2) {
        let (i, j) = (w[0], w[1]);
        if starts[i].saturating_add(bytes) > starts[j] {
            return Err(Error::invalid(
                "c",
                "pairwise disjoint output matrices",
                format!("c[{i}] and c[{j}] overlap"),
            ));
        }
    }
    Ok(())
}

impl Drop for Blas {
    fn drop(&mut self) {
        if let Err(e) = self.bind() {
            log::warn!("dropping a cuBLAS handle: {e}");
        }
        // SAFETY: the handle was created by cublasCreate and is destroyed exactly once;
        // cublasDestroy waits for the device (NVIDIA's documentation), so the workspace is idle
        // when it is released below.
        if let Err(e) = unsafe { result::destroy_handle(self.raw.as_ptr()) } {
            log::warn!("cublasDestroy: {e:?}");
        }
        if let Some(ws) = self.workspace.take() {
            self.release_after_stream(ws);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_invalid(r: &Result<impl fmt::Debug>, name: &str) -> bool {
        matches!(r, Err(Error::InvalidArgument { what, .. }) if *what == name)
    }

    #[test]
    fn column_major_shapes_and_spans() {
        let s =
            GemmShape::new(Order::Col, Transpose::No, Transpose::Yes, 4, 5, 3, 6, 7, 4).unwrap();
        // a stored 4×3, ld 6: 6·2 + 4; b stored 5×3 (n×k), ld 7: 7·2 + 5; c 4×5, ld 4.
        assert_eq!((s.a.rows, s.a.cols, s.a.span), (4, 3, 16));
        assert_eq!((s.b.rows, s.b.cols, s.b.span), (5, 3, 19));
        assert_eq!(s.c.span, 20);
        assert!(!s.call.swapped && !s.empty);
        assert_eq!((s.call.m, s.call.n, s.call.k), (4, 5, 3));
    }

    #[test]
    fn row_major_swaps_operands() {
        // Row-major a 4×3 (ld 3), b 3×5 (ld 5), c 4×5 (ld 5).
        let s = GemmShape::new(Order::Row, Transpose::No, Transpose::No, 4, 5, 3, 3, 5, 5).unwrap();
        assert_eq!((s.a.span, s.b.span, s.c.span), (12, 15, 20));
        assert!(s.call.swapped);
        assert_eq!((s.call.m, s.call.n, s.call.k), (5, 4, 3));
        assert_eq!((s.call.lda, s.call.ldb, s.call.ldc), (5, 3, 5));
        // ld covers columns in row-major: lda 2 < 3 columns.
        let r = GemmShape::new(Order::Row, Transpose::No, Transpose::No, 4, 5, 3, 2, 5, 5);
        assert!(is_invalid(&r, "lda"), "{r:?}");
        // Transposed row-major a is stored k×m = 3×4: lda must be ≥ 4.
        let r = GemmShape::new(Order::Row, Transpose::Yes, Transpose::No, 4, 5, 3, 3, 5, 5);
        assert!(is_invalid(&r, "lda"), "{r:?}");
    }

    #[test]
    fn leading_dimensions_and_dims_are_checked() {
        let ok = |ta, tb, lda, ldb, ldc| {
            GemmShape::new(Order::Col, ta, tb, 4, 5, 3, lda, ldb, ldc).map(|_| ())
        };
        assert!(ok(Transpose::No, Transpose::No, 4, 3, 4).is_ok());
        assert!(is_invalid(
            &ok(Transpose::No, Transpose::No, 3, 3, 4),
            "lda"
        ));
        assert!(is_invalid(
            &ok(Transpose::Yes, Transpose::No, 2, 3, 4),
            "lda"
        ));
        assert!(ok(Transpose::Yes, Transpose::No, 3, 3, 4).is_ok());
        assert!(is_invalid(
            &ok(Transpose::No, Transpose::No, 4, 2, 4),
            "ldb"
        ));
        assert!(is_invalid(
            &ok(Transpose::No, Transpose::Yes, 4, 4, 4),
            "ldb"
        ));
        assert!(is_invalid(
            &ok(Transpose::No, Transpose::No, 4, 3, 3),
            "ldc"
        ));
        // ld 0 is refused even for empty matrices.
        let r = GemmShape::new(Order::Col, Transpose::No, Transpose::No, 0, 0, 0, 0, 1, 1);
        assert!(is_invalid(&r, "lda"), "{r:?}");
        let e = GemmShape::new(Order::Col, Transpose::No, Transpose::No, 0, 5, 3, 1, 3, 1).unwrap();
        assert!(e.empty && e.a.span == 0 && e.c.span == 0);
        let r = GemmShape::new(Order::Col, Transpose::No, Transpose::No, -1, 5, 3, 4, 3, 4);
        assert!(is_invalid(&r, "m"), "{r:?}");
        let big = c_int::MAX as i64 + 1;
        let r = GemmShape::new(
            Order::Col,
            Transpose::No,
            Transpose::No,
            4,
            5,
            big,
            4,
            big,
            4,
        );
        assert!(matches!(r, Err(Error::Overflow { what: "k", .. })), "{r:?}");
        let r = GemmShape::new(Order::Col, Transpose::No, Transpose::No, 4, 5, 3, big, 3, 4);
        assert!(
            matches!(r, Err(Error::Overflow { what: "lda", .. })),
            "{r:?}"
        );
    }

    #[test]
    fn batched_spans_and_output_strides() {
        let s = GemmShape::new(Order::Col, Transpose::No, Transpose::No, 4, 5, 3, 6, 3, 4).unwrap();
        assert_eq!(s.c.span, 20);
        assert_eq!(s.c.batched_span("stride_c", 25, 3).unwrap(), 70);
        assert_eq!(s.a.batched_span("stride_a", 0, 3).unwrap(), s.a.span);
        assert_eq!(s.a.batched_span("stride_a", 7, 0).unwrap(), 0);
        assert!(is_invalid(&s.a.batched_span("stride_a", -1, 3), "stride_a"));
        assert!(matches!(
            s.c.batched_span("stride_c", i64::MAX / 2, 4),
            Err(Error::Overflow { what: "c", .. })
        ));
        assert!(s.c.check_output_stride(20, 3).is_ok());
        assert!(s.c.check_output_stride(0, 1).is_ok());
        let r = s.c.check_output_stride(19, 2);
        match r {
            Err(Error::OverlappingOutput {
                name,
                dims,
                strides,
            }) => {
                assert_eq!(name, "c");
                assert_eq!(dims, vec![2, 5, 4]);
                assert_eq!(strides, vec![19, 4, 1]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn gemv_shapes() {
        let s = GemvShape::new(Transpose::No, 4, 3, 5, 2, 3).unwrap();
        assert_eq!((s.x_count, s.y_count), (3, 4));
        assert_eq!((s.x_span, s.y_span, s.a.span), (5, 10, 14));
        let t = GemvShape::new(Transpose::Yes, 4, 3, 4, 1, 1).unwrap();
        assert_eq!((t.x_count, t.y_count, t.x_span, t.y_span), (4, 3, 4, 3));
        assert!(is_invalid(
            &GemvShape::new(Transpose::No, 4, 3, 4, 0, 1),
            "incx"
        ));
        assert!(is_invalid(
            &GemvShape::new(Transpose::No, 4, 3, 4, 1, -2),
            "incy"
        ));
        assert!(is_invalid(
            &GemvShape::new(Transpose::No, 4, 3, 3, 1, 1),
            "lda"
        ));
    }

    #[test]
    fn outputs_must_be_disjoint() {
        assert!(check_disjoint_outputs(&[0, 100, 200], 100).is_ok());
        assert!(check_disjoint_outputs(&[200, 0, 100], 100).is_ok());
        let r = check_disjoint_outputs(&[200, 0, 150], 100);
        assert!(is_invalid(&r, "c"), "{r:?}");
        let r = check_disjoint_outputs(&[64, 64], 8);
        assert!(is_invalid(&r, "c"), "{r:?}");
    }

    /// Reference BLAS `gemm` on the host, column-major, as cuBLAS defines it.
    #[allow(clippy::too_many_arguments)]
    fn host_gemm(
        ta: sys::cublasOperation_t,
        tb: sys::cublasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        a: &[f64],
        lda: c_int,
        b: &[f64],
        ldb: c_int,
        c: &mut [f64],
        ldc: c_int,
    ) {
        let n_op = sys::cublasOperation_t::CUBLAS_OP_N;
        let (lda, ldb, ldc) = (lda as usize, ldb as usize, ldc as usize);
        for j in 0..n as usize {
            for i in 0..m as usize {
                let mut s = 0.0;
                for l in 0..k as usize {
                    let av = if ta == n_op {
                        a[i + l * lda]
                    } else {
                        a[l + i * lda]
                    };
                    let bv = if tb == n_op {
                        b[l + j * ldb]
                    } else {
                        b[j + l * ldb]
                    };
                    s += av * bv;
                }
                c[i + j * ldc] = s;
            }
        }
    }

    /// Small integers, so that every sum is exact.
    fn fill(len: usize, seed: u64) -> Vec<f64> {
        (0..len as u64)
            .map(|i| ((i * 7 + seed * 13) % 11) as f64 - 5.0)
            .collect()
    }

    #[test]
    fn row_major_swap_matches_a_row_major_product() {
        for ta in [Transpose::No, Transpose::Yes] {
            for tb in [Transpose::No, Transpose::Yes] {
                let (m, n, k) = (5i64, 3i64, 4i64);
                let (ar, ac) = ta.stored(m, k);
                let (br, bc) = tb.stored(k, n);
                let (lda, ldb, ldc) = (ac + 2, bc + 1, n + 3);
                let a = fill((ar * lda) as usize, 1);
                let b = fill((br * ldb) as usize, 2);
                let s = GemmShape::new(Order::Row, ta, tb, m, n, k, lda, ldb, ldc).unwrap();
                assert_eq!(s.a.span, lda * (ar - 1) + ac);
                let mut c = vec![f64::NAN; s.c.span as usize];
                let call = s.call;
                let (first, second) = if call.swapped { (&b, &a) } else { (&a, &b) };
                host_gemm(
                    call.transa,
                    call.transb,
                    call.m,
                    call.n,
                    call.k,
                    first,
                    call.lda,
                    second,
                    call.ldb,
                    &mut c,
                    call.ldc,
                );
                for i in 0..m {
                    for j in 0..n {
                        let mut want = 0.0;
                        for l in 0..k {
                            let av = match ta {
                                Transpose::No => a[(i * lda + l) as usize],
                                Transpose::Yes => a[(l * lda + i) as usize],
                            };
                            let bv = match tb {
                                Transpose::No => b[(l * ldb + j) as usize],
                                Transpose::Yes => b[(j * ldb + l) as usize],
                            };
                            want += av * bv;
                        }
                        assert_eq!(c[(i * ldc + j) as usize], want, "{ta:?} {tb:?} ({i}, {j})");
                    }
                }
            }
        }
    }

    #[test]
    fn half_gemv_as_one_row_gemm_matches_gemv() {
        // What `gemv` passes to cublasGemmEx for f16/bf16, run through the host BLAS.
        for trans in [Transpose::No, Transpose::Yes] {
            let (m, n, lda, incx, incy) = (4i64, 3i64, 6i64, 2i64, 3i64);
            let s = GemvShape::new(trans, m, n, lda, incx, incy).unwrap();
            let a = fill(s.a.span as usize, 3);
            let x = fill(s.x_span as usize, 4);
            let mut y = vec![f64::NAN; s.y_span as usize];
            host_gemm(
                sys::cublasOperation_t::CUBLAS_OP_N,
                trans.flip().raw(),
                1,
                s.y_count as c_int,
                s.x_count as c_int,
                &x,
                s.incx,
                &a,
                s.a.ld,
                &mut y,
                s.incy,
            );
            for i in 0..s.y_count {
                let mut want = 0.0;
                for j in 0..s.x_count {
                    let av = match trans {
                        Transpose::No => a[(i + j * lda) as usize],
                        Transpose::Yes => a[(j + i * lda) as usize],
                    };
                    want += av * x[(j * incx) as usize];
                }
                assert_eq!(y[(i * incy) as usize], want, "{trans:?} y[{i}]");
            }
        }
    }

    #[test]
    fn linear_errors_name_features() {
        let e = rename_linear(Error::invalid("k", "a dimension ≥ 0", -3), 2, -3, 4);
        assert!(matches!(
            e,
            Error::InvalidArgument {
                what: "in_features",
                ..
            }
        ));
    }
}
