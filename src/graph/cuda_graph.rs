//! CUDA graphs populated from built plans: cuDNN's native CUDA-graph API
//! (`cudnnBackendPopulateCudaGraph`, `cudnnBackendUpdateCudaGraph`, cuDNN ≥ 9.5).
//!
//! [`Cudnn::populate_cuda_graph`] asks cuDNN to write the kernels of one execution of a [`Plan`]
//! into a fresh, empty CUDA graph (no stream capture), instantiates it, and returns a
//! [`PlanGraph`] whose [`launch`](PlanGraph::launch) replays that execution on the handle's
//! stream with a single `cuGraphLaunch`: no cuDNN call, no variant pack, no argument checks per
//! launch. Only engines carrying [`BehaviorNote::SupportsCudaGraphNativeApi`] support it
//! ([`PlanFilter::with_cuda_graph_native`](super::PlanFilter::with_cuda_graph_native) keeps only those);
//! other plans are refused before any cuDNN call. [`PlanGraph`] says what it borrows and why.
use std::cell::RefCell;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraph, CUgraphExec, CUgraphInstantiate_flags, CUresult};
use cudarc::driver::{result as cu, CudaContext, CudaStream};
use cudnn_safe_sys as sys;

use super::build::GraphInner;
use super::engine::{BehaviorNote, Plan};
use super::exec::{variant_pack, Args};
use crate::error::{Error, Result, Status};
use crate::handle::Cudnn;
use crate::workspace::Workspace;

/// The C calls of cuDNN's native CUDA-graph API.
mod ffi {
    #![allow(non_snake_case)] // the C names, so a search for them finds these

    use cudnn_safe_sys as sys;

    crate::raw::raw_fns! {
        fn cudnnBackendPopulateCudaGraph(
            handle: sys::cudnnHandle_t,
            plan: sys::cudnnBackendDescriptor_t,
            variant_pack: sys::cudnnBackendDescriptor_t,
            graph: sys::cudaGraph_t,
        );
        fn cudnnBackendUpdateCudaGraph(
            handle: sys::cudnnHandle_t,
            plan: sys::cudnnBackendDescriptor_t,
            variant_pack: sys::cudnnBackendDescriptor_t,
            graph: sys::cudaGraph_t,
        );
    }
}

/// `CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API`: what cuDNN returns for a plan whose
/// engine can't populate a CUDA graph, and what [`Cudnn::populate_cuda_graph`] returns when it
/// refuses such a plan itself.
pub const CUDA_GRAPH_NOT_SUPPORTED: Status = Status(3013);

/// The refusal of a plan whose engine lacks the native CUDA-graph note (`Ok` when it has it).
fn require_native_support(plan: &str, behavior: &[BehaviorNote]) -> Result<()> {
    if behavior.contains(&BehaviorNote::SupportsCudaGraphNativeApi) {
        return Ok(());
    }
    Err(Error::Cudnn {
        status: CUDA_GRAPH_NOT_SUPPORTED,
        function: "cudnnBackendPopulateCudaGraph",
        message: format!(
            "refused before the call: the engine of plan {plan} lacks \
             CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API (its behaviour notes: \
             {behavior:?}); pick a plan with PlanFilter::with_cuda_graph_native(true), or execute it \
             with Cudnn::execute"
        ),
    })
}

impl Plan {
    /// Whether the plan's engine supports cuDNN's native CUDA-graph API (it carries
    /// [`BehaviorNote::SupportsCudaGraphNativeApi`]), i.e. whether
    /// [`Cudnn::populate_cuda_graph`] accepts it.
    #[doc(alias = "CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API")]
    pub fn supports_cuda_graph(&self) -> bool {
        self.behavior_notes()
            .contains(&BehaviorNote::SupportsCudaGraphNativeApi)
    }
}

/// Wraps a driver error with what was being done.
fn driver(context: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    move |e| Error::driver(context, e)
}

