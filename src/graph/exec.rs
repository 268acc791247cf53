//! Execution: buffers bound to tensors ([`Args`]), checked execution with a reused variant pack,
//! autotuning by timing, and the plan cache.
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};

use super::backend::{attr, ffi, kind, Desc};
use super::build::{GraphInner, OperationGraph, TensorMeta};
use super::engine::Plan;
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

/// Buffers bound to the tensors of a graph for [`Cudnn::execute`] and [`autotune`](crate::tune::plan::autotune).
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
            check_binding(cudnn, e, m)?;
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

/// The checks of one buffer bound to the graph tensor `m`: on the handle's context, of the
/// tensor's data type, bound as input or output as the tensor is, at least the tensor's span
/// (an output's layout not overlapping itself), lengths checked on the host within their bound,
/// and aligned as the backend requires.
fn check_binding(cudnn: &Cudnn, e: &Entry<'_>, m: &TensorMeta) -> Result<()> {
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
    Ok(())
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

/// One entry of [`PlanCache::warm_up`], read back: the recorded graph built and checked against
/// its key, the bytes of each of its tensors' scratch buffers known and within the limit. Its
/// plan is built next (with the other entries', on several threads), then [`Replay::run`].
pub(crate) struct Replay {
    pub(crate) og: OperationGraph,
    /// Bytes of each scratch buffer, in the order of the graph's tensors (`io`).
    sizes: Vec<usize>,
    /// Their sum.
    buffers: usize,
    max_scratch_bytes: usize,
}

impl Replay {
    /// The recorded graph `record` of the entry `key` read back and built; its scratch buffers'
    /// sizes checked against `max_scratch_bytes`.
    pub(crate) fn prepare(
        cudnn: &Cudnn,
        key: &str,
        record: &str,
        max_scratch_bytes: usize,
    ) -> Result<Replay> {
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
        let buffers = sizes.iter().fold(0usize, |a, &b| a.saturating_add(b));
        let replay = Replay {
            og,
            sizes,
            buffers,
            max_scratch_bytes,
        };
        if buffers > max_scratch_bytes {
            return Err(replay.over(buffers));
        }
        Ok(replay)
    }

    fn over(&self, bytes: usize) -> Error {
        Error::invalid(
            "plan cache warm-up scratch memory",
            format!(
                "at most {} bytes (the warm-up's limit)",
                self.max_scratch_bytes
            ),
            format!("{bytes} bytes"),
        )
    }

    /// Executes `plan` (built from this graph) once on zero-filled scratch buffers, freed
    /// afterwards, with `ws` grown to the plan's workspace size when the buffers and the
    /// workspace fit the limit; returns the plan.
    pub(crate) fn run(self, cudnn: &Cudnn, ws: &mut Workspace, plan: Plan) -> Result<Plan> {
        let total = self.buffers.saturating_add(plan.workspace_size());
        if total > self.max_scratch_bytes {
            return Err(self.over(total));
        }
        let g = &self.og.inner;
        let stream = cudnn.stream();
        let mut bufs = Vec::with_capacity(g.io.len());
        for (&i, &bytes) in g.io.iter().zip(&self.sizes) {
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
}
