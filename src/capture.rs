//! A sequence of calls captured once into a CUDA graph and replayed with one launch
//! ([`Cudnn::capture`]).
//!
//! A network's forward pass or training step is a few hundred short launches; each costs host
//! time (argument checks, descriptor look-ups, the driver's launch path) that the GPU waits for
//! on small layers. Captured once into a CUDA graph, the whole sequence replays with one
//! `cuGraphLaunch`, no crate or cuDNN code running per replay.
//!
//! # What may run during a capture
//!
//! A capture records the work enqueued on the handle's stream. CUDA cannot capture the legacy
//! default stream (`ctx.default_stream()`), and cudarc, once a program has made streams with
//! `new_stream`, orders buffers across them with events that a capture cannot wait on: make
//! the handle on `ctx.per_thread_stream()` (a capturable stream that needs no events) in a
//! program that makes no other streams, or turn cudarc's event tracking off. The calls
//! themselves run on the host as usual, so every argument check still happens once, at
//! capture. Work that cannot be recorded is an error during the capture ([`Error::Capture`])
//! rather than a broken graph:
//!
//! * timing candidates or building plans, i.e. a tuner's first decision for a problem (run the
//!   sequence once before capturing, so that every decision is made and every kernel loaded, or
//!   load a cache file);
//! * growing a [`Workspace`] (reserve it first; the first run does);
//! * a host synchronization or a device-to-host copy (CUDA invalidates the capture; the error
//!   names the capture as the cause).
//!
//! # What the graph keeps alive
//!
//! A replay writes to the addresses seen at capture. [`Captured`] therefore holds:
//!
//! * the handle and everything the closure borrows, for the graph's life (`'env`): a buffer,
//!   a workspace or a plan the closure uses cannot be dropped, grown or reallocated while the
//!   graph exists — the borrow checker refuses it;
//! * the closure itself, with what it owns;
//! * the `buffers` given to [`Cudnn::capture`], reachable between replays through
//!   [`Captured::buffers_mut`] (to upload the next input, read an output). Replacing one of them
//!   (assigning a new allocation) is detected: [`Captured::launch`] compares every address and
//!   length with those recorded at capture and refuses to replay on a mismatch.
//!
//! Buffers that change between replays belong in `buffers`; weights and scratch can simply be
//! borrowed by the closure. The crate's own memory and plans (normalization scratch, sequence
//! lengths, plans built per handle, kernels) are never freed or replaced while the objects
//! holding them live. What the types cannot see is the caller's own interior mutability: a
//! buffer the closure reaches through a `static`, a `Cell`, `RefCell` or `Mutex` could be
//! replaced, and freed, through a shared borrow while the graph still writes to it. That is
//! why [`Cudnn::capture`] is `unsafe`: its caller promises that no such memory is freed or
//! replaced while the graph lives (pass such buffers in `buffers` instead, where a replacement
//! is detected).
//!
//! ```no_run
//! use cudnn_safe::{cuda_context, ActivationDesc, ActivationMode, Cudnn, TensorDesc};
//! # fn main() -> cudnn_safe::Result<()> {
//! let ctx = cuda_context(0)?;
//! // The per-thread default stream: CUDA cannot capture the legacy default stream.
//! let stream = ctx.per_thread_stream();
//! let cudnn = Cudnn::new(stream.clone())?;
//! let d = TensorDesc::<f32>::nchw(8, 64, 32, 32)?;
//! let relu = ActivationDesc::new(ActivationMode::Relu)?;
//! let x = stream.clone_htod(&vec![0.5f32; d.span()])?;
//! let mut y = stream.alloc_zeros::<f32>(d.span())?;
//!
//! // Once before capturing: kernels load at their first launch, which a capture cannot record.
//! cudnn.activation_forward(&relu, 1.0, &d, &x, 0.0, &d, &mut y)?;
//! // The input is borrowed by the closure; the output travels with the graph.
//! // SAFETY: the closure reaches device memory only through `y` (in `buffers`) and plain
//! // borrows, which last as long as the graph.
//! let mut graph = unsafe {
//!     cudnn.capture(y, |cudnn, y| {
//!         cudnn.activation_forward(&relu, 1.0, &d, &x, 0.0, &d, y)
//!     })
//! }?;
//! for _ in 0..10 {
//!     graph.launch()?;
//! }
//! let out = stream.clone_dtoh(graph.buffers())?;
//! # let _ = (out, graph.buffers_mut());
//! # Ok(()) }
//! ```
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode, CUstreamCaptureStatus};
use cudarc::driver::{CudaGraph, CudaSlice, CudaStream, DevicePtr};