/// A handle the driver returned with success, as non-null; a null one (which the driver never
/// returns with success) is reported as `CUDA_ERROR_UNKNOWN` while `context`.
fn non_null<T>(raw: *mut T, context: &'static str) -> Result<NonNull<c_void>> {
    NonNull::new(raw.cast::<c_void>()).ok_or_else(|| {
        Error::driver(
            context,
            cudarc::driver::DriverError(CUresult::CUDA_ERROR_UNKNOWN),
        )
    })
}

/// An owned `CUgraph`: destroyed exactly once in `Drop`, which logs and never panics.
struct OwnedGraph {
    raw: NonNull<c_void>,
    ctx: Arc<CudaContext>,
}

impl OwnedGraph {
    /// An empty graph (`cuGraphCreate`), with `ctx` current on this thread.
    fn new(ctx: &Arc<CudaContext>) -> Result<OwnedGraph> {
        let mut g: CUgraph = std::ptr::null_mut();
        // SAFETY: `g` is a valid out-pointer; flags must be 0 (the driver's documented value).
        unsafe { cudarc::driver::sys::cuGraphCreate(&mut g, 0) }
            .result()
            .map_err(driver("creating a CUDA graph"))?;
        let raw = non_null(g, "creating a CUDA graph")?;
        Ok(OwnedGraph {
            raw,
            ctx: ctx.clone(),
        })
    }

    fn as_raw(&self) -> CUgraph {
        self.raw.as_ptr().cast()
    }
}

impl Drop for OwnedGraph {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind_to_thread() {
            log::warn!("dropping a CUDA graph: binding its context: {e}");
        }
        // SAFETY: created by cuGraphCreate and destroyed exactly once here. An executable graph
        // instantiated from it is independent of it (the driver copies the topology and node
        // parameters at instantiation), so destroying the template never affects launches.
        if let Err(e) = unsafe { cu::graph::destroy(self.as_raw()) } {
            log::warn!("cuGraphDestroy: {e}");
        }
    }
}

/// An owned `CUgraphExec`: destroyed exactly once in `Drop`, which logs and never panics.
struct OwnedExec {
    raw: NonNull<c_void>,
    ctx: Arc<CudaContext>,
}

impl OwnedExec {
    /// Instantiates `graph` (`cuGraphInstantiateWithFlags`, no flags), with its context current.
    fn instantiate(graph: &OwnedGraph) -> Result<OwnedExec> {
        // SAFETY: `graph` is a live graph owned by the caller; instantiation only reads it.
        let e = unsafe { cu::graph::instantiate(graph.as_raw(), CUgraphInstantiate_flags(0)) }
            .map_err(driver("instantiating a CUDA graph"))?;
        let raw = non_null(e, "instantiating a CUDA graph")?;
        Ok(OwnedExec {
            raw,
            ctx: graph.ctx.clone(),
        })
    }

    fn as_raw(&self) -> CUgraphExec {
        self.raw.as_ptr().cast()
    }
}

impl Drop for OwnedExec {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind_to_thread() {
            log::warn!("dropping a CUDA graph executable: binding its context: {e}");
        }
        // SAFETY: instantiated by cuGraphInstantiateWithFlags and destroyed exactly once here.
        // The driver documents that an executable graph still in flight is not terminated but
        // freed asynchronously on completion, so launches already enqueued finish normally.
        if let Err(e) = unsafe { cu::graph::exec_destroy(self.as_raw()) } {
            log::warn!("cuGraphExecDestroy: {e}");
        }
    }
}

/// The `CUgraphExecUpdateResultInfo` the driver fills, with the result as a plain integer: the
/// driver may report a value newer than the enum cudarc declares, which must not become an
/// invalid Rust enum (same size and layout: a 32-bit enum, then two node handles).
#[repr(C)]
struct UpdateInfo {
    result: u32,
    error_node: *mut c_void,
    error_from_node: *mut c_void,
}

