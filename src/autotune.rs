//! Algorithm policies for convolutions and an autotune cache that can persist to a file.
//!
//! [`Autotuner`] is this crate's counterpart of PyTorch's `torch.backends.cudnn` knobs:
//!
//! | PyTorch                                  | cudnn-safe                                      |
//! |------------------------------------------|-------------------------------------------------|
//! | `benchmark = False` (default)            | [`Policy::Heuristic`]                           |
//! | `benchmark = True`                       | [`Policy::Benchmark`]                           |
//! | `deterministic = True`                   | [`Policy::Deterministic`]                       |
//! | (none)                                   | [`Policy::Fixed`]: named algorithms             |
//! | `allow_tf32`                             | [`MathType`](crate::conv::MathType) of the conv |
//! | `CUDNN_CONV_WSCAP_DBG` (workspace cap)   | [`Autotuner::workspace_limit`]                  |
//! | in-memory benchmark cache (per process)  | cache keyed by problem, GPU and cuDNN version, persisted with [`Autotuner::cache_file`] or `CUDNN_SAFE_AUTOTUNE_CACHE` |
//!
//! Under the benchmark policies every convolution call — forward, backward data (the transposed
//! convolution's pass included), backward filter and the fused forward with bias and
//! activation — also searches the backend (graph) engines ([`Autotuner::graph_search`], on by
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
//! use cudnn_safe::{conv::ConvDesc, cuda_context, Autotuner, Cudnn, FilterDesc, Policy,
//!                  TensorDesc, TensorFormat};
//! # fn main() -> cudnn_safe::Result<()> {
//! let ctx = cuda_context(0)?;
//! let stream = ctx.default_stream();
//! let cudnn = Cudnn::new(stream.clone())?;
//! let mut tuner = Autotuner::new(Policy::Benchmark)
//!     .workspace_limit(256 << 20)
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
use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::conv::{
    AlgoPerf, ConvAlgorithm, ConvBwdDataAlgo, ConvBwdFilterAlgo, ConvDesc, ConvDirection,
    ConvFwdAlgo, ConvMode, FusedActivation, MathType,
};
use crate::dtype::{DType, DataType, Scalar};
use crate::error::{Error, Result};
use crate::graph::union::{self as gunion, ConvGraph, Ids};
use crate::graph::{Args, ConvApi, EngineConfig, GraphSearch, Plan};
use crate::handle::Cudnn;
use crate::tensor::{FilterDesc, Layout, TensorDesc, TensorFormat};
use crate::workspace::{Workspace, MAX_WORKSPACE_BYTES};
use cudarc::driver::CudaView;

/// A union search's finals take the graph plans and the legacy favourite within this factor of
/// the first pass's best (a clear winner needs no second look).
const RETIME_WITHIN: f32 = 1.25;

/// Most graph plans in a union search's finals by default (the fastest of the first pass; see
/// [`Autotuner::finalists`]).
pub const DEFAULT_FINALISTS: usize = 6;
/// Sweeps over the finalists, the second in reverse order; each finalist keeps the mean of its
/// sweeps, so that a slow drift of the clocks during the finals weighs on all of them alike.
const FINAL_SWEEPS: usize = 2;
/// Wall-clock milliseconds each finalist runs alone before it is timed in a sweep, by default
/// (at the power limit, a plan's sustained speed depends on its own power draw, which
/// interleaved short rounds cannot see; see [`Autotuner::final_solo_ms`]).
pub const DEFAULT_FINAL_SOLO_MS: f32 = 25.0;
/// Most wall-clock milliseconds [`Autotuner::final_solo_ms`] accepts (10 s).
const MAX_FINAL_SOLO_MS: f32 = 10_000.0;
/// Timed rounds per finalist and sweep (the median counts).
const FINAL_ROUNDS: usize = 5;
/// Least duration of one timed round in the finals, in ms.
const FINAL_TARGET_MS: f32 = 4.0;
/// Wall-clock milliseconds the leader runs back to back before the finals, so they time the
/// settled clocks of a busy GPU (the first pass runs in bursts between plan builds, at the
/// higher clocks of a GPU that was idle, where a long kernel runs faster than it will in a
/// busy program, and close candidates can swap places between the two states).
const FINAL_HEAT_MS: f32 = 200.0;
/// Least duration of each of the warm-up rounds before a union search's first pass, in ms.
const WARM_UP_MS: f32 = 2.0;

/// A finalist's time from its sweeps: their mean (`None` when no sweep timed it).
fn final_ms(sweeps: &[f32]) -> Option<f32> {
    (!sweeps.is_empty()).then(|| sweeps.iter().sum::<f32>() / sweeps.len() as f32)
}

/// Environment variable naming the autotune cache file used by [`Autotuner::new`].
pub const CACHE_ENV: &str = "CUDNN_SAFE_AUTOTUNE_CACHE";

const FILE_HEADER: &str = "# cudnn-safe autotune cache v1: device<TAB>problem key<TAB>algo:workspace_bytes:ms,...[<TAB>graph=<engine config>:workspace_bytes:ms]";

/// Graph plans a union search builds and times per source by default (heuristics A, B when
/// [`Autotuner::heuristics_b`] asks for it, the fallback list, every engine with its default
/// knobs). See [`Autotuner::graph_plans`].
pub const DEFAULT_GRAPH_PLANS: usize = 24;

/// Fastest graph plans of a union search's first pass whose knob neighbourhoods are searched by
/// default. See [`Autotuner::refine_knobs`].
pub const DEFAULT_REFINE_KNOBS: usize = 2;

/// Most neighbour configurations one union search tries while refining knobs.
const MAX_REFINE_CONFIGS: usize = 64;

/// How an [`Autotuner`] picks a convolution algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Policy {
    /// cuDNN's heuristic ranking (`cudnnGetConvolution*Algorithm_v7`): nothing is timed, the
    /// first call is cheap, the pick can be far from the fastest.
    #[default]
    Heuristic,
    /// Run and time every algorithm once per problem (`cudnnFindConvolution*AlgorithmEx`) and
    /// use the fastest that fits the workspace limit.
    Benchmark,
    /// As `Benchmark`, among the algorithms cuDNN flags deterministic (bitwise reproducible).
    Deterministic,
    /// Always the named algorithms; an error when cuDNN cannot run one for a case.
    Fixed(FixedAlgos),
}

impl Policy {
    fn code(self) -> i64 {
        match self {
            Policy::Heuristic => 0,
            Policy::Benchmark => 1,
            Policy::Deterministic => 2,
            Policy::Fixed(_) => 3,
        }
    }
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Heuristic => "heuristic",
            Policy::Benchmark => "benchmark",
            Policy::Deterministic => "deterministic",
            Policy::Fixed(_) => "fixed",
        }
    }
}

/// The algorithms [`Policy::Fixed`] uses, one per direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FixedAlgos {
    /// Forward algorithm.
    pub forward: ConvFwdAlgo,
    /// Backward-data algorithm.
    pub backward_data: ConvBwdDataAlgo,
    /// Backward-filter algorithm.
    pub backward_filter: ConvBwdFilterAlgo,
}

impl Default for FixedAlgos {
    /// Algorithms that support nearly every case and are deterministic.
    fn default() -> Self {
        FixedAlgos {
            forward: ConvFwdAlgo::ImplicitGemm,
            backward_data: ConvBwdDataAlgo::Algo1,
            backward_filter: ConvBwdFilterAlgo::Algo1,
        }
    }
}

/// One ranked candidate of a decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate<A> {
    /// The algorithm.
    pub algo: A,
    /// Workspace it asked for, in bytes.
    pub workspace: usize,
    /// Measured time in ms (benchmark policies), cuDNN's estimate or −1 otherwise.
    pub time_ms: f32,
}

/// Where a decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// This tuner's cache (made earlier in the process, or read from the cache file).
    Cache,
    /// cuDNN's heuristics, just now.
    Heuristic,
    /// A benchmark, just now.
    Benchmark,
    /// The policy's fixed algorithm.
    Fixed,
}

impl Source {
    /// Short name (`"cache"`, `"heuristic"`, `"benchmark"`, `"fixed"`).
    pub fn name(self) -> &'static str {
        match self {
            Source::Cache => "cache",
            Source::Heuristic => "heuristic",
            Source::Benchmark => "benchmark",
            Source::Fixed => "fixed",
        }
    }
}

/// What an [`Autotuner`] call ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice<A> {
    /// The legacy algorithm that ran; when a graph engine ran instead ([`Choice::api`] is
    /// [`ConvApi::Graph`]), the legacy algorithm ranked first for the problem (the one that runs
    /// whenever the graph path does not apply, e.g. with `beta ≠ 0`).
    pub algo: A,
    /// Where the ranking came from.
    pub source: Source,
    /// Its position in the ranking (0 unless earlier candidates could not run).
    pub rank: usize,
    /// Bytes of workspace the tuner holds after the call: at least what the algorithm used (the
    /// workspace only grows, so an earlier, larger request can make it bigger).
    pub workspace: usize,
    /// The API that ran: [`ConvApi::Legacy`] (`algo`), or [`ConvApi::Graph`] with the engine
    /// configuration of the graph plan a union search chose ([`Autotuner::graph_search`]).
    pub api: ConvApi,
}

impl<A: std::fmt::Display> Choice<A> {
    /// What ran, in words: `legacy IMPLICIT_PRECOMP_GEMM` or `graph eng12_k2=1`.
    pub fn describe(&self) -> String {
        match &self.api {
            ConvApi::Graph(c) => format!("graph {c}"),
            _ => format!("legacy {}", self.algo),
        }
    }
}

/// Counters of an [`Autotuner`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TunerStats {
    /// Decisions served from the cache.
    pub hits: u64,
    /// Decisions made (heuristic or benchmark).
    pub misses: u64,
    /// Benchmarks run (a union search of a problem whose legacy ranking was known counts too).
    pub benchmarks: u64,
    /// Times a later candidate ran because an earlier one could not (including a graph plan
    /// that could not run, replaced by the legacy ranking).
    pub fallbacks: u64,
    /// Graph plans rebuilt from a remembered engine configuration (a decision read from the cache
    /// file, or used on another handle) without timing anything.
    pub plan_builds: u64,
    /// Union searches run (graph plans built and timed against the legacy favourite).
    pub graph_searches: u64,
    /// Graph plans the union searches built (and timed), knob refinements included.
    pub graph_plans: u64,
    /// Wall time the union searches spent asking the heuristics and building plans (engines
    /// that compile at run time make this the larger part of a search).
    pub graph_build: Duration,
    /// Wall time of the union searches in all: graph built, plans built, every candidate timed.
    pub graph_search: Duration,
    /// Candidates the union searches' finals timed again (graph plans and legacy favourites;
    /// each counts once per search, whatever the number of sweeps). 0 when no search was
    /// contested or [`Autotuner::finalists`] is 0.
    pub finalists: u64,
}

/// What [`Autotuner::warm_up`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WarmUp {
    /// Decisions replayed: plans rebuilt and held, kernels loaded.
    pub replayed: usize,
    /// Of those, how many run a graph plan.
    pub graph: usize,
    /// Remembered decisions of this GPU and cuDNN version not replayed (another policy, limit or
    /// search mode, a fused bias-activation call, a data type the replay does not cover, or a
    /// replay that failed).
    pub skipped: usize,
    /// Wall time of the warm-up, the GPU work included.
    pub elapsed: Duration,
}

/// The convolution and the descriptors of `a`, the filter and `b` of a [`KeyProblem`].
type KeyDescs<T> = (ConvDesc, TensorDesc<T>, FilterDesc<T>, TensorDesc<T>);

/// A plain convolution problem read back from its key ([`problem_key`], [`with_search`]).
#[derive(Debug, Clone, PartialEq)]
struct KeyProblem {
    dir: ConvDirection,
    a_t: DType,
    b_t: DType,
    compute: DType,
    math: MathType,
    mode: ConvMode,
    groups: i64,
    spatial: usize,
    pads: Vec<i64>,
    strides: Vec<i64>,
    dilations: Vec<i64>,
    a_dims: Vec<i64>,
    a_strides: Vec<i64>,
    w_format: TensorFormat,
    w_dims: Vec<i64>,
    b_dims: Vec<i64>,
    b_strides: Vec<i64>,
}

impl KeyProblem {
    /// The convolution and the descriptors of `a`, the filter and `b`, in `T`.
    fn descriptors<T: DataType>(&self) -> Result<KeyDescs<T>> {
        let conv = ConvDesc::builder(self.spatial)
            .pads(&self.pads)
            .strides(&self.strides)
            .dilations(&self.dilations)
            .groups(self.groups)
            .mode(self.mode)
            .math(self.math)
            .compute(self.compute)
            .build::<T>()?;
        Ok((
            conv,
            TensorDesc::<T>::strided(&self.a_dims, &self.a_strides)?,
            FilterDesc::<T>::new(&self.w_dims, self.w_format)?,
            TensorDesc::<T>::strided(&self.b_dims, &self.b_strides)?,
        ))
    }

    /// The key these descriptors have under `policy`, `limit` and `search`.
    fn key<T: DataType>(
        &self,
        (conv, a, w, b): &KeyDescs<T>,
        policy: Policy,
        limit: usize,
        search: GraphSearch,
    ) -> Vec<i64> {
        let k = problem_key(
            self.dir,
            (a.layout(), T::DTYPE),
            w,
            (b.layout(), T::DTYPE),
            conv,
            policy,
            limit,
        );
        with_search(k, policy, search)
    }

    /// The problem of a plain forward, backward-data or backward-filter key; `None` for other
    /// keys (fused calls, unknown codes, a length that does not match the ranks).
    fn decode(k: &[i64]) -> Option<KeyProblem> {
        let dir = match *k.first()? {
            0 => ConvDirection::Forward,
            1 => ConvDirection::BackwardData,
            2 => ConvDirection::BackwardFilter,
            _ => return None,
        };
        let spatial = usize::try_from(*k.get(7)?)
            .ok()
            .filter(|s| (1..=6).contains(s))?;
        let rank = usize::try_from(*k.get(8)?)
            .ok()
            .filter(|&t| t == spatial + 2)?;
        // Header, three spatial lists, a's dims and strides, filter format and dims, b's dims
        // and strides, policy and limit; the search suffix is optional.
        let len = 9 + 3 * spatial + 5 * rank + 3;
        if k.len() != len && k.len() != len + 1 {
            return None;
        }
        let mut at = 9;
        let mut take = |n: usize| {
            let v = k[at..at + n].to_vec();
            at += n;
            v
        };
        let pads = take(spatial);
        let strides = take(spatial);
        let dilations = take(spatial);
        let a_dims = take(rank);
        let a_strides = take(rank);
        let w_format = format_from_code(take(1)[0])?;
        let w_dims = take(rank);
        let b_dims = take(rank);
        let b_strides = take(rank);
        Some(KeyProblem {
            dir,
            a_t: dtype_from_code(k[1])?,
            b_t: dtype_from_code(k[2])?,
            compute: dtype_from_code(k[3])?,
            math: MathType::from_raw(crate::sys::cudnnMathType_t(u32::try_from(k[4]).ok()?))?,
            mode: match k[5] {
                0 => ConvMode::CrossCorrelation,
                1 => ConvMode::Convolution,
                _ => return None,
            },
            groups: k[6],
            spatial,
            pads,
            strides,
            dilations,
            a_dims,
            a_strides,
            w_format,
            w_dims,
            b_dims,
            b_strides,
        })
    }
}

