//! The graph side of the [`Autotuner`](crate::Autotuner)'s union search: a legacy convolution
//! forward problem (tensor, filter and convolution descriptors) rebuilt as a one-operation
//! graph, the filter its plans are asked under, and event timing shared with the legacy side so
//! that both APIs are measured the same way.
use cudarc::driver::sys::CUevent_flags;

use super::{ConvParams, EngineConfig, Graph, OperationGraph, Plan, PlanFilter, TensorId};
use crate::conv::{ConvDesc, MathType};
use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::tensor::{FilterDesc, TensorDesc, TensorFormat};

/// Which API ran a convolution an [`Autotuner`](crate::Autotuner) chose
/// ([`Choice::api`](crate::Choice::api)).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ConvApi {
    /// The legacy call (`cudnnConvolutionForward` and relatives) with [`Choice::algo`](crate::Choice::algo).
    #[default]
    Legacy,
    /// A backend (graph) execution plan of this engine configuration.
    Graph(EngineConfig),
}

impl ConvApi {
    /// Whether a graph engine ran.
    pub fn is_graph(&self) -> bool {
        matches!(self, ConvApi::Graph(_))
    }
}

/// Whether [`Policy::Benchmark`](crate::Policy::Benchmark) and
/// [`Policy::Deterministic`](crate::Policy::Deterministic) also search the graph engines for a
/// convolution forward ([`Autotuner::graph_search`](crate::Autotuner::graph_search)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GraphSearch {
    /// Legacy algorithms only (the behaviour before the union search).
    Off,
    /// Legacy algorithms and graph engines timed the same way; the faster wins.
    #[default]
    Union,
    /// The fastest graph engine whenever one builds and runs, however the legacy algorithms
    /// compare (to exercise or pin the graph path; the legacy ranking is still kept for the calls
    /// the graph path does not serve).
    Prefer,
}

impl GraphSearch {
    /// Short name (`"off"`, `"union"`, `"prefer"`).
    pub fn name(self) -> &'static str {
        match self {
            GraphSearch::Off => "off",
            GraphSearch::Union => "union",
            GraphSearch::Prefer => "prefer",
        }
    }
}

/// A convolution forward problem as a graph: `y = conv_fprop(x, w)`, x, w and y real tensors
/// with the legacy descriptors' dims, strides and data types.
pub(crate) struct ConvGraph {
    pub(crate) og: OperationGraph,
    pub(crate) x: TensorId,
    pub(crate) w: TensorId,
    pub(crate) y: TensorId,
}

/// Whether the graph path can express this legacy forward problem: same input and output type,
/// f32 / f16 / bf16 (f64 and the int8 configurations stay legacy), a packed NCHW or KRSC filter,
/// 2 or 3 spatial dimensions, and channels matching the group count (the graph infers groups from
/// the channel ratio).
pub(crate) fn eligible<X: DataType, Y: DataType>(
    x_desc: &TensorDesc<X>,
    w_desc: &FilterDesc<X>,
    conv: &ConvDesc,
    y_desc: &TensorDesc<Y>,
) -> bool {
    X::DTYPE == Y::DTYPE
        && matches!(X::DTYPE, DType::F32 | DType::F16 | DType::BF16)
        && matches!(w_desc.format(), TensorFormat::Nchw | TensorFormat::Nhwc)
        && (2..=3).contains(&conv.spatial_rank())
        && x_desc.dims().len() == conv.tensor_rank()
        && y_desc.dims().len() == conv.tensor_rank()
        && w_desc.dims().len() == conv.tensor_rank()
        && w_desc
            .dims()
            .get(1)
            .and_then(|c| c.checked_mul(conv.groups()))
            == x_desc.dims().get(1).copied()
}

/// Builds the graph of a forward problem on `cudnn`.
pub(crate) fn conv_graph<X: DataType, Y: DataType>(
    cudnn: &Cudnn,
    x_desc: &TensorDesc<X>,
    w_desc: &FilterDesc<X>,
    conv: &ConvDesc,
    y_desc: &TensorDesc<Y>,
) -> Result<ConvGraph> {
    let mut g = Graph::new(X::DTYPE, DType::F32, conv.compute());
    let x = g.tensor("x", x_desc.dims(), x_desc.layout().strides(), X::DTYPE)?;
    let w = g.tensor("w", w_desc.dims(), w_desc.layout().strides(), X::DTYPE)?;
    let params = ConvParams::new(conv.spatial_rank())
        .padding(conv.pads())
        .stride(conv.strides())
        .dilation(conv.dilations())
        .mode(conv.mode());
    let y = g.conv_fprop(x, w, &params)?;
    if g.dims(y)? != y_desc.dims() {
        return Err(Error::ShapeMismatch {
            a: "y",
            a_dims: y_desc.dims().to_vec(),
            b: "conv(x, w)",
            b_dims: g.dims(y)?.to_vec(),
            rule: "y must have the convolution's output dimensions",
        });
    }
    g.mark_output_strided(y, Y::DTYPE, y_desc.layout().strides())?;
    g.set_name(y, "y")?;
    let og = g.build(cudnn)?;
    Ok(ConvGraph { og, x, w, y })
}

/// The plan filter matching the legacy convolution's numerics: no tensor cores under
/// [`MathType::Fma`] (strict fp32, as the legacy math type asks), no down-conversion of inputs
/// unless [`MathType::TensorOpAllowConversion`] allows it (PyTorch drops those engines too), no
/// reduced-precision accumulation when the convolution computes in f32; deterministic engines
/// only under the deterministic policy; at most `max_plans` plans within `workspace` bytes.
pub(crate) fn filter(
    conv: &ConvDesc,
    deterministic: bool,
    workspace: usize,
    max_plans: usize,
) -> PlanFilter {
    PlanFilter::new()
        .deterministic(deterministic)
        .no_tensor_cores(conv.math() == MathType::Fma)
        .no_down_conversion(conv.math() != MathType::TensorOpAllowConversion)
        .no_reduced_precision(conv.compute() == DType::F32)
        .max_workspace(workspace)
        .max_plans(Some(max_plans))
}

/// Timed executions per candidate: one warm-up (kernel loading, variant pack), then the best of
/// `ROUNDS` rounds of `ITERATIONS` back-to-back launches, for graph plans and the legacy
/// algorithm alike.
const ROUNDS: usize = 3;
const ITERATIONS: usize = 3;

/// Milliseconds per launch of `launch`, timed with CUDA events on `cudnn`'s stream.
pub(crate) fn time_ms(cudnn: &Cudnn, mut launch: impl FnMut() -> Result<()>) -> Result<f32> {
    let stream = cudnn.stream();
    let event = || {
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| Error::driver("recording an autotune event", e))
    };
    launch()?;
    let mut best = f32::INFINITY;
    for _ in 0..ROUNDS {
        let start = event()?;
        for _ in 0..ITERATIONS {
            launch()?;
        }
        let end = event()?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| Error::driver("timing an autotune candidate", e))?;
        best = best.min(ms / ITERATIONS as f32);
    }
    Ok(best)
}

/// Whether the plan was built on this handle (plans run only there).
pub(crate) fn built_on(plan: &Plan, cudnn: &Cudnn) -> bool {
    plan.graph.check_handle(cudnn).is_ok()
}
