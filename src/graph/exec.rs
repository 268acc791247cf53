//! Execution: buffers bound to tensors ([`Args`]), checked execution with a reused variant pack,
//! autotuning by timing, and the plan cache.
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};

use super::backend::{attr, ffi, kind, Desc};
use super::build::{GraphInner, OperationGraph};
use super::engine::{EngineConfig, Plan, PlanFilter, Skipped};
use super::{Graph, TensorId};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::workspace::Workspace;

/// Byte alignment every bound pointer must have (what the tensor descriptors declare).
const ALIGNMENT: u64 = 16;

struct Entry<'a> {
    id: TensorId,
    ptr: u64,
    len: usize,
    dtype: DType,
    output: bool,
    /// Device ordinal of the buffer's context when it is not the handle's.
    foreign: Option<usize>,
    /// The smallest and largest value, when the buffer's values were checked on the host
    /// ([`Args::lengths`], or a zero-filled scratch buffer).
    values: Option<(i64, i64)>,
    _guard: SyncOnDrop<'a>,
    /// A buffer the bindings own ([`Args::lengths`]): freed (stream-ordered) with them.
    _owned: Option<CudaSlice<i32>>,
}

/// Buffers bound to the tensors of a graph for [`Cudnn::execute`] and [`autotune`].
///
/// Binding takes the device pointer through cudarc (keeping its guard until `Args` is dropped, so
/// frees and other streams are ordered after the work enqueued with it). Every check against the
/// graph (tensor known, data type, length ≥ span, context, alignment, outputs bound mutably) runs
/// at execution, before anything is enqueued.
pub struct Args<'a> {
    stream: &'a Arc<CudaStream>,
    ctx: &'a cudarc::driver::CudaContext,
    entries: Vec<Entry<'a>>,
}