/// A cache key: the GPU and cuDNN version, and the problem as integers. Its hash is computed
/// once, so that the steady-state lookup of a held plan hashes 8 bytes, not the whole problem.
#[derive(Debug, Clone)]
struct Key {
    device: Arc<str>,
    problem: Vec<i64>,
    hash: u64,
}

impl Key {
    fn new(device: Arc<str>, problem: Vec<i64>) -> Key {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        device.hash(&mut h);
        problem.hash(&mut h);
        Key {
            hash: h.finish(),
            device,
            problem,
        }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.hash == other.hash && self.problem == other.problem && self.device == other.device
    }
}
impl Eq for Key {}
impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

type Ranking = Vec<(u32, usize, f32)>;

/// The graph engine a union search chose: what is persisted of it.
#[derive(Debug, Clone, PartialEq)]
struct GraphPick {
    config: Arc<EngineConfig>,
    workspace: usize,
    ms: f32,
}

/// A cached decision: the legacy ranking (never empty), and the graph engine that beat its first
/// candidate, if a union search found one. Shared (`Arc`) between the cache and the recent
/// calls, so that a repeated call copies nothing.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    ranking: Ranking,
    graph: Option<GraphPick>,
}

impl Entry {
    fn legacy(ranking: Ranking) -> Entry {
        Entry {
            ranking,
            graph: None,
        }
    }
    /// The first legacy candidate.
    fn first<A: ConvAlgorithm>(&self) -> Option<Candidate<A>> {
        let &(a, workspace, time_ms) = self.ranking.first()?;
        Some(Candidate {
            algo: A::from_raw_value(a)?,
            workspace,
            time_ms,
        })
    }
}

/// A decision for a call: the entry, where it came from, and its cache key (none under a fixed
/// policy).
struct Decided {
    entry: Arc<Entry>,
    source: Source,
    key: Option<Arc<Key>>,
}

/// A built plan of a graph decision, kept so that repeated calls build nothing: the plan caches
/// its variant pack, rebuilt only when a buffer address changes.
struct HeldPlan {
    plan: Plan,
    ids: Ids,
    config: Arc<EngineConfig>,
}

impl std::fmt::Debug for HeldPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.plan.fmt(f)
    }
}

/// A candidate a union search times: a graph plan with the ids its buffers bind to, or the
/// legacy favourite.
enum Trial<'p> {
    Plan(&'p Plan, Ids),
    Legacy,
}

/// Chooses convolution algorithms under a [`Policy`], remembers each decision, and runs the
/// convolution with fallback to the next candidate. Owns the workspace it launches with.
///
/// Not `Sync` (it mutates its cache on every miss); one per thread or behind a lock.
#[derive(Debug)]
pub struct Autotuner {
    policy: Policy,
    limit: usize,
    workspace: Option<Workspace>,
    graph: GraphSearch,
    graph_plans: usize,
    refine_knobs: usize,
    heuristics_b: bool,
    finalists: usize,
    final_solo_ms: f32,
    cache: HashMap<Key, Arc<Entry>>,
    /// Plans of graph decisions, built on the handle they last ran on.
    held: HashMap<Key, HeldPlan>,
    path: Option<PathBuf>,
    devices: Vec<(usize, usize, Arc<str>)>,
    /// Recently used problems by descriptor ids (never reused, descriptors immutable) → key and
    /// decision, so a repeated call builds and hashes no key. Cleared whenever a decision or the
    /// policy, limit or search mode changes.
    recent: std::collections::VecDeque<([u64; 8], Arc<Key>, Arc<Entry>)>,
    stats: TunerStats,
}

/// What [`Autotuner::prepare`] found for a call.
enum Prepared {
    /// `Policy::Fixed`: nothing to decide or cache.
    Fixed,
    /// A cached decision.
    Known(Arc<Key>, Arc<Entry>),
    /// Not decided yet.
    Unknown(Arc<Key>),
}

const RECENT_CAPACITY: usize = 16;

impl Autotuner {
    /// A tuner with `policy`, no workspace limit beyond [`MAX_WORKSPACE_BYTES`], the union search
    /// on ([`GraphSearch::Union`], 24 plans per heuristic mode), and the
    /// cache file named by `CUDNN_SAFE_AUTOTUNE_CACHE` when that is set (loaded now).
    pub fn new(policy: Policy) -> Self {
        let tuner = Autotuner {
            policy,
            limit: MAX_WORKSPACE_BYTES,
            workspace: None,
            graph: GraphSearch::default(),
            graph_plans: DEFAULT_GRAPH_PLANS,
            refine_knobs: DEFAULT_REFINE_KNOBS,
            heuristics_b: false,
            finalists: DEFAULT_FINALISTS,
            final_solo_ms: DEFAULT_FINAL_SOLO_MS,
            cache: HashMap::new(),
            held: HashMap::new(),
            path: None,
            devices: Vec::new(),
            recent: Default::default(),
            stats: TunerStats::default(),
        };
        match std::env::var_os(CACHE_ENV) {
            Some(p) if !p.is_empty() => tuner.cache_file(PathBuf::from(p)),
            _ => tuner,
        }
    }

    /// Persists decisions to `path` (read now if it exists; rewritten after each new decision).
    /// Unreadable lines are skipped with a warning; entries for other GPUs or cuDNN versions are
    /// kept in the file but never used here.
    ///
    /// A file that exists but cannot be read is logged and left alone: the tuner starts without
    /// its entries and [`save`](Self::save) reports the error ([`Error::Io`]) instead of
    /// overwriting it. [`try_cache_file`](Self::try_cache_file) returns that error at once.
    #[must_use]
    pub fn cache_file(self, path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        match load_file(&path) {
            Ok(loaded) => self.with_loaded(path, loaded),
            Err(e) => {
                log::warn!("autotune cache not read: {e}");
                self.with_loaded(path, HashMap::new())
            }
        }
    }

    /// [`cache_file`](Self::cache_file), returning [`Error::Io`] (with the path and the
    /// operating system's error) when the file exists but cannot be read: not a regular file,
    /// no permission, or larger than 64 MiB. A missing file is an empty cache.
    pub fn try_cache_file(self, path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let loaded = load_file(&path)?;
        Ok(self.with_loaded(path, loaded))
    }

    fn with_loaded(mut self, path: PathBuf, loaded: HashMap<Key, Entry>) -> Self {
        log::info!(
            "autotune cache {}: {} entries loaded",
            path.display(),
            loaded.len()
        );
        self.cache
            .extend(loaded.into_iter().map(|(k, v)| (k, Arc::new(v))));
        self.path = Some(path);
        self.recent.clear();
        self
    }

    /// Keeps decisions in memory only: forgets the cache file (including entries already read
    /// from it, e.g. through `CUDNN_SAFE_AUTOTUNE_CACHE`), so the tuner starts empty.
    #[must_use]
    pub fn without_cache_file(mut self) -> Self {
        if self.path.take().is_some() {
            self.cache.clear();
            self.held.clear();
            self.recent.clear();
        }
        self
    }

    /// Limits the workspace any chosen algorithm may use (PyTorch's workspace cap). Part of the
    /// cache key: a different limit can change the answer.
    #[must_use]
    pub fn workspace_limit(mut self, bytes: usize) -> Self {
        self.limit = bytes.min(MAX_WORKSPACE_BYTES);
        self.workspace = None;
        self.held.clear();
        self.recent.clear();
        self
    }

    /// Whether [`Policy::Benchmark`] and [`Policy::Deterministic`] also search the backend
    /// (graph) engines ([`GraphSearch::Union`] by default), for the convolution forward, backward
    /// data, backward filter and the fused forward with bias and activation.
    ///
    /// The union search runs after the legacy benchmark of a new problem: the problem is rebuilt
    /// as a graph (same dims, strides, data types, padding, strides, dilations, mode and compute
    /// type: `conv_fprop`, `conv_dgrad` or `conv_wgrad`, or `conv_fprop → bias → activation` for
    /// the fused call); up to [`Autotuner::graph_plans`] plans from each of heuristics A,
    /// heuristics B (with [`Autotuner::heuristics_b`]), the fallback list and the engine list
    /// (default knobs, no engine that compiles at run time) are built under a filter matching
    /// the legacy numerics (no tensor cores with [`MathType::Fma`](crate::conv::MathType::Fma),
    /// no input down-conversion unless
    /// `TensorOpAllowConversion`, no reduced-precision accumulation with an f32 compute type,
    /// deterministic engines only under [`Policy::Deterministic`], the workspace limit); each
    /// plan and the legacy favourite are timed alike with CUDA events (on the caller's output,
    /// or on scratch memory when `beta ≠ 0`): a warm-up, a probe, then the best of 3 rounds of
    /// as many back-to-back launches as last 0.3 ms (a plan whose probe is 1.5× slower than
    /// the best so far is not timed further); the knob neighbourhoods of the
    /// [`Autotuner::refine_knobs`] fastest plans are built and timed the same way. Then the
    /// finals: up to six plans within 25% of the fastest, and the legacy favourite when it is
    /// that close, are timed again after 200 ms of the leader, each running alone for 25 ms
    /// before five rounds of at least 4 ms (the median counts), in two sweeps of opposite order
    /// (the mean counts): at the power limit a plan's sustained speed depends on its own power
    /// draw, which short interleaved rounds cannot see. The finals lengthen a contested
    /// search's first call ([`Autotuner::finalists`] and [`Autotuner::final_solo_ms`] set
    /// their size). A faster graph plan is
    /// remembered in the decision
    /// (and in the cache file as its engine configuration) and runs for every later call with
    /// `alpha = 1, beta = 0` (the graph computes the plain result only; the fused call also
    /// needs no `z`). Other calls, and problems the graph cannot express (f64, int8, mixed
    /// input/output types, vectorized filters), use the legacy ranking. When no plan builds or
    /// runs, the legacy decision stands (logged). A problem no legacy algorithm can run within
    /// the limit stays [`Error::NoAlgorithm`]. [`Policy::Heuristic`] and [`Policy::Fixed`] are
    /// legacy only. The build cost shows in [`TunerStats`] and the `info` log.
    ///
    /// Part of the cache key under the benchmark policies; [`GraphSearch::Union`] shares its key
    /// with the decisions of earlier versions, which searched legacy algorithms only: those keep
    /// working (legacy only).
    #[must_use]
    pub fn graph_search(mut self, mode: GraphSearch) -> Self {
        self.graph = mode;
        self.recent.clear();
        self
    }

    /// Most graph plans a union search builds and times per source (at least 1; default
    /// 24): up to this many from heuristics A, then up to this many new ones from heuristics B
    /// (when [`Autotuner::heuristics_b`] asks for it), from the fallback list and from the
    /// engine list. Fewer make a first call cheaper (each
    /// plan is built, and engines that compile at run time take long to build) at the risk of
    /// missing the fastest engine. Not part of the cache key: decisions already made stand.
    #[must_use]
    pub fn graph_plans(mut self, per_mode: usize) -> Self {
        self.graph_plans = per_mode.max(1);
        self
    }

    /// How many of the fastest graph plans of a union search's first pass get their knob
    /// neighbourhood searched (default [`DEFAULT_REFINE_KNOBS`]; 0: none): every configuration
    /// that differs from the plan's in one knob
    /// ([`knob_neighbours`](crate::graph::OperationGraph::knob_neighbours)), at most 64 per
    /// search, is built and timed like the heuristics' proposals. Heuristics propose a few
    /// points of each engine's knob space; this tries the points next to the best of them
    /// (each costs a plan build and a timing). Not part of the cache key.
    #[must_use]
    pub fn refine_knobs(mut self, plans: usize) -> Self {
        self.refine_knobs = plans;
        self
    }

    /// Whether union searches also ask cuDNN's heuristics mode B (a neural-network ranking; off
    /// by default, as in PyTorch, which reads `TORCH_CUDNN_USE_HEURISTIC_MODE_B`). B can
    /// propose plans that A, the fallback list and the engine list do not (for the 5×5 layer
    /// of the benchmark set, the fastest ones). Off by default because cuDNN 9.14's
    /// mode-B query creates an internal cuDNN handle it never destroys (about 25 KB of device
    /// memory, once per process), which `compute-sanitizer --leak-check full` reports as three
    /// leaked allocations. Not part of the cache key.
    #[must_use]
    pub fn heuristics_b(mut self, yes: bool) -> Self {
        self.heuristics_b = yes;
        self
    }

    /// Whether union searches ask heuristics mode B ([`Autotuner::heuristics_b`]).
    pub fn uses_heuristics_b(&self) -> bool {
        self.heuristics_b
    }

    /// Most graph plans a union search's finals time again (default [`DEFAULT_FINALISTS`]):
    /// the fastest plans of the first pass within 25 % of the best, plus the legacy favourite
    /// when it is that close. The finals run only when the first pass left more than one
    /// candidate that close; each finalist costs two sweeps of [`Autotuner::final_solo_ms`]
    /// alone and five timed rounds of at least 4 ms (about 0.1 s per finalist by default).
    /// 0 skips the finals: the first pass decides, which makes a contested first call cheaper
    /// and, where the fastest plans lie within a few percent of each other, the pick less
    /// sure. [`TunerStats::finalists`] counts what the finals timed. Not part of the
    /// cache key.
    ///
    /// ```no_run
    /// use cudnn_safe::{Autotuner, Policy};
    /// // Many convolution shapes and a short job: let the first pass decide.
    /// let quick = Autotuner::new(Policy::Benchmark).finalists(0);
    /// // A long training run on few shapes: time more finalists, each alone for longer.
    /// let thorough = Autotuner::new(Policy::Benchmark).finalists(8).final_solo_ms(100.0);
    /// # let _ = (quick, thorough);
    /// ```
    #[must_use]
    pub fn finalists(mut self, plans: usize) -> Self {
        self.finalists = plans;
        self
    }

    /// Wall-clock milliseconds each finalist of a union search runs alone, back to back,
    /// before its timed rounds in each sweep (default [`DEFAULT_FINAL_SOLO_MS`]; a negative or
    /// NaN value counts as 0, more than 10 s as 10 s). At the GPU's power limit a plan's
    /// sustained speed depends on its own power draw, which shows only after it has run alone
    /// for a while; plans whose kernels are long (a few tenths of a millisecond) can keep
    /// changing places for longer than the default. Longer is not surer: where the best plans
    /// lie within the timing noise of each other, a longer time alone does not make the pick
    /// steadier. Each millisecond costs two per finalist. Not part of the cache key.
    #[must_use]
    pub fn final_solo_ms(mut self, ms: f32) -> Self {
        self.final_solo_ms = if ms > 0.0 {
            ms.min(MAX_FINAL_SOLO_MS)
        } else {
            0.0
        };
        self
    }

    /// How many plans' knob neighbourhoods a union search searches
    /// ([`Autotuner::refine_knobs`]).
    pub fn refine_knobs_count(&self) -> usize {
        self.refine_knobs
    }

