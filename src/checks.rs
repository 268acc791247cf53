//! Launch checks and pointer helpers shared by several layer families (convolution,
//! normalization, reduction, RNN), kept in one place so every family refuses the same inputs
//! with the same errors.
use std::ffi::c_void;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::workspace::{Workspace, MAX_WORKSPACE_BYTES};

impl Cudnn {
    /// Checks that `ws` lives on this handle's context: its memory would be a wild pointer for
    /// a kernel launched on another one.
    pub(crate) fn check_workspace_context(&self, ws: &Workspace) -> Result<()> {
        let ctx = ws.stream().context();
        if **ctx != **self.context() {
            return Err(Error::ForeignContext {
                name: "workspace",
                expected: self.context().ordinal(),
                found: ctx.ordinal(),
            });
        }
        Ok(())
    }

    /// A workspace size from the handle's memo under `key`, or asked of cuDNN through `query`
    /// and remembered; an absurd answer (over [`MAX_WORKSPACE_BYTES`]) is refused, not memoised.
    pub(crate) fn memo_bytes(
        &self,
        key: [u64; 5],
        query: impl FnOnce(&mut usize) -> Result<()>,
    ) -> Result<usize> {
        if let Some(b) = self.ws_memo().borrow().get(&key) {
            return Ok(b);
        }
        let mut bytes = 0usize;
        query(&mut bytes)?;
        if bytes > MAX_WORKSPACE_BYTES {
            return Err(Error::WorkspaceLimit {
                requested: bytes,
                limit: MAX_WORKSPACE_BYTES,
            });
        }
        self.ws_memo().borrow_mut().put(key, bytes);
        Ok(bytes)
    }
}

/// The device address of an optional input (null when absent) and its stream-ordering guard.
pub(crate) fn opt_ptr<'a, T, B: DevicePtr<T>>(
    buf: Option<&'a B>,
    stream: &'a CudaStream,
) -> (*const c_void, Option<SyncOnDrop<'a>>) {
    match buf {
        Some(b) => {
            let (p, g) = b.device_ptr(stream);
            (p as *const c_void, Some(g))
        }
        None => (std::ptr::null(), None),
    }
}

/// The device address of an optional output (null when absent) and its stream-ordering guard.
pub(crate) fn opt_ptr_mut<'a, T, B: DevicePtrMut<T>>(
    buf: Option<&'a mut B>,
    stream: &'a CudaStream,
) -> (*mut c_void, Option<SyncOnDrop<'a>>) {
    match buf {
        Some(b) => {
            let (p, g) = b.device_ptr_mut(stream);
            (p as *mut c_void, Some(g))
        }
        None => (std::ptr::null_mut(), None),
    }
}

/// For unit tests that need the real library but no GPU: the library loaded, or `None` (test
/// skipped, with a line saying why) where cuDNN cannot be loaded; with
/// `CUDNN_SAFE_REQUIRE_LIBRARY=1` a missing library fails the test instead.
#[cfg(test)]
pub(crate) fn lib_or_skip() -> Option<()> {
    match crate::raw::lib() {
        Ok(_) => Some(()),
        Err(e) if std::env::var("CUDNN_SAFE_REQUIRE_LIBRARY").as_deref() == Ok("1") => {
            panic!("CUDNN_SAFE_REQUIRE_LIBRARY=1 but cuDNN did not load: {e}")
        }
        Err(e) => {
            eprintln!("skipping: {e}");
            None
        }
    }
}