impl<'a> Args<'a> {
    /// Empty bindings for executions on `cudnn`.
    pub fn new(cudnn: &'a Cudnn) -> Args<'a> {
        Args {
            stream: cudnn.stream(),
            ctx: cudnn.context(),
            entries: Vec::new(),
        }
    }

    /// Where a buffer lives: the device ordinal of its context when it is not the handle's,
    /// and its length. Taken before its device pointer, whose guard borrows it.
    fn origin<T>(&self, buf: &impl DeviceSlice<T>) -> (Option<usize>, usize) {
        let ctx = buf.stream().context();
        let foreign = (**ctx != *self.ctx).then(|| ctx.ordinal());
        (foreign, buf.len())
    }

    /// Records a binding of tensor `id` to a buffer: its [`Args::origin`], then its device
    /// pointer with the guard to keep.
    fn push(
        &mut self,
        id: TensorId,
        dtype: DType,
        output: bool,
        (foreign, len): (Option<usize>, usize),
        (ptr, guard): (u64, SyncOnDrop<'a>),
    ) -> Result<&mut Self> {
        if self.entries.iter().any(|x| x.id == id) {
            return Err(Error::invalid(
                "graph buffer binding",
                "one buffer per tensor",
                format!("tensor uid {} bound twice", id.uid()),
            ));
        }
        self.entries.push(Entry {
            id,
            ptr,
            len,
            dtype,
            output,
            foreign,
            values: None,
            _guard: guard,
            _owned: None,
        });
        Ok(self)
    }

    /// A binding of a buffer the graph reads, of `dtype`.
    fn push_input<T>(
        &mut self,
        t: TensorId,
        buf: &'a impl DeviceBuffer<T>,
        dtype: DType,
    ) -> Result<&mut Self> {
        let origin = self.origin(buf);
        self.push(t, dtype, false, origin, buf.device_ptr(self.stream))
    }

    /// Binds a buffer the graph reads.
    pub fn input<T: DataType>(
        &mut self,
        t: TensorId,
        buf: &'a impl DeviceBuffer<T>,
    ) -> Result<&mut Self> {
        self.push_input(t, buf, T::DTYPE)
    }

    /// Binds a buffer of 64-bit integers the graph reads: a [`DType::I64`] tensor, such as the
    /// seed or offset of a dropout mask ([`super::Graph::rng_input`]). Checked at execution like
    /// every binding (a tensor of another data type rejects it, and an i64 tensor rejects a
    /// buffer bound with [`Args::input`]).
    pub fn input_i64(&mut self, t: TensorId, buf: &'a impl DeviceBuffer<i64>) -> Result<&mut Self> {
        self.push_input(t, buf, DType::I64)
    }

    /// Binds a scratch buffer of bytes to tensor `t` as `dtype` ([`PlanCache::warm_up`]); its
    /// length in elements is its bytes over `dtype`'s size, checked at execution like every
    /// binding.
    pub(crate) fn scratch(
        &mut self,
        t: TensorId,
        dtype: DType,
        output: bool,
        buf: &'a mut CudaSlice<u8>,
    ) -> Result<&mut Self> {
        let (foreign, bytes) = self.origin(&*buf);
        let ptr = buf.device_ptr_mut(self.stream);
        self.push(t, dtype, output, (foreign, bytes / dtype.size()), ptr)?;
        if let Some(e) = self.entries.last_mut() {
            // Zero-filled: every value is 0, within any lengths tensor's bound.
            e.values = Some((0, 0));
        }
        Ok(self)
    }

    /// Binds lengths read by the graph, such as the per-sequence lengths of attention's padding
    /// mask ([`super::SdpaOptions::padding`]): the values are copied to a device buffer the
    /// bindings own (freed, stream-ordered, when they are dropped), and checked at execution to
    /// lie in `0..=bound` for a tensor whose values bound what the plan reads (each sequence
    /// length at most the tensor's extent): such a tensor takes its values only this way, never
    /// from a device buffer the host has not seen. The tensor must be INT32; the copy is
    /// enqueued on the handle's stream.
    ///
    /// ```no_run
    /// # fn f(cudnn: &cudnn_safe::Cudnn, args: &mut cudnn_safe::graph::Args,
    /// #      seq_q: cudnn_safe::graph::TensorId) -> cudnn_safe::Result<()> {
    /// args.lengths(seq_q, &[128, 77, 1, 100])?; // one length per batch entry
    /// # Ok(()) }
    /// ```
    pub fn lengths(&mut self, t: TensorId, values: &[i32]) -> Result<&mut Self> {
        let (lo, hi) = values.iter().fold((i64::MAX, i64::MIN), |(lo, hi), &v| {
            (lo.min(v.into()), hi.max(v.into()))
        });
        let buf = self
            .stream
            .clone_htod(values)
            .map_err(|e| Error::driver("copying lengths to the device", e))?;
        let (ptr, _) = buf.device_ptr(self.stream);
        self.push(
            t,
            DType::I32,
            false,
            (None, values.len()),
            (ptr, SyncOnDrop::Sync(None)),
        )?;
        if let Some(e) = self.entries.last_mut() {
            e.values = (!values.is_empty()).then_some((lo, hi));
            e._owned = Some(buf);
        }
        Ok(self)
    }

    /// Binds a buffer the graph writes (a tensor marked as an output).
    pub fn output<T: DataType>(
        &mut self,
        t: TensorId,
        buf: &'a mut impl DeviceBufferMut<T>,
    ) -> Result<&mut Self> {
        let origin = self.origin(&*buf);
        self.push(t, T::DTYPE, true, origin, buf.device_ptr_mut(self.stream))
    }

    /// Checks the bindings against a plan's graph and returns the device pointers in the
    /// graph's pack order (the scalars' host addresses after them). Shared by
    /// [`Cudnn::execute`] and the CUDA-graph population, which must check the same things.
    pub(crate) fn pointers(&self, cudnn: &Cudnn, g: &GraphInner) -> Result<Vec<usize>> {
        // The guards order work on the stream the pointers were taken for: it must be the one
        // the execution is enqueued on.
        if !std::ptr::eq(&**self.stream, &**cudnn.stream()) {
            return Err(Error::invalid(
                "graph bindings",
                "Args created for the executing handle's stream",
                "Args of another stream",
            ));
        }
        let mut ptrs = Vec::with_capacity(g.pack_uids.len());
        for &i in &g.io {
            let m = &g.meta[i];
            let Some(e) = self
                .entries
                .iter()
                .find(|e| e.id.index == i && g.accepts(e.id.graph))
            else {
                return Err(Error::invalid(
                    "graph buffer binding",
                    format!("a buffer bound to tensor `{}` (uid {})", m.name, m.uid),
                    "none",
                ));
            };
            if let Some(found) = e.foreign {
                return Err(Error::ForeignContext {
                    name: m.name,
                    expected: cudnn.context().ordinal(),
                    found,
                });
            }
            if e.dtype != m.dtype {
                return Err(Error::UnsupportedDataType {
                    op: "graph execution",
                    detail: format!(
                        "tensor `{}` is {}, the buffer bound to it holds {}",
                        m.name, m.dtype, e.dtype
                    ),
                });
            }
            if m.is_output && !e.output {
                return Err(Error::invalid(
                    "graph buffer binding",
                    format!("output `{}` bound with Args::output", m.name),
                    "bound with Args::input",
                ));
            }
            if !m.is_output && e.output {
                return Err(Error::invalid(
                    "graph buffer binding",
                    format!("input `{}` bound with Args::input", m.name),
                    "bound with Args::output",
                ));
            }
            let layout = m.layout.as_ref().expect("bound tensors have a layout");
            if m.is_output {
                layout.check_output(m.name)?;
            }
            if e.len < layout.span() {
                return Err(Error::BufferTooSmall {
                    name: m.name,
                    len: e.len,
                    required: layout.span(),
                });
            }
            if let Some(bound) = m.bound {
                match e.values {
                    Some((lo, hi)) if lo >= 0 && hi <= bound => {}
                    Some((lo, hi)) => {
                        return Err(Error::invalid(
                            "graph lengths",
                            format!("`{}`: every value in 0..={bound}", m.name),
                            format!("values from {lo} to {hi}"),
                        ))
                    }
                    None => {
                        return Err(Error::invalid(
                            "graph buffer binding",
                            format!("lengths `{}` bound with Args::lengths", m.name),
                            "a device buffer whose values the host has not checked",
                        ))
                    }
                }
            }
            if e.ptr % ALIGNMENT != 0 {
                return Err(Error::invalid(
                    "graph buffer alignment",
                    format!("`{}` at a multiple of {ALIGNMENT} bytes", m.name),
                    format!("address {:#x}", e.ptr),
                ));
            }
            ptrs.push(e.ptr as usize);
        }
        for e in &self.entries {
            let accepted = g.accepts(e.id.graph);
            if !(accepted && g.io.contains(&e.id.index)) {
                return Err(Error::invalid(
                    "graph buffer binding",
                    "buffers bound only to tensors of the plan's graph that take one",
                    format!(
                        "a buffer bound to uid {}{}",
                        e.id.uid(),
                        g.meta
                            .get(e.id.index)
                            .filter(|_| accepted)
                            .map(|m| format!(" (`{}`, virtual or scalar)", m.name))
                            .unwrap_or_else(|| " of another graph".into())
                    ),
                ));
            }
        }
        // Each tensor found a buffer above; more accepted entries than tensors means one was
        // bound twice (through the ids of two graphs sharing the plan).
        if self.entries.len() != g.io.len() {
            return Err(Error::invalid(
                "graph buffer binding",
                "one buffer per tensor",
                format!("{} buffers for {} tensors", self.entries.len(), g.io.len()),
            ));
        }
        ptrs.extend(g.scalars.iter().map(|w| w as *const u64 as usize));
        Ok(ptrs)
    }
}

/// The variant pack of a plan's last execution and the pointers it holds.
pub(crate) struct PackCache {
    desc: Desc,
    ptrs: Vec<usize>,
    workspace: usize,
}

pub(crate) fn variant_pack(
    lib: &'static cudnn_safe_sys::Library,
    uids: &[i64],
    ptrs: &[usize],
    ws: usize,
) -> Result<Desc> {
    let mut v = Desc::new(lib, kind!(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR))?;
    let raw: Vec<*mut c_void> = ptrs.iter().map(|&p| p as *mut c_void).collect();
    v.set(attr!(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS), &raw)?;
    v.set(attr!(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS), uids)?;
    v.set1(attr!(CUDNN_ATTR_VARIANT_PACK_WORKSPACE), ws as *mut c_void)?;
    v.finalize()?;
    Ok(v)
}

impl Cudnn {
    /// The checks and preparation [`Cudnn::execute`] and [`Cudnn::populate_cuda_graph`] share
    /// once the plan is known to be this handle's: the bindings checked against the plan's graph
    /// (their pointers in pack order, [`Args::pointers`]), the workspace on this handle's
    /// context and grown to the plan's workspace size, this handle's context bound.
    pub(crate) fn prepare_launch(
        &self,
        plan: &Plan,
        args: &Args<'_>,
        ws: &mut Workspace,
    ) -> Result<Vec<usize>> {
        let ptrs = args.pointers(self, &plan.graph)?;
        if **ws.stream().context() != **self.context() {
            return Err(Error::ForeignContext {
                name: "workspace",
                expected: self.context().ordinal(),
                found: ws.stream().context().ordinal(),
            });
        }
        ws.prepare(plan.workspace_size())?;
        self.bind()?;
        Ok(ptrs)
    }

    /// Executes a plan on the buffers bound in `args`, with workspace from `ws` (grown to the
    /// plan's [`Plan::workspace_size`] if its limit allows).
    ///
    /// Checks first, returning an error with nothing enqueued: the plan was built on this handle;
    /// every tensor of the graph that takes a buffer has exactly one bound, on this handle's
    /// context, of the tensor's data type, holding at least its span, 16-byte aligned; outputs are
    /// bound with [`Args::output`] and do not overlap themselves; nothing else is bound; the
    /// workspace is on this context and large enough. The backend variant pack is rebuilt only
    /// when a pointer differs from the previous execution's.
    #[doc(alias = "cudnnBackendExecute")]
    pub fn execute(&self, plan: &Plan, args: &Args<'_>, ws: &mut Workspace) -> Result<()> {
        plan.graph.check_handle(self)?;
        let ptrs = self.prepare_launch(plan, args, ws)?;
        let (wp, _gw) = ws.device_ptr_mut(self.stream())?;
        let wp = wp as usize;
        let mut cache = plan.pack.borrow_mut();
        let reuse = cache
            .as_ref()
            .is_some_and(|c| c.workspace == wp && c.ptrs == ptrs);
        if !reuse {
            let desc = variant_pack(self.lib(), &plan.graph.pack_uids, &ptrs, wp)?;
            *cache = Some(PackCache {
                desc,
                ptrs,
                workspace: wp,
            });
        }
        let pack = &cache.as_ref().expect("set above").desc;
        // SAFETY: live handle, and the plan was built on it (checked); the plan keeps its graph,
        // engine configuration and every descriptor they refer to alive. The variant pack holds
        // exactly the pointers checked above for this call (rebuilt unless equal): each device
        // buffer is on this handle's context, of the tensor's data type, holds at least its
        // tensor's span, is 16-byte aligned, and outputs do not overlap themselves; the guards in
        // `args` and `_gw` keep the buffers alive and ordered until the work is enqueued. Scalars
        // point to 8-byte host words of the graph (alive in `plan`), holding the tensor's type.
        // The workspace holds at least the plan's workspace size (`prepare` in `prepare_launch`).
        unsafe {
            ffi::cudnnBackendExecute(self.lib(), self.as_raw(), plan.plan.as_raw(), pack.as_raw())
        }
    }
}

/// How [`autotune`] times candidates.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AutotuneOptions {
    rounds: usize,
    iterations: usize,
}

impl Default for AutotuneOptions {
    fn default() -> Self {
        AutotuneOptions {
            rounds: 3,
            iterations: 5,
        }
    }
}

impl AutotuneOptions {
    /// Defaults: 3 rounds of 5 executions, after one warm-up execution.
    pub fn new() -> Self {
        Self::default()
    }
    /// Timed rounds per candidate (the best round counts), at least 1.
    #[must_use]
    pub fn rounds(mut self, n: usize) -> Self {
        self.rounds = n.max(1);
        self
    }
    /// Executions per round, at least 1.
    #[must_use]
    pub fn iterations(mut self, n: usize) -> Self {
        self.iterations = n.max(1);
        self
    }
}

/// The measured time of one candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    /// The plan's name ([`Plan::name`]).
    pub name: String,
    /// Milliseconds per execution, best round.
    pub ms: f32,
}

