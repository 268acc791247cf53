//! The cuDNN backend (graph) API: describe a graph of operations, let cuDNN's heuristics propose
//! engine configurations, build execution plans, pick one (first proposal or autotuned), cache it,
//! and execute it with checked buffers.
//!
//! * [`Graph`] is plain host data: tensors (unique ids assigned here, names kept for errors),
//!   convolution forward / backward data / backward filter, batched matmul, pointwise (arithmetic,
//!   activations and their backward modes), reduction and normalization (layer, RMS, instance and
//!   batch norm, forward in the training or inference phase and backward; group norm built on
//!   layer norm) operations. Each operation checks its
//!   shapes when added and returns its output as a virtual tensor with the dimensions computed
//!   here; [`Graph::mark_output`] makes a virtual tensor a real output.
//! * [`Graph::build`] creates and finalizes every backend descriptor on a handle:
//!   [`OperationGraph`]. [`OperationGraph::plans`] runs the heuristics (modes A, B, fallback,
//!   instant) or enumerates every engine, filters by numerical notes and a workspace limit, and
//!   builds the plans that finalize ([`PlanFilter`]).
//! * [`Cudnn::execute`](crate::Cudnn::execute) runs a [`Plan`] on buffers bound in [`Args`]:
//!   every tensor of the graph must be bound to a buffer on the handle's context, of the
//!   tensor's data type, holding at least the tensor's span, 16-byte aligned; outputs must not
//!   overlap themselves. The backend variant pack is built once and reused while the pointers
//!   stay the same.
//! * [`autotune`] times candidate plans with CUDA events and keeps the fastest; [`PlanCache`]
//!   keeps plans by graph signature, filter, GPU and cuDNN version, and can persist the winning
//!   engine configurations to a file with their graphs ([`Graph::to_json`]) so that a new
//!   process builds only the winner — at start-up for every recorded graph with
//!   [`PlanCache::warm_up`], which also runs each plan once so its kernel is loaded before the
//!   first call.
//!
//! ```no_run
//! use cudnn_safe::graph::{Args, ConvParams, Graph, PlanFilter, PointwiseMode};
//! use cudnn_safe::{cuda_context, Cudnn, DType, Workspace};
//! # fn main() -> cudnn_safe::Result<()> {
//! let ctx = cuda_context(0)?;
//! let stream = ctx.default_stream();
//! let cudnn = Cudnn::new(stream.clone())?;
//!
//! // y = relu(conv(x, w) + b), NHWC half in and out, f32 inside.
//! let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
//! let x = g.tensor_nhwc("x", &[8, 64, 56, 56], DType::F16)?;
//! let w = g.tensor_nhwc("w", &[128, 64, 3, 3], DType::F16)?;
//! let b = g.tensor_nhwc("b", &[1, 128, 1, 1], DType::F16)?;
//! let conv = g.conv_fprop(x, w, &ConvParams::new(2).padding(&[1, 1]))?;
//! let biased = g.bias(conv, b)?;
//! let y = g.pointwise(PointwiseMode::Relu, biased, None)?;
//! g.mark_output(y)?;
//!
//! let og = g.build(&cudnn)?;
//! let plans = og.plans(&cudnn, &PlanFilter::default())?;
//! let plan = &plans.plans[0];
//!
//! let xb = stream.alloc_zeros::<half::f16>(og.span(x)?).unwrap();
//! let wb = stream.alloc_zeros::<half::f16>(og.span(w)?).unwrap();
//! let bb = stream.alloc_zeros::<half::f16>(og.span(b)?).unwrap();
//! let mut yb = stream.alloc_zeros::<half::f16>(og.span(y)?).unwrap();
//! let mut ws = Workspace::new(stream.clone());
//! let mut args = Args::new(&cudnn);
//! args.input(x, &xb)?.input(w, &wb)?.input(b, &bb)?.output(y, &mut yb)?;
//! cudnn.execute(plan, &args, &mut ws)?;
//! # Ok(()) }
//! ```
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::conv::ConvMode;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::reduce::ReduceOp;
use crate::tensor::Layout;

mod attention;
pub(crate) mod backend;
mod build;
mod cuda_graph;
mod engine;
pub(crate) mod exec;
// Normalization ops live with the rest of normalization (src/norm/graph/); compiled here, as
// a child of `graph`, because they build on the graph's private tensor and op tables.
#[path = "../norm/graph/mod.rs"]
mod norm;
mod preload;
mod record;

pub use crate::tune::plan::{autotune, PlanCache};
/// The union search's graph side, where the convolution directions' graph builders find it.
#[allow(unused_imports)]
pub(crate) use crate::tune::union;
pub use attention::{alibi_slopes, DiagonalAlignment, SdpaGrads, SdpaOptions, SdpaOutputs};
pub use build::OperationGraph;
pub use cuda_graph::{PlanGraph, CUDA_GRAPH_NOT_SUPPORTED};
pub use engine::{
    BehaviorNote, EngineConfig, HeurMode, KnobRange, NumericalNote, Plan, PlanFilter, PlanList,
    Skipped, MAX_KNOB_VALUES,
};
pub use exec::Args;
pub use norm::{
    BatchNormOutputs, BatchNormRunning, GroupNormMethod, GroupNormOutputs, LayerNormGrads,
    LayerNormOutputs, RmsNormGrads, RmsNormOutputs,
};
pub use preload::{preload, Preloaded};

/// Identifies a tensor of one [`Graph`] (and of the [`OperationGraph`] built from it).
///
/// Ids of another graph are rejected with [`Error::InvalidArgument`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorId {
    graph: u64,
    index: usize,
}

impl TensorId {
    /// The unique id cuDNN knows the tensor by (`CUDNN_ATTR_TENSOR_UNIQUE_ID`).
    pub fn uid(self) -> i64 {
        self.index as i64 + 1
    }
}

/// Parameters of a convolution operation (`CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR`).
///
/// One entry per spatial dimension in each list. Padding may differ before and after
/// (`pre_padding`, `post_padding`); [`ConvParams::padding`] sets both.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ConvParams {
    pre_padding: Vec<i64>,
    post_padding: Vec<i64>,
    stride: Vec<i64>,
    dilation: Vec<i64>,
    mode: ConvMode,
}

