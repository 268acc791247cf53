//! cuBLAS and cuBLASLt: checked GEMM family and fused matmul epilogues, built on cudarc's
//! bindings (`cudarc::cublas`, `cudarc::cublaslt`), in this crate's error and type conventions.
//!
//! * [`Blas`] (cuBLAS): GEMM for f32, f64, f16 and bf16 with transposes, batched and
//!   strided-batched GEMM, GEMV, and a row-major layer.
//! * [`BlasLt`] (cuBLASLt): matmul with epilogues (bias, ReLU, GELU, their combinations, bias
//!   gradient), heuristic candidates and an autotune over them, cached. Its types live in [`lt`]
//!   and are named without a prefix: [`lt::Matmul`], [`lt::Epilogue`], [`lt::Policy`],
//!   [`lt::Choice`]. The handle itself is also here, as `blas::BlasLt`, beside [`Blas`].
//!
//! # Conventions
//!
//! * **Integer types.** Matrix dimensions (`m`, `n`, `k`, `batch`, feature counts), leading
//!   dimensions, strides and increments are `i64`, as the crate's tensor and convolution
//!   dimensions are; element counts of buffers (`a_len()`, `bias_len()`, ...) and byte sizes are
//!   `usize`. Where cuBLAS or cuBLASLt takes a 32-bit `int`, the value is converted with a check:
//!   a value out of range is [`Error::Overflow`] and a negative (or, for cuBLASLt, zero) one
//!   [`Error::InvalidArgument`], each naming the argument (`"lda"`, `"k"`, `"in_features"`);
//!   nothing is truncated.
//! * **Setters.** Plain-data descriptions ([`lt::Matmul`]) and handle builders take by-value
//!   `#[must_use]` setters named `with_x(v)`; handles change in place with `set_x(&mut self, v)`
//!   (fallible where cuBLAS is called); getters are `x()` or, for flags, `is_x()`.
//!
//! cuBLAS and cuBLASLt are loaded at run time by cudarc. A missing library is
//! [`Error::LibraryMissing`], never a panic: the handles check for
//! the library before cudarc first touches it.

mod gemm;
pub mod lt;

pub use gemm::{Blas, BlasMath, GemmType, Transpose, DEFAULT_BLAS_WORKSPACE_BYTES};
pub use lt::BlasLt;

use std::ffi::c_int;

use crate::error::{Error, Result};

/// Checks that cuBLAS can be loaded, before any cudarc cuBLAS call (cudarc panics otherwise).
pub(crate) fn require_cublas() -> Result<()> {
    // SAFETY: only tries to dlopen the library by its usual names and closes it again; the CUDA
    // library's initialisers are sound to run.
    if unsafe { cudarc::cublas::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::LibraryMissing {
            library: "cuBLAS",
            searched: "libcublas",
        })
    }
}

/// Checks that cuBLASLt can be loaded, before any cudarc cuBLASLt call.
pub(crate) fn require_cublaslt() -> Result<()> {
    // SAFETY: as in `require_cublas`.
    if unsafe { cudarc::cublaslt::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::LibraryMissing {
            library: "cuBLASLt",
            searched: "libcublasLt",
        })
    }
}

/// `v` as cuBLAS's (and cuBLASLt's) 32-bit `int`, or [`Error::Overflow`] naming the argument.
pub(crate) fn to_c_int(what: &'static str, v: i64) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| Error::Overflow {
        what,
        detail: format!("{v} does not fit cuBLAS's 32-bit int (max {})", c_int::MAX),
    })
}

/// Turns a cuBLAS status into this crate's error.
pub(crate) fn cublas_error(
    function: &'static str,
    e: cudarc::cublas::result::CublasError,
) -> Error {
    Error::Blas {
        library: "cuBLAS",
        function,
        status: format!("{:?}", e.0),
    }
}

/// Turns a cuBLASLt status into this crate's error.
pub(crate) fn cublaslt_error(
    function: &'static str,
    e: cudarc::cublaslt::result::CublasError,
) -> Error {
    Error::Blas {
        library: "cuBLASLt",
        function,
        status: format!("{:?}", e.0),
    }
}