/// The result of [`autotune`].
#[derive(Debug)]
pub struct Tuned {
    /// The fastest plan.
    pub plan: Plan,
    /// Every candidate that ran, fastest first.
    pub timings: Vec<Timing>,
    /// Candidates that could not run (workspace limit, execution error).
    pub failed: Vec<Skipped>,
}

/// Times each plan on the bound buffers (CUDA events around `iterations` executions, best of
/// `rounds`, after a warm-up) and returns the fastest.
///
/// The outputs bound in `args` are overwritten by every candidate: bind scratch buffers if their
/// contents matter. A candidate whose workspace does not fit `ws`'s limit, or that fails to
/// execute, is skipped; [`Error::NoAlgorithm`] when none runs.
pub fn autotune(
    cudnn: &Cudnn,
    plans: Vec<Plan>,
    args: &Args<'_>,
    ws: &mut Workspace,
    opts: &AutotuneOptions,
) -> Result<Tuned> {
    let stream = cudnn.stream();
    let event = || {
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| Error::driver("recording a graph autotune event", e))
    };
    let mut best: Option<(f32, Plan)> = None;
    let mut timings = Vec::new();
    let mut failed = Vec::new();
    for plan in plans {
        let name = plan.name();
        let run = |ws: &mut Workspace| -> Result<f32> {
            cudnn.execute(&plan, args, ws)?;
            let mut fastest = f32::INFINITY;
            for _ in 0..opts.rounds {
                let start = event()?;
                for _ in 0..opts.iterations {
                    cudnn.execute(&plan, args, ws)?;
                }
                let end = event()?;
                let ms = start
                    .elapsed_ms(&end)
                    .map_err(|e| Error::driver("timing a graph plan", e))?;
                fastest = fastest.min(ms / opts.iterations as f32);
            }
            Ok(fastest)
        };
        match run(ws) {
            Ok(ms) => {
                log::debug!("graph autotune: {name} {ms:.4} ms");
                timings.push(Timing { name, ms });
                if best.as_ref().map_or(true, |(b, _)| ms < *b) {
                    best = Some((ms, plan));
                }
            }
            Err(e) => {
                // An argument error is the caller's, not the candidate's: report it.
                if matches!(
                    e,
                    Error::BufferTooSmall { .. }
                        | Error::ForeignContext { .. }
                        | Error::OverlappingOutput { .. }
                        | Error::UnsupportedDataType { .. }
                ) || matches!(e, Error::InvalidArgument { what, .. } if what.starts_with("graph") || what == "cuDNN handle")
                {
                    return Err(e);
                }
                log::debug!("graph autotune: {name} failed: {e}");
                failed.push(Skipped {
                    name,
                    reason: e.to_string(),
                });
            }
        }
    }
    timings.sort_by(|a, b| a.ms.total_cmp(&b.ms));
    match best {
        Some((_, plan)) => Ok(Tuned {
            plan,
            timings,
            failed,
        }),
        None => Err(Error::NoAlgorithm {
            op: "graph autotune",
            detail: failed
                .iter()
                .map(|s| format!("{}: {}", s.name, s.reason))
                .collect::<Vec<_>>()
                .join("; "),
        }),
    }
}