/// An instantiated CUDA graph holding one execution of a [`Plan`] on the buffers of an
/// [`Args`] and a [`Workspace`], populated by cuDNN's native CUDA-graph API
/// ([`Cudnn::populate_cuda_graph`]); [`launch`](Self::launch) enqueues that execution on the
/// handle's stream.
///
/// `Send` (launch it from another thread, e.g. in [`std::thread::scope`]), not `Sync`: the
/// driver requires calls on one graph to be serialized. Dropping it destroys the executable
/// graph and the graph (launches already enqueued still complete) and never panics.
///
/// # What keeps a launch sound
///
/// The graph bakes in the device addresses of every buffer bound in [`Args`], of the
/// workspace, and the kernels of the plan's engine. A [`PlanGraph<'g>`](PlanGraph) therefore
/// borrows, for its whole life `'g`: the handle (its stream can't change, it can't be dropped),
/// the plan (its engine and kernels stay loaded), the [`Args`] (which themselves borrow every
/// input shared and every output exclusively, so no buffer can be freed, moved, reallocated or
/// written by anyone else), and the [`Workspace`] mutably (it can't grow, shrink or be released:
/// its address stays the one baked in). cudarc's guards in [`Args`] are dropped only after the
/// graph, and each launch takes the workspace's pointer through cudarc again, so later frees and
/// other streams are ordered after the last launch. The borrow checker enforces all of it:
///
/// ```compile_fail,E0505
/// # use cudnn_safe::cudarc::driver::CudaSlice;
/// # use cudnn_safe::graph::{Args, Plan, TensorId};
/// # use cudnn_safe::{Cudnn, Workspace};
/// # fn f(cudnn: &Cudnn, plan: &Plan, x: TensorId, y: TensorId, xb: CudaSlice<f32>,
/// #      mut yb: CudaSlice<f32>, ws: &mut Workspace) -> cudnn_safe::Result<()> {
/// let mut args = Args::new(cudnn);
/// args.input(x, &xb)?.output(y, &mut yb)?;
/// let graph = cudnn.populate_cuda_graph(plan, &args, ws)?;
/// drop(yb); // error: `yb` is still borrowed by `args`, which `graph` borrows
/// graph.launch()?;
/// # Ok(()) }
/// ```
///
/// ```compile_fail,E0499
/// # use cudnn_safe::cudarc::driver::CudaSlice;
/// # use cudnn_safe::graph::{Args, Plan, TensorId};
/// # use cudnn_safe::{Cudnn, Workspace};
/// # fn f(cudnn: &Cudnn, plan: &Plan, x: TensorId, y: TensorId, xb: CudaSlice<f32>,
/// #      mut yb: CudaSlice<f32>, mut ws: Workspace) -> cudnn_safe::Result<()> {
/// let mut args = Args::new(cudnn);
/// args.input(x, &xb)?.output(y, &mut yb)?;
/// let graph = cudnn.populate_cuda_graph(plan, &args, &mut ws)?;
/// ws.release(); // error: the workspace is mutably borrowed by `graph`
/// graph.launch()?;
/// # Ok(()) }
/// ```
///
/// It is not `Sync` (two threads must not launch or update one graph at once):
///
/// ```compile_fail,E0277
/// fn shared<T: Sync>() {}
/// shared::<cudnn_safe::graph::PlanGraph<'static>>();
/// ```
///
/// The consequence: while the graph lives, the bound buffers can't be touched from the host
/// side of Rust (not even read back); drop the graph (and the [`Args`]) to read the outputs.
/// Work enqueued on the stream is ordered as usual, so reading them right after the drop sees
/// every launch.
///
/// ```no_run
/// use cudnn_safe::graph::{Args, ConvParams, Graph, PlanFilter, PointwiseMode};
/// use cudnn_safe::{cuda_context, Cudnn, DType, Workspace};
/// # fn main() -> cudnn_safe::Result<()> {
/// let ctx = cuda_context(0)?;
/// let stream = ctx.default_stream();
/// let cudnn = Cudnn::new(stream.clone())?;
/// let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
/// let x = g.tensor_nhwc("x", &[8, 64, 56, 56], DType::F16)?;
/// let w = g.tensor_nhwc("w", &[64, 64, 3, 3], DType::F16)?;
/// let c = g.conv_fprop(x, w, &ConvParams::new(2).with_padding(&[1, 1]))?;
/// let y = g.pointwise(PointwiseMode::Relu, c, None)?;
/// g.mark_output(y)?;
/// let og = g.build(&cudnn)?;
/// // Only engines that support cuDNN's native CUDA-graph API.
/// let plan = og.plan(&cudnn, &PlanFilter::new().with_cuda_graph_native(true))?;
///
/// let xb = stream.alloc_zeros::<half::f16>(og.span(x)?).unwrap();
/// let wb = stream.alloc_zeros::<half::f16>(og.span(w)?).unwrap();
/// let mut yb = stream.alloc_zeros::<half::f16>(og.span(y)?).unwrap();
/// let mut ws = Workspace::new(stream.clone());
/// let mut args = Args::new(&cudnn);
/// args.input(x, &xb)?.input(w, &wb)?.output(y, &mut yb)?;
/// let graph = cudnn.populate_cuda_graph(&plan, &args, &mut ws)?;
/// for _ in 0..100 {
///     graph.launch()?; // one cuGraphLaunch each
/// }
/// drop(graph);
/// drop(args);
/// let y_host = stream.clone_dtoh(&yb).unwrap();
/// # let _ = y_host;
/// # Ok(()) }
/// ```
pub struct PlanGraph<'g> {
    // Field order is drop order: the executable before the graph it was instantiated from.
    exec: OwnedExec,
    graph: OwnedGraph,
    stream: Arc<CudaStream>,
    /// The plan's descriptor (kept alive by the borrow of the plan), for updates.
    plan: sys::cudnnBackendDescriptor_t,
    /// The plan's graph: checks of new bindings, pack unique ids, the handle it belongs to.
    inner: Arc<GraphInner>,
    /// The workspace, borrowed for `'g` so that it can't grow, shrink or be released. Each
    /// launch takes its device pointer through cudarc (a `RefCell` because `launch` takes
    /// `&self`; the type is not `Sync`), so that its guard records the launch's use of it.
    ws: RefCell<&'g mut Workspace>,
    /// Address of the workspace baked into the graph.
    workspace: usize,
    workspace_bytes: usize,
    name: String,
    _borrows: PhantomData<(&'g Cudnn, &'g Plan, &'g Args<'g>)>,
}

