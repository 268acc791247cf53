//! The cuDNN handle, bound to a cudarc stream, and the checks every launch runs.
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DeviceSlice};
use cudnn_safe_sys as sys;
use cudnn_safe_sys::Library;

use crate::error::{Error, Result};
use crate::raw;
use crate::tensor::Layout;

/// Opens CUDA device `ordinal` (its primary context), or returns an error when there is no
/// NVIDIA driver or no such device.
///
/// cudarc's `CudaContext::new` panics when `libcuda.so` is missing; this checks for the driver
/// library first and returns [`Error::NoDriver`] instead.
pub fn cuda_context(ordinal: usize) -> Result<Arc<CudaContext>> {
    if !driver_present() {
        return Err(Error::NoDriver);
    }
    CudaContext::new(ordinal).map_err(|e| Error::driver("opening the CUDA device", e))
}

/// Whether cudarc can reach the CUDA driver library.
#[cfg(not(feature = "cudarc-dynamic-linking"))]
pub(crate) fn driver_present() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library by its usual names and
    // closes it again; the NVIDIA driver library's initialisers are sound to run.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether cudarc can reach the CUDA driver library: always, when it is linked (a process
/// without it does not start).
#[cfg(feature = "cudarc-dynamic-linking")]
pub(crate) fn driver_present() -> bool {
    true
}

/// A cuDNN library handle (`cudnnHandle_t`) bound to one CUDA stream.
///
/// Every operation is enqueued on that stream. cuDNN forbids using one handle from two threads
/// at once, so `Cudnn` is `Send` (move it to another thread) but not `Sync`; changing its stream
/// takes `&mut self`.
///
/// ```no_run
/// # fn main() -> cudnn_safe::Result<()> {
/// let ctx = cudnn_safe::cuda_context(0)?;
/// let cudnn = cudnn_safe::Cudnn::new(ctx.default_stream())?;
/// println!("cuDNN {}", cudnn_safe::format_version(cudnn.version()));
/// # Ok(()) }
/// ```
pub struct Cudnn {
    /// The raw handle, shared with the graphs and plans built on it (they keep it alive, so its
    /// address cannot be handed to another handle while one of them lives).
    inner: Arc<HandleInner>,
    stream: Arc<CudaStream>,
    /// Recent workspace-size answers keyed by (direction, algorithm, descriptor ids), so a launch
    /// can check its workspace without asking cuDNN again. Ids are never reused and descriptors
    /// are immutable, so an entry can never describe another problem. `Cudnn` is not `Sync`,
    /// hence a plain `RefCell`.
    ws_memo: std::cell::RefCell<WorkspaceMemo>,
    /// The crate's own kernels (`fast.rs`), JIT-loaded on this handle's context by the first
    /// launch that can use one, or the remembered failure to load them. Dropped after
    /// `cudnnDestroy`, which synchronizes the device, so no kernel of the module still runs.
    pub(crate) fast: crate::fast::KernelCache,
}

/// Source of [`Cudnn::id`]: starts at 1, never reused in a process.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The `cudnnHandle_t` itself, destroyed when the last owner lets go: the [`Cudnn`] and every
/// graph or plan built on it (cuDNN's descriptors of those refer to the handle).
pub(crate) struct HandleInner {
    raw: NonNull<sys::cudnnContext>,
    lib: &'static Library,
    /// Kept so the handle is destroyed with its context current, and outlives nothing it needs.
    ctx: Arc<CudaContext>,
    id: u64,
}

// SAFETY: `HandleInner` is the raw handle plus immutable data. The handle is used only through a
// `Cudnn` (which is not `Sync`, so by one thread at a time) and destroyed once, by `Drop`, when
// no `Cudnn`, graph or plan refers to it any more — so no other thread can be using it then.
unsafe impl Send for HandleInner {}
// SAFETY: shared references to `HandleInner` expose only its id (and, inside the crate, the raw
// pointer, which is passed to cuDNN only through the owning `Cudnn`, see above).
unsafe impl Sync for HandleInner {}