impl ConvParams {
    /// No padding, unit stride and dilation, cross-correlation, over `spatial_dims` dimensions
    /// (2 for images, 3 for volumes).
    pub fn new(spatial_dims: usize) -> ConvParams {
        ConvParams {
            pre_padding: vec![0; spatial_dims],
            post_padding: vec![0; spatial_dims],
            stride: vec![1; spatial_dims],
            dilation: vec![1; spatial_dims],
            mode: ConvMode::CrossCorrelation,
        }
    }
    /// Symmetric padding (before and after), one value per spatial dimension.
    #[must_use]
    pub fn padding(mut self, pad: &[i64]) -> Self {
        self.pre_padding = pad.to_vec();
        self.post_padding = pad.to_vec();
        self
    }
    /// Padding before each spatial dimension.
    #[must_use]
    pub fn pre_padding(mut self, pad: &[i64]) -> Self {
        self.pre_padding = pad.to_vec();
        self
    }
    /// Padding after each spatial dimension.
    #[must_use]
    pub fn post_padding(mut self, pad: &[i64]) -> Self {
        self.post_padding = pad.to_vec();
        self
    }
    /// Filter strides.
    #[must_use]
    pub fn stride(mut self, stride: &[i64]) -> Self {
        self.stride = stride.to_vec();
        self
    }
    /// Dilations.
    #[must_use]
    pub fn dilation(mut self, dilation: &[i64]) -> Self {
        self.dilation = dilation.to_vec();
        self
    }
    /// Cross-correlation (the default) or true convolution.
    #[must_use]
    pub fn mode(mut self, mode: ConvMode) -> Self {
        self.mode = mode;
        self
    }
    /// Number of spatial dimensions.
    pub fn spatial_dims(&self) -> usize {
        self.stride.len()
    }
    /// Padding before each spatial dimension.
    pub fn pre_paddings(&self) -> &[i64] {
        &self.pre_padding
    }
    /// Padding after each spatial dimension.
    pub fn post_paddings(&self) -> &[i64] {
        &self.post_padding
    }
    /// Filter strides.
    pub fn strides(&self) -> &[i64] {
        &self.stride
    }
    /// Dilations.
    pub fn dilations(&self) -> &[i64] {
        &self.dilation
    }
    /// The convolution mode.
    pub fn conv_mode(&self) -> ConvMode {
        self.mode
    }

    fn validate(&self, op: &'static str) -> Result<()> {
        let n = self.stride.len();
        if n == 0
            || self.pre_padding.len() != n
            || self.post_padding.len() != n
            || self.dilation.len() != n
        {
            return Err(Error::invalid(
                "convolution parameters",
                format!(
                    "{op}: one padding (pre and post), stride and dilation per spatial dimension"
                ),
                format!(
                    "pre {:?}, post {:?}, stride {:?}, dilation {:?}",
                    self.pre_padding, self.post_padding, self.stride, self.dilation
                ),
            ));
        }
        if self
            .pre_padding
            .iter()
            .chain(&self.post_padding)
            .any(|&p| p < 0)
        {
            return Err(Error::invalid(
                "convolution padding",
                format!("{op}: paddings ≥ 0"),
                format!("pre {:?}, post {:?}", self.pre_padding, self.post_padding),
            ));
        }
        if self.stride.iter().chain(&self.dilation).any(|&s| s < 1) {
            return Err(Error::invalid(
                "convolution stride / dilation",
                format!("{op}: strides and dilations ≥ 1"),
                format!("stride {:?}, dilation {:?}", self.stride, self.dilation),
            ));
        }
        Ok(())
    }

    /// Output spatial extent for input `i` along axis `a`, filter extent `k`; `None` if the
    /// dilated filter does not fit the padded input.
    fn out_extent(&self, a: usize, i: i64, k: i64) -> Option<i64> {
        let padded = i
            .checked_add(self.pre_padding[a])?
            .checked_add(self.post_padding[a])?;
        let span = (k - 1).checked_mul(self.dilation[a])?.checked_add(1)?;
        if padded < span {
            return None;
        }
        Some((padded - span) / self.stride[a] + 1)
    }
}

/// A pointwise operation mode (`cudnnPointwiseMode_t`), with its parameters where it has some.
///
/// Unary modes read `x`; binary modes read `x` and `b` (broadcast: each dimension of one equal to
/// the other's or 1); backward modes ([`Graph::pointwise_bwd`]) read the gradient `dy` and the
/// forward input `x` and give `dx`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum PointwiseMode {
    /// `x + b`.
    Add,
    /// `x − b`.
    Sub,
    /// `x · b`.
    Mul,
    /// `x / b`.
    Div,
    /// `min(x, b)`.
    Min,
    /// `max(x, b)`.
    Max,
    /// `x ^ b`.
    Pow,
    /// `max(x, 0)`.
    Relu,
    /// `x` for `x > 0`, `slope · x` otherwise. [`Graph::pointwise`] refuses a slope other than
    /// 0: with cuDNN 9.14 a matmul epilogue with
    /// `CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE` = 0.1 returned 0 for negative inputs, i.e.
    /// the engine ignored the slope, and a safe graph must not compute something else silently.
    LeakyRelu {
        /// Slope below zero.
        slope: f64,
    },
    /// `x·Φ(x)` (exact, erf-based).
    Gelu,
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    GeluTanh,
    /// `1 / (1 + e^−x)`.
    Sigmoid,
    /// `tanh(x)`.
    Tanh,
    /// `x · sigmoid(beta · x)` (SiLU for `beta = 1`).
    Swish {
        /// The slope inside the sigmoid.
        beta: f64,
    },
    /// `x` for `x > 0`, `alpha · (e^x − 1)` otherwise.
    Elu {
        /// Scale of the negative branch.
        alpha: f64,
    },
    /// `log(1 + e^(beta·x)) / beta`.
    Softplus {
        /// Sharpness.
        beta: f64,
    },
    /// `e^x`.
    Exp,
    /// `ln x`.
    Log,
    /// `√x`.
    Sqrt,
    /// `1 / √x`.
    Rsqrt,
    /// `−x`.
    Neg,
    /// `|x|`.
    Abs,
    /// `1 / x`.
    Reciprocal,
    /// `erf(x)`.
    Erf,
    /// `x` (a copy, possibly converting data type or layout).
    Identity,
    /// Backward of [`PointwiseMode::Relu`]: `dy` where `x > 0`, else 0.
    ReluBwd,
    /// Backward of [`PointwiseMode::Gelu`].
    GeluBwd,
    /// Backward of [`PointwiseMode::GeluTanh`].
    GeluTanhBwd,
    /// Backward of [`PointwiseMode::Sigmoid`].
    SigmoidBwd,
    /// Backward of [`PointwiseMode::Tanh`].
    TanhBwd,
    /// Backward of [`PointwiseMode::Swish`].
    SwishBwd {
        /// The forward `beta`.
        beta: f64,
    },
    /// Backward of [`PointwiseMode::Elu`].
    EluBwd {
        /// The forward `alpha`.
        alpha: f64,
    },
    /// Backward of [`PointwiseMode::Softplus`].
    SoftplusBwd {
        /// The forward `beta`.
        beta: f64,
    },
    /// The index of each element along `axis` (`CUDNN_POINTWISE_GEN_INDEX`): x gives only the
    /// shape. The output is a virtual 32-bit integer tensor (as cudnn-frontend declares it),
    /// read by comparisons; it cannot be marked as an output.
    GenIndex {
        /// The axis whose index is generated (0 ≤ axis < rank).
        axis: i64,
    },
    /// `x == b` (`CUDNN_POINTWISE_CMP_EQ`). Comparison results are virtual boolean tensors,
    /// read as the condition of [`Graph::select`]; they cannot be marked as outputs.
    CmpEq,
    /// `x != b` (`CUDNN_POINTWISE_CMP_NEQ`), boolean as [`PointwiseMode::CmpEq`].
    CmpNeq,
    /// `x > b` (`CUDNN_POINTWISE_CMP_GT`), boolean as [`PointwiseMode::CmpEq`].
    CmpGt,
    /// `x >= b` (`CUDNN_POINTWISE_CMP_GE`), boolean as [`PointwiseMode::CmpEq`].
    CmpGe,
    /// `x < b` (`CUDNN_POINTWISE_CMP_LT`), boolean as [`PointwiseMode::CmpEq`].
    CmpLt,
    /// `x <= b` (`CUDNN_POINTWISE_CMP_LE`), boolean as [`PointwiseMode::CmpEq`].
    CmpLe,
    /// `x && b` of two boolean tensors (`CUDNN_POINTWISE_LOGICAL_AND`, e.g. two comparisons
    /// combined into one mask); boolean as [`PointwiseMode::CmpEq`].
    LogicalAnd,
}