    /// The graph search mode.
    pub fn graph_search_mode(&self) -> GraphSearch {
        self.graph
    }
    /// Most graph plans a union search builds per heuristic mode ([`Autotuner::graph_plans`]).
    pub fn graph_plans_per_mode(&self) -> usize {
        self.graph_plans
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }
    /// Changes the policy (decisions made under other policies stay cached under their key).
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
        self.recent.clear();
    }
    /// The workspace limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }
    /// The cache file, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
    /// Number of cached decisions (all devices).
    pub fn cached_decisions(&self) -> usize {
        self.cache.len()
    }
    /// Hit/miss/benchmark/fallback counters and the union searches' costs.
    pub fn stats(&self) -> TunerStats {
        self.stats
    }
    /// Replays every remembered convolution decision of this GPU and cuDNN version that this
    /// tuner's policy, workspace limit and search mode would look up (typically those read from
    /// the cache file), once, on scratch buffers of the problem's size: each graph decision's
    /// plan is rebuilt and held, and the kernels of every decision are loaded. Call it at
    /// start-up, after [`crate::graph::preload`]: the first real call of each problem then builds
    /// nothing and loads nothing. Without it, the first execution of a cached plan in a new
    /// process pays for CUDA's lazy loading of its kernel; after the warm-up it costs what the
    /// steady state does.
    ///
    /// Decisions of fused bias-activation calls and of data types the graph path does not cover
    /// (f64, int8) are left for their first call ([`WarmUp::skipped`]), as are those of other
    /// policies, limits and search modes. A replay that fails is logged and counted as skipped;
    /// the decision stays as it was. Replays count as cache hits in [`Autotuner::stats`].
    ///
    /// ```no_run
    /// # fn f(cudnn: &cudnn_safe::Cudnn) -> cudnn_safe::Result<()> {
    /// use cudnn_safe::{Autotuner, Policy};
    /// cudnn_safe::graph::preload(cudnn)?;
    /// let mut tuner = Autotuner::new(Policy::Benchmark).cache_file("/var/cache/app/conv.txt");
    /// let w = tuner.warm_up(cudnn)?;
    /// println!("{} decisions ready ({} graph plans) in {:?}", w.replayed, w.graph, w.elapsed);
    /// # Ok(()) }
    /// ```
    pub fn warm_up(&mut self, cudnn: &Cudnn) -> Result<WarmUp> {
        let started = Instant::now();
        let mut done = WarmUp::default();
        if let Policy::Fixed(_) = self.policy {
            return Ok(done);
        }
        let device = self.device(cudnn);
        let mut problems: Vec<Vec<i64>> = self
            .cache
            .keys()
            .filter(|k| k.device == device)
            .map(|k| k.problem.clone())
            .collect();
        problems.sort();
        for p in problems {
            match self.replay(cudnn, &p) {
                Ok(Some(graph)) => {
                    done.replayed += 1;
                    done.graph += usize::from(graph);
                }
                Ok(None) => done.skipped += 1,
                Err(e) => {
                    log::info!("autotune warm-up: a remembered decision was not replayed: {e}");
                    done.skipped += 1;
                }
            }
        }
        cudnn
            .stream()
            .synchronize()
            .map_err(|e| Error::driver("synchronizing after the autotune warm-up", e))?;
        done.elapsed = started.elapsed();
        log::info!(
            "autotune warm-up: {} decisions replayed ({} graph plans), {} skipped, {:.1} ms",
            done.replayed,
            done.graph,
            done.skipped,
            done.elapsed.as_secs_f64() * 1e3
        );
        Ok(done)
    }

    /// One decision of [`Autotuner::warm_up`]: `Some(ran a graph plan)`, or `None` when the key
    /// is not one this tuner replays.
    fn replay(&mut self, cudnn: &Cudnn, key: &[i64]) -> Result<Option<bool>> {
        let Some(p) = KeyProblem::decode(key) else {
            return Ok(None);
        };
        match (p.a_t, p.b_t) {
            (DType::F32, DType::F32) => self.replay_as::<f32>(cudnn, &p, key),
            (DType::F16, DType::F16) => self.replay_as::<half::f16>(cudnn, &p, key),
            (DType::BF16, DType::BF16) => self.replay_as::<half::bf16>(cudnn, &p, key),
            _ => Ok(None),
        }
    }

    fn replay_as<T: DataType>(
        &mut self,
        cudnn: &Cudnn,
        p: &KeyProblem,
        key: &[i64],
    ) -> Result<Option<bool>> {
        let descs = p.descriptors::<T>()?;
        // Only a problem whose key this tuner computes the same way is a cache hit.
        if p.key(&descs, self.policy, self.limit, self.graph) != key {
            return Ok(None);
        }
        let (conv, a_d, w_d, b_d) = descs;
        let (one, zero) = (T::Scalar::from_f64(1.0), T::Scalar::from_f64(0.0));
        let a = alloc::<T>(cudnn, a_d.span())?;
        let mut w = alloc::<T>(cudnn, w_d.span())?;
        let mut b = alloc::<T>(cudnn, b_d.span())?;
        let api = match p.dir {
            ConvDirection::Forward => {
                self.forward(cudnn, one, &a_d, &a, &w_d, &w, &conv, zero, &b_d, &mut b)?
                    .api
            }
            ConvDirection::BackwardData => {
                let mut dx = a;
                self.backward_data(cudnn, one, &w_d, &w, &b_d, &b, &conv, zero, &a_d, &mut dx)?
                    .api
            }
            ConvDirection::BackwardFilter => {
                self.backward_filter(cudnn, one, &a_d, &a, &b_d, &b, &conv, zero, &w_d, &mut w)?
                    .api
            }
        };
        Ok(Some(api.is_graph()))
    }

    /// Forgets every decision in memory (the file is left as it is).
    pub fn clear(&mut self) {
        self.cache.clear();
        self.held.clear();
        self.recent.clear();
    }
    /// Bytes of workspace currently held.
    pub fn workspace_bytes(&self) -> usize {
        self.workspace.as_ref().map_or(0, Workspace::capacity)
    }

    /// Writes every decision to the cache file (merging with entries another process wrote
    /// meanwhile), atomically: readers see the old file or the new one. Called automatically
    /// after each new decision when a file is set.
    ///
    /// Errors: [`Error::Io`] (the path and the operating system's error) when the file cannot
    /// be read for the merge or cannot be written; the file is then left as it was.
    pub fn save(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let mut all = load_file(path)?;
        for (k, v) in &self.cache {
            all.insert(k.clone(), (**v).clone());
        }
        let mut text = String::from(FILE_HEADER);
        text.push('\n');
        let mut lines: Vec<String> = all.iter().map(|(k, v)| format_line(k, v)).collect();
        lines.sort();
        for l in lines {
            let _ = writeln!(text, "{l}");
        }
        crate::persist::write_atomic(path, text.as_bytes())
    }

    fn device(&mut self, cudnn: &Cudnn) -> Arc<str> {
        let (ordinal, version) = (cudnn.context().ordinal(), cudnn.version());
        if let Some((_, _, d)) = self
            .devices
            .iter()
            .find(|(o, v, _)| *o == ordinal && *v == version)
        {
            return d.clone();
        }
        let ctx = cudnn.context();
        let name = ctx.name().unwrap_or_else(|_| format!("device{ordinal}"));
        let (major, minor) = ctx.compute_capability().unwrap_or((0, 0));
        let fp: Arc<str> = format!("{name}|sm{major}{minor}|cudnn{version}")
            .replace(['\t', '\n'], " ")
            .into();
        self.devices.push((ordinal, version, fp.clone()));
        fp
    }

    fn workspace(&mut self, cudnn: &Cudnn) -> &mut Workspace {
        let stale = self
            .workspace
            .as_ref()
            .map_or(true, |w| **w.stream().context() != **cudnn.context());
        if stale {
            self.workspace = None;
        }
        let limit = self.limit;
        self.workspace
            .get_or_insert_with(|| Workspace::new(cudnn.stream().clone()).with_limit(limit))
    }

    /// Finds the call's problem: by descriptor ids among recent calls (cheap), else by building
    /// its full key and looking it up in the cache. Under [`Policy::Fixed`] nothing is looked up.
    /// `ids` are a call kind and the ids of the descriptors the problem depends on.
    fn prepare(
        &mut self,
        cudnn: &Cudnn,
        ids: [u64; 6],
        problem: impl FnOnce(Policy, usize) -> Vec<i64>,
    ) -> Prepared {
        if let Policy::Fixed(_) = self.policy {
            return Prepared::Fixed;
        }
        let ids = [
            ids[0],
            ids[1],
            ids[2],
            ids[3],
            ids[4],
            ids[5],
            cudnn.context().ordinal() as u64,
            cudnn.version() as u64,
        ];
        if let Some((_, key, entry)) = self.recent.iter().find(|(i, _, _)| *i == ids) {
            return Prepared::Known(key.clone(), entry.clone());
        }
        let p = problem(self.policy, self.limit);
        let key = Arc::new(Key::new(self.device(cudnn), p));
        match self.cache.get(&*key) {
            Some(r) => {
                let r = r.clone();
                if self.recent.len() == RECENT_CAPACITY {
                    self.recent.pop_back();
                }
                self.recent.push_front((ids, key.clone(), r.clone()));
                Prepared::Known(key, r)
            }
            None => Prepared::Unknown(key),
        }
    }

    /// [`Autotuner::prepare`] for a forward problem (the plain call, or the legacy decision of the
    /// fused one).
    fn prepare_forward<X: DataType, Y: DataType>(
        &mut self,
        cudnn: &Cudnn,
        x_desc: &TensorDesc<X>,
        w_desc: &FilterDesc<X>,
        conv: &ConvDesc,
        y_desc: &TensorDesc<Y>,
    ) -> Prepared {
        let gmode = self.graph;
        self.prepare(
            cudnn,
            [0, x_desc.id(), w_desc.id(), conv.id(), y_desc.id(), 0],
            |policy, limit| forward_key(x_desc, w_desc, conv, y_desc, policy, limit, gmode),
        )
    }

    /// The cached ranking for a forward problem under the current policy, if decided already.
    pub fn cached_forward<X: DataType, Y: DataType>(
        &mut self,
        cudnn: &Cudnn,
        x_desc: &TensorDesc<X>,
        w_desc: &FilterDesc<X>,
        conv: &ConvDesc,
        y_desc: &TensorDesc<Y>,
    ) -> Option<Vec<Candidate<ConvFwdAlgo>>> {
        let prepared = self.prepare_forward(cudnn, x_desc, w_desc, conv, y_desc);
        match prepared {
            Prepared::Known(_, r) => Some(decode(&r.ranking)),
            _ => None,
        }
    }

    /// The graph engine configuration remembered for a forward problem under the current policy
    /// and search mode, if a union search chose one (a later call with `alpha = 1, beta = 0`
    /// runs it).
    pub fn cached_forward_graph<X: DataType, Y: DataType>(
        &mut self,
        cudnn: &Cudnn,
        x_desc: &TensorDesc<X>,
        w_desc: &FilterDesc<X>,
        conv: &ConvDesc,
        y_desc: &TensorDesc<Y>,
    ) -> Option<Arc<EngineConfig>> {
        let prepared = self.prepare_forward(cudnn, x_desc, w_desc, conv, y_desc);
        match prepared {
            Prepared::Known(_, r) => r.graph.as_ref().map(|g| g.config.clone()),
            _ => None,
        }
    }

    /// Decides (or recalls) the ranking for a problem. `heuristics` and `find` are only called
    /// on a miss; `find` receives the tuner's workspace.
    fn decide<A: ConvAlgorithm>(
        &mut self,
        cudnn: &Cudnn,
        prepared: Prepared,
        heuristics: impl FnOnce() -> Result<Vec<AlgoPerf<A>>>,
        mut find: impl FnMut(&mut Workspace) -> Result<Vec<AlgoPerf<A>>>,
        fixed: A,
    ) -> Result<Decided> {
        let key = match prepared {
            Prepared::Fixed => {
                return Ok(Decided {
                    entry: Arc::new(Entry::legacy(vec![(fixed.raw_value(), 0, -1.0)])),
                    source: Source::Fixed,
                    key: None,
                });
            }
            Prepared::Known(key, entry) => {
                self.stats.hits += 1;
                return Ok(Decided {
                    entry,
                    source: Source::Cache,
                    key: Some(key),
                });
            }
            Prepared::Unknown(key) => key,
        };
        self.stats.misses += 1;
        let started = Instant::now();
        let limit = self.limit;
        let (perf, source) = match self.policy {
            Policy::Heuristic => (heuristics()?, Source::Heuristic),
            _ => {
                self.stats.benchmarks += 1;
                let ws = self.workspace(cudnn);
                // cuDNN times each algorithm once; the first launch of a kernel in a process
                // also pays for loading it (CUDA lazy module loading), which can misrank small
                // problems by 1.5x or more. So find runs twice and each algorithm keeps its
                // better time.
                let first = find(ws)?;
                let mut second = find(ws)?;
                for p in &mut second {
                    if let Some(q) = first
                        .iter()
                        .find(|q| q.algo == p.algo && q.math == p.math && q.is_supported())
                    {
                        if p.is_supported() && q.time_ms >= 0.0 && q.time_ms < p.time_ms {
                            p.time_ms = q.time_ms;
                        }
                    }
                }
                second.sort_by(|a, b| {
                    (!a.is_supported(), a.time_ms)
                        .partial_cmp(&(!b.is_supported(), b.time_ms))
                        .unwrap_or(std::cmp::Ordering::Equal)
                });
                (second, Source::Benchmark)
            }
        };
        let deterministic_only = self.policy == Policy::Deterministic;
        let mut refused = Vec::new();
        let ranking: Vec<Candidate<A>> = perf
            .iter()
            .filter(|p| {
                let ok = p.is_supported()
                    && p.workspace <= limit
                    && (!deterministic_only || p.deterministic);
                if !ok {
                    refused.push(format!(
                        "{} ({})",
                        p.algo,
                        if !p.is_supported() {
                            p.status.name().to_string()
                        } else if p.workspace > limit {
                            format!("needs {} bytes > limit {limit}", p.workspace)
                        } else {
                            "non-deterministic".to_string()
                        }
                    ));
                }
                ok
            })
            .map(|p| Candidate {
                algo: p.algo,
                workspace: p.workspace,
                time_ms: p.time_ms,
            })
            .collect();
        if ranking.is_empty() {
            return Err(Error::NoAlgorithm {
                op: direction_op(A::DIRECTION),
                detail: format!(
                    "policy {} with a workspace limit of {limit} bytes; refused: {}",
                    self.policy.name(),
                    refused.join(", ")
                ),
            });
        }
        log::info!(
            "conv {} autotune ({}, {:.1} ms): {} — {} ms, {} bytes of workspace; {} candidates{}",
            A::DIRECTION.name(),
            self.policy.name(),
            started.elapsed().as_secs_f64() * 1e3,
            ranking[0].algo,
            ranking[0].time_ms,
            ranking[0].workspace,
            ranking.len(),
            if refused.is_empty() {
                String::new()
            } else {
                format!("; refused {}", refused.join(", "))
            }
        );
        let entry = Arc::new(Entry::legacy(encode(&ranking)));
        self.cache.insert((*key).clone(), entry.clone());
        self.persist();
        Ok(Decided {
            entry,
            source,
            key: Some(key),
        })
    }

    /// Runs the legacy candidates in order until one succeeds. Errors from this crate's argument
    /// checks end the attempt at once (no algorithm can fix them); cuDNN refusals and workspace
    /// failures move on to the next candidate, and refused candidates leave the cached ranking.
    fn run<A: ConvAlgorithm>(
        &mut self,
        cudnn: &Cudnn,
        d: Decided,
        mut launch: impl FnMut(A, &mut Workspace) -> Result<()>,
    ) -> Result<Choice<A>> {
        let mut failures = Vec::new();
        let mut refused = Vec::new();
        for (rank, &(raw, _, _)) in d.entry.ranking.iter().enumerate() {
            let Some(algo) = A::from_raw_value(raw) else {
                continue;
            };
            let ws = self.workspace(cudnn);
            match launch(algo, ws) {
                Ok(()) => {
                    if rank > 0 {
                        self.stats.fallbacks += 1;
                        log::warn!(
                            "conv {}: fell back to {algo} (rank {rank}) after {}",
                            A::DIRECTION.name(),
                            failures.join("; ")
                        );
                    }
                    if let (Some(key), false) = (&d.key, refused.is_empty()) {
                        if let Some(r) = self.cache.get_mut(&**key) {
                            Arc::make_mut(r)
                                .ranking
                                .retain(|(a, _, _)| !refused.contains(a));
                        }
                        self.recent.clear();
                    }
                    let workspace = self.workspace_bytes();
                    return Ok(Choice {
                        algo,
                        source: d.source,
                        rank,
                        workspace,
                        api: ConvApi::Legacy,
                    });
                }
                Err(e) if falls_back(&e) => {
                    if matches!(e, Error::Cudnn { .. }) {
                        refused.push(raw);
                    }
                    failures.push(format!("{algo}: {e}"));
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::NoAlgorithm {
            op: direction_op(A::DIRECTION),
            detail: failures.join("; "),
        })
    }

    /// Whether the policy and search mode search graph engines.
    fn union_on(&self) -> bool {
        self.graph != GraphSearch::Off
            && matches!(self.policy, Policy::Benchmark | Policy::Deterministic)
    }

    /// Builds the graph, builds and times its plans and the legacy favourite (`trial`), and
    /// records a faster plan (any plan that runs, under [`GraphSearch::Prefer`]) in the decision
    /// under `key`, keeping the plan built. Never fails the call: when the graph side cannot
    /// build or run, the legacy decision stands (logged).
    #[allow(clippy::too_many_arguments)] // the parts of one search
    fn union_search(
        &mut self,
        cudnn: &Cudnn,
        key: &Arc<Key>,
        op: &'static str,
        legacy: (String, f32),
        conv: &ConvDesc,
        build: impl FnOnce() -> Result<ConvGraph>,
        mut trial: impl FnMut(Trial<'_>, &mut Workspace) -> Result<()>,
    ) -> Option<GraphPick> {
        let started = Instant::now();
        self.stats.graph_searches += 1;
        let found = self.union_time(cudnn, op, &legacy, conv, build, &mut trial);
        self.stats.graph_search += started.elapsed();
        let (pick, held) = match found {
            Ok(Some(found)) => found,
            Ok(None) => return None,
            Err(e) => {
                log::info!(
                    "conv {op} union search: graph side failed ({e}); legacy {} stands",
                    legacy.0
                );
                return None;
            }
        };
        self.held.insert((**key).clone(), held);
        if let Some(entry) = self.cache.get_mut(&**key) {
            Arc::make_mut(entry).graph = Some(pick.clone());
        }
        self.recent.clear();
        self.persist();
        Some(pick)
    }

    /// The measuring part of [`Autotuner::union_search`]: the winning plan, if a graph plan wins.
    fn union_time(
        &mut self,
        cudnn: &Cudnn,
        op: &'static str,
        (legacy_name, legacy_find_ms): &(String, f32),
        conv: &ConvDesc,
        build: impl FnOnce() -> Result<ConvGraph>,
        trial: &mut impl FnMut(Trial<'_>, &mut Workspace) -> Result<()>,
    ) -> Result<Option<(GraphPick, HeldPlan)>> {
        let started = Instant::now();
        let cg = build()?;
        let deterministic = self.policy == Policy::Deterministic;
        let (plans, skipped, build_time) = gunion::search_plans(
            cudnn,
            &cg.og,
            conv,
            deterministic,
            self.limit,
            self.graph_plans,
            self.heuristics_b,
        )?;
        let built = plans.len();
        self.stats.graph_plans += built as u64;
        self.stats.graph_build += build_time;
        let prefer = self.graph == GraphSearch::Prefer;
        let policy = self.policy;
        let (limit, refine) = (self.limit, self.refine_knobs);
        let (finalists, solo_ms) = (self.finalists, self.final_solo_ms);
        let ws = self.workspace(cudnn);
        // Plans far slower than the best so far are not timed precisely: they cannot win. The
        // legacy favourite is timed after the plans: building them leaves the GPU idle, and a
        // candidate timed first runs while the clocks ramp up again (on an H200 the legacy
        // algorithm timed first lost to graph plans that were 8 % slower in steady state).
        // A few milliseconds of the legacy call first bring the clocks back up for the plans.
        let _ = gunion::time_ms_for(cudnn, WARM_UP_MS, || trial(Trial::Legacy, ws));
        let mut bound: Option<f32> = None;
        let mut timed: Vec<(f32, Plan)> = Vec::new();
        let ids = cg.ids;
        // Times `plan` against the bound and keeps it when it ran; a plan that fails in a way
        // another candidate may not is skipped, any other error ends the search.
        let mut time_plan = |plan: Plan,
                             tag: &str,
                             bound: &mut Option<f32>,
                             timed: &mut Vec<(f32, Plan)>|
         -> Result<()> {
            match gunion::time_ms(cudnn, *bound, || trial(Trial::Plan(&plan, ids), ws)) {
                Ok(ms) => {
                    log::debug!("union search: graph {}{tag} {ms:.4} ms", plan.name());
                    *bound = Some(bound.map_or(ms, |b| b.min(ms)));
                    timed.push((ms, plan));
                    Ok(())
                }
                Err(e) if falls_back(&e) => {
                    log::debug!("union search: graph {}{tag} failed: {e}", plan.name());
                    Ok(())
                }
                Err(e) => Err(e),
            }
        };
        for plan in plans {
            time_plan(plan, "", &mut bound, &mut timed)?;
        }
        // Knob refinement: the neighbours of the fastest plans, timed against the same bound.
        let mut refined = 0;
        if refine > 0 && !timed.is_empty() {
            timed.sort_by(|a, b| a.0.total_cmp(&b.0));
            let seeds: Vec<EngineConfig> = timed
                .iter()
                .take(refine)
                .map(|(_, p)| p.config().clone())
                .collect();
            let mut seen: std::collections::HashSet<EngineConfig> =
                timed.iter().map(|(_, p)| p.config().clone()).collect();
            let refuse = gunion::filter(conv, deterministic, limit, &[], 1);
            let mut tried = 0;
            'seeds: for seed in seeds {
                let neighbours = match cg.og.knob_neighbours(cudnn, &seed) {
                    Ok(n) => n,
                    Err(e) => {
                        log::debug!("union search: no knob neighbours of {seed}: {e}");
                        continue;
                    }
                };
                for config in neighbours {
                    if tried >= MAX_REFINE_CONFIGS {
                        break 'seeds;
                    }
                    if !seen.insert(config.clone()) {
                        continue;
                    }
                    tried += 1;
                    // Most neighbours the engine does not support for this graph: not logged.
                    let Ok(plan) = cg.og.plan_from_config(cudnn, &config) else {
                        continue;
                    };
                    if refuse
                        .refuse(plan.numerical_notes(), plan.behavior_notes())
                        .is_some()
                        || plan.workspace_size() > limit
                    {
                        continue;
                    }
                    refined += 1;
                    time_plan(plan, " (knobs)", &mut bound, &mut timed)?;
                }
            }
        }
        let built = built + refined;
        if timed.is_empty() {
            log::info!(
                "conv {op} union search: no graph plan ran ({built} built in {:.1} ms, {skipped} skipped); legacy {legacy_name} stands",
                build_time.as_secs_f64() * 1e3
            );
            return Ok(None);
        }
        let mut legacy_ms = match gunion::time_ms(cudnn, None, || trial(Trial::Legacy, ws)) {
            Ok(ms) => ms,
            Err(e) => {
                log::debug!("union search: legacy {legacy_name} not timed: {e}");
                *legacy_find_ms
            }
        };
        timed.sort_by(|a, b| a.0.total_cmp(&b.0));
        timed.truncate(finalists.max(1));
        // Finals: the first pass timed each candidate once, apart from the others, in short
        // bursts (a clock change in between can tip a close call: a 0.17 ms fp16 convolution
        // was seen picked 10 % slower than the legacy algorithm it beat in that pass). The graph
        // plans within `RETIME_WITHIN` of the best, and the legacy favourite when it is that
        // close, run again after `FINAL_HEAT_MS` of the leader (settled clocks): each alone for
        // `final_solo_ms`, then timed (its sustained speed), in `FINAL_SWEEPS` sweeps of
        // alternating order; each keeps the mean of its sweeps. At most `finalists` graph plans;
        // none (the first pass decides) with 0.
        let leader = timed[0].0;
        let close =
            |ms: f32| ms > 0.0 && ms < leader * RETIME_WITHIN && ms * RETIME_WITHIN > leader;
        let legacy_in = !prefer && close(legacy_ms);
        timed.retain(|(ms, _)| close(*ms) || *ms == leader);
        let mut finals_timed = 0;
        if finalists > 0 && (timed.len() > 1 || legacy_in) {
            finals_timed = timed.len() + usize::from(legacy_in);
            let (leader_plan, leader_ms) = (&timed[0].1, timed[0].0);
            let _ = gunion::heat(cudnn, FINAL_HEAT_MS, leader_ms, || {
                trial(Trial::Plan(leader_plan, ids), ws)
            });
            // Entry 0 is the legacy favourite (timed only when it is in the finals).
            let entries = timed.len() + 1;
            let mut sweeps: Vec<Vec<f32>> = vec![Vec::new(); entries];
            for sweep in 0..FINAL_SWEEPS {
                for i in 0..entries {
                    let k = if sweep % 2 == 0 { i } else { entries - 1 - i };
                    let ms = match k {
                        0 if !legacy_in => continue,
                        0 => gunion::sustained_ms(
                            cudnn,
                            solo_ms,
                            FINAL_ROUNDS,
                            FINAL_TARGET_MS,
                            || trial(Trial::Legacy, ws),
                        ),
                        _ => {
                            let plan = &timed[k - 1].1;
                            gunion::sustained_ms(
                                cudnn,
                                solo_ms,
                                FINAL_ROUNDS,
                                FINAL_TARGET_MS,
                                || trial(Trial::Plan(plan, ids), ws),
                            )
                        }
                    };
                    match ms {
                        Ok(ms) if ms > 0.0 => sweeps[k].push(ms),
                        Ok(_) => {}
                        // The legacy favourite's first-pass time stands if it fails here.
                        Err(e) if k == 0 || falls_back(&e) => {
                            log::debug!("union search finals: candidate {k} failed: {e}");
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            if let Some(m) = final_ms(&sweeps[0]) {
                legacy_ms = m;
            }
            for ((ms, plan), times) in timed.iter_mut().zip(&sweeps[1..]) {
                if let Some(m) = final_ms(times) {
                    log::debug!("union search finals: graph {} {m:.4} ms", plan.name());
                    *ms = m;
                }
            }
            timed.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        self.stats.graph_plans += refined as u64;
        self.stats.finalists += finals_timed as u64;
        let (ms, plan) = timed.swap_remove(0);
        let wins = prefer || legacy_ms < 0.0 || ms < legacy_ms;
        log::info!(
            "conv {op} union search ({}, {:.1} ms; {built} plans built in {:.1} ms, {skipped} skipped): graph {} {ms:.4} ms vs legacy {legacy_name} {legacy_ms:.4} ms: {} wins",
            policy.name(),
            started.elapsed().as_secs_f64() * 1e3,
            build_time.as_secs_f64() * 1e3,
            plan.name(),
            if wins { "graph" } else { "legacy" },
        );
        if !wins {
            return Ok(None);
        }
        let config = Arc::new(plan.config().clone());
        let pick = GraphPick {
            config: config.clone(),
            workspace: plan.workspace_size(),
            ms,
        };
        Ok(Some((pick, HeldPlan { plan, ids, config })))
    }

    /// Makes sure a plan of the graph decision under `key` is held for `cudnn`'s handle,
    /// rebuilding it from the remembered engine configuration when needed (checked against the
    /// current filter: the cache file is trusted for the choice only). `false` when there is no
    /// such decision or it no longer builds (it is then dropped from the decision: the caller
    /// searches again).
    fn ensure_held(
        &mut self,
        cudnn: &Cudnn,
        key: &Arc<Key>,
        op: &'static str,
        conv: &ConvDesc,
        build: impl FnOnce() -> Result<ConvGraph>,
    ) -> bool {
        if self
            .held
            .get(&**key)
            .is_some_and(|h| gunion::built_on(&h.plan, cudnn))
        {
            return true;
        }
        let Some(pick) = self.cache.get(&**key).and_then(|e| e.graph.clone()) else {
            return false;
        };
        let deterministic = self.policy == Policy::Deterministic;
        let limit = self.limit;
        let rebuilt = (|| -> Result<HeldPlan> {
            let cg = build()?;
            let plan = cg.og.plan_from_config(cudnn, &pick.config)?;
            let filter = gunion::filter(conv, deterministic, limit, &[], 1);
            if let Some(why) = filter.refuse(plan.numerical_notes(), plan.behavior_notes()) {
                return Err(Error::invalid(
                    "remembered graph plan",
                    "a plan the policy's filter accepts",
                    format!("{}: {why}", pick.config),
                ));
            }
            if plan.workspace_size() > limit {
                return Err(Error::WorkspaceLimit {
                    requested: plan.workspace_size(),
                    limit,
                });
            }
            Ok(HeldPlan {
                plan,
                ids: cg.ids,
                config: pick.config.clone(),
            })
        })();
        match rebuilt {
            Ok(h) => {
                self.stats.plan_builds += 1;
                log::info!("conv {op}: graph plan {} rebuilt", h.config);
                self.held.insert((**key).clone(), h);
                true
            }
            Err(e) => {
                log::warn!("conv {op}: remembered graph plan not rebuilt ({e}); tuning again");
                self.drop_graph(key);
                false
            }
        }
    }

    /// Forgets the graph engine of the decision under `key` (the legacy ranking runs instead).
    fn drop_graph(&mut self, key: &Arc<Key>) {
        self.held.remove(&**key);
        if let Some(entry) = self.cache.get_mut(&**key) {
            if entry.graph.is_some() {
                Arc::make_mut(entry).graph = None;
            }
        }
        self.recent.clear();
    }

    /// Runs the held plan of the decision under `key` through `exec` (which binds the caller's
    /// buffers and executes: every check of [`Cudnn::execute`] runs). Returns the configuration
    /// that ran, or `None` when the legacy ranking must run instead (no plan held, or cuDNN
    /// refused the plan: the graph choice is then dropped from the decision). Argument errors
    /// (short buffers, foreign contexts, ...) are returned: no algorithm can fix them.
    fn exec_held(
        &mut self,
        cudnn: &Cudnn,
        key: &Arc<Key>,
        op: &'static str,
        exec: impl FnOnce(&Plan, Ids, &mut Workspace) -> Result<()>,
    ) -> Result<Option<Arc<EngineConfig>>> {
        self.workspace(cudnn);
        let (Some(ws), Some(h)) = (self.workspace.as_mut(), self.held.get(&**key)) else {
            return Ok(None);
        };
        match exec(&h.plan, h.ids, ws) {
            Ok(()) => Ok(Some(h.config.clone())),
            Err(e) => {
                let config = h.config.clone();
                self.graph_failed(key, op, &config, e)
            }
        }
    }

    /// What a graph plan's failure to run means for the decision under `key`: `Ok(None)` when
    /// the legacy ranking must run this call instead, the error when no algorithm can fix it.
    ///
    /// A refusal of this call's buffers alone (a view not aligned to the graph's 16 bytes,
    /// [`is_graph_only_refusal`]) keeps the decision as it is, in memory and in the cache file:
    /// the next aligned call runs the graph engine again. A refusal of the plan itself (cuDNN
    /// errors, workspace) drops the graph engine from the decision.
    fn graph_failed(
        &mut self,
        key: &Arc<Key>,
        op: &'static str,
        config: &EngineConfig,
        e: Error,
    ) -> Result<Option<Arc<EngineConfig>>> {
        if is_graph_only_refusal(&e) {
            log::debug!("conv {op}: graph plan {config} not run for this call ({e}); legacy");
            self.stats.fallbacks += 1;
            return Ok(None);
        }
        if !falls_back(&e) {
            return Err(e);
        }
        log::warn!("conv {op}: graph plan {config} did not run ({e}); legacy ranking instead");
        self.stats.fallbacks += 1;
        self.drop_graph(key);
        self.persist();
        Ok(None)
    }

    /// Saves the cache file if there is one (a failure is logged: the decision stays in memory).
    fn persist(&self) {
        if self.path.is_some() {
            if let Err(e) = self.save() {
                log::warn!("autotune cache not saved: {e}");
            }
        }
    }

    /// The graph result of a call whose decision `d` may hold a graph engine: searches on a new
    /// benchmark decision (`search`), then, for a plain call (`plain`: `alpha = 1, beta = 0`, no
    /// residual), makes sure the plan is held (searching again when it no longer builds) and
    /// executes it on `out`. `Some(config)` when the graph ran.
    #[allow(clippy::too_many_arguments)] // the parts of one call
    fn graph_call<O>(
        &mut self,
        cudnn: &Cudnn,
        d: &Decided,
        plain: bool,
        op: &'static str,
        conv: &ConvDesc,
        out: &mut O,
        build: &dyn Fn() -> Result<ConvGraph>,
        mut search: impl FnMut(&mut Self, &mut O) -> Option<GraphPick>,
        exec: impl FnOnce(&Plan, Ids, &mut Workspace, &mut O) -> Result<()>,
    ) -> Result<Option<Arc<EngineConfig>>> {
        let Some(key) = &d.key else {
            return Ok(None);
        };
        let mut pick = d.entry.graph.is_some();
        if d.source == Source::Benchmark {
            pick = search(self, out).is_some();
        }
        if !(pick && plain) {
            return Ok(None);
        }
        if !self.ensure_held(cudnn, key, op, conv, build) {
            self.stats.benchmarks += 1;
            if search(self, out).is_none() {
                self.persist();
                return Ok(None);
            }
        }
        self.exec_held(cudnn, key, op, |plan, ids, ws| exec(plan, ids, ws, out))
    }

    /// [`Autotuner::prepare`] for a backward problem; `x_desc` describes the convolution's input
    /// (dx for backward data).
    fn prepare_backward<T: DataType>(
        &mut self,
        cudnn: &Cudnn,
        direction: ConvDirection,
        x_desc: &TensorDesc<T>,
        w_desc: &FilterDesc<T>,
        dy_desc: &TensorDesc<T>,
        conv: &ConvDesc,
    ) -> Prepared {
        let kind = match direction {
            ConvDirection::Forward => 0,
            ConvDirection::BackwardData => 1,
            ConvDirection::BackwardFilter => 2,
        };
        let gmode = self.graph;
        self.prepare(
            cudnn,
            [kind, x_desc.id(), w_desc.id(), conv.id(), dy_desc.id(), 0],
            |policy, limit| {
                let k = problem_key(
                    direction,
                    (x_desc.layout(), T::DTYPE),
                    w_desc,
                    (dy_desc.layout(), T::DTYPE),
                    conv,
                    policy,
                    limit,
                );
                with_search(k, policy, gmode)
            },
        )
    }

    /// The body of [`forward`](Self::forward), [`backward_data`](Self::backward_data) and
    /// [`backward_filter`](Self::backward_filter): decides (a benchmark runs on scratch memory
    /// when `beta ≠ 0`), searches and runs the graph engines where the union search applies,
    /// else runs the legacy ranking.
    fn tune<C: ConvCall>(
        &mut self,
        cudnn: &Cudnn,
        call: &C,
        prepared: Prepared,
        fixed: C::Algo,
        (alpha, beta): (C::Scalar, C::Scalar),
        out: &mut impl DeviceBufferMut<C::Out>,
    ) -> Result<Choice<C::Algo>> {
        let accumulate = beta.to_f64() != 0.0;
        let d = self.decide(
            cudnn,
            prepared,
            || call.heuristics(),
            |ws| {
                if accumulate {
                    let mut scratch = alloc::<C::Out>(cudnn, call.out_len())?;
                    call.find(&mut scratch, ws)
                } else {
                    call.find(out, ws)
                }
            },
            fixed,
        )?;
        let best = d.entry.first::<C::Algo>();
        if let (true, Some(best)) = (self.union_on() && call.eligible(), best) {
            let plain = alpha.to_f64() == 1.0 && !accumulate;
            let conv = call.conv();
            let build = || call.graph();
            let key = d.key.clone();
            let ran = self.graph_call(
                cudnn,
                &d,
                plain,
                C::OP,
                conv,
                out,
                &build,
                |me, out| {
                    let key = key.as_ref()?;
                    let legacy = (best.algo.to_string(), best.time_ms);
                    if accumulate {
                        let mut s = scratch::<C::Out>(cudnn, call.out_len())?;
                        let t = trial(call, best.algo, &mut s);
                        me.union_search(cudnn, key, C::OP, legacy, conv, build, t)
                    } else {
                        let t = trial(call, best.algo, out);
                        me.union_search(cudnn, key, C::OP, legacy, conv, build, t)
                    }
                },
                |plan, ids, ws, out| call.exec(plan, ids, ws, out),
            )?;
            if let Some(config) = ran {
                return Ok(self.graph_choice(best.algo, d.source, config));
            }
        }
        self.run(cudnn, d, |algo, ws| {
            call.launch(algo, (alpha, beta), ws, out)
        })
    }

    /// What a call that ran the graph plan `config` reports: `algo` is the legacy favourite of
    /// the decision from `source`.
    fn graph_choice<A>(&self, algo: A, source: Source, config: Arc<EngineConfig>) -> Choice<A> {
        Choice {
            algo,
            source,
            rank: 0,
            workspace: self.workspace_bytes(),
            api: ConvApi::Graph(config),
        }
    }

    /// `y = alpha·conv(x, w) + beta·y` with the algorithm the policy picks (see
    /// [`Cudnn::conv_forward`] for the types and checks). With `beta ≠ 0` a benchmark runs on
    /// scratch memory, so `y`'s contents are preserved for the accumulation.
    ///
    /// Under [`Policy::Benchmark`] and [`Policy::Deterministic`] the graph engines are searched
    /// too ([`Autotuner::graph_search`]); [`Choice::api`] says which API ran. A graph plan runs
    /// only for `alpha = 1, beta = 0`, after the same checks as the legacy call (buffer spans,
    /// data types, contexts, output layout not overlapping itself, workspace within the limit)
    /// and the graph's 16-byte alignment of every buffer (a misaligned view runs the legacy
    /// call).
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn forward<X: DataType, Y: DataType<Scalar = X::Scalar>>(
        &mut self,
        cudnn: &Cudnn,
        alpha: X::Scalar,
        x_desc: &TensorDesc<X>,
        x: &impl DeviceBuffer<X>,
        w_desc: &FilterDesc<X>,
        w: &impl DeviceBuffer<X>,
        conv: &ConvDesc,
        beta: X::Scalar,
        y_desc: &TensorDesc<Y>,
        y: &mut impl DeviceBufferMut<Y>,
    ) -> Result<Choice<ConvFwdAlgo>> {
        let fixed = match self.policy {
            Policy::Fixed(f) => f.forward,
            _ => ConvFwdAlgo::ImplicitGemm,
        };
        let prepared = self.prepare_forward(cudnn, x_desc, w_desc, conv, y_desc);
        let call = Fwd(cudnn, x_desc, x, w_desc, w, conv, y_desc);
        self.tune(cudnn, &call, prepared, fixed, (alpha, beta), y)
    }

    /// The fused `y = act(alpha1·conv(x, w) + alpha2·z + bias)` (see
    /// [`Cudnn::conv_bias_activation_forward`]) with the forward algorithm the policy picks for
    /// this convolution (the same legacy decision [`forward`](Self::forward) makes and caches).
    /// [`FusedActivation::Identity`] always runs `IMPLICIT_PRECOMP_GEMM` on the legacy path, the
    /// only algorithm cuDNN supports for it.
    ///
    /// Under the benchmark policies with the union search on, the fused operation is also
    /// searched as a graph, `conv_fprop → bias (pointwise add) → ReLU` (no ReLU for the identity
    /// activation), against the legacy fused call timed alike; the winner is remembered under its
    /// own key (convolution, bias descriptor and activation). The graph runs for calls with
    /// `alpha1 = 1` and no `z` (a residual takes the legacy call), with the bias of the output's
    /// type.
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn bias_activation_forward<X: DataType, Y: DataType<Scalar = X::Scalar>, B: DataType>(
        &mut self,
        cudnn: &Cudnn,
        alpha1: X::Scalar,
        x_desc: &TensorDesc<X>,
        x: &impl DeviceBuffer<X>,
        w_desc: &FilterDesc<X>,
        w: &impl DeviceBuffer<X>,
        conv: &ConvDesc,
        alpha2: X::Scalar,
        z: Option<CudaView<'_, Y>>,
        bias_desc: &TensorDesc<B>,
        bias: &impl DeviceBuffer<B>,
        activation: FusedActivation,
        y_desc: &TensorDesc<Y>,
        y: &mut impl DeviceBufferMut<Y>,
    ) -> Result<Choice<ConvFwdAlgo>> {
        let d = if activation == FusedActivation::Identity {
            Decided {
                entry: Arc::new(Entry::legacy(vec![(
                    ConvFwdAlgo::ImplicitPrecompGemm.raw_value(),
                    0,
                    -1.0,
                )])),
                source: Source::Fixed,
                key: None,
            }
        } else {
            let fixed = match self.policy {
                Policy::Fixed(f) => f.forward,
                _ => ConvFwdAlgo::ImplicitGemm,
            };
            let prepared = self.prepare_forward(cudnn, x_desc, w_desc, conv, y_desc);
            // The fused output is written, never read (z is a separate buffer), so a benchmark
            // may use `y` itself as its trial output.
            self.decide(
                cudnn,
                prepared,
                || cudnn.conv_forward_heuristics(x_desc, w_desc, conv, y_desc),
                |ws| cudnn.conv_forward_find(x_desc, x, w_desc, w, conv, y_desc, y, ws),
                fixed,
            )?
        };
        let best = d.entry.first::<ConvFwdAlgo>();
        // The graph's pointwise add would broadcast any bias shape: only the legacy call's
        // `[1, K, 1, ...]` takes the graph path (others get the legacy call's error).
        let (bd, yd) = (bias_desc.dims(), y_desc.dims());
        let per_channel = bd.len() == yd.len()
            && bd
                .iter()
                .enumerate()
                .all(|(i, &d)| d == if i == 1 { yd[1] } else { 1 });
        let graph_ok = self.union_on()
            && per_channel
            && B::DTYPE == Y::DTYPE
            && gunion::eligible::<X, Y>(x_desc.dims(), w_desc, conv, y_desc.dims());
        if let (true, Some(best)) = (graph_ok, best) {
            const OP: &str = "fused forward";
            let act = gunion::fused_mode(activation);
            let gmode = self.graph;
            let prepared = self.prepare(
                cudnn,
                [
                    16 + activation as u64,
                    x_desc.id(),
                    w_desc.id(),
                    conv.id(),
                    y_desc.id(),
                    bias_desc.id(),
                ],
                |policy, limit| {
                    let mut k = forward_key(x_desc, w_desc, conv, y_desc, policy, limit, gmode);
                    // A call kind of its own: no plain forward key can equal a fused one.
                    k[0] = 16 + activation as i64;
                    k.push(dtype_code(B::DTYPE));
                    k.extend_from_slice(bias_desc.dims());
                    k.extend_from_slice(bias_desc.layout().strides());
                    k
                },
            );
            // The fused decision keeps the legacy ranking beside its graph engine; this second
            // key counts no hit, miss or benchmark (the call made one legacy decision; the
            // search counts in `graph_searches`), and the choice reports the legacy decision's
            // source.
            let fd = match prepared {
                Prepared::Known(key, entry) => Some(Decided {
                    entry,
                    source: Source::Cache,
                    key: Some(key),
                }),
                Prepared::Unknown(key) => {
                    let entry = Arc::new(Entry::legacy(d.entry.ranking.clone()));
                    self.cache.insert((*key).clone(), entry.clone());
                    Some(Decided {
                        entry,
                        source: Source::Benchmark,
                        key: Some(key),
                    })
                }
                Prepared::Fixed => None,
            };
            if let Some(fd) = fd {
                let plain = alpha1.to_f64() == 1.0 && z.is_none();
                let bias_t = (bias_desc.layout(), B::DTYPE, act);
                let build =
                    || gunion::fprop_graph(cudnn, x_desc, w_desc, conv, y_desc, Some(bias_t));
                let key = fd.key.clone();
                let ran = self.graph_call(
                    cudnn,
                    &fd,
                    plain,
                    OP,
                    conv,
                    y,
                    &build,
                    |me, y| {
                        let key = key.as_ref()?;
                        let legacy = (best.algo.to_string(), best.time_ms);
                        let one = X::Scalar::from_f64(1.0);
                        let zero = X::Scalar::from_f64(0.0);
                        me.union_search(
                            cudnn,
                            key,
                            OP,
                            legacy,
                            conv,
                            build,
                            |t: Trial<'_>, ws: &mut Workspace| match t {
                                Trial::Plan(plan, ids) => {
                                    exec_plan(cudnn, plan, ids, ws, (x, w, Some(bias)), &mut *y)
                                }
                                Trial::Legacy => cudnn.conv_bias_activation_forward(
                                    one, x_desc, x, w_desc, w, conv, best.algo, ws, zero, None,
                                    bias_desc, bias, activation, y_desc, &mut *y,
                                ),
                            },
                        )
                    },
                    |plan, ids, ws, y| exec_plan(cudnn, plan, ids, ws, (x, w, Some(bias)), y),
                )?;
                if let Some(config) = ran {
                    return Ok(self.graph_choice(best.algo, d.source, config));
                }
            }
        }
        self.run(cudnn, d, |algo, ws| {
            cudnn.conv_bias_activation_forward(
                alpha1,
                x_desc,
                x,
                w_desc,
                w,
                conv,
                algo,
                ws,
                alpha2,
                z.as_ref().map(|z| z.slice(..)),
                bias_desc,
                bias,
                activation,
                y_desc,
                y,
            )
        })
    }

    /// `dx = alpha·backward_data(dy, w) + beta·dx` with the algorithm the policy picks (see
    /// [`Cudnn::conv_backward_data`]). With `beta ≠ 0` a benchmark runs on scratch memory.
    ///
    /// Under the benchmark policies the graph engines (`conv_dgrad`) are searched too, as for
    /// [`forward`](Self::forward); a graph plan runs only for `alpha = 1, beta = 0`.
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn backward_data<T: DataType>(
        &mut self,
        cudnn: &Cudnn,
        alpha: T::Scalar,
        w_desc: &FilterDesc<T>,
        w: &impl DeviceBuffer<T>,
        dy_desc: &TensorDesc<T>,
        dy: &impl DeviceBuffer<T>,
        conv: &ConvDesc,
        beta: T::Scalar,
        dx_desc: &TensorDesc<T>,
        dx: &mut impl DeviceBufferMut<T>,
    ) -> Result<Choice<ConvBwdDataAlgo>> {
        let fixed = match self.policy {
            Policy::Fixed(f) => f.backward_data,
            _ => ConvBwdDataAlgo::Algo1,
        };
        let prepared = self.prepare_backward(
            cudnn,
            ConvDirection::BackwardData,
            dx_desc,
            w_desc,
            dy_desc,
            conv,
        );
        let call = Dgrad(cudnn, w_desc, w, dy_desc, dy, conv, dx_desc);
        self.tune(cudnn, &call, prepared, fixed, (alpha, beta), dx)
    }

    /// Transposed convolution `y = alpha·conv_transpose(x, w) + beta·y` (see
    /// [`Cudnn::conv_transpose`] for the shapes, every output padding PyTorch accepts) with the
    /// backward-data algorithm the policy picks.
    ///
    /// The decision is the one [`backward_data`](Self::backward_data) makes for the pass the
    /// transposed convolution runs (`dy` = `x`, `dx` = `y` or, when an output padding reaches
    /// the stride, the part of `y` backward data can address), cached and searched (graph
    /// engines included) exactly as that call's; a problem met through either method is decided
    /// once. Errors name the transposed convolution's arguments (`x`, `w`, `y`), and every check
    /// runs before anything is enqueued. When no element of `y` receives a term, `y = beta·y`
    /// and the choice is the policy's fixed backward-data algorithm, nothing decided.
    ///
    /// ```no_run
    /// use cudnn_safe::{conv::ConvDesc, cuda_context, Autotuner, Cudnn, FilterDesc, Policy,
    ///                  TensorDesc, TensorFormat};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let mut tuner = Autotuner::new(Policy::Benchmark);
    /// // Stride 1, dilation 2, output padding 1 (below the dilation, as PyTorch allows).
    /// let conv = ConvDesc::builder(2).pads(&[2, 2]).dilations(&[2, 2]).build::<f32>()?;
    /// let x_d = TensorDesc::<f32>::nchw(1, 8, 16, 16)?;
    /// let w_d = FilterDesc::<f32>::new(&[8, 4, 3, 3], TensorFormat::Nchw)?;
    /// let y_d = TensorDesc::<f32>::nchw_nd(
    ///     &conv.transpose_output_dims(x_d.dims(), w_d.dims(), &[1, 1])?,
    /// )?;
    /// assert_eq!(y_d.dims(), [1, 4, 17, 17]);
    /// let x = stream.clone_htod(&vec![1.0f32; x_d.span()]).unwrap();
    /// let w = stream.clone_htod(&vec![0.5f32; w_d.span()]).unwrap();
    /// let mut y = stream.alloc_zeros::<f32>(y_d.span()).unwrap();
    /// let choice = tuner.conv_transpose(&cudnn, 1.0, &x_d, &x, &w_d, &w, &conv, 0.0, &y_d,
    ///                                   &mut y)?;
    /// println!("ran {}", choice.describe());
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn conv_transpose<T: DataType>(
        &mut self,
        cudnn: &Cudnn,
        alpha: T::Scalar,
        x_desc: &TensorDesc<T>,
        x: &impl DeviceBuffer<T>,
        w_desc: &FilterDesc<T>,
        w: &impl DeviceBuffer<T>,
        conv: &ConvDesc,
        beta: T::Scalar,
        y_desc: &TensorDesc<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<Choice<ConvBwdDataAlgo>> {
        let plan = cudnn.transpose_plan(x_desc, x, w_desc, w, conv, y_desc, y)?;
        // Allocated before the first launch, so that a failure refuses the call with y
        // untouched.
        let mut mem = plan.memory(cudnn, beta)?;
        let choice = match (plan.backward(conv, y_desc), &mut mem.scratch) {
            (Some((bconv, dx)), Some(s)) => {
                let zero = T::Scalar::from_f64(0.0);
                self.backward_data(cudnn, alpha, w_desc, w, x_desc, x, bconv, zero, dx, s)?
            }
            (Some((bconv, dx)), None) => {
                self.backward_data(cudnn, alpha, w_desc, w, x_desc, x, bconv, beta, dx, y)?
            }
            (None, _) => Choice {
                algo: match self.policy {
                    Policy::Fixed(f) => f.backward_data,
                    _ => FixedAlgos::default().backward_data,
                },
                source: Source::Fixed,
                rank: 0,
                workspace: self.workspace_bytes(),
                api: ConvApi::Legacy,
            },
        };
        plan.finish(cudnn, &mem, beta, y)?;
        Ok(choice)
    }

    /// `dw = alpha·backward_filter(x, dy) + beta·dw` with the algorithm the policy picks (see
    /// [`Cudnn::conv_backward_filter`]). With `beta ≠ 0` (gradient accumulation) a benchmark
    /// runs on scratch memory, so the accumulated gradient is preserved.
    ///
    /// Under the benchmark policies the graph engines (`conv_wgrad`) are searched too, as for
    /// [`forward`](Self::forward); a graph plan runs only for `alpha = 1, beta = 0`.
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn backward_filter<T: DataType>(
        &mut self,
        cudnn: &Cudnn,
        alpha: T::Scalar,
        x_desc: &TensorDesc<T>,
        x: &impl DeviceBuffer<T>,
        dy_desc: &TensorDesc<T>,
        dy: &impl DeviceBuffer<T>,
        conv: &ConvDesc,
        beta: T::Scalar,
        dw_desc: &FilterDesc<T>,
        dw: &mut impl DeviceBufferMut<T>,
    ) -> Result<Choice<ConvBwdFilterAlgo>> {
        let fixed = match self.policy {
            Policy::Fixed(f) => f.backward_filter,
            _ => ConvBwdFilterAlgo::Algo1,
        };
        let prepared = self.prepare_backward(
            cudnn,
            ConvDirection::BackwardFilter,
            x_desc,
            dw_desc,
            dy_desc,
            conv,
        );
        let call = Wgrad(cudnn, x_desc, x, dy_desc, dy, conv, dw_desc);
        self.tune(cudnn, &call, prepared, fixed, (alpha, beta), dw)
    }
}

impl Drop for Autotuner {
    fn drop(&mut self) {
        // Decisions are saved as they are made; nothing can fail here.
        self.workspace = None;
    }
}

/// Scratch memory for a union search's trials when the caller's output must be kept; `None`
/// (logged: the legacy decision stands) when it cannot be allocated.
fn scratch<T: DataType>(cudnn: &Cudnn, len: usize) -> Option<cudarc::driver::CudaSlice<T>> {
    alloc::<T>(cudnn, len)
        .map_err(|e| log::info!("union search skipped: {e}"))
        .ok()
}

/// The bias of the union graphs that have none (a fused forward's graph binds its bias).
const NO_BIAS: Option<&cudarc::driver::CudaSlice<f32>> = None;

/// Runs a union graph's `plan` writing `out`, with `inputs` bound to its tensors (see [`Ids`]):
/// `a`, `b`, and the fused forward's bias when the graph has one (`ids.c`).
fn exec_plan<'a, TA: DataType, TB: DataType, TC: DataType, TO: DataType>(
    cudnn: &'a Cudnn,
    plan: &Plan,
    ids: Ids,
    ws: &mut Workspace,
    (a, b, bias): (
        &'a impl DeviceBuffer<TA>,
        &'a impl DeviceBuffer<TB>,
        Option<&'a impl DeviceBuffer<TC>>,
    ),
    out: &'a mut impl DeviceBufferMut<TO>,
) -> Result<()> {
    let mut args = Args::new(cudnn);
    args.input(ids.a, a)?.input(ids.b, b)?;
    if let (Some(c), Some(bias)) = (ids.c, bias) {
        args.input(c, bias)?;
    }
    args.output(ids.out, out)?;
    cudnn.execute(plan, &args, ws)
}

/// The trials of a union search writing `out`: a graph plan, or the legacy favourite `algo` with
/// `alpha = 1, beta = 0` as the graph computes.
fn trial<'a, C: ConvCall, O: DeviceBufferMut<C::Out>>(
    call: &'a C,
    algo: C::Algo,
    out: &'a mut O,
) -> impl FnMut(Trial<'_>, &mut Workspace) -> Result<()> + 'a {
    let (one, zero) = (C::Scalar::from_f64(1.0), C::Scalar::from_f64(0.0));
    move |t, ws| match t {
        Trial::Plan(plan, ids) => call.exec(plan, ids, ws, &mut *out),
        Trial::Legacy => call.launch(algo, (one, zero), ws, &mut *out),
    }
}

/// One direction of a convolution call (forward, backward data or backward filter) as
/// [`Autotuner::tune`] runs it: its descriptors and inputs, with every call that writes the output
/// generic over the buffer written (the caller's output, or scratch memory when the caller's
/// contents must be kept).
trait ConvCall {
    /// The direction's algorithms.
    type Algo: ConvAlgorithm;
    /// The output's element type.
    type Out: DataType;
    /// The type of alpha and beta.
    type Scalar: Scalar;
    /// The direction's name in logs.
    const OP: &'static str;
    /// The convolution.
    fn conv(&self) -> &ConvDesc;
    /// Elements of the output (the size of scratch memory standing in for it).
    fn out_len(&self) -> usize;
    /// cuDNN's heuristic ranking.
    fn heuristics(&self) -> Result<Vec<AlgoPerf<Self::Algo>>>;
    /// cuDNN's benchmark of every algorithm, writing `out`.
    fn find(
        &self,
        out: &mut impl DeviceBufferMut<Self::Out>,
        ws: &mut Workspace,
    ) -> Result<Vec<AlgoPerf<Self::Algo>>>;
    /// The legacy call with `algo` and `(alpha, beta)`, writing `out`.
    fn launch(
        &self,
        algo: Self::Algo,
        alpha_beta: (Self::Scalar, Self::Scalar),
        ws: &mut Workspace,
        out: &mut impl DeviceBufferMut<Self::Out>,
    ) -> Result<()>;
    /// Whether the graph path can express the problem ([`gunion::eligible`]).
    fn eligible(&self) -> bool;
    /// The problem as a graph.
    fn graph(&self) -> Result<ConvGraph>;
    /// Runs a plan of [`ConvCall::graph`] writing `out`.
    fn exec(
        &self,
        plan: &Plan,
        ids: Ids,
        ws: &mut Workspace,
        out: &mut impl DeviceBufferMut<Self::Out>,
    ) -> Result<()>;
}

/// `y = conv(x, w)`: the handle, x, w, the convolution and y's descriptor, as the call takes them.
struct Fwd<'a, X: DataType, Y: DataType, XB, WB>(
    &'a Cudnn,
    &'a TensorDesc<X>,
    &'a XB,
    &'a FilterDesc<X>,
    &'a WB,
    &'a ConvDesc,
    &'a TensorDesc<Y>,
);

impl<X: DataType, Y: DataType<Scalar = X::Scalar>, XB: DeviceBuffer<X>, WB: DeviceBuffer<X>>
    ConvCall for Fwd<'_, X, Y, XB, WB>
{
    type Algo = ConvFwdAlgo;
    type Out = Y;
    type Scalar = X::Scalar;
    const OP: &'static str = "forward";
    fn conv(&self) -> &ConvDesc {
        self.5
    }
    fn out_len(&self) -> usize {
        self.6.span()
    }
    fn heuristics(&self) -> Result<Vec<AlgoPerf<ConvFwdAlgo>>> {
        let Fwd(cudnn, x_desc, _, w_desc, _, conv, y_desc) = *self;
        cudnn.conv_forward_heuristics(x_desc, w_desc, conv, y_desc)
    }
    fn find(
        &self,
        y: &mut impl DeviceBufferMut<Y>,
        ws: &mut Workspace,
    ) -> Result<Vec<AlgoPerf<ConvFwdAlgo>>> {
        let Fwd(cudnn, x_desc, x, w_desc, w, conv, y_desc) = *self;
        cudnn.conv_forward_find(x_desc, x, w_desc, w, conv, y_desc, y, ws)
    }
    fn launch(
        &self,
        algo: ConvFwdAlgo,
        (alpha, beta): (X::Scalar, X::Scalar),
        ws: &mut Workspace,
        y: &mut impl DeviceBufferMut<Y>,
    ) -> Result<()> {
        let Fwd(cudnn, x_desc, x, w_desc, w, conv, y_desc) = *self;
        cudnn.conv_forward(alpha, x_desc, x, w_desc, w, conv, algo, ws, beta, y_desc, y)
    }
    fn eligible(&self) -> bool {
        let Fwd(_, x_desc, _, w_desc, _, conv, y_desc) = *self;
        gunion::eligible::<X, Y>(x_desc.dims(), w_desc, conv, y_desc.dims())
    }
    fn graph(&self) -> Result<ConvGraph> {
        let Fwd(cudnn, x_desc, _, w_desc, _, conv, y_desc) = *self;
        gunion::fprop_graph(cudnn, x_desc, w_desc, conv, y_desc, None)
    }
    fn exec(
        &self,
        plan: &Plan,
        ids: Ids,
        ws: &mut Workspace,
        y: &mut impl DeviceBufferMut<Y>,
    ) -> Result<()> {
        exec_plan(self.0, plan, ids, ws, (self.2, self.4, NO_BIAS), y)
    }
}

/// `dx = backward_data(dy, w)`: the handle, w, dy, the convolution and dx's descriptor, as the
/// call takes them.
struct Dgrad<'a, T: DataType, WB, DYB>(
    &'a Cudnn,
    &'a FilterDesc<T>,
    &'a WB,
    &'a TensorDesc<T>,
    &'a DYB,
    &'a ConvDesc,
    &'a TensorDesc<T>,
);

impl<T: DataType, WB: DeviceBuffer<T>, DYB: DeviceBuffer<T>> ConvCall for Dgrad<'_, T, WB, DYB> {
    type Algo = ConvBwdDataAlgo;
    type Out = T;
    type Scalar = T::Scalar;
    const OP: &'static str = "backward-data";
    fn conv(&self) -> &ConvDesc {
        self.5
    }
    fn out_len(&self) -> usize {
        self.6.span()
    }
    fn heuristics(&self) -> Result<Vec<AlgoPerf<ConvBwdDataAlgo>>> {
        let Dgrad(cudnn, w_desc, _, dy_desc, _, conv, dx_desc) = *self;
        cudnn.conv_backward_data_heuristics(w_desc, dy_desc, conv, dx_desc)
    }
    fn find(
        &self,
        dx: &mut impl DeviceBufferMut<T>,
        ws: &mut Workspace,
    ) -> Result<Vec<AlgoPerf<ConvBwdDataAlgo>>> {
        let Dgrad(cudnn, w_desc, w, dy_desc, dy, conv, dx_desc) = *self;
        cudnn.conv_backward_data_find(w_desc, w, dy_desc, dy, conv, dx_desc, dx, ws)
    }
    fn launch(
        &self,
        algo: ConvBwdDataAlgo,
        (alpha, beta): (T::Scalar, T::Scalar),
        ws: &mut Workspace,
        dx: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        let Dgrad(cudnn, w_desc, w, dy_desc, dy, conv, dx_desc) = *self;
        cudnn.conv_backward_data(
            alpha, w_desc, w, dy_desc, dy, conv, algo, ws, beta, dx_desc, dx,
        )
    }
    fn eligible(&self) -> bool {
        let Dgrad(_, w_desc, _, dy_desc, _, conv, dx_desc) = *self;
        gunion::eligible::<T, T>(dx_desc.dims(), w_desc, conv, dy_desc.dims())
    }
    fn graph(&self) -> Result<ConvGraph> {
        let Dgrad(cudnn, w_desc, _, dy_desc, _, conv, dx_desc) = *self;
        gunion::dgrad_graph(cudnn, w_desc, dy_desc, conv, dx_desc)
    }
    fn exec(
        &self,
        plan: &Plan,
        ids: Ids,
        ws: &mut Workspace,
        dx: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        exec_plan(self.0, plan, ids, ws, (self.4, self.2, NO_BIAS), dx)
    }
}

/// `dw = backward_filter(x, dy)`: the handle, x, dy, the convolution and dw's descriptor, as the
/// call takes them.
struct Wgrad<'a, T: DataType, XB, DYB>(
    &'a Cudnn,
    &'a TensorDesc<T>,
    &'a XB,
    &'a TensorDesc<T>,
    &'a DYB,
    &'a ConvDesc,
    &'a FilterDesc<T>,
);

impl<T: DataType, XB: DeviceBuffer<T>, DYB: DeviceBuffer<T>> ConvCall for Wgrad<'_, T, XB, DYB> {
    type Algo = ConvBwdFilterAlgo;
    type Out = T;
    type Scalar = T::Scalar;
    const OP: &'static str = "backward-filter";
    fn conv(&self) -> &ConvDesc {
        self.5
    }
    fn out_len(&self) -> usize {
        self.6.span()
    }
    fn heuristics(&self) -> Result<Vec<AlgoPerf<ConvBwdFilterAlgo>>> {
        let Wgrad(cudnn, x_desc, _, dy_desc, _, conv, dw_desc) = *self;
        cudnn.conv_backward_filter_heuristics(x_desc, dy_desc, conv, dw_desc)
    }
    fn find(
        &self,
        dw: &mut impl DeviceBufferMut<T>,
        ws: &mut Workspace,
    ) -> Result<Vec<AlgoPerf<ConvBwdFilterAlgo>>> {
        let Wgrad(cudnn, x_desc, x, dy_desc, dy, conv, dw_desc) = *self;
        cudnn.conv_backward_filter_find(x_desc, x, dy_desc, dy, conv, dw_desc, dw, ws)
    }
    fn launch(
        &self,
        algo: ConvBwdFilterAlgo,
        (alpha, beta): (T::Scalar, T::Scalar),
        ws: &mut Workspace,
        dw: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        let Wgrad(cudnn, x_desc, x, dy_desc, dy, conv, dw_desc) = *self;
        cudnn.conv_backward_filter(
            alpha, x_desc, x, dy_desc, dy, conv, algo, ws, beta, dw_desc, dw,
        )
    }
    fn eligible(&self) -> bool {
        let Wgrad(_, x_desc, _, dy_desc, _, conv, dw_desc) = *self;
        gunion::eligible::<T, T>(x_desc.dims(), dw_desc, conv, dy_desc.dims())
    }
    fn graph(&self) -> Result<ConvGraph> {
        let Wgrad(cudnn, x_desc, _, dy_desc, _, conv, dw_desc) = *self;
        gunion::wgrad_graph(cudnn, x_desc, dy_desc, conv, dw_desc)
    }
    fn exec(
        &self,
        plan: &Plan,
        ids: Ids,
        ws: &mut Workspace,
        dw: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        exec_plan(self.0, plan, ids, ws, (self.2, self.4, NO_BIAS), dw)
    }
}

/// A refusal specific to the graph path, after which the legacy call can still run: the
/// backend's 16-byte alignment of every buffer (legacy calls take element-aligned views).
fn is_graph_only_refusal(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument { what, .. } if *what == "graph buffer alignment")
}