/// Plans kept by graph signature, filter, GPU and cuDNN version, so that a graph seen before
/// reuses its plan instead of asking the heuristics (or autotuning) again.
///
/// Plans run only on the handle they were built on: an entry built on another handle counts as
/// a miss and is replaced. With a file ([`PlanCache::with_file`]) the chosen engine
/// configurations persist with their graphs ([`Graph::to_json`]), and a new process rebuilds
/// only the chosen plan ([`OperationGraph::plan_from_config`]). [`PlanCache::warm_up`] does that
/// at start-up for every graph in the file and executes each plan once, so that the first call
/// of the process finds its plan held and its kernel loaded.
///
/// ```no_run
/// # use cudnn_safe::graph::{Graph, PlanCache, PlanFilter};
/// # fn f(cudnn: &cudnn_safe::Cudnn, g: &Graph) -> cudnn_safe::Result<()> {
/// let mut cache = PlanCache::with_file("/tmp/graph-plans.txt")?;
/// let og = g.build(cudnn)?;
/// let plan = cache.get_or_build(cudnn, &og, &PlanFilter::default())?;
/// println!("{} needs {} workspace bytes", plan.name(), plan.workspace_size());
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct PlanCache {
    plans: HashMap<String, Plan>,
    configs: HashMap<String, EngineConfig>,
    /// The graph of each persisted configuration ([`Graph::to_json`]), where it could be written.
    graphs: HashMap<String, String>,
    path: Option<PathBuf>,
    hits: u64,
    misses: u64,
}