/// How many tensors a pointwise mode reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arity {
    Unary,
    Binary,
    Backward,
}

impl PointwiseMode {
    pub(crate) fn arity(self) -> Arity {
        use PointwiseMode as P;
        match self {
            P::Add | P::Sub | P::Mul | P::Div | P::Min | P::Max | P::Pow => Arity::Binary,
            P::CmpEq | P::CmpNeq | P::CmpGt | P::CmpGe | P::CmpLt | P::CmpLe | P::LogicalAnd => {
                Arity::Binary
            }
            P::ReluBwd
            | P::GeluBwd
            | P::GeluTanhBwd
            | P::SigmoidBwd
            | P::TanhBwd
            | P::SwishBwd { .. }
            | P::EluBwd { .. }
            | P::SoftplusBwd { .. } => Arity::Backward,
            _ => Arity::Unary,
        }
    }

    /// Whether this is a backward (gradient) mode.
    pub fn is_backward(self) -> bool {
        self.arity() == Arity::Backward
    }

    /// Whether the mode reads a second operand `b`.
    pub fn is_binary(self) -> bool {
        self.arity() == Arity::Binary
    }

    /// Whether this is a comparison (its result is a boolean tensor).
    pub fn is_comparison(self) -> bool {
        use PointwiseMode as P;
        matches!(
            self,
            P::CmpEq | P::CmpNeq | P::CmpGt | P::CmpGe | P::CmpLt | P::CmpLe
        )
    }

    /// Whether the result is a boolean tensor (a comparison or [`PointwiseMode::LogicalAnd`]):
    /// it stays virtual and can be the condition of [`Graph::select`].
    pub fn gives_boolean(self) -> bool {
        self.is_comparison() || self == PointwiseMode::LogicalAnd
    }

    pub(crate) fn raw(self) -> cudnn_safe_sys::cudnnPointwiseMode_t {
        use cudnn_safe_sys::cudnnPointwiseMode_t as M;
        use PointwiseMode as P;
        match self {
            P::Add => M::CUDNN_POINTWISE_ADD,
            P::Sub => M::CUDNN_POINTWISE_SUB,
            P::Mul => M::CUDNN_POINTWISE_MUL,
            P::Div => M::CUDNN_POINTWISE_DIV,
            P::Min => M::CUDNN_POINTWISE_MIN,
            P::Max => M::CUDNN_POINTWISE_MAX,
            P::Pow => M::CUDNN_POINTWISE_POW,
            P::Relu | P::LeakyRelu { .. } => M::CUDNN_POINTWISE_RELU_FWD,
            P::Gelu => M::CUDNN_POINTWISE_GELU_FWD,
            P::GeluTanh => M::CUDNN_POINTWISE_GELU_APPROX_TANH_FWD,
            P::Sigmoid => M::CUDNN_POINTWISE_SIGMOID_FWD,
            P::Tanh => M::CUDNN_POINTWISE_TANH_FWD,
            P::Swish { .. } => M::CUDNN_POINTWISE_SWISH_FWD,
            P::Elu { .. } => M::CUDNN_POINTWISE_ELU_FWD,
            P::Softplus { .. } => M::CUDNN_POINTWISE_SOFTPLUS_FWD,
            P::Exp => M::CUDNN_POINTWISE_EXP,
            P::Log => M::CUDNN_POINTWISE_LOG,
            P::Sqrt => M::CUDNN_POINTWISE_SQRT,
            P::Rsqrt => M::CUDNN_POINTWISE_RSQRT,
            P::Neg => M::CUDNN_POINTWISE_NEG,
            P::Abs => M::CUDNN_POINTWISE_ABS,
            P::Reciprocal => M::CUDNN_POINTWISE_RECIPROCAL,
            P::Erf => M::CUDNN_POINTWISE_ERF,
            P::Identity => M::CUDNN_POINTWISE_IDENTITY,
            P::ReluBwd => M::CUDNN_POINTWISE_RELU_BWD,
            P::GeluBwd => M::CUDNN_POINTWISE_GELU_BWD,
            P::GeluTanhBwd => M::CUDNN_POINTWISE_GELU_APPROX_TANH_BWD,
            P::SigmoidBwd => M::CUDNN_POINTWISE_SIGMOID_BWD,
            P::TanhBwd => M::CUDNN_POINTWISE_TANH_BWD,
            P::SwishBwd { .. } => M::CUDNN_POINTWISE_SWISH_BWD,
            P::EluBwd { .. } => M::CUDNN_POINTWISE_ELU_BWD,
            P::SoftplusBwd { .. } => M::CUDNN_POINTWISE_SOFTPLUS_BWD,
            P::GenIndex { .. } => M::CUDNN_POINTWISE_GEN_INDEX,
            P::CmpEq => M::CUDNN_POINTWISE_CMP_EQ,
            P::CmpNeq => M::CUDNN_POINTWISE_CMP_NEQ,
            P::CmpGt => M::CUDNN_POINTWISE_CMP_GT,
            P::CmpGe => M::CUDNN_POINTWISE_CMP_GE,
            P::CmpLt => M::CUDNN_POINTWISE_CMP_LT,
            P::CmpLe => M::CUDNN_POINTWISE_CMP_LE,
            P::LogicalAnd => M::CUDNN_POINTWISE_LOGICAL_AND,
        }
    }

