//! The graph model: [`Graph`] (tensors and operations, described on the host), [`TensorId`] and
//! what the graph keeps per tensor; creating tensors, marking outputs, the signature.
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::record;
#[cfg(doc)]
use super::OperationGraph;
use super::{MatmulOverrides, Op};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Layout;

/// Identifies a tensor of one [`Graph`] (and of the [`OperationGraph`] built from it).
///
/// Ids of another graph are rejected with [`Error::InvalidArgument`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorId {
    pub(crate) graph: u64,
    pub(crate) index: usize,
}

impl TensorId {
    /// The unique id cuDNN knows the tensor by (`CUDNN_ATTR_TENSOR_UNIQUE_ID`).
    pub fn uid(self) -> i64 {
        self.index as i64 + 1
    }
}

/// What one tensor of a graph is.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct TensorInfo {
    #[serde(with = "record::name")]
    pub(crate) name: record::Name,
    pub(crate) dims: Vec<i64>,
    pub(crate) strides: Vec<i64>,
    pub(crate) dtype: DType,
    pub(crate) is_virtual: bool,
    /// By-value scalar (`CUDNN_ATTR_TENSOR_IS_BY_VALUE`): its value. Its dimensions are all 1,
    /// with the rank of the first operation that reads it (empty until then).
    #[serde(with = "record::scalar")]
    pub(crate) scalar: Option<f64>,
    /// Lengths (attention's sequence lengths): the tensor's values give extents of up to this,
    /// so execution takes them only through [`Args::lengths`], checked on the host to lie in
    /// `0..=bound`.
    #[serde(default)]
    pub(crate) bound: Option<i64>,
    /// The operation writing it, if any (not recorded: [`Graph::from_json`] derives it).
    #[serde(skip)]
    pub(crate) producer: Option<usize>,
    /// Whether some operation reads it (or the graph accepts it unread, as attention's
    /// inference statistics; [`Graph::from_json`] sets it for every tensor an operation reads).
    pub(crate) consumed: bool,
}

impl TensorInfo {
    /// A graph input: read by operations, written by none.
    pub(crate) fn input(
        name: record::Name,
        dims: Vec<i64>,
        strides: Vec<i64>,
        dtype: DType,
    ) -> TensorInfo {
        TensorInfo {
            name,
            dims,
            strides,
            dtype,
            is_virtual: false,
            scalar: None,
            bound: None,
            producer: None,
            consumed: false,
        }
    }

    /// A by-value scalar input; its dimensions are set by the first operation reading it.
    pub(crate) fn scalar(name: record::Name, value: f64, dtype: DType) -> TensorInfo {
        TensorInfo {
            scalar: Some(value),
            ..TensorInfo::input(name, Vec::new(), Vec::new(), dtype)
        }
    }

    /// A virtual tensor written by operation `op` (an index into `Graph::ops`).
    pub(crate) fn written(
        name: record::Name,
        dims: Vec<i64>,
        strides: Vec<i64>,
        dtype: DType,
        op: usize,
    ) -> TensorInfo {
        TensorInfo {
            is_virtual: true,
            producer: Some(op),
            ..TensorInfo::input(name, dims, strides, dtype)
        }
    }

    /// [`Error::ShapeMismatch`] between this tensor and `other` (names and dimensions), for
    /// the rule they break.
    pub(crate) fn shape_mismatch(&self, other: &TensorInfo, rule: &'static str) -> Error {
        Error::ShapeMismatch {
            a: self.name,
            a_dims: self.dims.clone(),
            b: other.name,
            b_dims: other.dims.clone(),
            rule,
        }
    }
}

/// A graph of cuDNN operations, described on the host; [`Graph::build`] hands it to cuDNN.
///
/// Tensors get unique ids in creation order. Operation outputs are virtual (kept inside the fused
/// kernels, in the graph's intermediate data type) until [`Graph::mark_output`] makes them real.
/// See the [module documentation](crate::graph) for an example.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Graph {
    /// Not recorded: a graph read back ([`Graph::from_json`]) is a new graph.
    #[serde(skip, default = "next_graph_id")]
    pub(crate) id: u64,
    pub(crate) io: DType,
    pub(crate) intermediate: DType,
    pub(crate) compute: DType,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) ops: Vec<Op>,
}

pub(crate) fn next_graph_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Packed strides for `dims` with axes ordered (slowest first) as in `order`.
pub(crate) fn strides_in_order(dims: &[i64], order: &[usize]) -> Result<Vec<i64>> {
    let mut strides = vec![1i64; dims.len()];
    let mut acc = 1i64;
    for &axis in order.iter().rev() {
        strides[axis] = acc;
        acc = acc.checked_mul(dims[axis]).ok_or_else(|| Error::Overflow {
            what: "tensor strides",
            detail: format!("packed strides of {dims:?}"),
        })?;
    }
    Ok(strides)
}