/// A problem key with the graph search mode under the benchmark policies, unless it is the
/// default (so that union decisions share the keys of the legacy-only decisions earlier
/// versions wrote; a union key never ends in a negative value).
fn with_search(mut k: Vec<i64>, policy: Policy, graph: GraphSearch) -> Vec<i64> {
    if matches!(policy, Policy::Benchmark | Policy::Deterministic) {
        match graph {
            GraphSearch::Union => {}
            GraphSearch::Off => k.push(-1),
            GraphSearch::Prefer => k.push(-2),
        }
    }
    k
}

/// The key of a forward problem: [`problem_key`] with the search mode ([`with_search`]).
fn forward_key<X: DataType, Y: DataType>(
    x_desc: &TensorDesc<X>,
    w_desc: &FilterDesc<X>,
    conv: &ConvDesc,
    y_desc: &TensorDesc<Y>,
    policy: Policy,
    limit: usize,
    graph: GraphSearch,
) -> Vec<i64> {
    let k = problem_key(
        ConvDirection::Forward,
        (x_desc.layout(), X::DTYPE),
        w_desc,
        (y_desc.layout(), Y::DTYPE),
        conv,
        policy,
        limit,
    );
    with_search(k, policy, graph)
}

fn alloc<T: DataType>(cudnn: &Cudnn, len: usize) -> Result<cudarc::driver::CudaSlice<T>> {
    cudnn
        .stream()
        .alloc_zeros::<T>(len)
        .map_err(|e| Error::driver("allocating benchmark scratch memory", e))
}

