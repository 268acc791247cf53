//! The GEMM family's launches: plain, row-major, `linear`, strided-batched, pointer-array
//! batched and GEMV.
use std::ffi::{c_longlong, c_void};

use cudarc::cublas::sys;
use cudarc::driver::{CudaStream, DevicePtr};

use super::check::{
    check_disjoint_outputs, dim, rename_linear, ColCall, GemmShape, GemvShape, Order,
};
#[cfg(doc)]
use super::BlasMath;
use super::{Blas, GemmType, Transpose};
use crate::blas::cublas_error;
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::error::{Error, Result};

impl Blas {
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

    pub(super) fn gemm_checked<T: GemmType>(
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
        // SAFETY: live handle with its context current; every dimension and leading dimension
        // was checked non-negative, within c_int and consistent with the stored shapes; a, b, c
        // live on the handle's context and hold the spans their shapes address (checked above);
        // their cudarc guards stay alive until the call is enqueued; c cannot alias a or b
        // (`&mut`).
        unsafe { self.gemm_ex::<T>(&shape.call, alpha, first, second, beta, cp) }
    }

    /// `cublasGemmEx` with the handle's compute type for `T` and the default algorithm.
    ///
    /// # Safety
    ///
    /// The handle's context is current; `call`'s dimensions and leading dimensions are within
    /// `c_int` and describe matrices at `first`, `second` and `c` (device addresses on the
    /// handle's context, each holding the span its operand addresses, kept alive until the call
    /// is enqueued); `c` overlaps neither input. alpha/beta are host values of the scale type of
    /// `T`'s compute type, and A, B, C of type `T` with that compute type form a combination
    /// cuBLAS documents for cublasGemmEx.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_ex<T: GemmType>(
        &self,
        call: &ColCall,
        alpha: T::Scalar,
        first: u64,
        second: u64,
        beta: T::Scalar,
        c: u64,
    ) -> Result<()> {
        // SAFETY: the caller's contract; the handle is live (owned by `self`).
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
                c as *mut c_void,
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
    /// elements; no element of C may belong to two of its matrices (else
    /// [`Error::OverlappingOutput`]): `stride_c ≥ ldc·(n − 1) + m` does it, and so do matrices
    /// that interleave without meeting (`ldc = batch·m`, `stride_c = m`). `batch = 0` does
    /// nothing.
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
    /// matrix sizes). No element of C may belong to two of its matrices: `stride_c ≥
    /// ldc·(m − 1) + n` does it, and so does a `[m, batch, n]` output (`ldc = batch·n`,
    /// `stride_c = n`).
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
    pub(super) fn strided_checked<T: GemmType>(
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
        // inside its buffer; no element of C belongs to two of its matrices
        // (`check_output_stride`: the strides [stride_c, ldc, 1] are non-overlapping, or a
        // single batch).
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
        // A slice's length is at most isize::MAX, so it fits i64; cuBLAS's int is checked.
        let batch = dim("batch", i64::try_from(len).unwrap_or(i64::MAX))?;
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
        // The one-row GEMM of `GemvShape::as_gemm`, with x first and A second.
        let call = s.as_gemm(trans);
        // SAFETY: the same buffers and checks as above, read as GEMM operands: xᵀ is 1×nx with
        // ld = incx ≥ 1 = max(1, rows) and span 1 + (nx − 1)·incx; op(A)ᵀ is nx×ny taken from
        // the stored m×n A with lda ≥ max(1, m) (transposed iff `trans` is No); yᵀ is 1×ny with
        // ld = incy and span 1 + (ny − 1)·incy; y cannot alias a or x (`&mut`).
        unsafe { self.gemm_ex::<T>(&call, alpha, xp, ap, beta, yp) }
    }
}
