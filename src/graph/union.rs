//! The graph side of the [`Autotuner`](crate::Autotuner)'s union search: a legacy convolution
//! problem (forward, backward data, backward filter, or the fused forward with bias and
//! activation) rebuilt as a graph of the same dims, strides and data types, the filter its plans
//! are asked under, and event timing shared with the legacy side so that both APIs are measured
//! the same way.
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;

use super::{
    ConvParams, EngineConfig, Graph, HeurMode, OperationGraph, Plan, PlanFilter, PointwiseMode,
    TensorId,
};
use crate::conv::{ConvDesc, FusedActivation, MathType};
use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::tensor::{FilterDesc, Layout, TensorDesc, TensorFormat};

/// Which API ran a convolution an [`Autotuner`](crate::Autotuner) chose
/// ([`Choice::api`](crate::Choice::api)).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ConvApi {
    /// The legacy call (`cudnnConvolutionForward` and relatives) with [`Choice::algo`](crate::Choice::algo).
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

/// Whether [`Policy::Benchmark`](crate::Policy::Benchmark) and
/// [`Policy::Deterministic`](crate::Policy::Deterministic) also search the graph engines for a
/// convolution ([`Autotuner::graph_search`](crate::Autotuner::graph_search)).
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
        .padding(conv.pads())
        .stride(conv.strides())
        .dilation(conv.dilations())
        .mode(conv.mode())
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
        .heuristics(modes)
        .deterministic(deterministic)
        .no_tensor_cores(conv.math() == MathType::Fma)
        .no_down_conversion(conv.math() != MathType::TensorOpAllowConversion)
        .no_reduced_precision(conv.compute() == DType::F32)
        .max_workspace(workspace)
        .max_plans(Some(max_plans))
}

