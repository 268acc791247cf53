//! cuBLAS GEMM family: [`Blas`], a cuBLAS handle bound to a stream, with checked GEMM (plain,
//! strided-batched, pointer-array batched), GEMV, and a row-major layer.
//!
//! Every launch checks first, in checked `i64` arithmetic, and returns an error before anything
//! is enqueued: dimensions are non-negative and fit cuBLAS's 32-bit `int`; each leading dimension
//! covers its matrix's stored rows (column-major) or columns (row-major); each buffer lives on the
//! handle's CUDA context and holds the span its matrix (or batch of matrices) addresses; batched
//! outputs do not overlap one another.

mod check;
mod launch;
mod types;

pub use types::{BlasMath, GemmType, Transpose};

use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::cublas::{result, sys};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtrMut, DeviceSlice};

use super::{check_buffer, created, cublas_error, require_cublas, same_context};
use crate::error::{Error, Result};
use crate::workspace::MAX_WORKSPACE_BYTES;
use check::span_len;

/// Workspace a [`Blas`] handle owns unless told otherwise: 32 MiB, what NVIDIA recommends for
/// Hopper (4 MiB suffices on older GPUs).
pub const DEFAULT_BLAS_WORKSPACE_BYTES: usize = 32 << 20;

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
    pub(super) raw: NonNull<sys::cublasContext>,
    pub(super) stream: Arc<CudaStream>,
    /// The workspace cuBLAS uses on `stream` (`None`: no workspace).
    pub(super) workspace: Option<CudaSlice<u8>>,
    pub(super) math: BlasMath,
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
        super::bind(&stream)?;
        let h = result::create_handle().map_err(|e| cublas_error("cublasCreate_v2", e))?;
        let raw = created(h, "cuBLAS", "cublasCreate_v2")?;
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

    pub(super) fn cu_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    /// Makes the handle's context current on this thread (the handle may have moved threads).
    pub(super) fn bind(&self) -> Result<()> {
        super::bind(&self.stream)
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
        same_context("stream", &self.stream, &stream)?;
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
    pub(super) fn release_after_stream(&self, buf: CudaSlice<u8>) {
        if buf.stream().as_ref() != self.stream.as_ref() {
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
    pub(super) fn apply_workspace(&mut self) -> Result<()> {
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
    pub(super) fn check_buf<T>(
        &self,
        name: &'static str,
        buf: &impl DeviceSlice<T>,
        span: i64,
    ) -> Result<()> {
        check_buffer(&self.stream, name, buf, span_len(name, span)?)
    }
}

pub(super) fn check_workspace_bytes(bytes: usize) -> Result<()> {
    if bytes > MAX_WORKSPACE_BYTES {
        return Err(Error::WorkspaceLimit {
            requested: bytes,
            limit: MAX_WORKSPACE_BYTES,
        });
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