/// Errors after which another algorithm may still succeed.
fn falls_back(e: &Error) -> bool {
    matches!(
        e,
        Error::Cudnn { .. }
            | Error::WorkspaceLimit { .. }
            | Error::WorkspaceTooSmall { .. }
            | Error::Driver { .. }
    )
}

fn direction_op(d: ConvDirection) -> &'static str {
    match d {
        ConvDirection::Forward => "convolution forward",
        ConvDirection::BackwardData => "convolution backward-data",
        ConvDirection::BackwardFilter => "convolution backward-filter",
    }
}

fn encode<A: ConvAlgorithm>(r: &[Candidate<A>]) -> Ranking {
    r.iter()
        .map(|c| (c.algo.raw_value(), c.workspace, c.time_ms))
        .collect()
}

fn decode<A: ConvAlgorithm>(r: &Ranking) -> Vec<Candidate<A>> {
    r.iter()
        .filter_map(|&(a, workspace, time_ms)| {
            Some(Candidate {
                algo: A::from_raw_value(a)?,
                workspace,
                time_ms,
            })
        })
        .collect()
}

fn dtype_code(d: DType) -> i64 {
    i64::from(d.raw().0)
}

/// The data types a warm-up replays, by [`dtype_code`].
fn dtype_from_code(c: i64) -> Option<DType> {
    [DType::F32, DType::F16, DType::BF16]
        .into_iter()
        .find(|&d| dtype_code(d) == c)
}