    /// The parameter a mode carries, as (attribute, value).
    pub(crate) fn param(self) -> Option<(backend::Attr, f64)> {
        use backend::attr;
        use PointwiseMode as P;
        match self {
            P::LeakyRelu { slope } => {
                Some((attr!(CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE), slope))
            }
            P::Swish { beta } | P::SwishBwd { beta } => {
                Some((attr!(CUDNN_ATTR_POINTWISE_SWISH_BETA), beta))
            }
            P::Elu { alpha } | P::EluBwd { alpha } => {
                Some((attr!(CUDNN_ATTR_POINTWISE_ELU_ALPHA), alpha))
            }
            P::Softplus { beta } | P::SoftplusBwd { beta } => {
                Some((attr!(CUDNN_ATTR_POINTWISE_SOFTPLUS_BETA), beta))
            }
            _ => None,
        }
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

/// Tensors (indices into `Graph::tensors`) whose values give a matmul's actual M, N or K per
/// batch (`CUDNN_ATTR_OPERATION_MATMUL_GEMM_{M,N,K}_OVERRIDE_DESC`; INT32 `[b, 1, 1, 1]`,
/// attention's sequence lengths): cuDNN computes only that part of each product.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct MatmulOverrides {
    pub(crate) m: Option<usize>,
    pub(crate) n: Option<usize>,
    pub(crate) k: Option<usize>,
}

impl MatmulOverrides {
    fn tensors(&self) -> impl Iterator<Item = usize> {
        [self.m, self.n, self.k].into_iter().flatten()
    }
}

/// One operation of a graph (tensor indices into `Graph::tensors`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) enum Op {
    ConvFprop {
        x: usize,
        w: usize,
        y: usize,
        conv: ConvParams,
    },
    ConvDgrad {
        dy: usize,
        w: usize,
        dx: usize,
        conv: ConvParams,
    },
    ConvWgrad {
        x: usize,
        dy: usize,
        dw: usize,
        conv: ConvParams,
    },
    Matmul {
        a: usize,
        b: usize,
        c: usize,
        /// Grouped heads (attention's GQA/MQA): b's batch extents divide a's and c has a's;
        /// described to cuDNN as is, without broadcast views.
        #[serde(default)]
        grouped: bool,
        /// Tensors holding the actual M, N or K of each batch (attention's sequence lengths).
        #[serde(default)]
        over: MatmulOverrides,
    },
    Pointwise {
        mode: PointwiseMode,
        x: usize,
        b: Option<usize>,
        y: usize,
    },
    PointwiseBwd {
        mode: PointwiseMode,
        dy: usize,
        x: usize,
        dx: usize,
    },
    Reduction {
        op: ReduceOp,
        x: usize,
        y: usize,
    },
    /// `y = cond ? x : b` (`CUDNN_POINTWISE_BINARY_SELECT`, cond through `..._POINTWISE_TDESC`).
    Select {
        x: usize,
        b: usize,
        cond: usize,
        y: usize,
    },
    /// `y` is x with its last two dimensions swapped (`CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR`).
    Transpose {
        x: usize,
        y: usize,
    },
    /// Bernoulli random mask (`CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR`, `attention.rs`).
    Rng(attention::RngOp),
    /// Layer, RMS, instance or batch norm forward (`norm.rs`).
    NormFwd(norm::NormFwdOp),
    /// Layer, RMS, instance or batch norm backward (`norm.rs`).
    NormBwd(norm::NormBwdOp),
}

impl Op {
    /// The tensors the operation reads (with repetition if it reads one twice).
    pub(crate) fn reads(&self) -> Vec<usize> {
        match *self {
            Op::ConvFprop { x, w, .. } => vec![x, w],
            Op::ConvDgrad { dy, w, .. } => vec![dy, w],
            Op::ConvWgrad { x, dy, .. } => vec![x, dy],
            Op::Matmul { a, b, over, .. } => [a, b].into_iter().chain(over.tensors()).collect(),
            Op::Pointwise { x, b, .. } => std::iter::once(x).chain(b).collect(),
            Op::PointwiseBwd { dy, x, .. } => vec![dy, x],
            Op::Reduction { x, .. } => vec![x],
            Op::Select { x, b, cond, .. } => vec![x, b, cond],
            Op::Transpose { x, .. } => vec![x],
            Op::Rng(ref r) => r.reads(),
            Op::NormFwd(ref n) => n.reads(),
            Op::NormBwd(ref n) => n.reads(),
        }
    }

    /// A convolution's (x, w, y) — (dx, w, dy) for backward data, (x, dw, dy) for backward
    /// filter — and its parameters; `None` for other operations.
    pub(crate) fn conv_operands(&self) -> Option<([usize; 3], &ConvParams)> {
        match self {
            Op::ConvFprop { x, w, y, conv } => Some(([*x, *w, *y], conv)),
            Op::ConvDgrad { dy, w, dx, conv } => Some(([*dx, *w, *dy], conv)),
            Op::ConvWgrad { x, dy, dw, conv } => Some(([*x, *dw, *dy], conv)),
            _ => None,
        }
    }

