//! The graph side of the [`Autotuner`](super::Autotuner)'s union search: a legacy convolution
//! problem (forward, backward data, backward filter, or the fused forward with bias and
//! activation) rebuilt as a graph of the same dims, strides and data types, the filter its plans
//! are asked under, and the plans searched (the `timing` module times them and the legacy
//! side alike, so that both APIs are measured the same way).
use std::sync::Arc;

use crate::conv::{ConvDesc, FusedActivation, MathType};
use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::graph::{
    ConvParams, EngineConfig, Graph, HeurMode, OperationGraph, Plan, PlanFilter, PointwiseMode,
    TensorId,
};
use crate::handle::Cudnn;
use crate::tensor::{FilterDesc, Layout, TensorDesc, TensorFormat};

/// Which API ran a convolution an [`Autotuner`](super::Autotuner) chose
/// ([`Choice::api`](super::Choice::api)).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ConvApi {
    /// The legacy call (`cudnnConvolutionForward` and relatives) with [`Choice::algo`](super::Choice::algo).
    #[default]
    Legacy,
    /// A backend (graph) execution plan of this engine configuration (shared with the tuner's
    /// decision: a steady-state call copies no configuration).
    Graph(Arc<EngineConfig>),
}

impl ConvApi {
    /// Whether a graph engine ran.
    pub fn is_graph(&self) -> bool {
        matches!(self, ConvApi::Graph(_))
    }
    /// The engine configuration that ran, if a graph engine ran.
    pub fn config(&self) -> Option<&EngineConfig> {
        match self {
            ConvApi::Graph(c) => Some(c),
            ConvApi::Legacy => None,
        }
    }
}

/// Whether [`Policy::Benchmark`](super::Policy::Benchmark) and
/// [`Policy::Deterministic`](super::Policy::Deterministic) also search the graph engines for a
/// convolution ([`Autotuner::with_graph_search`](super::Autotuner::with_graph_search)).
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

/// The tensors of a union graph that take buffers: two or three inputs and one output.
///
/// | problem | `a` | `b` | `c` | `out` |
/// |---|---|---|---|---|
/// | forward | x | w | — | y |
/// | backward data | dy | w | — | dx |
/// | backward filter | x | dy | — | dw |
/// | fused forward | x | w | bias | y |
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ids {
    pub(crate) a: TensorId,
    pub(crate) b: TensorId,
    pub(crate) c: Option<TensorId>,
    pub(crate) out: TensorId,
}

/// A legacy convolution problem as a graph, with the ids its buffers bind to.
pub(crate) struct ConvGraph {
    pub(crate) og: OperationGraph,
    pub(crate) ids: Ids,
}

/// Whether the graph path can express this legacy problem: same input and output type, f32 /
/// f16 / bf16 (f64 and the int8 configurations stay legacy), a packed NCHW or KRSC filter, 2 or 3
/// spatial dimensions, and channels matching the group count (the graph infers groups from the
/// channel ratio). `x_dims` are the dims of the convolution's input (x, or dx for backward data).
pub(crate) fn eligible<X: DataType, Y: DataType>(
    x_dims: &[i64],
    w_desc: &FilterDesc<X>,
    conv: &ConvDesc,
    y_dims: &[i64],
) -> bool {
    X::DTYPE == Y::DTYPE
        && matches!(X::DTYPE, DType::F32 | DType::F16 | DType::BF16)
        && matches!(w_desc.format(), TensorFormat::Nchw | TensorFormat::Nhwc)
        && (2..=3).contains(&conv.spatial_rank())
        && x_dims.len() == conv.tensor_rank()
        && y_dims.len() == conv.tensor_rank()
        && w_desc.dims().len() == conv.tensor_rank()
        && w_desc
            .dims()
            .get(1)
            .and_then(|c| c.checked_mul(conv.groups()))
            == x_dims.get(1).copied()
}

/// The graph activation matching a legacy fused activation: `None` for
/// [`FusedActivation::Identity`] (bias only). The legacy activation descriptor asks
/// `CUDNN_NOT_PROPAGATE_NAN` with no clipping; the pointwise ReLU has lower clip 0 and no upper
/// clip, the same function on every number.
pub(crate) fn fused_mode(activation: FusedActivation) -> Option<PointwiseMode> {
    match activation {
        FusedActivation::Relu => Some(PointwiseMode::Relu),
        FusedActivation::Identity => None,
    }
}

fn params(conv: &ConvDesc) -> ConvParams {
    ConvParams::new(conv.spatial_rank())
        .with_padding(conv.pads())
        .with_strides(conv.strides())
        .with_dilations(conv.dilations())
        .with_mode(conv.mode())
}