use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::workspace::Workspace;

/// Device memory that travels with a [`Captured`] graph: what it lists is compared before each
/// replay with what was listed at capture.
///
/// # Safety
///
/// `ranges` must list the address and byte length of every device allocation the value owns
/// or borrows and that a captured call may use: a range left out could be replaced (and freed)
/// without [`Captured::launch`] noticing. The implementations here list every element.
pub unsafe trait CaptureBuffers {
    /// Appends `(device address, bytes)` of each buffer, in a fixed order.
    fn ranges(&self, out: &mut Vec<(u64, usize)>);
}

// SAFETY: one allocation, listed with its address and byte length.
unsafe impl<T> CaptureBuffers for CudaSlice<T> {
    fn ranges(&self, out: &mut Vec<(u64, usize)>) {
        let stream = self.stream().clone();
        let (ptr, _guard) = self.device_ptr(&stream);
        out.push((ptr, self.num_bytes()));
    }
}

// SAFETY: the workspace's one allocation (none: an empty range), address and capacity.
unsafe impl CaptureBuffers for Workspace {
    fn ranges(&self, out: &mut Vec<(u64, usize)>) {
        out.push((self.address(), self.capacity()));
    }
}

// SAFETY: a mutable borrow lists what it points to; the borrow lasts as long as the graph.
unsafe impl<B: CaptureBuffers + ?Sized> CaptureBuffers for &mut B {
    fn ranges(&self, out: &mut Vec<(u64, usize)>) {
        (**self).ranges(out);
    }
}

// SAFETY: every element, in order; a changed length changes the list.
unsafe impl<B: CaptureBuffers> CaptureBuffers for Vec<B> {
    fn ranges(&self, out: &mut Vec<(u64, usize)>) {
        out.push((0, self.len()));
        self.iter().for_each(|b| b.ranges(out));
    }
}

// SAFETY: every element, in order.
unsafe impl<B: CaptureBuffers, const N: usize> CaptureBuffers for [B; N] {
    fn ranges(&self, out: &mut Vec<(u64, usize)>) {
        self.iter().for_each(|b| b.ranges(out));
    }
}

// SAFETY: the element when present, and whether it is (a marker range), so `None` ↔ `Some`
// changes the list.
unsafe impl<B: CaptureBuffers> CaptureBuffers for Option<B> {
    fn ranges(&self, out: &mut Vec<(u64, usize)>) {
        out.push((0, usize::from(self.is_some())));
        if let Some(b) = self {
            b.ranges(out);
        }
    }
}

// SAFETY: nothing to list.
unsafe impl CaptureBuffers for () {
    fn ranges(&self, _: &mut Vec<(u64, usize)>) {}
}

macro_rules! tuple_buffers {
    ($($name:ident),+) => {
        // SAFETY: every member, in order.
        unsafe impl<$($name: CaptureBuffers),+> CaptureBuffers for ($($name,)+) {
            #[allow(non_snake_case)] // the members, named after their types
            fn ranges(&self, out: &mut Vec<(u64, usize)>) {
                let ($($name,)+) = self;
                $($name.ranges(out);)+
            }
        }
    };
}
tuple_buffers!(A);
tuple_buffers!(A, B);
tuple_buffers!(A, B, C);
tuple_buffers!(A, B, C, D);
tuple_buffers!(A, B, C, D, E);
tuple_buffers!(A, B, C, D, E, F);
tuple_buffers!(A, B, C, D, E, F, G);
tuple_buffers!(A, B, C, D, E, F, G, H);

/// `CU_STREAM_LEGACY`, the legacy default stream's other name.
const LEGACY_STREAM: usize = 0x1;