/// Inverse of [`format_code`] for filter formats.
fn format_from_code(c: i64) -> Option<TensorFormat> {
    match c {
        0 => Some(TensorFormat::Nchw),
        1 => Some(TensorFormat::Nhwc),
        101..=255 => Some(TensorFormat::NchwVectC {
            width: u8::try_from(c - 100).ok()?,
        }),
        _ => None,
    }
}

fn format_code(f: TensorFormat) -> i64 {
    match f {
        TensorFormat::Nchw => 0,
        TensorFormat::Nhwc => 1,
        TensorFormat::NchwVectC { width } => 100 + i64::from(width),
        TensorFormat::Strided => 2,
    }
}

/// Everything about a problem that can change the answer, as integers.
fn problem_key<T: DataType>(
    dir: ConvDirection,
    (a, a_t): (&Layout, DType),
    w: &FilterDesc<T>,
    (b, b_t): (&Layout, DType),
    conv: &ConvDesc,
    policy: Policy,
    limit: usize,
) -> Vec<i64> {
    let mut k = Vec::with_capacity(64);
    k.push(dir as i64);
    k.push(dtype_code(a_t));
    k.push(dtype_code(b_t));
    k.push(dtype_code(conv.compute()));
    k.push(i64::from(conv.math().raw().0));
    k.push(conv.mode() as i64);
    k.push(conv.groups());
    k.push(conv.spatial_rank() as i64);
    k.push(conv.tensor_rank() as i64);
    k.extend_from_slice(conv.pads());
    k.extend_from_slice(conv.strides());
    k.extend_from_slice(conv.dilations());
    k.extend_from_slice(a.dims());
    k.extend_from_slice(a.strides());
    k.push(format_code(w.format()));
    k.extend_from_slice(w.dims());
    k.extend_from_slice(b.dims());
    k.extend_from_slice(b.strides());
    k.push(policy.code());
    k.push(i64::try_from(limit).unwrap_or(i64::MAX));
    k
}