impl HandleInner {
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for HandleInner {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind_to_thread() {
            log::warn!("dropping a cuDNN handle: binding its context: {e}");
        }
        // SAFETY: the handle was created by cudnnCreate and is destroyed exactly once, here,
        // when its last owner is gone (no `Cudnn`, graph or plan can use it afterwards); work
        // already enqueued keeps running (cudnnDestroy synchronizes as needed).
        if let Err(e) = unsafe { raw::cudnnDestroy(self.lib, self.raw.as_ptr()) } {
            log::warn!("cudnnDestroy: {e}");
        }
    }
}

/// A small most-recently-used list of workspace sizes.
#[derive(Default)]
pub(crate) struct WorkspaceMemo {
    entries: std::collections::VecDeque<([u64; 5], usize)>,
}

impl WorkspaceMemo {
    const CAPACITY: usize = 32;
    pub(crate) fn get(&self, key: &[u64; 5]) -> Option<usize> {
        self.entries.iter().find(|(k, _)| k == key).map(|&(_, v)| v)
    }
    pub(crate) fn put(&mut self, key: [u64; 5], bytes: usize) {
        if self.entries.len() == Self::CAPACITY {
            self.entries.pop_back();
        }
        self.entries.push_front((key, bytes));
    }
}

// SAFETY: a cuDNN handle may be used from any thread as long as no two threads use it at the
// same time (NVIDIA's rule); `Cudnn` is not `Sync`, so moving it is the only way to share it,
// and every call binds the handle's CUDA context to the calling thread first.
unsafe impl Send for Cudnn {}

impl fmt::Debug for Cudnn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cudnn")
            .field("id", &self.inner.id)
            .field("device", &self.stream.context().ordinal())
            .field("library", &self.inner.lib.origin())
            .finish()
    }
}

impl Cudnn {
    /// Loads cuDNN (if not yet loaded), creates a handle on the stream's context and binds it to
    /// the stream.
    ///
    /// Without a GPU this returns the `CUDNN_STATUS_NOT_INITIALIZED` error from `cudnnCreate`;
    /// without cuDNN, [`Error::Load`] listing what was searched.
    #[doc(alias = "cudnnCreate")]
    #[doc(alias = "cudnnSetStream")]
    pub fn new(stream: Arc<CudaStream>) -> Result<Self> {
        let lib = raw::lib()?;
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| Error::driver("binding the CUDA context", e))?;
        let mut h: sys::cudnnHandle_t = std::ptr::null_mut();
        // SAFETY: `h` is a valid out-pointer; the stream's context is current on this thread.
        unsafe { raw::cudnnCreate(lib, &mut h) }?;
        let raw = NonNull::new(h).ok_or(Error::Cudnn {
            status: crate::Status::NOT_INITIALIZED,
            function: "cudnnCreate",
            message: "returned a null handle".into(),
        })?;
        let handle = Cudnn {
            inner: Arc::new(HandleInner {
                raw,
                lib,
                ctx: stream.context().clone(),
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            }),
            stream,
            ws_memo: Default::default(),
            fast: Default::default(),
        };
        // SAFETY: live handle; the stream belongs to the context the handle was created on and
        // outlives the handle's use of it (we hold an Arc to it).
        unsafe { raw::cudnnSetStream(lib, handle.as_raw(), handle.cu_stream()) }?;
        Ok(handle)
    }

    fn cu_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream().cast()
    }

    /// Moves the handle to another stream of the same CUDA context.
    #[doc(alias = "cudnnSetStream")]
    pub fn set_stream(&mut self, stream: Arc<CudaStream>) -> Result<()> {
        same_context("stream", self.stream.context(), stream.context())?;
        self.bind()?;
        // SAFETY: live handle; same context, checked above; we keep the Arc to the stream.
        unsafe { raw::cudnnSetStream(self.lib(), self.as_raw(), stream.cu_stream().cast()) }?;
        self.stream = stream;
        Ok(())
    }

    /// The stream operations are enqueued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// The CUDA context the handle was created on.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }
    /// `cudnnGetVersion()` of the loaded library (e.g. `91400`).
    pub fn version(&self) -> usize {
        self.inner.lib.version()
    }
    /// Where the library was loaded from.
    pub fn library_origin(&self) -> &str {
        self.inner.lib.origin()
    }
    /// The raw handle, for cuDNN functions this crate does not wrap. It stays owned by `self`
    /// (and by the graphs and plans built on it).
    pub fn as_raw(&self) -> sys::cudnnHandle_t {
        self.inner.raw.as_ptr()
    }

    /// This handle's identity: unique in the process, never reused (unlike the address of the
    /// raw handle, which cuDNN may hand to a later handle). Graphs, plans, plan-cache entries and
    /// the autotuner's held plans remember it, and refuse a handle with another id.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The shared raw handle, for objects that must keep it alive (graphs and plans).
    pub(crate) fn inner(&self) -> &Arc<HandleInner> {
        &self.inner
    }

    pub(crate) fn lib(&self) -> &'static Library {
        self.inner.lib
    }

    pub(crate) fn ws_memo(&self) -> &std::cell::RefCell<WorkspaceMemo> {
        &self.ws_memo
    }

    /// Makes the handle's context current on this thread (the handle may have moved threads).
    pub(crate) fn bind(&self) -> Result<()> {
        self.context()
            .bind_to_thread()
            .map_err(|e| Error::driver("binding the CUDA context", e))
    }

    /// Checks that `buf` lives on this handle's context and holds at least `required` elements.
    pub(crate) fn check_buffer<T, B: DeviceSlice<T> + ?Sized>(
        &self,
        name: &'static str,
        buf: &B,
        required: usize,
    ) -> Result<()> {
        check_buffer_on(self.context(), name, buf, required)
    }

    /// [`Self::check_buffer`] against a layout's span, plus the no-overlap rule for outputs.
    pub(crate) fn check_tensor<T, B: DeviceSlice<T> + ?Sized>(
        &self,
        name: &'static str,
        layout: &Layout,
        buf: &B,
        output: bool,
    ) -> Result<()> {
        if output {
            layout.check_output(name)?;
        }
        self.check_buffer(name, buf, layout.span())
    }
}