/// The memory order of a layout (slowest axis first): axes by decreasing stride, ties by
/// increasing axis index.
pub(crate) fn stride_order(strides: &[i64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..strides.len()).collect();
    order.sort_by(|&a, &b| strides[b].cmp(&strides[a]).then(a.cmp(&b)));
    order
}

impl Graph {
    /// An empty graph. `io` is the data type [`Graph::mark_output`] gives outputs,
    /// `intermediate` the data type of virtual tensors, `compute` the arithmetic type of every
    /// operation (e.g. `F16, F32, F32` for mixed precision; `F32, F32, F32` for strict f32).
    pub fn new(io: DType, intermediate: DType, compute: DType) -> Graph {
        Graph {
            id: next_graph_id(),
            io,
            intermediate,
            compute,
            tensors: Vec::new(),
            ops: Vec::new(),
        }
    }

    /// The data type outputs get from [`Graph::mark_output`].
    pub fn io_type(&self) -> DType {
        self.io
    }
    /// The data type of virtual (intermediate) tensors.
    pub fn intermediate_type(&self) -> DType {
        self.intermediate
    }
    /// The arithmetic type of every operation.
    pub fn compute_type(&self) -> DType {
        self.compute
    }

    pub(crate) fn check_float(what: &'static str, dtype: DType) -> Result<()> {
        match dtype {
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 => Ok(()),
            d => Err(Error::UnsupportedDataType {
                op: what,
                detail: format!("{d} (graph tensors here are f32, f64, f16 or bf16)"),
            }),
        }
    }

    pub(crate) fn push(&mut self, info: TensorInfo) -> TensorId {
        self.tensors.push(info);
        TensorId {
            graph: self.id,
            index: self.tensors.len() - 1,
        }
    }

    /// An input tensor with explicit strides (in elements). The layout is validated as
    /// [`Layout::strided`] does (dims and strides ≥ 1, span within cuDNN's 32-bit addressing).
    #[doc(alias = "CUDNN_BACKEND_TENSOR_DESCRIPTOR")]
    pub fn tensor(
        &mut self,
        name: &'static str,
        dims: &[i64],
        strides: &[i64],
        dtype: DType,
    ) -> Result<TensorId> {
        Self::check_float("graph tensor", dtype)?;
        Layout::strided(dims, strides)?;
        Ok(self.push(TensorInfo::input(
            name,
            dims.to_vec(),
            strides.to_vec(),
            dtype,
        )))
    }

    /// A packed row-major input tensor (`N, C, spatial...` for images; any rank).
    pub fn tensor_nchw(
        &mut self,
        name: &'static str,
        dims: &[i64],
        dtype: DType,
    ) -> Result<TensorId> {
        let l = Layout::nchw_nd(dims)?;
        self.tensor(name, dims, l.strides(), dtype)
    }

    /// A packed channels-last input tensor: logical dims `[N, C, spatial...]`, memory order
    /// `N, spatial..., C` (NHWC for rank 4, KRSC for filters).
    pub fn tensor_nhwc(
        &mut self,
        name: &'static str,
        dims: &[i64],
        dtype: DType,
    ) -> Result<TensorId> {
        let l = Layout::nhwc_nd(dims)?;
        self.tensor(name, dims, l.strides(), dtype)
    }

    /// A by-value scalar (`CUDNN_ATTR_TENSOR_IS_BY_VALUE`), e.g. a scale factor for a pointwise
    /// operation. Its value is kept by the graph and handed to cuDNN at each execution; it needs
    /// no buffer. Its dimensions are all 1, with the rank of the operation that reads it.
    pub fn scalar(&mut self, name: &'static str, value: f64, dtype: DType) -> Result<TensorId> {
        Self::check_float("graph scalar", dtype)?;
        Ok(self.push(TensorInfo::scalar(name, value, dtype)))
    }

    pub(crate) fn index(&self, t: TensorId) -> Result<usize> {
        if t.graph != self.id || t.index >= self.tensors.len() {
            return Err(Error::invalid(
                "graph tensor id",
                "a tensor created by this graph",
                format!("{t:?}"),
            ));
        }
        Ok(t.index)
    }

    pub(crate) fn info(&self, t: TensorId) -> Result<&TensorInfo> {
        Ok(&self.tensors[self.index(t)?])
    }

