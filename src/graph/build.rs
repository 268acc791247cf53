//! From a host [`Graph`] to finalized backend descriptors: tensors, operations and the
//! operation graph ([`OperationGraph`]).
use std::sync::Arc;

use cudarc::driver::CudaContext;
use cudnn_safe_sys as sys;
use cudnn_safe_sys::Library;

use super::backend::{attr, kind, with_cudnn_message, Desc};
use super::conv::conv_desc;
use super::matmul::matmul_desc;
use super::reduction::reduction_desc;
use super::select::{select_desc, transpose_desc};
use super::{Graph, Op, TensorId, TensorInfo};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::raw;
use crate::tensor::Layout;

/// What execution needs to know about one tensor.
#[derive(Debug, Clone)]
pub(crate) struct TensorMeta {
    pub(crate) name: &'static str,
    pub(crate) uid: i64,
    pub(crate) layout: Option<Layout>,
    pub(crate) dtype: DType,
    pub(crate) is_virtual: bool,
    pub(crate) is_output: bool,
    pub(crate) is_scalar: bool,
    /// Lengths tensor: values must lie in `0..=bound` ([`crate::graph::Args::lengths`]).
    pub(crate) bound: Option<i64>,
}

/// The finalized tensor and operation descriptors of a graph (host side, no handle needed).
pub(crate) struct Parts {
    /// Operations, in graph order.
    ops: Vec<Desc>,
    /// Descriptors the operations refer to (convolution, pointwise, matmul, reduction).
    aux: Vec<Desc>,
    /// Tensor descriptors, by tensor index.
    tensors: Vec<Desc>,
}

/// Adds "what" to the message of a cuDNN error (the tensor or operation being built).
fn context(e: Error, what: impl FnOnce() -> String) -> Error {
    with_cudnn_message(e, |message| format!("{}: {message}", what()))
}

/// An 8-byte host word holding `v` in `dtype`'s representation, in its first bytes (what cuDNN
/// reads through a by-value tensor's pointer).
pub(crate) fn scalar_word(v: f64, dtype: DType) -> u64 {
    let mut b = [0u8; 8];
    match dtype {
        DType::F64 => b.copy_from_slice(&v.to_ne_bytes()),
        DType::F16 => b[..2].copy_from_slice(&half::f16::from_f64(v).to_ne_bytes()),
        DType::BF16 => b[..2].copy_from_slice(&half::bf16::from_f64(v).to_ne_bytes()),
        DType::I32 => b[..4].copy_from_slice(&(v as i32).to_ne_bytes()),
        _ => b[..4].copy_from_slice(&(v as f32).to_ne_bytes()),
    }
    u64::from_ne_bytes(b)
}

/// Dimensions and strides cuDNN is told for a tensor when they differ from the graph's: a
/// matmul operand broadcast along batch dimensions.
type View = (Vec<i64>, Vec<i64>);

/// `view` replaces the tensor's dims and strides in the descriptor (see [`Graph::matmul_views`]);
/// `boolean` declares it `CUDNN_DATA_BOOLEAN` (a comparison's virtual result).
fn tensor_desc(
    lib: &'static Library,
    uid: i64,
    t: &TensorInfo,
    view: Option<&View>,
    boolean: bool,
) -> Result<Desc> {
    let (dims, strides) = match view {
        Some((d, s)) => (d, s),
        None => (&t.dims, &t.strides),
    };
    let mut d = Desc::new(lib, kind!(CUDNN_BACKEND_TENSOR_DESCRIPTOR))?;
    let dtype = if boolean {
        sys::cudnnDataType_t::CUDNN_DATA_BOOLEAN
    } else {
        t.dtype.raw()
    };
    d.set1(attr!(CUDNN_ATTR_TENSOR_DATA_TYPE), dtype)?;
    d.set(attr!(CUDNN_ATTR_TENSOR_DIMENSIONS), dims)?;
    d.set(attr!(CUDNN_ATTR_TENSOR_STRIDES), strides)?;
    d.set1(attr!(CUDNN_ATTR_TENSOR_UNIQUE_ID), uid)?;
    // 16 bytes, as cudnn-frontend sets; execution checks every pointer against it.
    d.set1(attr!(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), 16i64)?;
    if t.is_virtual {
        d.set1(attr!(CUDNN_ATTR_TENSOR_IS_VIRTUAL), true)?;
    }
    if t.scalar.is_some() {
        d.set1(attr!(CUDNN_ATTR_TENSOR_IS_BY_VALUE), true)?;
    }
    d.finalize()?;
    Ok(d)
}