fn new_graph(dtype: DType, conv: &ConvDesc) -> Graph {
    Graph::new(dtype, DType::F32, conv.compute())
}

/// Marks `ids.out` the graph's output with the legacy descriptor's dims (checked) and strides,
/// and builds the graph.
fn finish(
    cudnn: &Cudnn,
    mut g: Graph,
    ids: Ids,
    name: &'static str,
    dtype: DType,
    layout: &Layout,
    rule: &'static str,
) -> Result<ConvGraph> {
    let t = ids.out;
    if g.dims(t)? != layout.dims() {
        return Err(Error::ShapeMismatch {
            a: name,
            a_dims: layout.dims().to_vec(),
            b: "the graph operation's output",
            b_dims: g.dims(t)?.to_vec(),
            rule,
        });
    }
    g.mark_output_strided(t, dtype, layout.strides())?;
    g.set_name(t, name)?;
    let og = g.build(cudnn)?;
    Ok(ConvGraph { og, ids })
}

/// `y = conv_fprop(x, w)`, optionally followed by `+ bias` and an activation (the fused
/// forward: `bias` with its descriptor's dims, strides and type).
pub(crate) fn fprop_graph<X: DataType, Y: DataType>(
    cudnn: &Cudnn,
    x_desc: &TensorDesc<X>,
    w_desc: &FilterDesc<X>,
    conv: &ConvDesc,
    y_desc: &TensorDesc<Y>,
    fused: Option<(&Layout, DType, Option<PointwiseMode>)>,
) -> Result<ConvGraph> {
    let mut g = new_graph(X::DTYPE, conv);
    let x = g.tensor("x", x_desc.dims(), x_desc.layout().strides(), X::DTYPE)?;
    let w = g.tensor("w", w_desc.dims(), w_desc.layout().strides(), X::DTYPE)?;
    let mut y = g.conv_fprop(x, w, &params(conv))?;
    let mut c = None;
    if let Some((bias, bias_type, act)) = fused {
        let b = g.tensor("bias", bias.dims(), bias.strides(), bias_type)?;
        y = g.bias(y, b)?;
        if let Some(mode) = act {
            y = g.pointwise(mode, y, None)?;
        }
        c = Some(b);
    }
    let ids = Ids {
        a: x,
        b: w,
        c,
        out: y,
    };
    let rule = "y must have the convolution's output dimensions";
    finish(cudnn, g, ids, "y", Y::DTYPE, y_desc.layout(), rule)
}

/// `dx = conv_dgrad(dy, w)` with dx of `dx_desc`'s dims and strides.
pub(crate) fn dgrad_graph<T: DataType>(
    cudnn: &Cudnn,
    w_desc: &FilterDesc<T>,
    dy_desc: &TensorDesc<T>,
    conv: &ConvDesc,
    dx_desc: &TensorDesc<T>,
) -> Result<ConvGraph> {
    let mut g = new_graph(T::DTYPE, conv);
    let dy = g.tensor("dy", dy_desc.dims(), dy_desc.layout().strides(), T::DTYPE)?;
    let w = g.tensor("w", w_desc.dims(), w_desc.layout().strides(), T::DTYPE)?;
    let dx = g.conv_dgrad(dy, w, dx_desc.dims(), &params(conv))?;
    let ids = Ids {
        a: dy,
        b: w,
        c: None,
        out: dx,
    };
    let rule = "dx must have the input dimensions of the convolution";
    finish(cudnn, g, ids, "dx", T::DTYPE, dx_desc.layout(), rule)
}

/// `dw = conv_wgrad(x, dy)` with dw of `dw_desc`'s dims and strides (KRSC for an NHWC filter).
pub(crate) fn wgrad_graph<T: DataType>(
    cudnn: &Cudnn,
    x_desc: &TensorDesc<T>,
    dy_desc: &TensorDesc<T>,
    conv: &ConvDesc,
    dw_desc: &FilterDesc<T>,
) -> Result<ConvGraph> {
    let mut g = new_graph(T::DTYPE, conv);
    let x = g.tensor("x", x_desc.dims(), x_desc.layout().strides(), T::DTYPE)?;
    let dy = g.tensor("dy", dy_desc.dims(), dy_desc.layout().strides(), T::DTYPE)?;
    let dw = g.conv_wgrad(x, dy, dw_desc.dims(), &params(conv))?;
    let ids = Ids {
        a: x,
        b: dy,
        c: None,
        out: dw,
    };
    let rule = "dw must have the filter's dimensions";
    finish(cudnn, g, ids, "dw", T::DTYPE, dw_desc.layout(), rule)
}