    /// The name given to a tensor.
    pub fn name(&self, t: TensorId) -> Result<&'static str> {
        Ok(self.info(t)?.name)
    }
    /// A tensor's dimensions (empty for a scalar not yet read by an operation).
    pub fn dims(&self, t: TensorId) -> Result<&[i64]> {
        Ok(&self.info(t)?.dims)
    }
    /// A tensor's strides.
    pub fn strides(&self, t: TensorId) -> Result<&[i64]> {
        Ok(&self.info(t)?.strides)
    }
    /// A tensor's data type.
    pub fn dtype(&self, t: TensorId) -> Result<DType> {
        Ok(self.info(t)?.dtype)
    }
    /// Whether a tensor is virtual (an intermediate no buffer is bound to).
    pub fn is_virtual(&self, t: TensorId) -> Result<bool> {
        Ok(self.info(t)?.is_virtual)
    }

    /// Index of an operand; fixes a scalar's rank at its first use.
    pub(crate) fn operand(
        &mut self,
        t: TensorId,
        rank: Option<usize>,
        op: &'static str,
    ) -> Result<usize> {
        let i = self.index(t)?;
        let info = &mut self.tensors[i];
        if info.scalar.is_some() {
            let Some(r) = rank else {
                return Err(Error::invalid(
                    "graph operand",
                    format!("{op}: a tensor, not a by-value scalar"),
                    format!("scalar `{}`", info.name),
                ));
            };
            if info.dims.is_empty() {
                info.dims = vec![1; r];
                info.strides = vec![1; r];
            } else if info.dims.len() != r {
                return Err(Error::invalid(
                    "graph scalar rank",
                    format!(
                        "{op}: rank {r} (the scalar was first read at rank {})",
                        info.dims.len()
                    ),
                    format!("`{}`", info.name),
                ));
            }
        }
        info.consumed = true;
        Ok(i)
    }

    /// A new virtual tensor of the intermediate type, packed in the memory order of `like`.
    pub(crate) fn output(
        &mut self,
        name: &'static str,
        dims: Vec<i64>,
        order: &[usize],
        op: usize,
    ) -> Result<TensorId> {
        // Packed strides computed with overflow checks; no 32-bit span rule: a virtual tensor
        // is never addressed in memory (attention's [b, h, s, s] scores pass 2^31 elements).
        let strides = strides_in_order(&dims, order)?;
        Ok(self.push(TensorInfo::written(
            name,
            dims,
            strides,
            self.intermediate,
            op,
        )))
    }

    /// Makes an operation's output a real output of the graph, of the graph's io data type: a
    /// buffer must be bound to it at execution.
    pub fn mark_output(&mut self, t: TensorId) -> Result<()> {
        let io = self.io;
        self.mark_output_as(t, io)
    }

    /// [`Graph::mark_output`] with an explicit data type.
    pub fn mark_output_as(&mut self, t: TensorId, dtype: DType) -> Result<()> {
        Self::check_float("graph output", dtype)?;
        let i = self.index(t)?;
        let info = &mut self.tensors[i];
        if info.producer.is_none() {
            return Err(Error::invalid(
                "graph output",
                "the output of an operation",
                format!("input tensor `{}`", info.name),
            ));
        }
        if self.index_or_boolean(i) {
            let info = &self.tensors[i];
            return Err(Error::invalid(
                "graph output",
                "a floating-point result (index and comparison results stay virtual)",
                format!("`{}`", info.name),
            ));
        }
        let info = &mut self.tensors[i];
        info.is_virtual = false;
        info.dtype = dtype;
        Ok(())
    }

    /// [`Graph::mark_output`] with explicit strides (e.g. a padded or transposed output).
    pub fn mark_output_strided(
        &mut self,
        t: TensorId,
        dtype: DType,
        strides: &[i64],
    ) -> Result<()> {
        let i = self.index(t)?;
        let dims = self.tensors[i].dims.clone();
        Layout::strided(&dims, strides)?.check_output(self.tensors[i].name)?;
        self.mark_output_as(t, dtype)?;
        self.tensors[i].strides = strides.to_vec();
        Ok(())
    }

    /// Gives a virtual tensor another data type than the graph's intermediate type (as
    /// cudnn-frontend's `set_data_type` on an intermediate, e.g. a half ReLU gradient between
    /// a batch norm and its backward). An input or a tensor marked as an output is refused with
    /// [`Error::InvalidArgument`] (its type is set where it is created or marked).
    pub fn set_virtual_dtype(&mut self, t: TensorId, dtype: DType) -> Result<()> {
        Self::check_float("graph virtual tensor", dtype)?;
        let i = self.index(t)?;
        if !self.tensors[i].is_virtual || self.index_or_boolean(i) {
            return Err(Error::invalid(
                "virtual tensor data type",
                "a floating-point virtual tensor (an operation output not marked as an output)",
                format!("`{}`", self.tensors[i].name),
            ));
        }
        self.tensors[i].dtype = dtype;
        Ok(())
    }

    /// Renames a tensor (names appear in errors; op outputs start as `conv_fprop.y`, ...).
    pub fn set_name(&mut self, t: TensorId, name: &'static str) -> Result<()> {
        let i = self.index(t)?;
        self.tensors[i].name = name;
        Ok(())
    }

    /// Checks the graph as a whole: every tensor is read or written by some operation, every
    /// virtual tensor is read by some operation (else it must be marked as an output), and there
    /// is at least one operation.
    pub(crate) fn check_structure(&self) -> Result<()> {
        if self.ops.is_empty() {
            return Err(Error::invalid("graph", "at least one operation", "none"));
        }
        for t in &self.tensors {
            if t.producer.is_none() && !t.consumed {
                return Err(Error::invalid(
                    "graph tensor",
                    "every tensor read or written by an operation",
                    format!("`{}` is not used", t.name),
                ));
            }
            if t.is_virtual && !t.consumed {
                return Err(Error::invalid(
                    "graph tensor",
                    "every operation output read by another operation or marked as an output",
                    format!("`{}` is neither", t.name),
                ));
            }
        }
        Ok(())
    }

    /// The graph's operations by name, in order (`convolution forward, pointwise`), as
    /// [`Error::NoEngine`] names the graph.
    pub(crate) fn op_names(&self) -> String {
        let names: Vec<&str> = self.ops.iter().map(Op::name).collect();
        names.join(", ")
    }

    /// A string identifying the graph for caches: data types, every tensor (uid, dims, strides,
    /// type, virtual, scalar value) and every operation with its parameters. Two graphs with the
    /// same signature can run the same plans.
    pub fn signature(&self) -> String {
        use std::fmt::Write;
        let mut s = format!(
            "io={} mid={} comp={};",
            self.io, self.intermediate, self.compute
        );
        for (i, t) in self.tensors.iter().enumerate() {
            let _ = write!(
                s,
                "t{}:{:?}/{:?}/{}{}{}{};",
                i + 1,
                t.dims,
                t.strides,
                t.dtype,
                if t.is_virtual { "/v" } else { "" },
                t.scalar
                    .map(|v| format!("/s{:x}", v.to_bits()))
                    .unwrap_or_default(),
                t.bound.map(|b| format!("/b{b}")).unwrap_or_default()
            );
        }
        for op in &self.ops {
            let _ = match op {
                Op::ConvFprop { x, w, y, conv } => write!(s, "fprop({x},{w},{y},{conv:?});"),
                Op::ConvDgrad { dy, w, dx, conv } => write!(s, "dgrad({dy},{w},{dx},{conv:?});"),
                Op::ConvWgrad { x, dy, dw, conv } => write!(s, "wgrad({x},{dy},{dw},{conv:?});"),
                Op::Matmul {
                    a,
                    b,
                    c,
                    grouped,
                    over,
                } => {
                    let g = if *grouped { "g" } else { "" };
                    let _ = write!(s, "{g}matmul({a},{b},{c}");
                    if *over != MatmulOverrides::default() {
                        let _ = write!(s, ",over{:?}/{:?}/{:?}", over.m, over.n, over.k);
                    }
                    s.write_str(");")
                }
                Op::Pointwise { mode, x, b, y } => write!(s, "pw({mode:?},{x},{b:?},{y});"),
                Op::PointwiseBwd { mode, dy, x, dx } => write!(s, "pwb({mode:?},{dy},{x},{dx});"),
                Op::Reduction { op, x, y } => write!(s, "red({op:?},{x},{y});"),
                Op::Select { x, b, cond, y } => write!(s, "sel({x},{b},{cond},{y});"),
                Op::Transpose { x, y } => write!(s, "tr({x},{y});"),
                Op::Rng(r) => s.write_str(&r.signature()),
                Op::NormFwd(n) => s.write_str(&n.signature()),
                Op::NormBwd(n) => s.write_str(&n.signature()),
            };
        }
        s
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "graph (io {}, intermediate {}, compute {})",
            self.io, self.intermediate, self.compute
        )?;
        for (i, t) in self.tensors.iter().enumerate() {
            writeln!(
                f,
                "  uid {} `{}` {} dims {:?} strides {:?}{}{}",
                i + 1,
                t.name,
                t.dtype,
                t.dims,
                t.strides,
                if t.is_virtual { " virtual" } else { "" },
                t.scalar.map(|v| format!(" scalar {v}")).unwrap_or_default()
            )?;
        }
        for op in &self.ops {
            writeln!(f, "  {}", op.name())?;
        }
        Ok(())
    }
}
