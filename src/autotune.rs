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
//! Under the benchmark policies a convolution forward also searches the backend (graph)
//! engines ([`Autotuner::graph_search`], on by default): legacy algorithms and graph plans are
//! timed alike and the faster runs; [`Choice::api`] says which API ran.
//!
//! A decision is made once per problem (direction, dims, strides, data types, convolution
//! parameters, math type, policy, workspace limit, GPU model and cuDNN version) and logged with
//! the `log` crate at `info` level. When the chosen algorithm cannot run (its workspace cannot
//! be allocated, or cuDNN refuses it), the next candidate is tried.
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
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{DevicePtr, DevicePtrMut};

use crate::conv::{
    AlgoPerf, ConvAlgorithm, ConvBwdDataAlgo, ConvBwdFilterAlgo, ConvDesc, ConvDirection,
    ConvFwdAlgo,
};
use crate::dtype::{DType, DataType, Scalar};
use crate::error::{Error, Result};
use crate::graph::union as gunion;
use crate::graph::{Args, ConvApi, EngineConfig, GraphSearch, Plan, TensorId};
use crate::handle::Cudnn;
use crate::tensor::{FilterDesc, Layout, TensorDesc, TensorFormat};
use crate::workspace::{Workspace, MAX_WORKSPACE_BYTES};

/// Environment variable naming the autotune cache file used by [`Autotuner::new`].
pub const CACHE_ENV: &str = "CUDNN_SAFE_AUTOTUNE_CACHE";

const FILE_HEADER: &str = "# cudnn-safe autotune cache v1: device<TAB>problem key<TAB>algo:workspace_bytes:ms,...[<TAB>graph=<engine config>:workspace_bytes:ms]";

/// Most graph plans a union search builds and times (heuristics A then fallback, in order).
const GRAPH_MAX_PLANS: usize = 12;

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
    /// configuration of the graph plan a union search chose
    /// ([`Autotuner::graph_search`]; convolution forward only).
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
    /// Benchmarks run.
    pub benchmarks: u64,
    /// Times a later candidate ran because an earlier one could not (including a graph plan
    /// that could not run, replaced by the legacy ranking).
    pub fallbacks: u64,
    /// Graph plans rebuilt from a remembered engine configuration (a decision read from the cache
    /// file, or used on another handle) without timing anything.
    pub plan_builds: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    device: Arc<str>,
    problem: Vec<i64>,
}

type Ranking = Vec<(u32, usize, f32)>;

/// The graph engine a union search chose: what is persisted of it.
#[derive(Debug, Clone, PartialEq)]
struct GraphPick {
    config: EngineConfig,
    workspace: usize,
    ms: f32,
}

/// A cached decision: the legacy ranking (never empty), and the graph engine that beat its first
/// candidate, if a union search found one.
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
}

/// A ranking, where it came from, its cache key (none under a fixed policy), and the graph
/// engine chosen for it, if any.
type Decision<A> = (
    Vec<Candidate<A>>,
    Source,
    Option<Arc<Key>>,
    Option<GraphPick>,
);

/// A built plan of a graph decision, kept so that repeated calls build nothing: the plan caches
/// its variant pack, rebuilt only when a buffer address changes.
struct HeldPlan {
    plan: Plan,
    x: TensorId,
    w: TensorId,
    y: TensorId,
}

impl std::fmt::Debug for HeldPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.plan.fmt(f)
    }
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
    cache: HashMap<Key, Entry>,
    /// Plans of graph decisions, built on the handle they last ran on.
    held: HashMap<Key, HeldPlan>,
    path: Option<PathBuf>,
    devices: Vec<(usize, usize, Arc<str>)>,
    /// Recently used problems by descriptor ids (never reused, descriptors immutable) → key and
    /// ranking, so a repeated call builds and hashes no key. Cleared whenever a ranking or the
    /// policy or limit changes.
    recent: std::collections::VecDeque<([u64; 7], Arc<Key>, Entry)>,
    stats: TunerStats,
}

/// What [`Autotuner::prepare`] found for a call.
enum Prepared {
    /// `Policy::Fixed`: nothing to decide or cache.
    Fixed,
    /// A cached decision.
    Known(Arc<Key>, Entry),
    /// Not decided yet.
    Unknown(Arc<Key>),
}

const RECENT_CAPACITY: usize = 16;