/// The entries of the cache file at `path` (none when it does not exist); unreadable lines are
/// skipped with a warning. [`Error::Io`] when the file exists but cannot be read.
fn load_file(path: &Path) -> Result<HashMap<Key, Entry>> {
    let mut map = HashMap::new();
    let Some(bytes) = crate::persist::read(path)? else {
        return Ok(map);
    };
    for (no, line) in crate::persist::lines(&bytes) {
        let parsed = match line {
            Some(l) if l.starts_with('#') || l.trim().is_empty() => continue,
            Some(l) => parse_line(l),
            None => None,
        };
        match parsed {
            Some((k, v)) => {
                map.insert(k, v);
            }
            None => log::warn!(
                "autotune cache {}:{no}: unreadable line skipped",
                path.display()
            ),
        }
    }
    Ok(map)
}

fn parse_line(line: &str) -> Option<(Key, Entry)> {
    let mut parts = line.split('\t');
    let device = parts.next()?;
    let problem = parts
        .next()?
        .split(',')
        .map(|s| s.parse::<i64>().ok())
        .collect::<Option<Vec<_>>>()?;
    let ranking = parts
        .next()?
        .split(',')
        .map(|c| {
            let mut f = c.split(':');
            let a = f.next()?.parse::<u32>().ok()?;
            let ws = f.next()?.parse::<usize>().ok()?;
            let ms = f.next()?.parse::<f32>().ok()?;
            Some((a, ws, ms))
        })
        .collect::<Option<Vec<_>>>()?;
    // Optional (files written before the union search have none): the graph engine chosen.
    let graph = match parts.next() {
        None => None,
        Some(g) => {
            let mut f = g.strip_prefix("graph=")?.rsplitn(3, ':');
            let ms = f.next()?.parse::<f32>().ok()?;
            let workspace = f.next()?.parse::<usize>().ok()?;
            let config = f.next()?.parse::<EngineConfig>().ok()?;
            Some(GraphPick {
                config: Arc::new(config),
                workspace,
                ms,
            })
        }
    };
    if parts.next().is_some() || device.is_empty() || problem.is_empty() || ranking.is_empty() {
        return None;
    }
    Some((Key::new(device.into(), problem), Entry { ranking, graph }))
}