/// Where a union search's plans come from, in order: heuristics A, heuristics B (only when the
/// tuner asks for it: `Autotuner::heuristics_b`), the fallback list, then every engine of the
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
/// (B only `with_b`; configurations an earlier source proposed are not counted twice). Returns the plans, how
/// many configurations were skipped, and the wall time spent building.
pub(crate) fn search_plans(
    cudnn: &Cudnn,
    og: &OperationGraph,
    conv: &ConvDesc,
    deterministic: bool,
    workspace: usize,
    per_mode: usize,
    with_b: bool,
) -> Result<(Vec<Plan>, usize, std::time::Duration)> {
    let started = std::time::Instant::now();
    let mut plans: Vec<Plan> = Vec::new();
    let mut skipped = 0;
    let mut last_error = None;
    for (mode, name) in SOURCES {
        if mode == Some(HeurMode::B) && !with_b {
            continue;
        }
        // Later sources often repeat earlier ones: ask for enough to find `per_mode` new ones.
        let ask = per_mode + plans.len();
        let f = match mode {
            Some(m) => filter(conv, deterministic, workspace, &[m], ask),
            None => filter(conv, deterministic, workspace, &[], ask)
                .all_engines(true)
                .no_runtime_compilation(true),
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

/// Timing of candidates, for graph plans and legacy algorithms alike: one warm-up launch
/// (kernel loading, variant pack), a probe of [`PROBE`] launches, then the best of [`ROUNDS`]
/// rounds of back-to-back launches, as many per round as make it last at least [`TARGET_MS`]
/// by the probe (between 1 and [`MAX_ITERATIONS`]): a 0.02 ms kernel is timed over 15 or 16
/// launches per round, a 5 ms kernel over 1.
pub(crate) const ROUNDS: usize = 3;
/// Launches of the probe.
pub(crate) const PROBE: usize = 2;
/// Least duration of one timed round, in ms.
pub(crate) const TARGET_MS: f32 = 0.3;
/// Most launches per round.
pub(crate) const MAX_ITERATIONS: usize = 100;
/// A candidate whose probe is this many times slower than the best time so far is not timed
/// further (its probe is its time): it cannot win, and 48 candidates must stay quick to search.
pub(crate) const HOPELESS: f32 = 1.5;

/// Launches per round for a probe of `probe_ms` per launch.
#[cfg(test)]
pub(crate) fn iterations(probe_ms: f32) -> usize {
    iterations_for(probe_ms, TARGET_MS)
}

/// Launches per round of at least `target_ms` for a probe of `probe_ms` per launch.
fn iterations_for(probe_ms: f32, target_ms: f32) -> usize {
    if probe_ms.is_nan() || probe_ms <= 0.0 {
        return MAX_ITERATIONS;
    }
    ((target_ms / probe_ms).ceil() as usize).clamp(1, MAX_ITERATIONS)
}

/// Milliseconds per launch of `launch`, timed with CUDA events on `cudnn`'s stream (see
/// [`ROUNDS`]). `best` is the best time of the candidates timed before, if any.
pub(crate) fn time_ms(
    cudnn: &Cudnn,
    best: Option<f32>,
    launch: impl FnMut() -> Result<()>,
) -> Result<f32> {
    time_with(cudnn, best, TARGET_MS, launch)
}

/// [`time_ms`] with rounds of at least `target_ms` and no early exit (a union search's warm-up).
pub(crate) fn time_ms_for(
    cudnn: &Cudnn,
    target_ms: f32,
    launch: impl FnMut() -> Result<()>,
) -> Result<f32> {
    time_with(cudnn, None, target_ms, launch)
}

fn time_with(
    cudnn: &Cudnn,
    best: Option<f32>,
    target_ms: f32,
    mut launch: impl FnMut() -> Result<()>,
) -> Result<f32> {
    batch_ms(cudnn, 1, &mut launch)?;
    let probe = batch_ms(cudnn, PROBE, &mut launch)?;
    if best.is_some_and(|b| probe > b * HOPELESS) {
        return Ok(probe);
    }
    let n = iterations_for(probe, target_ms);
    let mut fastest = f32::INFINITY;
    for _ in 0..ROUNDS {
        fastest = fastest.min(batch_ms(cudnn, n, &mut launch)?);
    }
    Ok(fastest)
}

/// Milliseconds per launch of `n` back-to-back launches, between two CUDA events on `cudnn`'s
/// stream.
fn batch_ms(cudnn: &Cudnn, n: usize, launch: &mut impl FnMut() -> Result<()>) -> Result<f32> {
    let stream = cudnn.stream();
    let event = || {
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| Error::driver("recording an autotune event", e))
    };
    let start = event()?;
    for _ in 0..n {
        launch()?;
    }
    let end = event()?;
    let ms = start
        .elapsed_ms(&end)
        .map_err(|e| Error::driver("timing an autotune candidate", e))?;
    Ok(ms / n.max(1) as f32)
}

/// Median of `times` (the upper one of an even count); `None` when empty.
pub(crate) fn median(times: &[f32]) -> Option<f32> {
    let mut v = times.to_vec();
    v.sort_by(f32::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Most launches per round of [`sustained_ms`] (a 0.01 ms kernel fills a 5 ms round).
const SUSTAINED_MAX_LAUNCHES: usize = 2000;

/// Milliseconds per launch of `launch` running alone under sustained load, as a training loop
/// or a benchmark that repeats one layer sees it: after a warm-up launch and a probe, `launch`
/// runs back to back for `solo_ms` of wall clock ([`heat`]), then `rounds` rounds of at least
/// `target_ms` each are timed; the median round.
///
/// Why alone: a GPU at its power limit lowers its clocks by the power the running kernels
/// draw, so a plan that draws more runs slower once it has run for a while. Short rounds
/// interleaved between candidates time them all at the clocks the mix of them set; only a
/// candidate that runs alone for some milliseconds shows its own sustained speed (plans that
/// interleaved rounds cannot order can separate once each runs alone).
pub(crate) fn sustained_ms(
    cudnn: &Cudnn,
    solo_ms: f32,
    rounds: usize,
    target_ms: f32,
    mut launch: impl FnMut() -> Result<()>,
) -> Result<f32> {
    batch_ms(cudnn, 1, &mut launch)?;
    let probe = batch_ms(cudnn, PROBE, &mut launch)?;
    heat(cudnn, solo_ms, probe, &mut launch)?;
    let n = if probe.is_nan() || probe <= 0.0 {
        SUSTAINED_MAX_LAUNCHES
    } else {
        ((target_ms / probe).ceil() as usize).clamp(1, SUSTAINED_MAX_LAUNCHES)
    };
    let mut times = Vec::with_capacity(rounds.max(1));
    for _ in 0..rounds.max(1) {
        times.push(batch_ms(cudnn, n, &mut launch)?);
    }
    Ok(median(&times).unwrap_or(f32::NAN))
}

/// Runs `launch` back to back for about `heat_ms` of wall clock, in batches of about
/// [`HEAT_BATCH_MS`] by `per_launch_ms` (each followed by a synchronize, so the clock measures
/// the GPU's work rather than the enqueueing). A GPU that has been idle runs its first ~0.2 s of
/// load at higher clocks than it settles to; candidates timed after this run are timed in the
/// state a busy program sees.
pub(crate) fn heat(
    cudnn: &Cudnn,
    heat_ms: f32,
    per_launch_ms: f32,
    mut launch: impl FnMut() -> Result<()>,
) -> Result<()> {
    let stream = cudnn.stream();
    let batch = iterations_for(per_launch_ms, HEAT_BATCH_MS).max(1);
    let started = std::time::Instant::now();
    while started.elapsed().as_secs_f32() * 1e3 < heat_ms {
        for _ in 0..batch {
            launch()?;
        }
        stream
            .synchronize()
            .map_err(|e| Error::driver("synchronizing an autotune warm-up", e))?;
    }
    Ok(())
}

/// GPU time of one batch of [`heat`], in ms.
pub(crate) const HEAT_BATCH_MS: f32 = 5.0;

/// Whether the plan was built on this handle (plans run only there).
pub(crate) fn built_on(plan: &Plan, cudnn: &Cudnn) -> bool {
    plan.graph.check_handle(cudnn).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sustained_rounds_keep_their_median() {
        // One fast outlier (a round timed before the clocks settled) does not decide.
        assert_eq!(median(&[0.19, 0.166, 0.19, 0.188, 0.191]), Some(0.19));
        assert_eq!(median(&[2.0, 1.0]), Some(2.0));
        assert_eq!(median(&[0.5]), Some(0.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn iterations_time_every_round_over_the_target() {
        // 0.3 / 0.02 rounds to just above 15 in f32.
        assert!((15..=16).contains(&iterations(0.02)));
        assert!(iterations(0.02) as f32 * 0.02 >= TARGET_MS - 1e-6);
        assert_eq!(iterations(5.0), 1);
        assert_eq!(iterations(1e-6), MAX_ITERATIONS);
        assert_eq!(iterations(0.0), MAX_ITERATIONS);
        assert_eq!(iterations(f32::NAN), MAX_ITERATIONS);
        assert!((3..=4).contains(&iterations(0.1)));
        assert_eq!(iterations(f32::INFINITY), 1);
    }

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