impl Autotuner {
    /// A tuner with `policy`, no workspace limit beyond [`MAX_WORKSPACE_BYTES`], and the cache
    /// file named by `CUDNN_SAFE_AUTOTUNE_CACHE` when that is set (loaded now).
    pub fn new(policy: Policy) -> Self {
        let tuner = Autotuner {
            policy,
            limit: MAX_WORKSPACE_BYTES,
            workspace: None,
            graph: GraphSearch::default(),
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
    #[must_use]
    pub fn cache_file(mut self, path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let loaded = load_file(&path);
        log::info!(
            "autotune cache {}: {} entries loaded",
            path.display(),
            loaded.len()
        );
        self.cache.extend(loaded);
        self.path = Some(path);
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
    /// (graph) engines for a convolution forward ([`GraphSearch::Union`] by default).
    ///
    /// The union search runs after the legacy benchmark of a new problem: the problem is rebuilt
    /// as a one-operation graph (same dims, strides, data types, padding, strides, dilations,
    /// mode and compute type), up to 12 plans are built (heuristics A, then fallback) under a
    /// filter matching the legacy numerics (no tensor cores with
    /// [`MathType::Fma`](crate::conv::MathType::Fma), no input down-conversion unless
    /// `TensorOpAllowConversion`, no reduced-precision accumulation with an f32 compute type,
    /// deterministic engines only under [`Policy::Deterministic`], the workspace limit), and each
    /// plan and the legacy favourite are timed alike with CUDA events (on the caller's output,
    /// or on scratch memory when `beta ≠ 0`). A faster graph plan is remembered in the decision
    /// (and in the cache file as its engine configuration) and runs for every later call with
    /// `alpha = 1, beta = 0` (the graph computes `y = conv(x, w)` only); other calls,
    /// [`Autotuner::bias_activation_forward`], and problems the graph cannot express (f64,
    /// int8, mixed input/output types, vectorized filters) use the legacy ranking. When no plan
    /// builds or runs, the legacy decision stands (logged). A problem no legacy algorithm can run
    /// within the limit stays [`Error::NoAlgorithm`]. The backward directions, and
    /// [`Policy::Heuristic`] and [`Policy::Fixed`], are legacy only.
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

    /// The graph search mode.
    pub fn graph_search_mode(&self) -> GraphSearch {
        self.graph
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
    /// Hit/miss/benchmark/fallback counters.
    pub fn stats(&self) -> TunerStats {
        self.stats
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
    /// meanwhile). Called automatically after each new decision when a file is set.
    pub fn save(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let mut all = load_file(path);
        for (k, v) in &self.cache {
            all.insert(k.clone(), v.clone());
        }
        let mut text = String::from(FILE_HEADER);
        text.push('\n');
        let mut lines: Vec<String> = all
            .iter()
            .map(|(k, v)| {
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
            })
            .collect();
        lines.sort();
        for l in lines {
            let _ = writeln!(text, "{l}");
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let io = |e: std::io::Error| {
            Error::invalid(
                "autotune cache file",
                "a writable path",
                format!("{}: {e}", path.display()),
            )
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
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
            self.workspace = Some(Workspace::new(cudnn.stream().clone()).with_limit(self.limit));
        }
        self.workspace.as_mut().expect("set above")
    }

    fn key(&mut self, cudnn: &Cudnn, problem: Vec<i64>) -> Key {
        Key {
            device: self.device(cudnn),
            problem,
        }
    }

    /// Finds the call's problem: by descriptor ids among recent calls (cheap), else by building
    /// its full key and looking it up in the cache. Under [`Policy::Fixed`] nothing is looked up.
    fn prepare(
        &mut self,
        cudnn: &Cudnn,
        ids: [u64; 5],
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
            cudnn.context().ordinal() as u64,
            cudnn.version() as u64,
        ];
        if let Some((_, key, ranking)) = self.recent.iter().find(|(i, _, _)| *i == ids) {
            return Prepared::Known(key.clone(), ranking.clone());
        }
        let p = problem(self.policy, self.limit);
        let key = Arc::new(self.key(cudnn, p));
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

    /// The cached ranking for a forward problem under the current policy, if decided already.
    pub fn cached_forward<X: DataType, Y: DataType>(
        &mut self,
        cudnn: &Cudnn,
        x_desc: &TensorDesc<X>,
        w_desc: &FilterDesc<X>,
        conv: &ConvDesc,
        y_desc: &TensorDesc<Y>,
    ) -> Option<Vec<Candidate<ConvFwdAlgo>>> {
        let gmode = self.graph;
        let prepared = self.prepare(
            cudnn,
            [0, x_desc.id(), w_desc.id(), conv.id(), y_desc.id()],
            |policy, limit| forward_key(x_desc, w_desc, conv, y_desc, policy, limit, gmode),
        );
        match prepared {
            Prepared::Known(_, r) => Some(decode(&r.ranking)),
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
    ) -> Result<Decision<A>> {
        let key = match prepared {
            Prepared::Fixed => {
                let only = Candidate {
                    algo: fixed,
                    workspace: 0,
                    time_ms: -1.0,
                };
                return Ok((vec![only], Source::Fixed, None, None));
            }
            Prepared::Known(key, entry) => {
                self.stats.hits += 1;
                return Ok((
                    decode(&entry.ranking),
                    Source::Cache,
                    Some(key),
                    entry.graph,
                ));
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
        self.cache
            .insert((*key).clone(), Entry::legacy(encode(&ranking)));
        self.persist();
        Ok((ranking, source, Some(key), None))
    }

    /// Runs the candidates in order until one succeeds. Errors from this crate's argument
    /// checks end the attempt at once (no algorithm can fix them); cuDNN refusals and workspace
    /// failures move on to the next candidate, and refused candidates leave the cached ranking.
    fn run<A: ConvAlgorithm>(
        &mut self,
        cudnn: &Cudnn,
        key: Option<Arc<Key>>,
        ranking: Vec<Candidate<A>>,
        source: Source,
        mut launch: impl FnMut(A, &mut Workspace) -> Result<()>,
    ) -> Result<Choice<A>> {
        let mut failures = Vec::new();
        let mut refused = Vec::new();
        for (rank, c) in ranking.iter().enumerate() {
            let ws = self.workspace(cudnn);
            match launch(c.algo, ws) {
                Ok(()) => {
                    if rank > 0 {
                        self.stats.fallbacks += 1;
                        log::warn!(
                            "conv {}: fell back to {} (rank {rank}) after {}",
                            A::DIRECTION.name(),
                            c.algo,
                            failures.join("; ")
                        );
                    }
                    if let (Some(key), false) = (key, refused.is_empty()) {
                        if let Some(r) = self.cache.get_mut(&*key) {
                            r.ranking.retain(|(a, _, _)| !refused.contains(a));
                        }
                        self.recent.clear();
                    }
                    let workspace = self.workspace_bytes();
                    return Ok(Choice {
                        algo: c.algo,
                        source,
                        rank,
                        workspace,
                        api: ConvApi::Legacy,
                    });
                }
                Err(e) if falls_back(&e) => {
                    if matches!(e, Error::Cudnn { .. }) {
                        refused.push(c.algo.raw_value());
                    }
                    failures.push(format!("{}: {e}", c.algo));
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::NoAlgorithm {
            op: direction_op(A::DIRECTION),
            detail: failures.join("; "),
        })
    }

    /// `y = alpha·conv(x, w) + beta·y` with the algorithm the policy picks (see
    /// [`Cudnn::conv_forward`] for the types and checks). With `beta ≠ 0` a benchmark runs on
    /// scratch memory, so `y`'s contents are preserved for the accumulation.
    ///
    /// Under [`Policy::Benchmark`] and [`Policy::Deterministic`] the graph engines are searched
    /// too ([`Autotuner::graph_search`]); [`Choice::api`] says which API ran. A graph plan runs
    /// only for `alpha = 1, beta = 0`, after the same checks as the legacy call (buffer spans,
    /// data types, contexts, output layout not overlapping itself, workspace within the limit).
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn forward<X: DataType, Y: DataType<Scalar = X::Scalar>>(
        &mut self,
        cudnn: &Cudnn,
        alpha: X::Scalar,
        x_desc: &TensorDesc<X>,
        x: &impl DevicePtr<X>,
        w_desc: &FilterDesc<X>,
        w: &impl DevicePtr<X>,
        conv: &ConvDesc,
        beta: X::Scalar,
        y_desc: &TensorDesc<Y>,
        y: &mut impl DevicePtrMut<Y>,
    ) -> Result<Choice<ConvFwdAlgo>> {
        let fixed = match self.policy {
            Policy::Fixed(f) => f.forward,
            _ => ConvFwdAlgo::ImplicitGemm,
        };
        let gmode = self.graph;
        let prepared = self.prepare(
            cudnn,
            [0, x_desc.id(), w_desc.id(), conv.id(), y_desc.id()],
            |policy, limit| forward_key(x_desc, w_desc, conv, y_desc, policy, limit, gmode),
        );
        let accumulate = beta.to_f64() != 0.0;
        let (ranking, source, key, mut pick) = self.decide(
            cudnn,
            prepared,
            || cudnn.conv_forward_heuristics(x_desc, w_desc, conv, y_desc),
            |ws| {
                if accumulate {
                    let mut scratch = alloc::<Y>(cudnn, y_desc.span())?;
                    cudnn.conv_forward_find(x_desc, x, w_desc, w, conv, y_desc, &mut scratch, ws)
                } else {
                    cudnn.conv_forward_find(x_desc, x, w_desc, w, conv, y_desc, y, ws)
                }
            },
            fixed,
        )?;
        let union = gmode != GraphSearch::Off
            && matches!(self.policy, Policy::Benchmark | Policy::Deterministic)
            && gunion::eligible(x_desc, w_desc, conv, y_desc);
        if let (true, Some(key)) = (union, &key) {
            let p = Problem {
                x_desc,
                x,
                w_desc,
                w,
                conv,
                y_desc,
            };
            if source == Source::Benchmark {
                pick = self.union_search(cudnn, key, &ranking[0], accumulate, &p, y);
            }
            // The graph computes y = conv(x, w): other scalings take the legacy call.
            if pick.is_some() && alpha.to_f64() == 1.0 && !accumulate {
                if let Some(config) = self.run_graph(cudnn, key, &ranking[0], &p, y)? {
                    return Ok(Choice {
                        algo: ranking[0].algo,
                        source,
                        rank: 0,
                        workspace: self.workspace_bytes(),
                        api: ConvApi::Graph(config),
                    });
                }
            }
        }
        self.run(cudnn, key, ranking, source, |algo, ws| {
            cudnn.conv_forward(alpha, x_desc, x, w_desc, w, conv, algo, ws, beta, y_desc, y)
        })
    }

    /// Times up to [`GRAPH_MAX_PLANS`] graph plans of a forward problem against the legacy
    /// favourite `best` (both with CUDA events, on `y` or, when `accumulate`, on scratch memory),
    /// and records a faster plan (any plan that runs, under [`GraphSearch::Prefer`]) in the
    /// decision under `key`, keeping the plan built. Never fails the call: when the graph side
    /// cannot build or run, the legacy decision stands (logged).
    fn union_search<X: DataType, Y: DataType<Scalar = X::Scalar>>(
        &mut self,
        cudnn: &Cudnn,
        key: &Arc<Key>,
        best: &Candidate<ConvFwdAlgo>,
        accumulate: bool,
        p: &Problem<'_, X, impl DevicePtr<X>, impl DevicePtr<X>, Y>,
        y: &mut impl DevicePtrMut<Y>,
    ) -> Option<GraphPick> {
        let started = Instant::now();
        let policy = self.policy;
        let prefer = self.graph == GraphSearch::Prefer;
        let found = (|| -> Result<Option<(GraphPick, HeldPlan)>> {
            let cg = gunion::conv_graph(cudnn, p.x_desc, p.w_desc, p.conv, p.y_desc)?;
            let filter = gunion::filter(
                p.conv,
                policy == Policy::Deterministic,
                self.limit,
                GRAPH_MAX_PLANS,
            );
            let list = cg.og.plans(cudnn, &filter)?;
            let (built, skipped) = (list.plans.len(), list.skipped.len());
            let mut scratch = if accumulate {
                Some(alloc::<Y>(cudnn, p.y_desc.span())?)
            } else {
                None
            };
            let ws = self.workspace(cudnn);
            let (graph, legacy) = match scratch.as_mut() {
                Some(s) => (
                    time_plans(cudnn, list.plans, &cg, p, s, ws)?,
                    time_legacy(cudnn, best.algo, p, s, ws),
                ),
                None => (
                    time_plans(cudnn, list.plans, &cg, p, y, ws)?,
                    time_legacy(cudnn, best.algo, p, y, ws),
                ),
            };
            let legacy_ms = match legacy {
                Ok(ms) => ms,
                Err(e) => {
                    log::debug!("union search: legacy {} not timed: {e}", best.algo);
                    best.time_ms
                }
            };
            let Some((ms, plan)) = graph else {
                log::info!(
                    "conv forward union search: no graph plan ran ({built} built, {skipped} skipped); legacy {} stands",
                    best.algo
                );
                return Ok(None);
            };
            let wins = prefer || legacy_ms < 0.0 || ms < legacy_ms;
            log::info!(
                "conv forward union search ({}, {:.1} ms): graph {} {ms:.4} ms vs legacy {} {legacy_ms:.4} ms: {} wins ({built} plans built, {skipped} skipped)",
                policy.name(),
                started.elapsed().as_secs_f64() * 1e3,
                plan.name(),
                best.algo,
                if wins { "graph" } else { "legacy" },
            );
            if !wins {
                return Ok(None);
            }
            let pick = GraphPick {
                config: plan.config().clone(),
                workspace: plan.workspace_size(),
                ms,
            };
            let held = HeldPlan {
                plan,
                x: cg.x,
                w: cg.w,
                y: cg.y,
            };
            Ok(Some((pick, held)))
        })();
        let (pick, held) = match found {
            Ok(Some(found)) => found,
            Ok(None) => return None,
            Err(e) => {
                log::info!(
                    "conv forward union search: graph side failed ({e}); legacy {} stands",
                    best.algo
                );
                return None;
            }
        };
        self.held.insert((**key).clone(), held);
        if let Some(entry) = self.cache.get_mut(&**key) {
            entry.graph = Some(pick.clone());
        }
        self.recent.clear();
        self.persist();
        Some(pick)
    }

    /// Runs the graph plan of the decision under `key` on the caller's buffers, building it first
    /// when this tuner holds none for `cudnn`'s handle (from the remembered engine configuration;
    /// if that no longer builds or passes the filter, the union search runs again).
    ///
    /// Returns the configuration that ran, or `None` when the legacy ranking must run instead
    /// (no plan, or cuDNN refused the plan: the graph choice is then dropped from the decision).
    /// Argument errors (short buffers, foreign contexts, ...) are returned: no algorithm can fix
    /// them.
    fn run_graph<X: DataType, Y: DataType<Scalar = X::Scalar>>(
        &mut self,
        cudnn: &Cudnn,
        key: &Arc<Key>,
        best: &Candidate<ConvFwdAlgo>,
        p: &Problem<'_, X, impl DevicePtr<X>, impl DevicePtr<X>, Y>,
        y: &mut impl DevicePtrMut<Y>,
    ) -> Result<Option<EngineConfig>> {
        let ready = self
            .held
            .get(&**key)
            .is_some_and(|h| gunion::built_on(&h.plan, cudnn));
        if !ready {
            let pick = self.cache.get(&**key).and_then(|e| e.graph.clone());
            let rebuilt = pick
                .as_ref()
                .map(|pick| self.rebuild(cudnn, p, &pick.config));
            match rebuilt {
                Some(Ok(h)) => {
                    self.stats.plan_builds += 1;
                    log::info!("conv forward: graph plan {} rebuilt", h.plan.name());
                    self.held.insert((**key).clone(), h);
                }
                other => {
                    if let Some(Err(e)) = other {
                        log::warn!(
                            "conv forward: remembered graph plan not rebuilt ({e}); tuning again"
                        );
                    }
                    self.held.remove(&**key);
                    if let Some(entry) = self.cache.get_mut(&**key) {
                        entry.graph = None;
                    }
                    self.recent.clear();
                    self.stats.benchmarks += 1;
                    if self.union_search(cudnn, key, best, false, p, y).is_none() {
                        self.persist();
                        return Ok(None);
                    }
                }
            }
        }
        self.workspace(cudnn);
        let (Some(ws), Some(h)) = (self.workspace.as_mut(), self.held.get(&**key)) else {
            return Ok(None);
        };
        let mut args = Args::new(cudnn);
        args.input(h.x, p.x)?.input(h.w, p.w)?.output(h.y, y)?;
        match cudnn.execute(&h.plan, &args, ws) {
            Ok(()) => Ok(Some(h.plan.config().clone())),
            Err(e) if falls_back(&e) || is_graph_only_refusal(&e) => {
                log::warn!(
                    "conv forward: graph plan {} did not run ({e}); legacy ranking instead",
                    h.plan.name()
                );
                self.stats.fallbacks += 1;
                self.held.remove(&**key);
                if let Some(entry) = self.cache.get_mut(&**key) {
                    entry.graph = None;
                }
                self.recent.clear();
                self.persist();
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The plan of a remembered engine configuration for this problem, checked against the
    /// current filter (the cache file is trusted for the choice only).
    fn rebuild<X: DataType, Y: DataType>(
        &self,
        cudnn: &Cudnn,
        p: &Problem<'_, X, impl DevicePtr<X>, impl DevicePtr<X>, Y>,
        config: &EngineConfig,
    ) -> Result<HeldPlan> {
        let cg = gunion::conv_graph(cudnn, p.x_desc, p.w_desc, p.conv, p.y_desc)?;
        let plan = cg.og.plan_from_config(cudnn, config)?;
        let filter = gunion::filter(
            p.conv,
            self.policy == Policy::Deterministic,
            self.limit,
            GRAPH_MAX_PLANS,
        );
        if let Some(why) = filter.refuse(plan.numerical_notes(), plan.behavior_notes()) {
            return Err(Error::invalid(
                "remembered graph plan",
                "a plan the policy's filter accepts",
                format!("{config}: {why}"),
            ));
        }
        if plan.workspace_size() > self.limit {
            return Err(Error::WorkspaceLimit {
                requested: plan.workspace_size(),
                limit: self.limit,
            });
        }
        Ok(HeldPlan {
            plan,
            x: cg.x,
            w: cg.w,
            y: cg.y,
        })
    }

    /// Saves the cache file if there is one (a failure is logged: the decision stays in memory).
    fn persist(&self) {
        if self.path.is_some() {
            if let Err(e) = self.save() {
                log::warn!("autotune cache not saved: {e}");
            }
        }
    }

    /// The fused `y = act(alpha1·conv(x, w) + alpha2·z + bias)` (see
    /// [`Cudnn::conv_bias_activation_forward`]) with the forward algorithm the policy picks for
    /// this convolution (the same decision [`forward`](Self::forward) makes and caches).
    /// [`FusedActivation::Identity`](crate::conv::FusedActivation::Identity) always runs
    /// `IMPLICIT_PRECOMP_GEMM`, the only algorithm cuDNN supports for it.
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn bias_activation_forward<X: DataType, Y: DataType<Scalar = X::Scalar>, B: DataType>(
        &mut self,
        cudnn: &Cudnn,
        alpha1: X::Scalar,
        x_desc: &TensorDesc<X>,
        x: &impl DevicePtr<X>,
        w_desc: &FilterDesc<X>,
        w: &impl DevicePtr<X>,
        conv: &ConvDesc,
        alpha2: X::Scalar,
        z: Option<&cudarc::driver::CudaSlice<Y>>,
        bias_desc: &TensorDesc<B>,
        bias: &impl DevicePtr<B>,
        activation: crate::conv::FusedActivation,
        y_desc: &TensorDesc<Y>,
        y: &mut impl DevicePtrMut<Y>,
    ) -> Result<Choice<ConvFwdAlgo>> {
        let launch = |algo, ws: &mut Workspace, y: &mut _| {
            cudnn.conv_bias_activation_forward(
                alpha1, x_desc, x, w_desc, w, conv, algo, ws, alpha2, z, bias_desc, bias,
                activation, y_desc, y,
            )
        };
        if activation == crate::conv::FusedActivation::Identity {
            let ranking = vec![Candidate {
                algo: ConvFwdAlgo::ImplicitPrecompGemm,
                workspace: 0,
                time_ms: -1.0,
            }];
            return self.run(cudnn, None, ranking, Source::Fixed, |a, ws| {
                launch(a, ws, y)
            });
        }
        let fixed = match self.policy {
            Policy::Fixed(f) => f.forward,
            _ => ConvFwdAlgo::ImplicitGemm,
        };
        let gmode = self.graph;
        let prepared = self.prepare(
            cudnn,
            [0, x_desc.id(), w_desc.id(), conv.id(), y_desc.id()],
            |policy, limit| forward_key(x_desc, w_desc, conv, y_desc, policy, limit, gmode),
        );
        // The fused output is written, never read (z is a separate buffer), so a benchmark may
        // use `y` itself as its trial output.
        let (ranking, source, key, _) = self.decide(
            cudnn,
            prepared,
            || cudnn.conv_forward_heuristics(x_desc, w_desc, conv, y_desc),
            |ws| cudnn.conv_forward_find(x_desc, x, w_desc, w, conv, y_desc, y, ws),
            fixed,
        )?;
        self.run(cudnn, key, ranking, source, |a, ws| launch(a, ws, y))
    }

    /// `dx = alpha·backward_data(dy, w) + beta·dx` with the algorithm the policy picks (see
    /// [`Cudnn::conv_backward_data`]).
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn backward_data<T: DataType>(
        &mut self,
        cudnn: &Cudnn,
        alpha: T::Scalar,
        w_desc: &FilterDesc<T>,
        w: &impl DevicePtr<T>,
        dy_desc: &TensorDesc<T>,
        dy: &impl DevicePtr<T>,
        conv: &ConvDesc,
        beta: T::Scalar,
        dx_desc: &TensorDesc<T>,
        dx: &mut impl DevicePtrMut<T>,
    ) -> Result<Choice<ConvBwdDataAlgo>> {
        let fixed = match self.policy {
            Policy::Fixed(f) => f.backward_data,
            _ => ConvBwdDataAlgo::Algo1,
        };
        let prepared = self.prepare(
            cudnn,
            [1, dx_desc.id(), w_desc.id(), conv.id(), dy_desc.id()],
            |policy, limit| {
                problem_key(
                    ConvDirection::BackwardData,
                    (dx_desc.layout(), T::DTYPE),
                    w_desc,
                    (dy_desc.layout(), T::DTYPE),
                    conv,
                    policy,
                    limit,
                )
            },
        );
        let accumulate = beta.to_f64() != 0.0;
        let (ranking, source, key, _) = self.decide(
            cudnn,
            prepared,
            || cudnn.conv_backward_data_heuristics(w_desc, dy_desc, conv, dx_desc),
            |ws| {
                if accumulate {
                    let mut scratch = alloc::<T>(cudnn, dx_desc.span())?;
                    cudnn.conv_backward_data_find(
                        w_desc,
                        w,
                        dy_desc,
                        dy,
                        conv,
                        dx_desc,
                        &mut scratch,
                        ws,
                    )
                } else {
                    cudnn.conv_backward_data_find(w_desc, w, dy_desc, dy, conv, dx_desc, dx, ws)
                }
            },
            fixed,
        )?;
        self.run(cudnn, key, ranking, source, |algo, ws| {
            cudnn.conv_backward_data(
                alpha, w_desc, w, dy_desc, dy, conv, algo, ws, beta, dx_desc, dx,
            )
        })
    }

    /// `dw = alpha·backward_filter(x, dy) + beta·dw` with the algorithm the policy picks (see
    /// [`Cudnn::conv_backward_filter`]). With `beta ≠ 0` (gradient accumulation) a benchmark
    /// runs on scratch memory, so the accumulated gradient is preserved.
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn backward_filter<T: DataType>(
        &mut self,
        cudnn: &Cudnn,
        alpha: T::Scalar,
        x_desc: &TensorDesc<T>,
        x: &impl DevicePtr<T>,
        dy_desc: &TensorDesc<T>,
        dy: &impl DevicePtr<T>,
        conv: &ConvDesc,
        beta: T::Scalar,
        dw_desc: &FilterDesc<T>,
        dw: &mut impl DevicePtrMut<T>,
    ) -> Result<Choice<ConvBwdFilterAlgo>> {
        let fixed = match self.policy {
            Policy::Fixed(f) => f.backward_filter,
            _ => ConvBwdFilterAlgo::Algo1,
        };
        let prepared = self.prepare(
            cudnn,
            [2, x_desc.id(), dw_desc.id(), conv.id(), dy_desc.id()],
            |policy, limit| {
                problem_key(
                    ConvDirection::BackwardFilter,
                    (x_desc.layout(), T::DTYPE),
                    dw_desc,
                    (dy_desc.layout(), T::DTYPE),
                    conv,
                    policy,
                    limit,
                )
            },
        );
        let accumulate = beta.to_f64() != 0.0;
        let (ranking, source, key, _) = self.decide(
            cudnn,
            prepared,
            || cudnn.conv_backward_filter_heuristics(x_desc, dy_desc, conv, dw_desc),
            |ws| {
                if accumulate {
                    let mut scratch = alloc::<T>(cudnn, dw_desc.span())?;
                    cudnn.conv_backward_filter_find(
                        x_desc,
                        x,
                        dy_desc,
                        dy,
                        conv,
                        dw_desc,
                        &mut scratch,
                        ws,
                    )
                } else {
                    cudnn.conv_backward_filter_find(x_desc, x, dy_desc, dy, conv, dw_desc, dw, ws)
                }
            },
            fixed,
        )?;
        self.run(cudnn, key, ranking, source, |algo, ws| {
            cudnn.conv_backward_filter(
                alpha, x_desc, x, dy_desc, dy, conv, algo, ws, beta, dw_desc, dw,
            )
        })
    }
}

impl Drop for Autotuner {
    fn drop(&mut self) {
        // Decisions are saved as they are made; nothing can fail here.
        self.workspace = None;
    }
}

/// The inputs of a forward problem, passed together to the union search.
struct Problem<'a, X: DataType, XB, WB, Y: DataType> {
    x_desc: &'a TensorDesc<X>,
    x: &'a XB,
    w_desc: &'a FilterDesc<X>,
    w: &'a WB,
    conv: &'a ConvDesc,
    y_desc: &'a TensorDesc<Y>,
}

/// Times each plan on `out` and returns the fastest with its time (`None` if none ran). A
/// candidate that fails is skipped; an error in the bindings themselves (the caller's buffers) is
/// returned, as no plan can fix it.
fn time_plans<X: DataType, Y: DataType>(
    cudnn: &Cudnn,
    plans: Vec<Plan>,
    cg: &gunion::ConvGraph,
    p: &Problem<'_, X, impl DevicePtr<X>, impl DevicePtr<X>, Y>,
    out: &mut impl DevicePtrMut<Y>,
    ws: &mut Workspace,
) -> Result<Option<(f32, Plan)>> {
    let mut args = Args::new(cudnn);
    args.input(cg.x, p.x)?.input(cg.w, p.w)?.output(cg.y, out)?;
    let mut best: Option<(f32, Plan)> = None;
    for plan in plans {
        match gunion::time_ms(cudnn, || cudnn.execute(&plan, &args, ws)) {
            Ok(ms) => {
                log::debug!("union search: graph {} {ms:.4} ms", plan.name());
                if best.as_ref().map_or(true, |(b, _)| ms < *b) {
                    best = Some((ms, plan));
                }
            }
            Err(e) if falls_back(&e) => {
                log::debug!("union search: graph {} failed: {e}", plan.name());
            }
            Err(e) => return Err(e),
        }
    }
    Ok(best)
}

/// Times the legacy algorithm `algo` with `alpha = 1, beta = 0` on `out`, as graph plans are.
fn time_legacy<X: DataType, Y: DataType<Scalar = X::Scalar>>(
    cudnn: &Cudnn,
    algo: ConvFwdAlgo,
    p: &Problem<'_, X, impl DevicePtr<X>, impl DevicePtr<X>, Y>,
    out: &mut impl DevicePtrMut<Y>,
    ws: &mut Workspace,
) -> Result<f32> {
    let (one, zero) = (X::Scalar::from_f64(1.0), X::Scalar::from_f64(0.0));
    gunion::time_ms(cudnn, || {
        cudnn.conv_forward(
            one, p.x_desc, p.x, p.w_desc, p.w, p.conv, algo, ws, zero, p.y_desc, out,
        )
    })
}

/// A refusal specific to the graph path, after which the legacy call can still run: the
/// backend's 16-byte alignment of every buffer (legacy calls take element-aligned views).
fn is_graph_only_refusal(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument { what, .. } if *what == "graph buffer alignment")
}

/// The key of a forward problem: [`problem_key`], and under the benchmark policies the graph
/// search mode unless it is the default (so that union decisions share the keys of the
/// legacy-only decisions earlier versions wrote; a union key never ends in a negative value).
fn forward_key<X: DataType, Y: DataType>(
    x_desc: &TensorDesc<X>,
    w_desc: &FilterDesc<X>,
    conv: &ConvDesc,
    y_desc: &TensorDesc<Y>,
    policy: Policy,
    limit: usize,
    graph: GraphSearch,
) -> Vec<i64> {
    let mut k = problem_key(
        ConvDirection::Forward,
        (x_desc.layout(), X::DTYPE),
        w_desc,
        (y_desc.layout(), Y::DTYPE),
        conv,
        policy,
        limit,
    );
    if matches!(policy, Policy::Benchmark | Policy::Deterministic) {
        match graph {
            GraphSearch::Union => {}
            GraphSearch::Off => k.push(-1),
            GraphSearch::Prefer => k.push(-2),
        }
    }
    k
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

fn load_file(path: &Path) -> HashMap<Key, Entry> {
    let mut map = HashMap::new();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return map,
        Err(e) => {
            log::warn!("autotune cache {} not read: {e}", path.display());
            return map;
        }
    };
    for (no, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        match parse_line(line) {
            Some((k, v)) => {
                map.insert(k, v);
            }
            None => log::warn!(
                "autotune cache {}:{}: unreadable line skipped",
                path.display(),
                no + 1
            ),
        }
    }
    map
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
                config,
                workspace,
                ms,
            })
        }
    };
    if parts.next().is_some() || device.is_empty() || problem.is_empty() || ranking.is_empty() {
        return None;
    }
    Some((
        Key {
            device: device.into(),
            problem,
        },
        Entry { ranking, graph },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_lines_round_trip_and_bad_lines_are_skipped() {
        let dir = std::env::temp_dir().join(format!("cudnn-safe-tune-{}", std::process::id()));
        let path = dir.join("cache.txt");
        let _ = std::fs::remove_file(&path);
        let mut t = Autotuner::new(Policy::Benchmark)
            .without_cache_file()
            .cache_file(&path);
        assert_eq!(t.cached_decisions(), 0);
        let key = Key {
            device: "GPU X|sm90|cudnn91400".into(),
            problem: vec![0, 1, 2, -3],
        };
        t.cache.insert(
            key.clone(),
            Entry::legacy(vec![(7, 1024, 0.25), (1, 0, 0.5)]),
        );
        let graph_key = Key {
            device: "GPU X|sm90|cudnn91400".into(),
            problem: vec![0, 1, 2, -4],
        };
        let pick = GraphPick {
            config: "eng12_k2=1_k5=0".parse().unwrap(),
            workspace: 4096,
            ms: 0.125,
        };
        t.cache.insert(
            graph_key.clone(),
            Entry {
                ranking: vec![(1, 0, 0.5)],
                graph: Some(pick.clone()),
            },
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
            t2.cache[&key],
            Entry::legacy(vec![(7, 1024, 0.25), (1, 0, 0.5)])
        );
        assert_eq!(t2.cache[&graph_key].graph, Some(pick));
        let old = Key {
            device: "GPU Y".into(),
            problem: vec![5, 6],
        };
        assert_eq!(t2.cache[&old], Entry::legacy(vec![(1, 0, 0.5)]));
        let r: Vec<Candidate<ConvFwdAlgo>> = decode(&t2.cache[&key].ranking);
        assert_eq!(r[0].algo, ConvFwdAlgo::WinogradNonfused);
        assert_eq!(r[1].algo, ConvFwdAlgo::ImplicitPrecompGemm);
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