/// One line of the cache file: what [`parse_line`] reads.
fn format_line(k: &Key, v: &Entry) -> String {
    let problem: Vec<String> = k.problem.iter().map(i64::to_string).collect();
    let ranking: Vec<String> = v
        .ranking
        .iter()
        .map(|(a, ws, ms)| format!("{a}:{ws}:{ms}"))
        .collect();
    let graph = v
        .graph
        .as_ref()
        .map(|g| format!("\tgraph={}:{}:{}", g.config, g.workspace, g.ms))
        .unwrap_or_default();
    format!(
        "{}\t{}\t{}{graph}",
        k.device,
        problem.join(","),
        ranking.join(",")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(device: &str, problem: Vec<i64>) -> Key {
        Key::new(device.into(), problem)
    }

    fn pick(config: &str, workspace: usize, ms: f32) -> GraphPick {
        GraphPick {
            config: Arc::new(config.parse().unwrap()),
            workspace,
            ms,
        }
    }

    #[test]
    fn finals_knobs_take_sane_values() {
        let t = Autotuner::new(Policy::Benchmark).without_cache_file();
        assert_eq!(
            (t.finalists, t.final_solo_ms),
            (DEFAULT_FINALISTS, DEFAULT_FINAL_SOLO_MS)
        );
        let t = t.finalists(0).final_solo_ms(100.0);
        assert_eq!((t.finalists, t.final_solo_ms), (0, 100.0));
        for (asked, kept) in [
            (-1.0, 0.0),
            (f32::NAN, 0.0),
            (f32::INFINITY, MAX_FINAL_SOLO_MS),
            (0.5, 0.5),
        ] {
            let t = Autotuner::new(Policy::Benchmark)
                .without_cache_file()
                .final_solo_ms(asked);
            assert_eq!(t.final_solo_ms, kept, "final_solo_ms({asked})");
        }
    }

    #[test]
    fn finals_keep_the_mean_of_their_sweeps() {
        // Two sweeps in opposite orders: a drift of the clocks weighs on every finalist alike.
        assert_eq!(final_ms(&[0.25, 0.75]), Some(0.5));
        assert_eq!(final_ms(&[0.5]), Some(0.5));
        assert_eq!(final_ms(&[]), None);
    }

    #[test]
    fn cache_lines_round_trip_and_bad_lines_are_skipped() {
        let dir = std::env::temp_dir().join(format!("cudnn-safe-tune-{}", std::process::id()));
        let path = dir.join("cache.txt");
        let _ = std::fs::remove_file(&path);
        let mut t = Autotuner::new(Policy::Benchmark)
            .without_cache_file()
            .cache_file(&path);
        assert_eq!(t.cached_decisions(), 0);
        let k = key("GPU X|sm90|cudnn91400", vec![0, 1, 2, -3]);
        t.cache.insert(
            k.clone(),
            Arc::new(Entry::legacy(vec![(7, 1024, 0.25), (1, 0, 0.5)])),
        );
        let graph_key = key("GPU X|sm90|cudnn91400", vec![0, 1, 2, -4]);
        let p = pick("eng12_k2=1_k5=0", 4096, 0.125);
        t.cache.insert(
            graph_key.clone(),
            Arc::new(Entry {
                ranking: vec![(1, 0, 0.5)],
                graph: Some(p.clone()),
            }),
        );
        t.save().unwrap();
        let mut text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("\tgraph=eng12_k2=1_k5=0:4096:0.125\n"),
            "{text}"
        );
        // A line as written before the union search (three fields) still reads; a bad graph
        // field makes the line unreadable.
        text.push_str("garbage line\nGPU\t1,x\t1:2:3\nGPU Y\t5,6\t1:0:0.5\n");
        text.push_str("GPU Z\t5,6\t1:0:0.5\tgraph=engX:1:1\n");
        std::fs::write(&path, text).unwrap();
        let t2 = Autotuner::new(Policy::Benchmark).cache_file(&path);
        assert_eq!(t2.cached_decisions(), 3);
        assert_eq!(
            *t2.cache[&k],
            Entry::legacy(vec![(7, 1024, 0.25), (1, 0, 0.5)])
        );
        assert_eq!(t2.cache[&graph_key].graph, Some(p));
        let old = key("GPU Y", vec![5, 6]);
        assert_eq!(*t2.cache[&old], Entry::legacy(vec![(1, 0, 0.5)]));
        let r: Vec<Candidate<ConvFwdAlgo>> = decode(&t2.cache[&k].ranking);
        assert_eq!(r[0].algo, ConvFwdAlgo::WinogradNonfused);
        assert_eq!(r[1].algo, ConvFwdAlgo::ImplicitPrecompGemm);
        let first: Option<Candidate<ConvFwdAlgo>> = t2.cache[&k].first();
        assert_eq!(first.map(|c| c.algo), Some(ConvFwdAlgo::WinogradNonfused));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn graph_picks_of_every_call_kind_round_trip() {
        // Backward-data (1), backward-filter (2) and fused (16, 17) decisions with graph engines,
        // under the union (no suffix) and prefer (-2) search modes: one line each, read back
        // equal.
        let dev = "GPU X|sm90|cudnn91400";
        let entries = [
            (
                key(dev, vec![1, 2, 2, 0, 8, 1]),
                Entry {
                    ranking: vec![(1, 0, 0.5), (0, 0, 0.75)],
                    graph: Some(pick("eng9_k3=2", 0, 0.0625)),
                },
            ),
            (
                key(dev, vec![2, 2, 2, 0, 8, 1, -2]),
                Entry {
                    ranking: vec![(1, 128, 0.5)],
                    graph: Some(pick("eng0", 1 << 20, 1.5)),
                },
            ),
            (
                key(dev, vec![16, 2, 2, 0, 8, 1, 2, 1, 4, 1, 1, 4, 1, 1, 1]),
                Entry {
                    ranking: vec![(1, 0, 0.5)],
                    graph: Some(pick("eng4_k1=0_k2=3_k11=-1", 64, 0.03125)),
                },
            ),
            (
                key(dev, vec![17, 2, 2, 0, 8, 1]),
                Entry::legacy(vec![(1, 0, -1.0)]),
            ),
        ];
        for (k, e) in &entries {
            let line = format_line(k, e);
            let (k2, e2) = parse_line(&line).unwrap_or_else(|| panic!("unreadable: {line}"));
            assert_eq!(&k2, k, "{line}");
            assert_eq!(k2.hash, k.hash, "{line}");
            assert_eq!(&e2, e, "{line}");
        }
    }

    #[test]
    fn keys_hash_once_and_compare_whole() {
        let a = key("GPU", vec![1, 2, 3]);
        let b = key("GPU", vec![1, 2, 3]);
        let c = key("GPU", vec![1, 2, 4]);
        let d = key("GPU 2", vec![1, 2, 3]);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
        let mut m = HashMap::new();
        m.insert(a.clone(), 1);
        assert_eq!(m.get(&b), Some(&1));
        assert_eq!(m.get(&c), None);
        // A key with a forged hash still compares its fields.
        let forged = Key {
            hash: a.hash,
            ..c.clone()
        };
        assert_ne!(forged, a);
    }

    #[test]
    fn search_modes_mark_keys_under_the_benchmark_policies_only() {
        let base = vec![0, 5];
        assert_eq!(
            with_search(base.clone(), Policy::Benchmark, GraphSearch::Union),
            base
        );
        assert_eq!(
            with_search(base.clone(), Policy::Deterministic, GraphSearch::Off),
            vec![0, 5, -1]
        );
        assert_eq!(
            with_search(base.clone(), Policy::Benchmark, GraphSearch::Prefer),
            vec![0, 5, -2]
        );
        assert_eq!(
            with_search(base.clone(), Policy::Heuristic, GraphSearch::Prefer),
            base
        );
    }

    #[test]
    fn graph_plan_cap_is_configurable() {
        let t = Autotuner::new(Policy::Benchmark).without_cache_file();
        assert_eq!(t.graph_plans_per_mode(), DEFAULT_GRAPH_PLANS);
        assert_eq!(DEFAULT_GRAPH_PLANS, 24);
        assert!(t.union_on());
        let t = t.graph_plans(4);
        assert_eq!(t.graph_plans_per_mode(), 4);
        assert_eq!(t.graph_plans(0).graph_plans_per_mode(), 1);
        let t = Autotuner::new(Policy::Benchmark).without_cache_file();
        assert_eq!(t.refine_knobs_count(), DEFAULT_REFINE_KNOBS);
        assert_eq!(t.refine_knobs(0).refine_knobs_count(), 0);
        let t = Autotuner::new(Policy::Benchmark).without_cache_file();
        assert!(!t.uses_heuristics_b());
        assert!(t.heuristics_b(true).uses_heuristics_b());
        let off = Autotuner::new(Policy::Benchmark)
            .without_cache_file()
            .graph_search(GraphSearch::Off);
        assert!(!off.union_on());
        let heuristic = Autotuner::new(Policy::Heuristic).without_cache_file();
        assert!(!heuristic.union_on());
        assert_eq!(heuristic.stats(), TunerStats::default());
    }

    /// Rebuilds the descriptors of a decoded key and computes the key again.
    fn rekey<T: DataType>(
        p: &KeyProblem,
        policy: Policy,
        limit: usize,
        g: GraphSearch,
    ) -> Vec<i64> {
        p.key(&p.descriptors::<T>().unwrap(), policy, limit, g)
    }

    #[test]
    fn warm_up_reads_problems_back_from_their_keys() {
        let Some(()) = crate::checks::lib_or_skip() else {
            return;
        };
        use half::f16;
        // A grouped, strided, dilated f16 NHWC problem with an odd layout for b.
        let conv = ConvDesc::builder(2)
            .pads(&[1, 2])
            .strides(&[2, 1])
            .dilations(&[1, 2])
            .groups(2)
            .mode(ConvMode::Convolution)
            .math(MathType::TensorOp)
            .build::<f16>()
            .unwrap();
        let x = TensorDesc::<f16>::nhwc(2, 8, 9, 10).unwrap();
        let w = FilterDesc::<f16>::new(&[16, 4, 3, 3], TensorFormat::Nhwc).unwrap();
        let y_dims = conv.output_dims(x.dims(), w.dims()).unwrap();
        let y = TensorDesc::<f16>::nchw_nd(&y_dims).unwrap();
        for dir in [
            ConvDirection::Forward,
            ConvDirection::BackwardData,
            ConvDirection::BackwardFilter,
        ] {
            for (policy, g) in [
                (Policy::Benchmark, GraphSearch::Union),
                (Policy::Benchmark, GraphSearch::Prefer),
                (Policy::Deterministic, GraphSearch::Off),
                (Policy::Heuristic, GraphSearch::Union),
            ] {
                let key = with_search(
                    problem_key(
                        dir,
                        (x.layout(), DType::F16),
                        &w,
                        (y.layout(), DType::F16),
                        &conv,
                        policy,
                        1 << 20,
                    ),
                    policy,
                    g,
                );
                let p = KeyProblem::decode(&key).unwrap_or_else(|| panic!("{dir:?}: {key:?}"));
                assert_eq!(p.dir, dir);
                assert_eq!(
                    (p.a_t, p.b_t, p.compute),
                    (DType::F16, DType::F16, DType::F32)
                );
                assert_eq!(
                    (p.math, p.mode, p.groups),
                    (MathType::TensorOp, ConvMode::Convolution, 2)
                );
                assert_eq!(
                    (p.pads.as_slice(), p.strides.as_slice()),
                    (&[1, 2][..], &[2, 1][..])
                );
                assert_eq!(p.a_strides, x.layout().strides());
                assert_eq!(p.w_format, TensorFormat::Nhwc);
                assert_eq!(p.b_dims, y_dims);
                assert_eq!(
                    rekey::<f16>(&p, policy, 1 << 20, g),
                    key,
                    "{dir:?} {policy:?} {g:?}"
                );
                // Another policy or limit computes another key: not replayed by that tuner.
                assert_ne!(rekey::<f16>(&p, policy, 1 << 21, g), key);
            }
        }
    }

    #[test]
    fn warm_up_leaves_keys_it_cannot_read() {
        // [dir, a, b, compute, math, mode, groups, spatial 1, rank 3, pad, stride, dilation,
        //  a dims ×3, a strides ×3, filter format, w dims ×3, b dims ×3, b strides ×3, policy, limit]
        let f32c = dtype_code(DType::F32);
        let good: Vec<i64> = vec![
            0, f32c, f32c, f32c, 0, 0, 1, 1, 3, 0, 1, 1, 1, 4, 8, 32, 8, 1, 0, 2, 4, 3, 1, 2, 8,
            16, 8, 1, 2, 0,
        ];
        let p = KeyProblem::decode(&good).expect("a plain forward key");
        assert_eq!((p.spatial, p.w_dims.as_slice()), (1, &[2, 4, 3][..]));
        assert_eq!(p.b_strides, [16, 8, 1]);
        let mut suffixed = good.clone();
        suffixed.push(-1);
        assert!(KeyProblem::decode(&suffixed).is_some());
        let mut fused = good.clone();
        fused[0] = 17;
        assert_eq!(
            KeyProblem::decode(&fused),
            None,
            "fused bias-activation keys"
        );
        assert_eq!(KeyProblem::decode(&good[..good.len() - 1]), None, "short");
        let mut long = suffixed.clone();
        long.push(0);
        assert_eq!(KeyProblem::decode(&long), None, "long");
        let mut rank = good.clone();
        rank[8] = 4;
        assert_eq!(KeyProblem::decode(&rank), None, "rank not spatial + 2");
        let mut dtype = good.clone();
        dtype[1] = dtype_code(DType::F64);
        assert_eq!(KeyProblem::decode(&dtype), None, "f64 is not replayed");
        let mut math = good.clone();
        math[4] = 9;
        assert_eq!(KeyProblem::decode(&math), None, "unknown math type");
        assert_eq!(KeyProblem::decode(&[]), None);
        assert_eq!(
            format_from_code(format_code(TensorFormat::NchwVectC { width: 32 })),
            Some(TensorFormat::NchwVectC { width: 32 })
        );
        assert_eq!(format_from_code(2), None, "filters are never strided");
    }

    /// A graph plan refused for one call's buffers (a view off the graph's 16-byte alignment)
    /// leaves the decision's graph engine in memory and in the cache file; a refusal of the plan
    /// itself drops it from both; an argument error leaves the decision and is returned.
    #[test]
    fn only_a_refused_plan_loses_its_graph_decision() {
        let dir =
            std::env::temp_dir().join(format!("cudnn-safe-tune-align-{}", std::process::id()));
        let path = dir.join("cache.txt");
        let _ = std::fs::remove_file(&path);
        let mut t = Autotuner::new(Policy::Benchmark)
            .without_cache_file()
            .cache_file(&path);
        let k = Arc::new(key("GPU X|sm90|cudnn91400", vec![0, 1, 2, 3]));
        let p = pick("eng12_k2=1_k5=0", 4096, 0.125);
        t.cache.insert(
            (*k).clone(),
            Arc::new(Entry {
                ranking: vec![(1, 0, 0.5)],
                graph: Some(p.clone()),
            }),
        );
        t.save().unwrap();
        let graph_in_file = || {
            let fresh = Autotuner::new(Policy::Benchmark)
                .without_cache_file()
                .cache_file(&path);
            fresh.cache.get(&*k).and_then(|e| e.graph.clone())
        };
        assert_eq!(graph_in_file(), Some(p.clone()));

        let misaligned = Error::invalid("graph buffer alignment", "16 bytes", "address 0x4");
        assert!(is_graph_only_refusal(&misaligned));
        let r = t.graph_failed(&k, "forward", &p.config, misaligned);
        assert!(matches!(r, Ok(None)), "{r:?}");
        assert_eq!(t.cache[&*k].graph, Some(p.clone()));
        assert_eq!(graph_in_file(), Some(p.clone()));
        assert_eq!(t.stats().fallbacks, 1);

        let short = Error::BufferTooSmall {
            name: "y",
            len: 1,
            required: 2,
        };
        let r = t.graph_failed(&k, "forward", &p.config, short);
        assert!(matches!(r, Err(Error::BufferTooSmall { .. })), "{r:?}");
        assert_eq!(t.cache[&*k].graph, Some(p.clone()));

        let refused = Error::Cudnn {
            status: crate::Status::NOT_SUPPORTED,
            function: "cudnnBackendExecute",
            message: String::new(),
        };
        let r = t.graph_failed(&k, "forward", &p.config, refused);
        assert!(matches!(r, Ok(None)), "{r:?}");
        assert_eq!(t.cache[&*k].graph, None);
        assert_eq!(t.cache[&*k].ranking, vec![(1, 0, 0.5)]);
        assert_eq!(graph_in_file(), None);
        assert_eq!(t.stats().fallbacks, 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tuner_is_send() {
        fn send<T: Send>() {}
        send::<Autotuner>();
        send::<Choice<ConvFwdAlgo>>();
    }

    #[test]
    fn policies_have_distinct_codes() {
        let all = [
            Policy::Heuristic,
            Policy::Benchmark,
            Policy::Deterministic,
            Policy::Fixed(FixedAlgos::default()),
        ];
        let codes: std::collections::HashSet<i64> = all.iter().map(|p| p.code()).collect();
        assert_eq!(codes.len(), all.len());
    }
}