impl Graph {
    /// How cuDNN is told about matmul operands broadcast along batch dimensions: with the
    /// output's batch extents and stride 0 there (the element read is the same for every batch
    /// index, which is what the broadcast means), so that no engine has to infer the batch count
    /// from the operands. With cuDNN 9.14 a plain matmul engine given `[1, K, N]`
    /// against `a` `[3, M, K]` wrote only the first batch of the output; with this description
    /// every engine sees equal batch extents. Buffers keep the tensor's own layout (same span).
    ///
    /// Such an operand must be read by no other operation (its one descriptor carries the
    /// expanded dimensions); [`Graph::matmul`] already refused virtual ones.
    pub(crate) fn matmul_views(&self) -> Result<Vec<Option<View>>> {
        let mut views: Vec<Option<View>> = vec![None; self.tensors.len()];
        let mut reads = vec![0usize; self.tensors.len()];
        for op in &self.ops {
            for i in op.reads() {
                reads[i] += 1;
            }
        }
        for op in &self.ops {
            let Op::Matmul {
                a,
                b,
                c,
                grouped: false,
                ..
            } = *op
            else {
                continue;
            };
            let out = &self.tensors[c].dims;
            let r = out.len();
            for i in [a, b] {
                let t = &self.tensors[i];
                if (0..r - 2).all(|d| t.dims[d] == out[d]) {
                    continue;
                }
                if reads[i] != 1 {
                    return Err(Error::invalid(
                        "matmul operand",
                        "an operand broadcast along a batch dimension is read by this matmul only",
                        format!(
                            "`{}` {:?} is read by {} operations",
                            t.name, t.dims, reads[i]
                        ),
                    ));
                }
                let mut dims = t.dims.clone();
                let mut strides = t.strides.clone();
                for d in 0..r - 2 {
                    if dims[d] != out[d] {
                        dims[d] = out[d];
                        strides[d] = 0;
                    }
                }
                views[i] = Some((dims, strides));
            }
        }
        Ok(views)
    }

    /// Creates and finalizes every tensor and operation descriptor (host only).
    fn build_parts(&self, lib: &'static Library) -> Result<Parts> {
        self.check_structure()?;
        for t in &self.tensors {
            if t.scalar.is_some() && t.dims.is_empty() {
                return Err(Error::invalid(
                    "graph scalar",
                    "a scalar read by an operation",
                    format!("`{}` is not read", t.name),
                ));
            }
        }
        let views = self.matmul_views()?;
        let booleans = self.boolean_tensors();
        let mut tensors = Vec::with_capacity(self.tensors.len());
        for (i, t) in self.tensors.iter().enumerate() {
            let d = tensor_desc(lib, i as i64 + 1, t, views[i].as_ref(), booleans[i])
                .map_err(|e| context(e, || format!("tensor `{}`", t.name)))?;
            tensors.push(d);
        }
        let comp = self.compute_type().raw();
        let mut ops = Vec::with_capacity(self.ops.len());
        let mut aux = Vec::new();
        for (i, op) in self.ops.iter().enumerate() {
            let (o, a) = self
                .op_desc(lib, op, comp, &tensors)
                .map_err(|e| context(e, || format!("operation #{i} ({})", op.name())))?;
            ops.push(o);
            aux.extend(a);
        }
        Ok(Parts { ops, aux, tensors })
    }

    /// One operation descriptor, and the descriptor it refers to besides tensors.
    fn op_desc(
        &self,
        lib: &'static Library,
        op: &Op,
        comp: sys::cudnnDataType_t,
        t: &[Desc],
    ) -> Result<(Desc, Option<Desc>)> {
        match op {
            Op::ConvFprop { .. } | Op::ConvDgrad { .. } | Op::ConvWgrad { .. } => {
                conv_desc(lib, op, comp, t)
            }
            Op::Matmul { a, b, c, over, .. } => matmul_desc(lib, [*a, *b, *c], over, comp, t),
            Op::Pointwise { mode, .. } | Op::PointwiseBwd { mode, .. } => {
                self.pointwise_desc(lib, op, *mode, comp, t)
            }
            Op::Select { x, b, cond, y } => select_desc(lib, [*x, *b, *cond, *y], comp, t),
            Op::Transpose { x, y } => transpose_desc(lib, *x, *y, t),
            Op::Reduction { op, x, y } => reduction_desc(lib, *op, *x, *y, comp, t),
            Op::Rng(r) => r.descs(lib, t),
            Op::NormFwd(n) => Ok((n.desc(self, lib, t)?, None)),
            Op::NormBwd(n) => Ok((n.desc(self, lib, t)?, None)),
        }
    }