/// What [`PlanCache::warm_up`] did.
#[derive(Debug, Clone, Default)]
pub struct PlanWarmUp {
    /// Entries whose plan was rebuilt from the recorded graph, executed once on scratch buffers
    /// and is now held by the cache.
    pub replayed: usize,
    /// Entries of this GPU and cuDNN version whose plan was already held on this handle.
    pub held: usize,
    /// Entries of this GPU and cuDNN version not replayed, with why (no recorded graph, a record
    /// that does not read back, a plan that no longer builds or runs).
    pub skipped: Vec<Skipped>,
    /// Entries of other GPUs or cuDNN versions (left alone).
    pub other: usize,
    /// Largest workspace a replayed plan needs (the workspace was grown to it).
    pub workspace: usize,
    /// Wall time of the warm-up, the GPU work included.
    pub elapsed: Duration,
}

impl PlanCache {
    /// An empty in-memory cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache persisting its choices to `path` (read now if it exists; written after each new
    /// choice). Lines are `<engine config>\t<key>\t<graph>` (the graph as [`Graph::to_json`]
    /// writes it; lines without one are still read, for their choice only); malformed lines are
    /// ignored. A configuration read from the file is checked against its engine's knobs when
    /// its plan is built ([`OperationGraph::plan_from_config`]); one that fails is logged and
    /// replaced.
    ///
    /// Errors: [`Error::Io`] (the path and the operating system's error) when the file exists
    /// but cannot be read (not a regular file, no permission, larger than 64 MiB).
    pub fn with_file(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let mut configs = HashMap::new();
        let mut graphs = HashMap::new();
        let bytes = crate::persist::read(&path)?.unwrap_or_default();
        for (_, line) in crate::persist::lines(&bytes) {
            let Some(line) = line else { continue };
            let mut fields = line.splitn(3, '\t');
            let (Some(cfg), Some(key)) = (fields.next(), fields.next()) else {
                continue;
            };
            let Ok(c) = cfg.parse::<EngineConfig>() else {
                continue;
            };
            configs.insert(key.to_string(), c);
            if let Some(g) = fields.next().filter(|g| !g.is_empty()) {
                graphs.insert(key.to_string(), g.to_string());
            }
        }
        Ok(PlanCache {
            configs,
            graphs,
            path: Some(path),
            ..Default::default()
        })
    }

    /// The start of every key of this handle's GPU and cuDNN version.
    fn key_prefix(cudnn: &Cudnn) -> String {
        let ctx = cudnn.context();
        let name = ctx
            .name()
            .unwrap_or_else(|_| format!("device{}", ctx.ordinal()));
        let (major, minor) = ctx.compute_capability().unwrap_or((0, 0));
        format!(
            "{} sm{major}{minor} cudnn{} | ",
            name.replace(['\t', '\n'], " "),
            cudnn.version()
        )
    }