/// [`Error::Capture`] for a stream CUDA cannot capture (the legacy default stream), or whose
/// buffers cudarc orders across streams with events that a capture could not wait on.
fn capturable(stream: &CudaStream) -> Result<()> {
    let raw = stream.cu_stream() as usize;
    if raw == 0 || raw == LEGACY_STREAM {
        return Err(Error::Capture {
            operation: "starting a capture",
            detail: "the handle's stream is its context's legacy default stream, which CUDA \
                     cannot capture; make the handle on `ctx.per_thread_stream()`"
                .into(),
        });
    }
    if stream.context().is_managing_stream_synchronization() {
        return Err(Error::Capture {
            operation: "starting a capture",
            detail: "cudarc orders this context's buffers across its streams with events (it \
                     has streams made by `new_stream` and tracks events), and a capture cannot \
                     wait on an event recorded before it began; capture on \
                     `ctx.per_thread_stream()` in a program that makes no other streams, or \
                     turn event tracking off (`CudaContext::disable_event_tracking`, whose \
                     contract makes the program order its streams itself)"
                .into(),
        });
    }
    Ok(())
}

/// Refuses, with [`Error::Capture`], work that a CUDA graph cannot record while `stream` is
/// capturing: `operation` says what was about to happen.
pub(crate) fn refuse_during_capture(stream: &CudaStream, operation: &'static str) -> Result<()> {
    match stream.capture_status() {
        Ok(CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE) => Ok(()),
        Ok(status) => Err(Error::Capture {
            operation,
            detail: format!(
                "the stream is being captured into a CUDA graph ({status:?}); run the sequence \
                 once before capturing so that this happens outside the capture"
            ),
        }),
        Err(e) => Err(Error::driver("asking whether the stream is capturing", e)),
    }
}

/// Ends a capture left open by a panic, discarding what it recorded. Never panics.
struct EndOnUnwind<'a>(Option<&'a Arc<CudaStream>>);

impl Drop for EndOnUnwind<'_> {
    fn drop(&mut self) {
        if let Some(stream) = self.0.take() {
            if let Err(e) = stream.end_capture(CUgraphInstantiate_flags(0)) {
                log::warn!("ending a capture after a panic: {e}");
            }
        }
    }
}

/// The type-erased closure a [`Captured`] keeps (with what it owns).
type Body<'env, B> = Box<dyn FnMut(&Cudnn, &mut B) -> Result<()> + 'env>;

/// A CUDA graph captured from a sequence of calls on a handle's stream, replayed by
/// [`launch`](Self::launch). Made by [`Cudnn::capture`]; the module documentation says what it
/// keeps alive and why.
pub struct Captured<'env, B: CaptureBuffers> {
    graph: CudaGraph,
    stream: Arc<CudaStream>,
    buffers: B,
    /// `buffers`' ranges at capture.
    ranges: Vec<(u64, usize)>,
    /// Kept for what it owns (moved-in buffers live as long as the graph).
    _body: Body<'env, B>,
    _handle: PhantomData<&'env Cudnn>,
}

impl<B: CaptureBuffers> std::fmt::Debug for Captured<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Captured")
            .field("buffers", &self.ranges.len())
            .finish_non_exhaustive()
    }
}

impl<'env, B: CaptureBuffers> Captured<'env, B> {
    /// Replays the captured sequence on the handle's stream (asynchronously, one graph launch).
    ///
    /// [`Error::Capture`] without launching when a buffer of [`buffers`](Self::buffers) is no
    /// longer the allocation captured (replaced, resized, a `Vec` grown or shrunk).
    #[doc(alias = "cuGraphLaunch")]
    pub fn launch(&self) -> Result<()> {
        let mut now = Vec::with_capacity(self.ranges.len());
        self.buffers.ranges(&mut now);
        if now != self.ranges {
            let at = now
                .iter()
                .zip(&self.ranges)
                .position(|(a, b)| a != b)
                .unwrap_or(now.len().min(self.ranges.len()));
            return Err(Error::Capture {
                operation: "replaying a captured graph",
                detail: format!(
                    "buffer {at} of the captured buffers is no longer the allocation the graph \
                     writes to (it was replaced or resized after capture); capture again"
                ),
            });
        }
        self.graph
            .launch()
            .map_err(|e| Error::driver("launching a captured CUDA graph", e))
    }