    /// Validates the graph with cuDNN without a handle (no GPU needed): the structure checks of
    /// [`Graph::build`], then every tensor and operation descriptor is created and finalized, so
    /// cuDNN's own validation of shapes, strides and parameters runs. Errors name the tensor or
    /// operation.
    #[doc(alias = "cudnnBackendFinalize")]
    pub fn check(&self) -> Result<()> {
        self.build_parts(raw::lib()?).map(|_| ())
    }

    /// Hands the graph to cuDNN on `cudnn`'s handle: creates and finalizes every tensor and
    /// operation descriptor and the operation graph. Errors name the tensor or operation
    /// cuDNN rejected (e.g. `CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN` for a pattern no engine
    /// knows, which may also only show when plans are built).
    #[doc(alias = "CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR")]
    pub fn build(&self, cudnn: &Cudnn) -> Result<OperationGraph> {
        let lib = cudnn.lib();
        let parts = self.build_parts(lib)?;
        cudnn.bind()?;
        let mut graph = Desc::new(lib, kind!(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR))?;
        let refs: Vec<&Desc> = parts.ops.iter().collect();
        graph.set_descs(attr!(CUDNN_ATTR_OPERATIONGRAPH_OPS), &refs)?;
        graph.set1(attr!(CUDNN_ATTR_OPERATIONGRAPH_HANDLE), cudnn.as_raw())?;
        graph.finalize()?;

        let mut meta = Vec::with_capacity(self.tensors.len());
        let mut io = Vec::new();
        let mut scalar_uids = Vec::new();
        let mut scalar_words = Vec::new();
        for (i, t) in self.tensors.iter().enumerate() {
            let uid = i as i64 + 1;
            let layout = if t.is_virtual {
                None
            } else {
                Some(Layout::strided(&t.dims, &t.strides)?)
            };
            meta.push(TensorMeta {
                name: t.name,
                uid,
                layout,
                dtype: t.dtype,
                is_virtual: t.is_virtual,
                is_output: t.producer.is_some(),
                is_scalar: t.scalar.is_some(),
                bound: t.bound,
            });
            if let Some(v) = t.scalar {
                scalar_uids.push(uid);
                scalar_words.push(scalar_word(v, t.dtype));
            } else if !t.is_virtual {
                io.push(i);
            }
        }
        let mut pack_uids: Vec<i64> = io.iter().map(|&i| i as i64 + 1).collect();
        pack_uids.extend(&scalar_uids);
        Ok(OperationGraph {
            inner: Arc::new(GraphInner {
                graph,
                ops: parts.ops,
                aux: parts.aux,
                tensors: parts.tensors,
                meta,
                io,
                scalars: scalar_words.into_boxed_slice(),
                pack_uids,
                graph_id: self.id,
                aliases: Default::default(),
                signature: self.signature(),
                source: self.clone(),
                handle: cudnn.inner().clone(),
                context: cudnn.context().clone(),
            }),
        })
    }
}

/// The finalized descriptors of a graph and what execution needs to know about its tensors.
///
/// Field order is drop order: the graph before the operations it refers to, the operations
/// before their tensors.
pub(crate) struct GraphInner {
    pub(crate) graph: Desc,
    #[allow(dead_code)] // kept alive: the graph refers to them
    ops: Vec<Desc>,
    #[allow(dead_code)] // kept alive: the operations refer to them
    aux: Vec<Desc>,
    #[allow(dead_code)] // kept alive: the operations refer to them
    tensors: Vec<Desc>,
    pub(crate) meta: Vec<TensorMeta>,
    /// Indices of the tensors a buffer is bound to (not virtual, not scalar), in pack order.
    pub(crate) io: Vec<usize>,
    /// Host words of the by-value scalars, in pack order after `io`. Never mutated, so their
    /// addresses are stable for the life of the graph.
    pub(crate) scalars: Box<[u64]>,
    /// Unique ids of the variant pack: `io` then the scalars.
    pub(crate) pack_uids: Vec<i64>,
    pub(crate) graph_id: u64,
    /// Ids of other graphs with the same signature whose tensor ids this graph's plans accept
    /// ([`crate::graph::Plan::share_with`]): equal signatures mean equal tensors at each index.
    aliases: std::sync::Mutex<Vec<u64>>,
    pub(crate) signature: String,
    /// The host graph it was built from (what a [`crate::graph::PlanCache`] file records).
    pub(crate) source: Graph,
    /// The handle the graph (and its plans) were built on, kept alive by them; identified by
    /// its process-unique id, never by address.
    pub(crate) handle: Arc<crate::handle::HandleInner>,
    /// Kept alive: plans may hold kernels loaded on this context until they are destroyed.
    #[allow(dead_code)]
    context: Arc<CudaContext>,
}