/// The plan filter matching the legacy convolution's numerics: no tensor cores under
/// [`MathType::Fma`] (strict fp32, as the legacy math type asks), no down-conversion of inputs
/// unless [`MathType::TensorOpAllowConversion`] allows it (PyTorch drops those engines too), no
/// reduced-precision accumulation when the convolution computes in f32; deterministic engines
/// only under the deterministic policy; plans within `workspace` bytes, proposed by `modes`, at
/// most `max_plans` of them.
pub(crate) fn filter(
    conv: &ConvDesc,
    deterministic: bool,
    workspace: usize,
    modes: &[HeurMode],
    max_plans: usize,
) -> PlanFilter {
    PlanFilter::new()
        .with_heuristics(modes)
        .with_deterministic(deterministic)
        .with_no_tensor_cores(conv.math() == MathType::Fma)
        .with_no_down_conversion(conv.math() != MathType::TensorOpAllowConversion)
        .with_no_reduced_precision(conv.compute() == DType::F32)
        .with_workspace_limit(workspace)
        .with_max_plans(Some(max_plans))
}

/// Where a union search's plans come from, in order: heuristics A, heuristics B (only when the
/// tuner asks for it: `Autotuner::with_heuristics_b`), the fallback list, then every engine of the
/// graph with its default knobs (engines that compile kernels at run time left out of that last
/// source: each would cost a compilation). Each source can propose the fastest plan of a
/// problem that none of the others proposes (B on 5×5 convolutions, the engine list on 1×1 ones
/// in the benchmark set).
pub(crate) const SOURCES: [(Option<HeurMode>, &str); 4] = [
    (Some(HeurMode::A), "A"),
    (Some(HeurMode::B), "B"),
    (Some(HeurMode::Fallback), "fallback"),
    (None, "all engines"),
];

/// The plans of a union search: up to `per_mode` new configurations from each of [`SOURCES`]
/// (B only `with_b`; configurations an earlier source proposed are not counted twice; without
/// `every_source`, the fallback list only when no earlier source proposed a plan, and no
/// engine list). Returns the plans, how many configurations were skipped, and the wall time
/// spent building.
#[allow(clippy::too_many_arguments)] // the filter's parts and the sources asked
pub(crate) fn search_plans(
    cudnn: &Cudnn,
    og: &OperationGraph,
    conv: &ConvDesc,
    deterministic: bool,
    workspace: usize,
    per_mode: usize,
    with_b: bool,
    every_source: bool,
) -> Result<(Vec<Plan>, usize, std::time::Duration)> {
    let started = std::time::Instant::now();
    let mut plans: Vec<Plan> = Vec::new();
    let mut skipped = 0;
    let mut last_error = None;
    for (mode, name) in SOURCES {
        if mode == Some(HeurMode::B) && !with_b {
            continue;
        }
        if !every_source
            && (mode.is_none() || (mode == Some(HeurMode::Fallback) && !plans.is_empty()))
        {
            continue;
        }
        // Later sources often repeat earlier ones: ask for enough to find `per_mode` new ones.
        let ask = per_mode + plans.len();
        let f = match mode {
            Some(m) => filter(conv, deterministic, workspace, &[m], ask),
            None => filter(conv, deterministic, workspace, &[], ask)
                .with_all_engines(true)
                .with_no_runtime_compilation(true),
        };
        match og.plans(cudnn, &f) {
            Ok(list) => {
                skipped += list.skipped.len();
                let mut added = 0;
                for p in list.plans {
                    if added < per_mode && plans.iter().all(|q| q.config() != p.config()) {
                        plans.push(p);
                        added += 1;
                    }
                }
            }
            Err(e) => {
                log::debug!("union search: {name} gave no plan: {e}");
                last_error = Some(e);
            }
        }
    }
    match (plans.is_empty(), last_error) {
        (true, Some(e)) => Err(e),
        _ => Ok((plans, skipped, started.elapsed())),
    }
}

/// Whether the plan was built on this handle (plans run only there).
pub(crate) fn built_on(plan: &Plan, cudnn: &Cudnn) -> bool {
    plan.graph.check_handle(cudnn).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_api_names_its_config() {
        let c: EngineConfig = "eng3_k2=1".parse().unwrap();
        let api = ConvApi::Graph(Arc::new(c.clone()));
        assert!(api.is_graph());
        assert_eq!(api.config(), Some(&c));
        assert_eq!(ConvApi::Legacy.config(), None);
        assert!(!ConvApi::default().is_graph());
    }

    #[test]
    fn fused_activations_map_to_pointwise_modes() {
        assert_eq!(fused_mode(FusedActivation::Relu), Some(PointwiseMode::Relu));
        assert_eq!(fused_mode(FusedActivation::Identity), None);
    }
}