    /// The tensors the operation writes.
    pub(crate) fn writes(&self) -> Vec<usize> {
        match *self {
            Op::ConvFprop { y, .. } => vec![y],
            Op::ConvDgrad { dx, .. } => vec![dx],
            Op::ConvWgrad { dw, .. } => vec![dw],
            Op::Matmul { c, .. } => vec![c],
            Op::Pointwise { y, .. } | Op::Select { y, .. } | Op::Transpose { y, .. } => vec![y],
            Op::PointwiseBwd { dx, .. } => vec![dx],
            Op::Reduction { y, .. } => vec![y],
            Op::Rng(ref r) => r.writes(),
            Op::NormFwd(ref n) => n.writes(),
            Op::NormBwd(ref n) => n.writes(),
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Op::ConvFprop { .. } => "convolution forward",
            Op::ConvDgrad { .. } => "convolution backward data",
            Op::ConvWgrad { .. } => "convolution backward filter",
            Op::Matmul { .. } => "matmul",
            Op::Pointwise { .. } => "pointwise",
            Op::PointwiseBwd { .. } => "pointwise backward",
            Op::Reduction { .. } => "reduction",
            Op::Select { .. } => "binary select",
            Op::Transpose { .. } => "transpose",
            Op::Rng(r) => r.name(),
            Op::NormFwd(n) => n.name(),
            Op::NormBwd(n) => n.name(),
        }
    }
}

/// A graph of cuDNN operations, described on the host; [`Graph::build`] hands it to cuDNN.
///
/// Tensors get unique ids in creation order. Operation outputs are virtual (kept inside the fused
/// kernels, in the graph's intermediate data type) until [`Graph::mark_output`] makes them real.
/// See the [module documentation](self) for an example.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Graph {
    /// Not recorded: a graph read back ([`Graph::from_json`]) is a new graph.
    #[serde(skip, default = "next_graph_id")]
    id: u64,
    io: DType,
    intermediate: DType,
    compute: DType,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) ops: Vec<Op>,
}