impl Drop for Cudnn {
    fn drop(&mut self) {
        // Graphs and plans built on this handle may keep the raw handle alive after this value
        // (and its stream) are gone; leave it on the default stream, which never dangles.
        if let Err(e) = self.bind() {
            log::warn!("dropping a cuDNN handle: {e}");
        }
        // SAFETY: live handle (we own a reference to it); the null stream is CUDA's legacy
        // default stream of the handle's context, always valid.
        let reset = unsafe { raw::cudnnSetStream(self.lib(), self.as_raw(), std::ptr::null_mut()) };
        if let Err(e) = reset {
            log::warn!("dropping a cuDNN handle: cudnnSetStream: {e}");
        }
        // The crate's own kernels (`fast`) are unloaded with this value: the work launched from
        // them must be done first. (The raw handle itself goes with its last owner.)
        if self.fast.is_loaded() {
            if let Err(e) = self.context().synchronize() {
                log::warn!("dropping a cuDNN handle: synchronizing before unloading kernels: {e}");
            }
        }
    }
}

/// Errors unless `buf` (called `name`) lives on `ctx` and holds at least `required` elements:
/// the check every launch makes of its buffers, for any handle bound to `ctx`.
pub(crate) fn check_buffer_on<T, B: DeviceSlice<T> + ?Sized>(
    ctx: &CudaContext,
    name: &'static str,
    buf: &B,
    required: usize,
) -> Result<()> {
    same_context(name, ctx, buf.stream().context())?;
    if buf.len() < required {
        return Err(Error::BufferTooSmall {
            name,
            len: buf.len(),
            required,
        });
    }
    Ok(())
}

/// Errors unless `found` (the context of the thing called `name`) is `expected` (the handle's):
/// memory or state of another context would be a wild pointer for a launch on this one.
pub(crate) fn same_context(
    name: &'static str,
    expected: &CudaContext,
    found: &CudaContext,
) -> Result<()> {
    if *found != *expected {
        return Err(Error::ForeignContext {
            name,
            expected: expected.ordinal(),
            found: found.ordinal(),
        });
    }
    Ok(())
}
