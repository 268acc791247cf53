//! The element types and enums of cuBLAS calls: [`Transpose`], [`BlasMath`], [`GemmType`].
#[cfg(doc)]
use super::Blas;
use cudarc::cublas::sys;

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
    pub(super) fn raw(self) -> sys::cublasOperation_t {
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
    pub(super) fn stored(self, rows_op: i64, cols_op: i64) -> (i64, i64) {
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
    pub(super) fn raw(self) -> sys::cublasMath_t {
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