    /// Uploads the graph's resources so that the first [`launch`](Self::launch) costs no more
    /// than the later ones.
    #[doc(alias = "cuGraphUpload")]
    pub fn upload(&self) -> Result<()> {
        self.graph
            .upload()
            .map_err(|e| Error::driver("uploading a captured CUDA graph", e))
    }

    /// The buffers that travel with the graph.
    pub fn buffers(&self) -> &B {
        &self.buffers
    }

    /// The buffers, to write the next input or read an output between replays (work on the
    /// handle's stream is ordered after the replays enqueued before it). Replacing a buffer
    /// makes the next [`launch`](Self::launch) fail.
    pub fn buffers_mut(&mut self) -> &mut B {
        &mut self.buffers
    }

    /// The buffers, giving the graph up.
    pub fn into_buffers(self) -> B {
        self.buffers
    }

    /// The stream the graph replays on (the handle's at capture).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl Cudnn {
    /// Captures the work `body` enqueues on this handle's stream into a CUDA graph, and returns
    /// it ready to replay ([`Captured::launch`]).
    ///
    /// The handle's stream must be capturable and free of cudarc's cross-stream events (the
    /// [module documentation](crate::capture) says which streams are): otherwise
    /// [`Error::Capture`] before anything happens. `body` runs once, now,
    /// with the handle and `buffers`; every call it makes is checked as
    /// usual. Run the same sequence once before capturing, so that tuners have decided, plans
    /// are built and workspaces are grown: those would be [`Error::Capture`] here. An error
    /// from `body` ends the capture and is returned as is; a capture CUDA invalidated (a host
    /// synchronization, work from another stream that cudarc orders by events recorded before
    /// the capture) is [`Error::Capture`]. On any error nothing stays captured.
    ///
    /// The [module documentation](crate::capture) says what the graph keeps alive and shows an
    /// example.
    ///
    /// # Safety
    ///
    /// Every replay reads and writes the device addresses the calls used at capture. Memory
    /// reached through `buffers` (compared before each replay), through borrows the closure
    /// holds (which last as long as the graph) and through values it owns is kept valid by
    /// the types. The caller guarantees the rest: device memory `body` reaches through a
    /// `static` or through interior mutability (a `Cell`, `RefCell`, `Mutex`, `OnceCell` or
    /// the like holding a buffer or a workspace) is neither freed nor replaced while the
    /// returned [`Captured`] exists.
    #[doc(alias = "cuStreamBeginCapture")]
    #[doc(alias = "cuStreamEndCapture")]
    pub unsafe fn capture<'env, B, F>(
        &'env self,
        mut buffers: B,
        body: F,
    ) -> Result<Captured<'env, B>>
    where
        B: CaptureBuffers,
        F: FnMut(&Cudnn, &mut B) -> Result<()> + 'env,
    {
        let stream = self.stream().clone();
        capturable(&stream)?;
        refuse_during_capture(&stream, "starting a capture")?;
        let mut body: Body<'env, B> = Box::new(body);
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| Error::driver("beginning a CUDA-graph capture", e))?;
        // Should `body` panic, the capture still ends (the stream stays usable).
        let mut open = EndOnUnwind(Some(&stream));
        let ran = body(self, &mut buffers);
        open.0 = None;
        drop(open);
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        // Errors cudarc recorded instead of returning (event waits refused by the capture).
        let recorded = self.context().check_err().err();
        ran?;
        let graph = match ended {
            Ok(Some(graph)) => graph,
            Ok(None) => {
                return Err(Error::Capture {
                    operation: "ending a capture",
                    detail: "the capture recorded no graph".into(),
                })
            }
            Err(e) => {
                let why = recorded.map_or(String::new(), |r| format!(" (first refused: {r})"));
                return Err(Error::Capture {
                    operation: "ending a capture",
                    detail: format!(
                        "CUDA invalidated the capture: {e}{why}; a host synchronization, a \
                         device-to-host copy, or a wait on an event recorded before the capture \
                         (cudarc orders buffers shared by several streams that way) cannot be \
                         captured"
                    ),
                });
            }
        };
        let mut ranges = Vec::new();
        buffers.ranges(&mut ranges);
        Ok(Captured {
            graph,
            stream,
            buffers,
            ranges,
            _body: body,
            _handle: PhantomData,
        })
    }
}