// SAFETY: nothing in a `PlanGraph` is tied to the thread that made it. The executable graph and
// the graph are driver objects usable from any thread once their context is bound (every method
// and `Drop` binds it); the driver asks that calls on one graph be serialized, which `&mut self`
// for `update` and the absence of `Sync` guarantee. The stream is `Send + Sync`; the workspace
// is `Send` and borrowed exclusively (nobody else can use it meanwhile). The borrows of the handle,
// the plan and the bindings are loans that keep them alive and unchanged: `launch` makes no cuDNN
// call and touches neither the handle nor the plan. The only cuDNN call on them (`update`)
// takes `&Cudnn` for the plan's handle (checked), so it runs on the thread holding that handle,
// which is where every other call on the plan is made (they all take its handle): `Cudnn` is not
// `Sync`, so no two threads make them at once. Launches and the owner's executions meet only on
// the shared stream, which CUDA orders.
unsafe impl Send for PlanGraph<'_> {}

impl std::fmt::Debug for PlanGraph<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanGraph")
            .field("plan", &self.name)
            .field("workspace_bytes", &self.workspace_bytes)
            .finish()
    }
}

impl Cudnn {
    /// Populates a CUDA graph with one execution of `plan` on the buffers bound in `args` and
    /// workspace from `ws` (grown to [`Plan::workspace_size`] if its limit allows), instantiates
    /// it, and returns it ready to [`launch`](PlanGraph::launch) on this handle's stream.
    ///
    /// Checks first, returning an error with nothing populated or enqueued: everything
    /// [`Cudnn::execute`] checks (the plan was built on this handle; every tensor that takes a
    /// buffer has exactly one, on this context, of its data type, holding its span, 16-byte
    /// aligned; outputs bound with [`Args::output`] and not self-overlapping; nothing else
    /// bound; the workspace on this context and large enough), and that the plan's engine
    /// supports the native CUDA-graph API ([`Plan::supports_cuda_graph`]); a plan without it is
    /// refused with an [`Error::Cudnn`] of status [`CUDA_GRAPH_NOT_SUPPORTED`]
    /// (`CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API`, what cuDNN itself would return)
    /// naming the plan. A cuDNN without the call (before 9.5) gives [`Error::Load`].
    ///
    /// Populating enqueues no work: the outputs are written by the launches only.
    #[doc(alias = "cudnnBackendPopulateCudaGraph")]
    #[doc(alias = "cuGraphInstantiate")]
    pub fn populate_cuda_graph<'g>(
        &'g self,
        plan: &'g Plan,
        args: &'g Args<'_>,
        ws: &'g mut Workspace,
    ) -> Result<PlanGraph<'g>> {
        plan.graph.check_handle(self)?;
        require_native_support(&plan.name(), plan.behavior_notes())?;
        let ptrs = self.prepare_launch(plan, args, ws)?;
        let stream: &'g CudaStream = self.stream();
        // Every launch takes the pointer again (with its guard); this one only reads it.
        let wp = ws.device_ptr_mut(self.stream())?.0 as usize;
        let pack = variant_pack(self.lib(), &plan.graph.pack_uids, &ptrs, wp)?;
        let graph = OwnedGraph::new(self.context())?;
        // SAFETY: live handle, and the plan was built on it (checked); the plan's engine
        // supports this call (checked note). `graph` is a fresh, empty graph created by us, as
        // cuDNN requires; cuDNN adds nodes to it and keeps no reference to it. The variant pack
        // holds exactly the pointers checked above: each device buffer is on this handle's
        // context, of its tensor's data type, holds at least its span, is 16-byte aligned, and
        // outputs do not overlap themselves; scalars point to 8-byte host words alive in the
        // plan's graph (which we keep). The workspace holds at least the plan's workspace size.
        // Populating reads these addresses into kernel parameters without enqueueing work; the
        // borrows of `PlanGraph<'g>` keep every one of them valid for as long as it can launch.
        unsafe {
            ffi::cudnnBackendPopulateCudaGraph(
                self.lib(),
                self.as_raw(),
                plan.as_raw(),
                pack.as_raw(),
                graph.as_raw().cast::<sys::CUgraph_st>(),
            )
        }?;
        let exec = OwnedExec::instantiate(&graph)?;
        // Uploading now makes the first launch as cheap as the others.
        // SAFETY: live executable graph and live stream of its context.
        unsafe { cu::graph::upload(exec.as_raw(), stream.cu_stream()) }
            .map_err(driver("uploading a CUDA graph"))?;
        Ok(PlanGraph {
            exec,
            graph,
            stream: self.stream().clone(),
            plan: plan.as_raw(),
            inner: plan.graph.clone(),
            ws: RefCell::new(ws),
            workspace: wp,
            workspace_bytes: plan.workspace_size(),
            name: plan.name(),
            _borrows: PhantomData,
        })
    }
}

