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
//! * **Setters.** As everywhere in the crate ([Conventions](crate#conventions)): plain-data
//!   descriptions ([`lt::Matmul`]) and handles take by-value `#[must_use]` setters named
//!   `with_x(v)`; handles change in place with `set_x(&mut self, v)` (fallible where cuBLAS is
//!   called); getters are `x()` or, for flags, `is_x()`.
//!
//! cuBLAS and cuBLASLt are loaded at run time by cudarc. A missing library is
//! [`Error::LibraryMissing`], never a panic: the handles check for
//! the library before cudarc first touches it.

mod gemm;
pub mod lt;

pub use gemm::{Blas, BlasMath, GemmType, Transpose, DEFAULT_BLAS_WORKSPACE_BYTES};
pub use lt::BlasLt;

use std::ffi::c_int;
use std::fmt;
use std::ptr::NonNull;

use cudarc::driver::{CudaStream, DeviceSlice};

use crate::error::{Error, Result};

/// Checks that cuBLAS can be loaded, before any cudarc cuBLAS call (cudarc panics otherwise).
pub(crate) fn require_cublas() -> Result<()> {
    #[cfg(not(feature = "cudarc-dynamic-linking"))]
    // SAFETY: only tries to dlopen the library by its usual names and closes it again; the CUDA
    // library's initialisers are sound to run.
    let found = unsafe { cudarc::cublas::sys::is_culib_present() };
    // Linked: a process without it does not start.
    #[cfg(feature = "cudarc-dynamic-linking")]
    let found = true;
    present(found, "cuBLAS", "libcublas")
}

/// Checks that cuBLASLt can be loaded, before any cudarc cuBLASLt call.
pub(crate) fn require_cublaslt() -> Result<()> {
    #[cfg(not(feature = "cudarc-dynamic-linking"))]
    // SAFETY: as in `require_cublas`.
    let found = unsafe { cudarc::cublaslt::sys::is_culib_present() };
    #[cfg(feature = "cudarc-dynamic-linking")]
    let found = true;
    present(found, "cuBLASLt", "libcublasLt")
}

fn present(found: bool, library: &'static str, searched: &'static str) -> Result<()> {
    if found {
        Ok(())
    } else {
        Err(Error::LibraryMissing { library, searched })
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
    status_error("cuBLAS", function, e.0)
}

/// Turns a cuBLASLt status into this crate's error.
pub(crate) fn cublaslt_error(
    function: &'static str,
    e: cudarc::cublaslt::result::CublasError,
) -> Error {
    status_error("cuBLASLt", function, e.0)
}

fn status_error(library: &'static str, function: &'static str, status: impl fmt::Debug) -> Error {
    Error::Blas {
        library,
        function,
        status: format!("{status:?}"),
    }
}

/// A handle `function` created, or [`Error::Blas`] when it returned null.
pub(crate) fn created<T>(
    handle: *mut T,
    library: &'static str,
    function: &'static str,
) -> Result<NonNull<T>> {
    NonNull::new(handle).ok_or_else(|| Error::Blas {
        library,
        function,
        status: "a null handle".into(),
    })
}

/// Makes `stream`'s CUDA context current on this thread: a handle may have moved threads since
/// its last call.
pub(crate) fn bind(stream: &CudaStream) -> Result<()> {
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| Error::driver("binding the CUDA context", e))
}

/// [`Error::ForeignContext`] (naming `name`) unless `other` belongs to `stream`'s context.
pub(crate) fn same_context(
    name: &'static str,
    stream: &CudaStream,
    other: &CudaStream,
) -> Result<()> {
    if **other.context() != **stream.context() {
        return Err(Error::ForeignContext {
            name,
            expected: stream.context().ordinal(),
            found: other.context().ordinal(),
        });
    }
    Ok(())
}

/// Checks that `buf` lives on `stream`'s context and holds at least `required` elements.
pub(crate) fn check_buffer<T, B: DeviceSlice<T> + ?Sized>(
    stream: &CudaStream,
    name: &'static str,
    buf: &B,
    required: usize,
) -> Result<()> {
    same_context(name, stream, buf.stream())?;
    if buf.len() < required {
        return Err(Error::BufferTooSmall {
            name,
            len: buf.len(),
            required,
        });
    }
    Ok(())
}