    /// The key of a graph under a filter on this handle's GPU and cuDNN version.
    pub fn key(cudnn: &Cudnn, og: &OperationGraph, filter: &PlanFilter) -> String {
        format!("{}{filter:?} | {}", Self::key_prefix(cudnn), og.signature())
    }

    /// The cached plan for this graph and filter on this handle, if any (counts a hit or a miss).
    /// A plan found for another graph of the same signature is shared with `og`
    /// ([`Plan::share_with`]), so it executes with `og`'s tensor ids.
    pub fn get(
        &mut self,
        cudnn: &Cudnn,
        og: &OperationGraph,
        filter: &PlanFilter,
    ) -> Option<&Plan> {
        let key = Self::key(cudnn, og, filter);
        let hit = self
            .plans
            .get(&key)
            .is_some_and(|p| p.graph.check_handle(cudnn).is_ok() && p.share_with(og).is_ok());
        if hit {
            self.hits += 1;
            self.plans.get(&key)
        } else {
            self.misses += 1;
            None
        }
    }

    /// Stores a plan for this graph and filter (replacing any), persisting its configuration and
    /// graph when the cache has a file.
    pub fn insert(
        &mut self,
        cudnn: &Cudnn,
        og: &OperationGraph,
        filter: &PlanFilter,
        plan: Plan,
    ) -> Result<&Plan> {
        if plan.signature() != og.signature() {
            return Err(Error::invalid(
                "graph plan cache entry",
                "a plan of the graph it is stored under",
                "a plan of another graph",
            ));
        }
        let key = Self::key(cudnn, og, filter);
        let record = match og.graph().to_json() {
            Ok(r) => Some(r),
            Err(e) => {
                log::debug!("graph plan cache: the graph is kept without its record: {e}");
                None
            }
        };
        let changed = self.configs.get(&key) != Some(plan.config())
            || self.graphs.get(&key) != record.as_ref();
        self.configs.insert(key.clone(), plan.config().clone());
        match record {
            Some(r) => self.graphs.insert(key.clone(), r),
            None => self.graphs.remove(&key),
        };
        if changed {
            self.save()?;
        }
        self.plans.insert(key.clone(), plan);
        Ok(&self.plans[&key])
    }

    /// The cached plan, or the persisted configuration's plan, or the first plan the filter
    /// yields (the heuristics' favourite), stored for next time.
    pub fn get_or_build(
        &mut self,
        cudnn: &Cudnn,
        og: &OperationGraph,
        filter: &PlanFilter,
    ) -> Result<&Plan> {
        self.get_or_make(cudnn, og, filter, || {
            Ok(og
                .plans(cudnn, &filter.clone().max_plans(Some(1)))?
                .plans
                .swap_remove(0))
        })
    }

    /// The cached plan, or the persisted configuration's plan, or the fastest of the filter's
    /// plans timed by [`autotune`] on `args` (whose outputs are overwritten), stored for next
    /// time.
    pub fn get_or_autotune(
        &mut self,
        cudnn: &Cudnn,
        og: &OperationGraph,
        filter: &PlanFilter,
        args: &Args<'_>,
        ws: &mut Workspace,
        opts: &AutotuneOptions,
    ) -> Result<&Plan> {
        self.get_or_make(cudnn, og, filter, || {
            Ok(autotune(cudnn, og.plans(cudnn, filter)?.plans, args, ws, opts)?.plan)
        })
    }

    /// The cached plan, or the persisted configuration's plan, or the plan of `make`, stored
    /// for next time.
    fn get_or_make(
        &mut self,
        cudnn: &Cudnn,
        og: &OperationGraph,
        filter: &PlanFilter,
        make: impl FnOnce() -> Result<Plan>,
    ) -> Result<&Plan> {
        let key = Self::key(cudnn, og, filter);
        if self.get(cudnn, og, filter).is_some() {
            return Ok(&self.plans[&key]);
        }
        let plan = match self.persisted(cudnn, og, &key) {
            Some(p) => p,
            None => make()?,
        };
        self.insert(cudnn, og, filter, plan)
    }

    /// The plan of the persisted configuration for `key`, if there is one and it still builds.
    fn persisted(&self, cudnn: &Cudnn, og: &OperationGraph, key: &str) -> Option<Plan> {
        let cfg = self.configs.get(key)?;
        match og.plan_from_config(cudnn, cfg) {
            Ok(p) => Some(p),
            Err(e) => {
                log::warn!("graph plan cache: persisted {cfg} no longer builds: {e}");
                None
            }
        }
    }

