//! Choosing: the convolution [`Autotuner`] (legacy algorithms and graph engines searched
//! together), the graph plan tuner ([`plan`]: [`plan::autotune`] and [`plan::PlanCache`]), and
//! the one cache-file format they and the cuBLASLt tuner share.
//!
//! [`Autotuner`] is this crate's counterpart of PyTorch's `torch.backends.cudnn` knobs:
//!
//! | PyTorch                                  | cudnn-safe                                      |
//! |------------------------------------------|-------------------------------------------------|
//! | `benchmark = False` (default)            | [`Policy::Heuristic`]                           |
//! | `benchmark = True`                       | [`Policy::Benchmark`]                           |
//! | `deterministic = True`                   | [`Policy::Deterministic`]                       |
//! | (none)                                   | [`Policy::Fixed`]: named algorithms             |
//! | (none)                                   | [`SearchEffort`]: how much a first call searches |
//! | `allow_tf32`                             | [`MathType`](crate::conv::MathType) of the conv |
//! | `CUDNN_CONV_WSCAP_DBG` (workspace cap)   | [`Autotuner::with_workspace_limit`]             |
//! | in-memory benchmark cache (per process)  | cache keyed by problem, GPU and cuDNN version, persisted with [`Autotuner::cache_file`] or `CUDNN_SAFE_AUTOTUNE_CACHE` |
//!
//! Under the benchmark policies every convolution call — forward, backward data (the transposed
//! convolution's pass included), backward filter and the fused forward with bias and
//! activation — also searches the backend (graph) engines ([`Autotuner::with_graph_search`], on by
//! default): legacy algorithms and graph plans are timed alike and the faster runs, without
//! the caller knowing which API served;
//! [`Choice::api`] says which did. A repeated call is served from the decision as cheaply as
//! the bare plan: nothing is copied or rebuilt (the held plan's variant pack is reused while
//! the buffers stay the same), and every check of the call still runs.
//!
//! A decision is made once per problem (direction, dims, strides, data types, convolution
//! parameters, math type, policy, workspace limit, GPU model and cuDNN version) and logged with
//! the `log` crate at `info` level. When the chosen algorithm cannot run (its workspace cannot
//! be allocated, or cuDNN refuses it), the next candidate is tried. A process that starts with
//! a cache file can replay its decisions at start-up ([`Autotuner::warm_up`]): the first call
//! of each problem then builds no plan and loads no kernel.
//!
//! ```no_run
//! use cudnn_safe::tune::{Autotuner, Policy};
//! use cudnn_safe::{conv::ConvDesc, cuda_context, Cudnn, FilterDesc, TensorDesc, TensorFormat};
//! # fn main() -> cudnn_safe::Result<()> {
//! let ctx = cuda_context(0)?;
//! let stream = ctx.default_stream();
//! let cudnn = Cudnn::new(stream.clone())?;
//! let mut tuner = Autotuner::new(Policy::Benchmark)
//!     .with_workspace_limit(256 << 20)
//!     .cache_file("conv-autotune.txt");
//! let x_d = TensorDesc::<f32>::nchw(32, 64, 56, 56)?;
//! let w_d = FilterDesc::<f32>::new(&[128, 64, 3, 3], TensorFormat::Nchw)?;
//! let conv = ConvDesc::builder(2).pads(&[1, 1]).build::<f32>()?;
//! let y_d = TensorDesc::<f32>::nchw_nd(&conv.output_dims(x_d.dims(), w_d.dims())?)?;
//! let x = stream.clone_htod(&vec![0.5f32; x_d.span()]).unwrap();
//! let w = stream.clone_htod(&vec![0.1f32; w_d.span()]).unwrap();
//! let mut y = stream.alloc_zeros::<f32>(y_d.span()).unwrap();
//! let choice = tuner.forward(&cudnn, 1.0, &x_d, &x, &w_d, &w, &conv, 0.0, &y_d, &mut y)?;
//! println!("ran {} ({:?})", choice.algo, choice.source);
//! # Ok(()) }
//! ```
//!
//! Every tuner speaks the same words: a [`Policy`] says how it chooses, a [`Choice`] what it
//! ran, a [`Candidate`] one ranked option, [`Stats`] what it counted, [`WarmUp`] what a
//! start-up replay did; `cache_file` / `try_cache_file` / `without_cache_file` name its file,
//! `save`, `clear` (forget them), `cached_decisions` and `stats` work on its decisions (the graph
//! plan tuner's and cuBLASLt's are [`plan::Policy`], [`plan::Choice`], ... and
//! `blas::lt::Policy`, ...); [`PlanCache::drop_plans`](plan::PlanCache::drop_plans) drops the
//! graph plans held and keeps the decisions.
mod autotuner;
mod cache;
mod key;
pub mod plan;
mod policy;
mod run;
mod search;
#[cfg(test)]
mod tests;
pub(crate) mod union;
mod warm;

pub use autotuner::{Autotuner, CACHE_ENV};
pub(crate) use cache::{
    cudnn_device, device_name, entry_fields, entry_line, list, or_empty, Format,
};
pub use policy::{
    Candidate, Choice, FixedAlgos, Policy, SearchEffort, Source, Stats, WarmUp,
    COMPOSED_MIN_SPEEDUP, DEFAULT_FINALISTS, DEFAULT_FINAL_SOLO_MS, DEFAULT_GRAPH_PLANS,
    DEFAULT_REFINE_KNOBS, QUICK_GRAPH_PLANS,
};
pub use union::{ConvApi, GraphSearch};