fn next_graph_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Packed strides for `dims` with axes ordered (slowest first) as in `order`.
fn strides_in_order(dims: &[i64], order: &[usize]) -> Result<Vec<i64>> {
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
fn stride_order(strides: &[i64]) -> Vec<usize> {
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

    fn check_float(what: &'static str, dtype: DType) -> Result<()> {
        match dtype {
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 => Ok(()),
            d => Err(Error::UnsupportedDataType {
                op: what,
                detail: format!("{d} (graph tensors here are f32, f64, f16 or bf16)"),
            }),
        }
    }

    /// A mode's parameter (slope, alpha, beta) must be finite: cuDNN would compute with an
    /// infinity or NaN, and a graph record ([`Graph::to_json`]) cannot hold one.
    fn check_param(mode: PointwiseMode) -> Result<()> {
        match mode.param() {
            Some((_, v)) if !v.is_finite() => Err(Error::invalid(
                "pointwise mode parameter",
                "a finite value",
                format!("{mode:?}"),
            )),
            _ => Ok(()),
        }
    }

    fn push(&mut self, info: TensorInfo) -> TensorId {
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
        Ok(self.push(TensorInfo {
            name,
            dims: dims.to_vec(),
            strides: strides.to_vec(),
            dtype,
            is_virtual: false,
            scalar: None,
            bound: None,
            producer: None,
            consumed: false,
        }))
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
        Ok(self.push(TensorInfo {
            name,
            dims: Vec::new(),
            strides: Vec::new(),
            dtype,
            is_virtual: false,
            scalar: Some(value),
            bound: None,
            producer: None,
            consumed: false,
        }))
    }

    fn index(&self, t: TensorId) -> Result<usize> {
        if t.graph != self.id || t.index >= self.tensors.len() {
            return Err(Error::invalid(
                "graph tensor id",
                "a tensor created by this graph",
                format!("{t:?}"),
            ));
        }
        Ok(t.index)
    }

    fn info(&self, t: TensorId) -> Result<&TensorInfo> {
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
    fn operand(&mut self, t: TensorId, rank: Option<usize>, op: &'static str) -> Result<usize> {
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
    fn output(
        &mut self,
        name: &'static str,
        dims: Vec<i64>,
        order: &[usize],
        op: usize,
    ) -> Result<TensorId> {
        // Packed strides computed with overflow checks; no 32-bit span rule: a virtual tensor
        // is never addressed in memory (attention's [b, h, s, s] scores pass 2^31 elements).
        let strides = strides_in_order(&dims, order)?;
        Ok(self.push(TensorInfo {
            name,
            dims,
            strides,
            dtype: self.intermediate,
            is_virtual: true,
            scalar: None,
            bound: None,
            producer: Some(op),
            consumed: false,
        }))
    }

    fn conv_rank_check(
        &self,
        op: &'static str,
        a: usize,
        b: usize,
        conv: &ConvParams,
    ) -> Result<()> {
        conv.validate(op)?;
        let (ta, tb) = (&self.tensors[a], &self.tensors[b]);
        for t in [ta, tb] {
            if !(4..=5).contains(&t.dims.len()) || t.scalar.is_some() {
                return Err(Error::invalid(
                    "convolution operand rank",
                    format!("{op}: 4 or 5 dimensions ([N, C, spatial...])"),
                    format!("`{}` with dims {:?}", t.name, t.dims),
                ));
            }
        }
        if ta.dims.len() != tb.dims.len() || ta.dims.len() != conv.spatial_dims() + 2 {
            return Err(ta.shape_mismatch(tb, "convolution operands have the same rank, 2 + the number of spatial dimensions of the parameters"));
        }
        Ok(())
    }

    /// Forward output dims of x `[N, C, s...]` and w `[K, C/g, r...]`.
    fn conv_out_dims(&self, x: usize, w: usize, conv: &ConvParams) -> Result<Vec<i64>> {
        let (xt, wt) = (&self.tensors[x], &self.tensors[w]);
        let (xd, wd) = (&xt.dims, &wt.dims);
        let groups_ok = xd[1] % wd[1] == 0 && wd[0] % (xd[1] / wd[1]) == 0;
        if !groups_ok {
            return Err(xt.shape_mismatch(wt, "input channels are a multiple g of the filter's channels, and the filter count a multiple of g (groups)"));
        }
        let mut out = vec![xd[0], wd[0]];
        for a in 0..conv.spatial_dims() {
            match conv.out_extent(a, xd[a + 2], wd[a + 2]) {
                Some(e) => out.push(e),
                None => {
                    return Err(xt.shape_mismatch(
                        wt,
                        "the dilated filter fits the padded input in every spatial dimension",
                    ))
                }
            }
        }
        Ok(out)
    }

    /// Convolution forward (`CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR`):
    /// `y = conv(x, w)` with x `[N, C, spatial...]` and w `[K, C/groups, filter...]` (grouped when
    /// `C` is a multiple of w's channels). Returns the virtual output `[N, K, out...]`, laid out in
    /// x's memory order.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR")]
    pub fn conv_fprop(&mut self, x: TensorId, w: TensorId, conv: &ConvParams) -> Result<TensorId> {
        const OP: &str = "convolution forward";
        let (xi, wi) = (self.index(x)?, self.index(w)?);
        self.conv_rank_check(OP, xi, wi, conv)?;
        let dims = self.conv_out_dims(xi, wi, conv)?;
        let order = stride_order(&self.tensors[xi].strides);
        let xi = self.operand(x, None, OP)?;
        let wi = self.operand(w, None, OP)?;
        let y = self.output("conv_fprop.y", dims, &order, self.ops.len())?;
        self.ops.push(Op::ConvFprop {
            x: xi,
            w: wi,
            y: y.index,
            conv: conv.clone(),
        });
        Ok(y)
    }

    /// Convolution backward data (`..._CONVOLUTION_BACKWARD_DATA_DESCRIPTOR`): the gradient with
    /// respect to the input, of dimensions `dx_dims`, from `dy` and the filter `w`. `dx_dims` must
    /// be an input shape whose forward output is `dy`'s shape. Laid out in dy's memory order.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR")]
    pub fn conv_dgrad(
        &mut self,
        dy: TensorId,
        w: TensorId,
        dx_dims: &[i64],
        conv: &ConvParams,
    ) -> Result<TensorId> {
        const OP: &str = "convolution backward data";
        let (dyi, wi) = (self.index(dy)?, self.index(w)?);
        self.conv_rank_check(OP, dyi, wi, conv)?;
        let dx_layout = Layout::nchw_nd(dx_dims)?;
        // Check the forward shape relation on a probe tensor holding dx's dims.
        let probe = self.tensors.len();
        self.tensors.push(TensorInfo {
            name: "dx",
            dims: dx_dims.to_vec(),
            strides: dx_layout.strides().to_vec(),
            dtype: self.intermediate,
            is_virtual: true,
            scalar: None,
            bound: None,
            producer: None,
            consumed: false,
        });
        let fwd = self
            .conv_rank_check(OP, probe, wi, conv)
            .and_then(|_| self.conv_out_dims(probe, wi, conv));
        self.tensors.pop();
        let fwd = fwd?;
        let dyt = &self.tensors[dyi];
        if fwd != dyt.dims {
            return Err(Error::ShapeMismatch {
                a: dyt.name,
                a_dims: dyt.dims.clone(),
                b: "dx",
                b_dims: dx_dims.to_vec(),
                rule: "dy has the forward output shape of dx and w",
            });
        }
        let order = stride_order(&dyt.strides);
        let dyi = self.operand(dy, None, OP)?;
        let wi = self.operand(w, None, OP)?;
        let dx = self.output("conv_dgrad.dx", dx_dims.to_vec(), &order, self.ops.len())?;
        self.ops.push(Op::ConvDgrad {
            dy: dyi,
            w: wi,
            dx: dx.index,
            conv: conv.clone(),
        });
        Ok(dx)
    }

    /// Convolution backward filter (`..._CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR`): the gradient
    /// with respect to the filter, of dimensions `dw_dims`, from `x` and `dy`. Laid out in x's
    /// memory order (KRSC for an NHWC x).
    #[doc(alias = "CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR")]
    pub fn conv_wgrad(
        &mut self,
        x: TensorId,
        dy: TensorId,
        dw_dims: &[i64],
        conv: &ConvParams,
    ) -> Result<TensorId> {
        const OP: &str = "convolution backward filter";
        let (xi, dyi) = (self.index(x)?, self.index(dy)?);
        self.conv_rank_check(OP, xi, dyi, conv)?;
        let dw_layout = Layout::nchw_nd(dw_dims)?;
        let probe = self.tensors.len();
        self.tensors.push(TensorInfo {
            name: "dw",
            dims: dw_dims.to_vec(),
            strides: dw_layout.strides().to_vec(),
            dtype: self.intermediate,
            is_virtual: true,
            scalar: None,
            bound: None,
            producer: None,
            consumed: false,
        });
        let fwd = self
            .conv_rank_check(OP, xi, probe, conv)
            .and_then(|_| self.conv_out_dims(xi, probe, conv));
        self.tensors.pop();
        let fwd = fwd?;
        let dyt = &self.tensors[dyi];
        if fwd != dyt.dims {
            return Err(Error::ShapeMismatch {
                a: dyt.name,
                a_dims: dyt.dims.clone(),
                b: "dw",
                b_dims: dw_dims.to_vec(),
                rule: "dy has the forward output shape of x and dw",
            });
        }
        let order = stride_order(&self.tensors[xi].strides);
        let xi = self.operand(x, None, OP)?;
        let dyi = self.operand(dy, None, OP)?;
        let dw = self.output("conv_wgrad.dw", dw_dims.to_vec(), &order, self.ops.len())?;
        self.ops.push(Op::ConvWgrad {
            x: xi,
            dy: dyi,
            dw: dw.index,
            conv: conv.clone(),
        });
        Ok(dw)
    }

    /// Batched matrix product (`CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR`): a `[B..., M, K]`
    /// times b `[B..., K, N]` gives c `[B..., M, N]` (row-major, packed). At least 3 dimensions
    /// (use a batch of 1; cuDNN's own matmul engines take rank 3, runtime-fusion engines more).
    ///
    /// Each batch dimension of a and b is equal, or 1 on one of them (broadcast: c has the
    /// larger extent). A broadcast operand is described to cuDNN with c's batch extents and
    /// stride 0 on those dimensions, which every engine reads correctly; its buffer keeps the
    /// tensor's own layout. For that it must be a graph input (not an operation's output) that
    /// no other operation reads: otherwise [`Error::InvalidArgument`] (here for an operation's
    /// output, at [`Graph::build`] / [`Graph::check`] for a second reader).
    #[doc(alias = "CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR")]
    pub fn matmul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.matmul_with(a, b, false)
    }

    /// [`Graph::matmul`], or with `grouped` a matmul of grouped heads: each batch extent of b
    /// divides a's (equal, or a group of a's heads shares one of b's, as attention's GQA and
    /// MQA read k and v), and c has a's batch extents.
    pub(crate) fn matmul_with(
        &mut self,
        a: TensorId,
        b: TensorId,
        grouped: bool,
    ) -> Result<TensorId> {
        self.matmul_over(a, b, grouped, [None; 3])
    }

    /// [`Graph::matmul_with`] with tensors giving the actual M, N and K of each batch
    /// ([`MatmulOverrides`]; checked by the caller).
    pub(crate) fn matmul_over(
        &mut self,
        a: TensorId,
        b: TensorId,
        grouped: bool,
        [m, n, k]: [Option<TensorId>; 3],
    ) -> Result<TensorId> {
        const OP: &str = "matmul";
        let (ai, bi) = (self.index(a)?, self.index(b)?);
        let (at, bt) = (&self.tensors[ai], &self.tensors[bi]);
        let (ad, bd) = (&at.dims, &bt.dims);
        let r = ad.len();
        if r < 3 || bd.len() != r || at.scalar.is_some() || bt.scalar.is_some() {
            return Err(at.shape_mismatch(
                bt,
                "matmul operands have the same rank, at least 3 ([batch..., rows, columns])",
            ));
        }
        if ad[r - 1] != bd[r - 2] {
            return Err(at.shape_mismatch(bt, "a's column count (K) equals b's row count"));
        }
        let mut dims = Vec::with_capacity(r);
        for i in 0..r - 2 {
            if grouped {
                if ad[i] % bd[i] != 0 {
                    return Err(at.shape_mismatch(
                        bt,
                        "each batch dimension of b divides a's (grouped heads)",
                    ));
                }
                dims.push(ad[i]);
                continue;
            }
            if ad[i] != bd[i] && ad[i] != 1 && bd[i] != 1 {
                return Err(at.shape_mismatch(bt, "each batch dimension of a and b is equal or 1"));
            }
            dims.push(ad[i].max(bd[i]));
        }
        for t in [at, bt].into_iter().filter(|_| !grouped) {
            let broadcast = (0..r - 2).any(|i| t.dims[i] != dims[i]);
            if broadcast && t.producer.is_some() {
                return Err(Error::invalid(
                    "matmul operand",
                    "an operand broadcast along a batch dimension is a graph input",
                    format!("`{}` {:?} is an operation's output", t.name, t.dims),
                ));
            }
        }
        dims.push(ad[r - 2]);
        dims.push(bd[r - 1]);
        let order: Vec<usize> = (0..r).collect();
        let ai = self.operand(a, None, OP)?;
        let bi = self.operand(b, None, OP)?;
        let mut over = |t: Option<TensorId>| t.map(|t| self.operand(t, None, OP)).transpose();
        let over = MatmulOverrides {
            m: over(m)?,
            n: over(n)?,
            k: over(k)?,
        };
        let c = self.output("matmul.c", dims, &order, self.ops.len())?;
        self.ops.push(Op::Matmul {
            a: ai,
            b: bi,
            c: c.index,
            grouped,
            over,
        });
        Ok(c)
    }

    /// A pointwise operation (`CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR`): `y = mode(x)` for
    /// unary modes, `y = mode(x, b)` for binary ones (`b` required; same rank as x, each
    /// dimension equal or 1; or a [`Graph::scalar`]). The output has the broadcast shape, laid out
    /// in the memory order of the full-shaped operand. Backward modes go through
    /// [`Graph::pointwise_bwd`].
    ///
    /// Engines: cuDNN 9 runs pointwise operations in its runtime-fusion engines, best as the
    /// epilogue of a convolution or matmul (`conv → bias → relu`, `matmul → bias → gelu`). With
    /// cuDNN 9.14, standalone graphs of one f32 NCHW pointwise operation got no engine
    /// configuration from the heuristics ([`OperationGraph::plans`] then returns a typed error),
    /// while f16 channels-last standalone graphs (scale and shift by scalars) ran.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR")]
    pub fn pointwise(
        &mut self,
        mode: PointwiseMode,
        x: TensorId,
        b: Option<TensorId>,
    ) -> Result<TensorId> {
        const OP: &str = "pointwise";
        let xi = self.index(x)?;
        Self::check_param(mode)?;
        if let PointwiseMode::LeakyRelu { slope } = mode {
            if slope != 0.0 {
                return Err(Error::invalid(
                    "pointwise mode",
                    "LeakyRelu with slope 0 (cuDNN 9.14's engines ignored the slope on the H200)",
                    format!("slope {slope} on `{}`", self.tensors[xi].name),
                ));
            }
        }
        match (mode.arity(), b) {
            (Arity::Unary, None) | (Arity::Binary, Some(_)) => {}
            (arity, _) => {
                return Err(Error::invalid(
                    "pointwise operands",
                    match arity {
                        Arity::Unary => format!("{mode:?} reads x only (no b)"),
                        Arity::Binary => format!("{mode:?} reads x and b"),
                        Arity::Backward => {
                            format!("{mode:?} is a backward mode: use pointwise_bwd")
                        }
                    },
                    format!(
                        "x = `{}`, b = {:?}",
                        self.tensors[xi].name,
                        b.map(|b| b.uid())
                    ),
                ))
            }
        }
        if self.tensors[xi].scalar.is_some() {
            return Err(Error::invalid(
                "pointwise operand",
                "x is a tensor (only b may be a by-value scalar)",
                format!("scalar `{}`", self.tensors[xi].name),
            ));
        }
        let r = self.tensors[xi].dims.len();
        let (dims, order) = match b {
            None => (
                self.tensors[xi].dims.clone(),
                stride_order(&self.tensors[xi].strides),
            ),
            Some(b) => {
                let bi = self.index(b)?;
                let bt = &self.tensors[bi];
                let xt = &self.tensors[xi];
                if bt.scalar.is_some() {
                    (xt.dims.clone(), stride_order(&xt.strides))
                } else {
                    let ok = bt.dims.len() == r
                        && xt
                            .dims
                            .iter()
                            .zip(&bt.dims)
                            .all(|(&p, &q)| p == q || p == 1 || q == 1);
                    if !ok {
                        return Err(xt.shape_mismatch(
                            bt,
                            "pointwise operands have the same rank and each dimension equal or 1",
                        ));
                    }
                    let dims: Vec<i64> = xt
                        .dims
                        .iter()
                        .zip(&bt.dims)
                        .map(|(&p, &q)| p.max(q))
                        .collect();
                    let like = if xt.dims == dims { xt } else { bt };
                    let order = if like.dims == dims {
                        stride_order(&like.strides)
                    } else {
                        (0..r).collect()
                    };
                    (dims, order)
                }
            }
        };
        let xi = self.operand(x, None, OP)?;
        let bi = match b {
            Some(b) => Some(self.operand(b, Some(r), OP)?),
            None => None,
        };
        if let PointwiseMode::GenIndex { axis } = mode {
            if axis < 0 || axis >= r as i64 {
                return Err(Error::invalid(
                    "pointwise GenIndex axis",
                    format!("0 ≤ axis < {r} (x's rank)"),
                    format!("axis {axis} on `{}`", self.tensors[xi].name),
                ));
            }
        }
        let y = self.output("pointwise.y", dims, &order, self.ops.len())?;
        let int_operands = matches!(mode, PointwiseMode::Add | PointwiseMode::Sub)
            && self.tensors[xi].dtype == DType::I32
            && bi.is_some_and(|b| self.tensors[b].dtype == DType::I32);
        if matches!(mode, PointwiseMode::GenIndex { .. }) || int_operands {
            // cudnn-frontend declares generated indices INT32 (the comparisons read them so),
            // and the sums and differences of indices and lengths its diagonal masks shift
            // them by (computed in INT32).
            self.tensors[y.index].dtype = DType::I32;
        }
        self.ops.push(Op::Pointwise {
            mode,
            x: xi,
            b: bi,
            y: y.index,
        });
        Ok(y)
    }

    /// `x + b` with broadcast (a bias: b `[1, C, 1, 1]` on x `[N, C, H, W]`).
    pub fn bias(&mut self, x: TensorId, b: TensorId) -> Result<TensorId> {
        self.pointwise(PointwiseMode::Add, x, Some(b))
    }

    /// `x · s` with broadcast (a per-channel scale, or a [`Graph::scalar`]).
    pub fn scale(&mut self, x: TensorId, s: TensorId) -> Result<TensorId> {
        self.pointwise(PointwiseMode::Mul, x, Some(s))
    }

    /// A backward pointwise operation: `dx = mode'(x) · dy` for an activation's backward mode
    /// ([`PointwiseMode::ReluBwd`], [`PointwiseMode::GeluBwd`], ...), where `x` is the forward
    /// input. `dy` and `x` have the same dimensions; dx is laid out like dy.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR")]
    pub fn pointwise_bwd(
        &mut self,
        mode: PointwiseMode,
        dy: TensorId,
        x: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "pointwise backward";
        let (dyi, xi) = (self.index(dy)?, self.index(x)?);
        Self::check_param(mode)?;
        if !mode.is_backward() {
            return Err(Error::invalid(
                "pointwise backward mode",
                "a backward mode (ReluBwd, GeluBwd, ...)",
                format!("{mode:?}"),
            ));
        }
        let (dyt, xt) = (&self.tensors[dyi], &self.tensors[xi]);
        if dyt.dims != xt.dims || dyt.scalar.is_some() || xt.scalar.is_some() {
            return Err(dyt.shape_mismatch(xt, "dy and x have the same dimensions"));
        }
        let dims = dyt.dims.clone();
        let order = stride_order(&dyt.strides);
        let dyi = self.operand(dy, None, OP)?;
        let xi = self.operand(x, None, OP)?;
        let dx = self.output("pointwise_bwd.dx", dims, &order, self.ops.len())?;
        self.ops.push(Op::PointwiseBwd {
            mode,
            dy: dyi,
            x: xi,
            dx: dx.index,
        });
        Ok(dx)
    }

    /// A reduction (`CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR`) of x to `out_dims` (same
    /// rank; each dimension equal to x's or 1 — the dimensions of extent 1 are reduced). Laid out
    /// in x's memory order.
    ///
    /// Engines: cuDNN 9 runs reductions fused at the end of a convolution or matmul graph
    /// (e.g. NVIDIA's `matmul → gelu backward → bias-gradient reduction` pattern, the reduction's
    /// output in f32). With cuDNN 9.14, standalone f32 NCHW reduction graphs got no
    /// engine configuration from the heuristics ([`OperationGraph::plans`] then returns a typed
    /// error).
    #[doc(alias = "CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR")]
    pub fn reduction(&mut self, op: ReduceOp, x: TensorId, out_dims: &[i64]) -> Result<TensorId> {
        self.reduction_with(op, x, out_dims, false)
    }

    /// [`Graph::reduction`], or with `grouped` a reduction over groups of consecutive indices:
    /// each output dimension divides x's (a group of attention heads summed into one head, as
    /// the GQA backward pass reduces dK and dV).
    pub(crate) fn reduction_with(
        &mut self,
        op: ReduceOp,
        x: TensorId,
        out_dims: &[i64],
        grouped: bool,
    ) -> Result<TensorId> {
        const OP: &str = "reduction";
        let xi = self.index(x)?;
        let xt = &self.tensors[xi];
        let ok = xt.scalar.is_none()
            && out_dims.len() == xt.dims.len()
            && out_dims
                .iter()
                .zip(&xt.dims)
                .all(|(&o, &i)| o == i || o == 1 || (grouped && o > 0 && i % o == 0));
        if !ok {
            return Err(Error::ShapeMismatch {
                a: xt.name,
                a_dims: xt.dims.clone(),
                b: "reduction output",
                b_dims: out_dims.to_vec(),
                rule: if grouped {
                    "the output has x's rank and each dimension dividing x's"
                } else {
                    "the output has x's rank and each dimension equal to x's or 1"
                },
            });
        }
        let order = stride_order(&xt.strides);
        let xi = self.operand(x, None, OP)?;
        let y = self.output("reduction.y", out_dims.to_vec(), &order, self.ops.len())?;
        self.ops.push(Op::Reduction {
            op,
            x: xi,
            y: y.index,
        });
        Ok(y)
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
