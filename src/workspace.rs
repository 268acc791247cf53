//! Scratch device memory for cuDNN calls, grown on demand, reused, and capped.
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::error::{Error, Result};
use crate::stream_order::UseOrder;

/// Largest workspace ever allocated, whatever the limit: a request above it (1 TiB, PyTorch's
/// cap too) is treated as a failure of the query, not as an allocation to attempt.
pub const MAX_WORKSPACE_BYTES: usize = 1 << 40;

/// A growable device buffer used as cuDNN workspace.
///
/// It grows to the largest size asked of it (within its limit) and is reused afterwards; each
/// launch compares the size the algorithm asked for with what the workspace holds.
///
/// ```no_run
/// # fn main() -> cudnn_safe::Result<()> {
/// let ctx = cudnn_safe::cuda_context(0)?;
/// let mut ws = cudnn_safe::Workspace::new(ctx.default_stream()).with_limit(256 << 20);
/// ws.reserve(1 << 20)?;          // grows to 1 MiB
/// assert!(ws.reserve(512 << 20).is_err()); // over the 256 MiB limit
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Workspace {
    buf: Option<CudaSlice<u8>>,
    stream: Arc<CudaStream>,
    limit: usize,
    /// Uses on streams other than `stream` (a handle's), ordered by events of the crate's own.
    order: UseOrder,
}

impl Workspace {
    /// An empty workspace allocating on `stream`, limited to [`MAX_WORKSPACE_BYTES`].
    pub fn new(stream: Arc<CudaStream>) -> Self {
        Workspace {
            buf: None,
            stream,
            limit: MAX_WORKSPACE_BYTES,
            order: UseOrder::default(),
        }
    }

    /// Sets the most bytes this workspace may hold (PyTorch's workspace limit knob).
    #[must_use]
    pub fn with_limit(mut self, bytes: usize) -> Self {
        self.limit = bytes.min(MAX_WORKSPACE_BYTES);
        self
    }

    /// The limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes currently allocated.
    pub fn capacity(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }

    /// The stream the memory is allocated on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device address of the allocation (0 when nothing is allocated).
    pub(crate) fn address(&self) -> u64 {
        self.buf.as_ref().map_or(0, |b| {
            let (ptr, _guard) = cudarc::driver::DevicePtr::device_ptr(b, &self.stream);
            ptr
        })
    }

    /// Whether `bytes` could be granted under the limit.
    pub fn allows(&self, bytes: usize) -> bool {
        bytes <= self.limit
    }

    /// Ensures at least `bytes` are allocated: grows (dropping the old buffer) when needed,
    /// fails with [`Error::WorkspaceLimit`] above the limit.
    pub fn reserve(&mut self, bytes: usize) -> Result<()> {
        if bytes > self.limit {
            return Err(Error::WorkspaceLimit {
                requested: bytes,
                limit: self.limit,
            });
        }
        if bytes <= self.capacity() {
            return Ok(());
        }
        crate::capture::refuse_during_capture(&self.stream, "growing a workspace")?;
        // Free the old buffer first so peak memory is the new size, not old + new; its free on
        // the allocating stream waits for its last use on another stream.
        self.release();
        // SAFETY: the memory is uninitialised, which is sound for `u8` storage that is only ever
        // handed to cuDNN as scratch (cuDNN writes its workspace before reading it) and never
        // read on the host; skipping the zero-fill keeps a first call's growth cheap.
        let buf = unsafe { self.stream.alloc::<u8>(bytes) }
            .map_err(|e| Error::driver("allocating the workspace", e))?;
        log::debug!("workspace grown to {bytes} bytes");
        self.buf = Some(buf);
        Ok(())
    }

    /// Releases the memory (the next `reserve` allocates again). The free is ordered after
    /// the work already enqueued with it, on any stream.
    pub fn release(&mut self) {
        if self.buf.is_some() {
            self.order.release(&self.stream);
        }
        self.buf = None;
    }

    /// Checks that the workspace holds `required` bytes (no growth): what every launch does
    /// with the size its algorithm or plan asked for, before anything is enqueued.
    pub fn check(&self, required: usize) -> Result<()> {
        let available = self.capacity();
        if available < required {
            return Err(Error::WorkspaceTooSmall {
                available,
                required,
            });
        }
        Ok(())
    }

    /// The device address of the buffer (null when nothing is allocated) and the cudarc guard
    /// that orders the buffer's later reuse or free after work enqueued on `stream`; `stream`
    /// first waits for the buffer's previous use on another stream (see [`UseOrder`]), so the
    /// ordering holds whether or not cudarc tracks events.
    pub(crate) fn device_ptr_mut<'a>(
        &'a mut self,
        stream: &'a Arc<CudaStream>,
    ) -> Result<(
        *mut std::ffi::c_void,
        Option<cudarc::driver::SyncOnDrop<'a>>,
    )> {
        match self.buf.as_mut() {
            Some(b) => {
                self.order.enter(&self.stream, stream)?;
                let (p, g) = cudarc::driver::DevicePtrMut::device_ptr_mut(b, stream);
                Ok((p as *mut std::ffi::c_void, Some(g)))
            }
            None => Ok((std::ptr::null_mut(), None)),
        }
    }

    /// Grows to `required` bytes if the limit allows, then [`check`](Self::check)s.
    pub fn prepare(&mut self, required: usize) -> Result<()> {
        self.reserve(required)?;
        self.check(required)
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        self.release();
    }
}
