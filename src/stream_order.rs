//! Ordering of the crate's own device memory (workspace, scratch, saved values, reserves,
//! dropout states, sequence lengths) across streams, by explicit events.
//!
//! cudarc orders a buffer's uses and its free across streams with events it records through the
//! pointer guards — but only while the context manages stream synchronization: not for buffers
//! allocated while event tracking is disabled (`CudaContext::disable_event_tracking`, whose
//! contract makes the *user* order their buffers), nor on streams the context does not count
//! (`wrap_borrowed_stream`). The user cannot order memory they never see, so the crate orders its
//! own: a use on a stream other than the previous use's waits for that stream, and the free on
//! the allocating stream waits for the last use. Streams compare as cudarc compares them, handle
//! and context together: the raw handle alone is no identity (every context's default stream is
//! null).
use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};

/// Where the memory it guards was last used, when that is not its allocating stream.
#[derive(Debug, Default)]
pub(crate) struct UseOrder {
    last: Option<Arc<CudaStream>>,
}

impl UseOrder {
    /// Before a use on `stream` of memory allocated on `alloc`: when the previous use was on
    /// another stream, `stream` first waits for the work enqueued there (stream-ordered, nothing
    /// blocks the host).
    pub(crate) fn enter(&mut self, alloc: &CudaStream, stream: &Arc<CudaStream>) -> Result<()> {
        let prev: &CudaStream = self.last.as_deref().unwrap_or(alloc);
        if prev != stream.as_ref() {
            stream.join(prev).map_err(|e| {
                Error::driver(
                    "ordering a stream after the previous use of scratch memory",
                    e,
                )
            })?;
        }
        self.last = (stream.as_ref() != alloc).then(|| stream.clone());
        Ok(())
    }

    /// Before the memory allocated on `alloc` is freed (stream-ordered on `alloc`): `alloc`
    /// waits for the last use on another stream. Never fails: on an error the last use's stream
    /// is synchronized instead (and a failure of that is logged).
    pub(crate) fn release(&mut self, alloc: &CudaStream) {
        if let Some(last) = self.last.take() {
            if last.as_ref() == alloc {
                return;
            }
            if let Err(e) = alloc.join(&last) {
                log::warn!(
                    "ordering the release of scratch memory after its last use: {e}; synchronizing"
                );
                if let Err(e) = last.synchronize() {
                    log::warn!("synchronizing before releasing scratch memory: {e}");
                }
            }
        }
    }
}

/// A use, on another stream, of memory allocated on `alloc` (see [`cross_use`]): dropped after
/// the use is enqueued, it makes `alloc` wait for that stream, so that the memory's later free
/// or reuse on `alloc` follows the use.
#[must_use = "the ordering after the use happens when the guard is dropped"]
pub(crate) struct CrossUse<'a> {
    alloc: &'a CudaStream,
    stream: &'a CudaStream,
}

/// Orders a use on `stream` of memory the crate allocated on `alloc`: when they differ,
/// `stream` first waits for `alloc` (the memory's writes there), and the returned guard, dropped
/// once the use is enqueued, makes `alloc` wait for `stream`. `None` when they are the same
/// stream (stream order does it all).
pub(crate) fn cross_use<'a>(
    alloc: &'a CudaStream,
    stream: &'a CudaStream,
) -> Result<Option<CrossUse<'a>>> {
    if alloc == stream {
        return Ok(None);
    }
    stream
        .join(alloc)
        .map_err(|e| Error::driver("ordering a use of memory allocated on another stream", e))?;
    Ok(Some(CrossUse { alloc, stream }))
}

/// [`cross_use`] for memory that may be absent (`None`: nothing to order).
pub(crate) fn cross_use_opt<'a>(
    alloc: Option<&'a CudaStream>,
    stream: &'a CudaStream,
) -> Result<Option<CrossUse<'a>>> {
    Ok(alloc.map(|a| cross_use(a, stream)).transpose()?.flatten())
}

impl Drop for CrossUse<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.alloc.join(self.stream) {
            log::warn!(
                "ordering memory's allocating stream after a use elsewhere: {e}; synchronizing"
            );
            if let Err(e) = self.stream.synchronize() {
                log::warn!("synchronizing after a use of memory allocated on another stream: {e}");
            }
        }
    }
}