    /// Start-up work for a cache read from a file: for every persisted entry of this handle's
    /// GPU and cuDNN version, reads its graph back ([`Graph::from_json`], checked), builds it,
    /// builds the chosen plan ([`OperationGraph::plan_from_config`]) and executes it once on
    /// zero-filled scratch buffers (one per tensor, of its span; freed afterwards) with `ws`
    /// (grown to the plan's workspace size), then holds the plan. A later [`PlanCache::get`] of a
    /// graph with the same signature finds it, and its first execution finds its kernel loaded:
    /// CUDA loads a kernel lazily at its first launch, so without this warm-up the first real
    /// call pays for it (after [`super::preload`], that is what remains of a new process's first
    /// call).
    ///
    /// The file is trusted for the choice and the graph description only: the graph passes the
    /// record checks and cuDNN's validation, a key whose signature is not its graph's is
    /// skipped, and the scratch execution is checked like every [`Cudnn::execute`]. An entry
    /// that fails is reported in [`PlanWarmUp::skipped`] (and logged) and left for
    /// [`PlanCache::get_or_build`]. Each entry is logged at `info` level as it finishes (plans
    /// of runtime-compiled engines take up to about a second each to build).
    ///
    /// ```no_run
    /// # use cudnn_safe::graph::PlanCache;
    /// # fn f(cudnn: &cudnn_safe::Cudnn) -> cudnn_safe::Result<()> {
    /// cudnn_safe::graph::preload(cudnn)?;
    /// let mut cache = PlanCache::with_file("/tmp/graph-plans.txt")?;
    /// let mut ws = cudnn_safe::Workspace::new(cudnn.stream().clone());
    /// let w = cache.warm_up(cudnn, &mut ws)?;
    /// println!("{} plans ready in {:?}, {} skipped", w.replayed, w.elapsed, w.skipped.len());
    /// # Ok(()) }
    /// ```
    pub fn warm_up(&mut self, cudnn: &Cudnn, ws: &mut Workspace) -> Result<PlanWarmUp> {
        self.warm_up_within(cudnn, ws, usize::MAX)
    }

    /// [`PlanCache::warm_up`] within a memory limit: an entry whose scratch memory (the
    /// buffers of all its graph's tensors plus its plan's workspace, in bytes) would exceed
    /// `max_scratch_bytes` is skipped (reported in [`PlanWarmUp::skipped`] with its size, and
    /// left for [`PlanCache::get_or_build`]) instead of allocated (a bf16 attention graph of
    /// 8×16×4096×128 needs about 0.5 GB of scratch forward and 1.4 GB backward). The buffers
    /// are checked before the plan is built, the workspace after.
    ///
    /// ```no_run
    /// # use cudnn_safe::graph::PlanCache;
    /// # fn f(cudnn: &cudnn_safe::Cudnn) -> cudnn_safe::Result<()> {
    /// let mut cache = PlanCache::with_file("/tmp/graph-plans.txt")?;
    /// let mut ws = cudnn_safe::Workspace::new(cudnn.stream().clone());
    /// // Replay only graphs that fit in 256 MiB of scratch.
    /// let w = cache.warm_up_within(cudnn, &mut ws, 256 << 20)?;
    /// for s in &w.skipped {
    ///     println!("not warmed up: {} ({})", s.name, s.reason);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn warm_up_within(
        &mut self,
        cudnn: &Cudnn,
        ws: &mut Workspace,
        max_scratch_bytes: usize,
    ) -> Result<PlanWarmUp> {
        let started = Instant::now();
        let mut done = PlanWarmUp::default();
        let prefix = Self::key_prefix(cudnn);
        let mut keys: Vec<String> = self.configs.keys().cloned().collect();
        keys.sort();
        let total = keys.iter().filter(|k| k.starts_with(&prefix)).count();
        let mut seen = 0;
        for key in keys {
            if !key.starts_with(&prefix) {
                done.other += 1;
                continue;
            }
            seen += 1;
            let cfg = self.configs[&key].clone();
            if self
                .plans
                .get(&key)
                .is_some_and(|p| p.graph.check_handle(cudnn).is_ok())
            {
                done.held += 1;
                continue;
            }
            let t = Instant::now();
            let outcome = match self.graphs.get(&key) {
                Some(record) => replay(cudnn, ws, &key, &cfg, record, max_scratch_bytes),
                None => Err(Error::invalid(
                    "graph plan cache entry",
                    "a recorded graph",
                    "a configuration only (written before graphs were recorded, or a graph \
                     JSON cannot hold)",
                )),
            };
            match outcome {
                Ok(plan) => {
                    log::info!(
                        "graph plan cache warm-up [{seen}/{total}]: {cfg} ready in {:.1} ms",
                        t.elapsed().as_secs_f64() * 1e3
                    );
                    done.replayed += 1;
                    done.workspace = done.workspace.max(plan.workspace_size());
                    self.plans.insert(key, plan);
                }
                Err(e) => {
                    log::info!("graph plan cache warm-up [{seen}/{total}]: {cfg} skipped: {e}");
                    done.skipped.push(Skipped {
                        name: cfg.to_string(),
                        reason: e.to_string(),
                    });
                }
            }
        }
        cudnn
            .stream()
            .synchronize()
            .map_err(|e| Error::driver("synchronizing after the plan cache warm-up", e))?;
        done.elapsed = started.elapsed();
        log::info!(
            "graph plan cache warm-up: {} plans replayed, {} held, {} skipped, {} of other \
             devices or versions, {:.1} ms",
            done.replayed,
            done.held,
            done.skipped.len(),
            done.other,
            done.elapsed.as_secs_f64() * 1e3
        );
        Ok(done)
    }

    /// Writes the persisted configurations (no-op without a file), atomically: readers see the
    /// old file or the new one. Errors: [`Error::Io`] (the path and the operating system's
    /// error) when it cannot be written; the file is then left as it was.
    pub fn save(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        save_configs(path, &self.configs, &self.graphs)
    }

    /// Number of plans held in memory.
    pub fn len(&self) -> usize {
        self.plans.len()
    }
    /// Whether no plan is held in memory.
    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }
    /// Lookups that found a plan.
    pub fn hits(&self) -> u64 {
        self.hits
    }
    /// Lookups that found none.
    pub fn misses(&self) -> u64 {
        self.misses
    }
    /// Drops the plans held in memory (persisted configurations stay).
    pub fn clear(&mut self) {
        self.plans.clear();
    }
}