// SAFETY: `GraphInner` is immutable after construction. The only calls into its descriptors
// (heuristics and plans reading the graph, executions) take the `&Cudnn` it was built on, checked
// by its process-unique id ([`GraphInner::check_handle`]); `Cudnn` is not `Sync`, so those calls are made by
// one thread at a time, except plan finalization, which `graph::parallel::run` spreads over
// threads while the caller's thread holds the `&Cudnn` and waits: finalizing plans of one graph
// concurrently only reads the graph, as cuDNN's own parallel plan build does. Dropping happens
// once, by the last owner.
unsafe impl Sync for GraphInner {}

impl GraphInner {
    pub(crate) fn check_handle(&self, cudnn: &Cudnn) -> Result<()> {
        if cudnn.id() != self.handle.id() {
            return Err(Error::invalid(
                "cuDNN handle",
                format!(
                    "the handle the graph was built on (id {})",
                    self.handle.id()
                ),
                format!("handle id {}", cudnn.id()),
            ));
        }
        Ok(())
    }

    /// Whether tensor ids of graph `id` name this graph's tensors.
    pub(crate) fn accepts(&self, id: u64) -> bool {
        id == self.graph_id
            || self
                .aliases
                .lock()
                .map(|a| a.contains(&id))
                .unwrap_or(false)
    }

    /// Lets tensor ids of `other` (same signature) name this graph's tensors.
    pub(crate) fn add_alias(&self, other: &GraphInner) -> Result<()> {
        if other.signature != self.signature {
            return Err(Error::invalid(
                "graph of a shared plan",
                "a graph with the plan's signature",
                "a graph with another signature",
            ));
        }
        if !self.accepts(other.graph_id) {
            if let Ok(mut a) = self.aliases.lock() {
                a.push(other.graph_id);
            }
        }
        Ok(())
    }

    pub(crate) fn index(&self, t: TensorId) -> Result<usize> {
        if t.graph != self.graph_id || t.index >= self.meta.len() {
            return Err(Error::invalid(
                "graph tensor id",
                "a tensor of this graph",
                format!("{t:?}"),
            ));
        }
        Ok(t.index)
    }
}

/// A graph handed to cuDNN ([`Graph::build`]): finalized descriptors on one handle. Plans built
/// from it keep it alive.
pub struct OperationGraph {
    pub(crate) inner: Arc<GraphInner>,
}

impl std::fmt::Debug for OperationGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperationGraph")
            .field("signature", &self.inner.signature)
            .finish()
    }
}

impl OperationGraph {
    fn meta(&self, t: TensorId) -> Result<&TensorMeta> {
        Ok(&self.inner.meta[self.inner.index(t)?])
    }

    /// Elements a buffer bound to `t` must hold (its layout's span). Errors for virtual tensors
    /// and scalars, which take no buffer.
    pub fn span(&self, t: TensorId) -> Result<usize> {
        let m = self.meta(t)?;
        m.layout
            .as_ref()
            .filter(|_| !m.is_scalar)
            .map(Layout::span)
            .ok_or_else(|| {
                Error::invalid(
                    "graph tensor",
                    "a tensor bound to a buffer (not virtual, not a scalar)",
                    format!("`{}`", m.name),
                )
            })
    }

    /// The layout of a tensor bound to a buffer (`None` for virtual tensors).
    pub fn layout(&self, t: TensorId) -> Result<Option<&Layout>> {
        Ok(self.meta(t)?.layout.as_ref())
    }

    /// A tensor's data type.
    pub fn dtype(&self, t: TensorId) -> Result<DType> {
        Ok(self.meta(t)?.dtype)
    }

    /// Whether a tensor is virtual (no buffer bound to it).
    pub fn is_virtual(&self, t: TensorId) -> Result<bool> {
        Ok(self.meta(t)?.is_virtual)
    }

    /// A tensor's name.
    pub fn name(&self, t: TensorId) -> Result<&'static str> {
        Ok(self.meta(t)?.name)
    }

    /// The signature of the graph it was built from ([`Graph::signature`]).
    pub fn signature(&self) -> &str {
        &self.inner.signature
    }

    /// The host graph it was built from (a copy taken by [`Graph::build`]).
    pub fn graph(&self) -> &Graph {
        &self.inner.source
    }

    /// How many engines cuDNN has for this graph (`CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT`).
    #[doc(alias = "CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT")]
    pub fn engine_count(&self, cudnn: &Cudnn) -> Result<i64> {
        self.inner.check_handle(cudnn)?;
        self.inner
            .graph
            .get_i64(attr!(CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT))
    }

    /// The raw operation graph descriptor, for backend calls this crate does not wrap. It stays
    /// owned by `self`.
    pub fn as_raw(&self) -> sys::cudnnBackendDescriptor_t {
        self.inner.graph.as_raw()
    }
}