impl<'g> PlanGraph<'g> {
    /// Enqueues one execution of the plan on the handle's stream (`cuGraphLaunch`): the same
    /// computation as [`Cudnn::execute`] on the bound buffers, without any per-call cuDNN or
    /// host-side work beyond the launch.
    #[doc(alias = "cuGraphLaunch")]
    pub fn launch(&self) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(driver("binding the CUDA context"))?;
        let mut ws = self.ws.try_borrow_mut().map_err(|_| {
            Error::invalid(
                "CUDA graph launch",
                "no launch in progress",
                "a nested launch",
            )
        })?;
        // The guard, dropped after the launch is enqueued, records the launch's use of the
        // workspace, so that its later reuse or free (on any stream) waits for it even if this
        // graph is leaked rather than dropped.
        let (wp, _guard) = ws.device_ptr_mut(&self.stream)?;
        if wp as usize != self.workspace {
            // Unreachable: the workspace is borrowed exclusively since the graph was populated.
            return Err(Error::invalid(
                "CUDA graph workspace",
                format!("the address baked into the graph ({:#x})", self.workspace),
                format!("{:#x}", wp as usize),
            ));
        }
        // SAFETY: live executable graph, instantiated on this stream's context. Every address
        // baked into it stays valid and unaliased by other Rust code for `'g`, which outlives
        // `self`: the bound buffers (borrowed through the `Args`), the workspace (checked just
        // above, borrowed exclusively), the plan's kernels (the plan is borrowed) and its
        // scalars (copied into kernel parameters; their words live in `inner` anyway). The
        // launch is ordered on the stream the bindings' guards were taken for.
        unsafe { cu::graph::launch(self.exec.as_raw(), self.stream.cu_stream()) }
            .map_err(driver("launching a CUDA graph"))
    }

    /// Rebinds the graph to the buffers of `args` (another binding of the same plan's tensors,
    /// e.g. other inputs or outputs of the same shapes), keeping the workspace: cuDNN rewrites
    /// the graph's nodes (`cudnnBackendUpdateCudaGraph`), then the executable graph takes the
    /// new parameters (`cuGraphExecUpdate`, or a new instantiation when the driver refuses the
    /// update).
    ///
    /// `cudnn` must be the handle the graph was populated on (the cuDNN call needs it, and
    /// taking it here keeps the graph `Send`). `args` is checked as in
    /// [`Cudnn::populate_cuda_graph`], before anything changes. Its borrow lasts as long as the
    /// graph's, like the first bindings' (launches already enqueued may still use those), so
    /// bindings made after the graph must be dropped after it: `drop(graph)` explicitly before
    /// their scope ends. On an error the executable graph keeps its previous bindings.
    #[doc(alias = "cudnnBackendUpdateCudaGraph")]
    #[doc(alias = "cuGraphExecUpdate")]
    pub fn update(&mut self, cudnn: &Cudnn, args: &'g Args<'_>) -> Result<()> {
        self.inner.check_handle(cudnn)?;
        let ptrs = args.pointers(cudnn, &self.inner)?;
        cudnn.bind()?;
        let pack = variant_pack(cudnn.lib(), &self.inner.pack_uids, &ptrs, self.workspace)?;
        // SAFETY: live handle, the one the plan was built on and the graph populated on
        // (checked); the plan is alive (borrowed for 'g). `self.graph` is the graph cuDNN
        // populated for this plan, with nothing added. The pack holds pointers checked as for
        // populating, and the workspace address is the one pinned by our exclusive borrow, which
        // holds at least the plan's workspace size. The new buffers stay borrowed for 'g.
        unsafe {
            ffi::cudnnBackendUpdateCudaGraph(
                cudnn.lib(),
                cudnn.as_raw(),
                self.plan,
                pack.as_raw(),
                self.graph.as_raw().cast::<sys::CUgraph_st>(),
            )
        }?;
        let mut info = UpdateInfo {
            result: 0,
            error_node: std::ptr::null_mut(),
            error_from_node: std::ptr::null_mut(),
        };
        // SAFETY: live executable graph and graph of the same context (bound by `cudnn.bind()`,
        // the handle's context); `info` has the layout of `CUgraphExecUpdateResultInfo` (see
        // `UpdateInfo`) and lives for the call. Launches in flight keep their parameters.
        let updated = unsafe {
            cudarc::driver::sys::cuGraphExecUpdate_v2(
                self.exec.as_raw(),
                self.graph.as_raw(),
                (&mut info as *mut UpdateInfo).cast(),
            )
        }
        .result();
        if let Err(e) = updated {
            log::debug!(
                "cuGraphExecUpdate refused the update of {} ({e}, result {}): instantiating again",
                self.name,
                info.result
            );
            let exec = OwnedExec::instantiate(&self.graph)?;
            // SAFETY: live executable graph and live stream of its context.
            unsafe { cu::graph::upload(exec.as_raw(), self.stream.cu_stream()) }
                .map_err(driver("uploading a CUDA graph"))?;
            // The old executable is destroyed here; launches of it already enqueued complete
            // (the driver frees it when they do), on buffers still borrowed for 'g.
            self.exec = exec;
        }
        Ok(())
    }

    /// Number of nodes cuDNN put in the graph (`cuGraphGetNodes`).
    #[doc(alias = "cuGraphGetNodes")]
    pub fn node_count(&self) -> Result<usize> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(driver("binding the CUDA context"))?;
        let mut n = 0usize;
        // SAFETY: live graph; a null node array asks only for the count, written to `n`.
        unsafe {
            cudarc::driver::sys::cuGraphGetNodes(self.graph.as_raw(), std::ptr::null_mut(), &mut n)
        }
        .result()
        .map_err(driver("counting CUDA graph nodes"))?;
        Ok(n)
    }

    /// The plan's name ([`Plan::name`]).
    pub fn plan_name(&self) -> &str {
        &self.name
    }

    /// Workspace bytes the graph uses (the plan's [`Plan::workspace_size`]).
    pub fn workspace_size(&self) -> usize {
        self.workspace_bytes
    }

    /// The stream launches are enqueued on (the handle's).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::PlanFilter;

    #[test]
    fn plans_without_the_note_are_refused_by_name() {
        let e =
            require_native_support("eng7_k2=1", &[BehaviorNote::RuntimeCompilation]).unwrap_err();
        assert_eq!(e.status(), Some(CUDA_GRAPH_NOT_SUPPORTED));
        assert_eq!(
            CUDA_GRAPH_NOT_SUPPORTED.known_name(),
            Some("CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API")
        );
        let text = e.to_string();
        assert!(text.contains("eng7_k2=1"), "{text}");
        assert!(
            text.contains("CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API"),
            "{text}"
        );
        assert!(require_native_support("eng7", &[]).is_err());
        assert!(require_native_support(
            "eng7",
            &[
                BehaviorNote::RuntimeCompilation,
                BehaviorNote::SupportsCudaGraphNativeApi
            ]
        )
        .is_ok());
    }

    #[test]
    fn filter_keeps_only_native_cuda_graph_engines() {
        let native = [BehaviorNote::SupportsCudaGraphNativeApi];
        let f = PlanFilter::new().with_cuda_graph_native(true);
        assert!(f.refuse(&[], &[]).is_some());
        assert!(f.refuse(&[], &[BehaviorNote::Other(99)]).is_some());
        assert!(f.refuse(&[], &native).is_none());
        // Off by default, and off again when asked.
        assert!(PlanFilter::new().refuse(&[], &[]).is_none());
        assert!(f
            .clone()
            .with_cuda_graph_native(false)
            .refuse(&[], &[])
            .is_none());
        assert_ne!(f, PlanFilter::new());
    }

    #[test]
    fn update_info_has_the_driver_layout() {
        use cudarc::driver::sys::CUgraphExecUpdateResultInfo;
        assert_eq!(
            std::mem::size_of::<UpdateInfo>(),
            std::mem::size_of::<CUgraphExecUpdateResultInfo>()
        );
        assert_eq!(
            std::mem::align_of::<UpdateInfo>(),
            std::mem::align_of::<CUgraphExecUpdateResultInfo>()
        );
    }
}
