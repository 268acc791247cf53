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
//!   builds the plans that finalize ([`PlanFilter`]); [`OperationGraph::plan`] builds only the
//!   first. No plan is [`Error::NoEngine`](crate::Error::NoEngine) naming the graph.
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
//! let conv = g.conv_fprop(x, w, &ConvParams::new(2).with_padding(&[1, 1]))?;
//! let biased = g.bias(conv, b)?;
//! let y = g.pointwise(PointwiseMode::Relu, biased, None)?;
//! g.mark_output(y)?;
//!
//! let og = g.build(&cudnn)?;
//! // The heuristics' first plan; `og.plans(..)` lists every one that builds.
//! let plan = og.plan(&cudnn, &PlanFilter::default())?;
//!
//! let xb = stream.alloc_zeros::<half::f16>(og.span(x)?).unwrap();
//! let wb = stream.alloc_zeros::<half::f16>(og.span(w)?).unwrap();
//! let bb = stream.alloc_zeros::<half::f16>(og.span(b)?).unwrap();
//! let mut yb = stream.alloc_zeros::<half::f16>(og.span(y)?).unwrap();
//! let mut ws = Workspace::new(stream.clone());
//! let mut args = Args::new(&cudnn);
//! args.input(x, &xb)?.input(w, &wb)?.input(b, &bb)?.output(y, &mut yb)?;
//! cudnn.execute(&plan, &args, &mut ws)?;
//! # Ok(()) }
//! ```
mod attention;
pub(crate) mod backend;
mod build;
mod conv;
mod cuda_graph;
mod engine;
pub(crate) mod exec;
mod matmul;
mod model;
// Normalization ops live with the rest of normalization (src/norm/graph/); compiled here, as
// a child of `graph`, because they build on the graph's private tensor and op tables.
#[path = "../norm/graph/mod.rs"]
mod norm;
mod op;
mod parallel;
mod plan;
mod pointwise;
mod preload;
mod record;
mod reduction;
mod rng;
mod select;

pub use crate::tune::plan::{autotune, PlanCache};
pub use attention::{
    alibi_slopes, DiagonalAlignment, Sdpa, SdpaBackward, SdpaDropout, SdpaForward, SdpaGrads,
    SdpaInputs, SdpaLayout, SdpaOptions, SdpaOutputs,
};
pub use build::OperationGraph;
pub use cuda_graph::{PlanGraph, CUDA_GRAPH_NOT_SUPPORTED};
pub use engine::{
    BehaviorNote, EngineConfig, HeurMode, KnobRange, NumericalNote, PlanFilter, PlanList, Skipped,
    MAX_KNOB_VALUES,
};
pub use exec::Args;
pub use norm::{
    BatchNormOutputs, BatchNormRunning, GroupNormMethod, GroupNormOutputs, LayerNormGrads,
    LayerNormOutputs, RmsNormGrads, RmsNormOutputs,
};
pub use parallel::{build_threads, set_build_threads, DEFAULT_MAX_BUILD_THREADS};
pub use plan::Plan;
pub use preload::{preload, Preloaded};

pub use conv::ConvParams;
pub(crate) use model::{stride_order, strides_in_order, TensorInfo};
pub use model::{Graph, TensorId};
pub(crate) use op::{MatmulOverrides, Op};
pub(crate) use plan::plans_from_configs;
pub use pointwise::PointwiseMode;