/// One entry of [`PlanCache::warm_up`]: the recorded graph read back and built, checked against
/// its key, the chosen plan built and executed once on zero-filled scratch buffers.
fn replay(
    cudnn: &Cudnn,
    ws: &mut Workspace,
    key: &str,
    cfg: &EngineConfig,
    record: &str,
    max_scratch_bytes: usize,
) -> Result<Plan> {
    let og = Graph::from_json(record)?.build(cudnn)?;
    if !key.ends_with(&format!(" | {}", og.signature())) {
        return Err(Error::invalid(
            "graph plan cache entry",
            "a recorded graph of the signature in its key",
            "a graph of another signature",
        ));
    }
    let g = &og.inner;
    let mut sizes = Vec::with_capacity(g.io.len());
    for &i in &g.io {
        let m = &g.meta[i];
        let span = m.layout.as_ref().map_or(1, |l| l.span());
        let bytes = span
            .checked_mul(m.dtype.size())
            .ok_or_else(|| Error::Overflow {
                what: "plan cache warm-up buffer",
                detail: format!("`{}`: {span} elements of {}", m.name, m.dtype),
            })?;
        sizes.push(bytes.max(1));
    }
    let over = |bytes: usize| {
        Error::invalid(
            "plan cache warm-up scratch memory",
            format!("at most {max_scratch_bytes} bytes (the warm-up's limit)"),
            format!("{bytes} bytes"),
        )
    };
    let buffers = sizes.iter().fold(0usize, |a, &b| a.saturating_add(b));
    if buffers > max_scratch_bytes {
        return Err(over(buffers));
    }
    let plan = og.plan_from_config(cudnn, cfg)?;
    let total = buffers.saturating_add(plan.workspace_size());
    if total > max_scratch_bytes {
        return Err(over(total));
    }
    let stream = cudnn.stream();
    let mut bufs = Vec::with_capacity(g.io.len());
    for (&i, &bytes) in g.io.iter().zip(&sizes) {
        let m = &g.meta[i];
        let buf = stream
            .alloc_zeros::<u8>(bytes)
            .map_err(|e| Error::driver("allocating a plan cache warm-up buffer", e))?;
        bufs.push((i, m.dtype, m.is_output, buf));
    }
    let mut args = Args::new(cudnn);
    for (i, dtype, output, buf) in &mut bufs {
        let id = TensorId {
            graph: g.graph_id,
            index: *i,
        };
        args.scratch(id, *dtype, *output, buf)?;
    }
    cudnn.execute(&plan, &args, ws)?;
    Ok(plan)
}

fn save_configs(
    path: &Path,
    configs: &HashMap<String, EngineConfig>,
    graphs: &HashMap<String, String>,
) -> Result<()> {
    use std::fmt::Write;
    let mut lines: Vec<String> = configs
        .iter()
        .map(|(k, c)| {
            let key = k.replace(['\n', '\t'], " ");
            match graphs.get(k) {
                Some(g) => format!("{c}\t{key}\t{}", g.replace(['\n', '\t'], " ")),
                None => format!("{c}\t{key}"),
            }
        })
        .collect();
    lines.sort();
    let mut text = String::new();
    for l in lines {
        let _ = writeln!(text, "{l}");
    }
    crate::persist::write_atomic(path, text.as_bytes())
}
