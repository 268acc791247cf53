//! The [`Autotuner`]: its state, builders and getters, and the lookup of a call's problem.
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::cache::{self, decode, load_file, Entry};
use super::key::{call_key, Key};
use super::search::HeldPlan;
use super::{
    Candidate, GraphSearch, Policy, SearchEffort, Stats, DEFAULT_FINALISTS, DEFAULT_FINAL_SOLO_MS,
    DEFAULT_GRAPH_PLANS, DEFAULT_REFINE_KNOBS,
};
use crate::conv::{ConvDesc, ConvDirection, ConvFwdAlgo};
use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::EngineConfig;
use crate::handle::Cudnn;
use crate::tensor::{FilterDesc, TensorDesc};
use crate::workspace::{Workspace, MAX_WORKSPACE_BYTES};

/// Environment variable naming the autotune cache file used by [`Autotuner::new`].
pub const CACHE_ENV: &str = "CUDNN_SAFE_AUTOTUNE_CACHE";

/// Most wall-clock milliseconds [`Autotuner::with_final_solo_ms`] accepts (10 s).
pub(super) const MAX_FINAL_SOLO_MS: f32 = 10_000.0;

/// Chooses convolution algorithms under a [`Policy`], remembers each decision, and runs the
/// convolution with fallback to the next candidate. Owns the workspace it launches with.
///
/// Not `Sync` (it mutates its cache on every miss); one per thread or behind a lock.
#[derive(Debug)]
pub struct Autotuner {
    pub(super) policy: Policy,
    pub(super) limit: usize,
    pub(super) workspace: Option<Workspace>,
    pub(super) graph: GraphSearch,
    pub(super) graph_plans: usize,
    pub(super) refine_knobs: usize,
    pub(super) heuristics_b: bool,
    pub(super) finalists: usize,
    pub(super) final_solo_ms: f32,
    pub(super) effort: SearchEffort,
    /// Engine configurations that won this tuner's union searches, by kind
    /// ([`super::key::kind_of`]), most recent last (carried into later searches under
    /// [`SearchEffort::Quick`]).
    pub(super) winners: HashMap<[i64; 5], Vec<Arc<EngineConfig>>>,
    pub(super) cache: HashMap<Key, Arc<Entry>>,
    /// Plans of graph decisions, built on the handle they last ran on.
    pub(super) held: HashMap<Key, HeldPlan>,
    pub(super) path: Option<PathBuf>,
    pub(super) devices: Vec<(usize, usize, Arc<str>)>,
    /// Recently used problems by descriptor ids (never reused, descriptors immutable) → key and
    /// decision, so a repeated call builds and hashes no key. Cleared whenever a decision or the
    /// policy, limit or search mode changes.
    pub(super) recent: VecDeque<([u64; 8], Arc<Key>, Arc<Entry>)>,
    pub(super) stats: Stats,
}

/// What [`Autotuner::prepare`] found for a call.
pub(super) enum Prepared {
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
            effort: SearchEffort::Thorough,
            winners: HashMap::new(),
            cache: HashMap::new(),
            held: HashMap::new(),
            path: None,
            devices: Vec::new(),
            recent: Default::default(),
            stats: Stats::default(),
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
    /// its entries and [`save`](Self::save) reports the error ([`Error::Io`](crate::Error::Io)) instead of
    /// overwriting it. [`try_cache_file`](Self::try_cache_file) returns that error at once.
    #[must_use]
    pub fn cache_file(self, path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let loaded = cache::or_empty("autotune", load_file(&path));
        self.with_loaded(path, loaded)
    }

    /// [`cache_file`](Self::cache_file), returning [`Error::Io`](crate::Error::Io) (with the path and the
    /// operating system's error) when the file exists but cannot be read: not a regular file,
    /// no permission, or larger than 64 MiB. A missing file is an empty cache.
    pub fn try_cache_file(self, path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let loaded = load_file(&path)?;
        Ok(self.with_loaded(path, loaded))
    }

    pub(super) fn with_loaded(mut self, path: PathBuf, loaded: HashMap<Key, Entry>) -> Self {
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
    pub fn with_workspace_limit(mut self, bytes: usize) -> Self {
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
    /// the fused call); under the default [`SearchEffort::Thorough`] (see
    /// [`Autotuner::with_effort`] for the cheaper preset), up to [`Autotuner::with_graph_plans`]
    /// plans from each of heuristics A,
    /// heuristics B (with [`Autotuner::with_heuristics_b`]), the fallback list and the engine list
    /// (default knobs, no engine that compiles at run time) are built under a filter matching
    /// the legacy numerics (no tensor cores with [`MathType::Fma`](crate::conv::MathType::Fma),
    /// no input down-conversion unless
    /// `TensorOpAllowConversion`, no reduced-precision accumulation with an f32 compute type,
    /// deterministic engines only under [`Policy::Deterministic`], the workspace limit); each
    /// plan and the legacy favourite are timed alike with CUDA events (on the caller's output,
    /// or on scratch memory when `beta ≠ 0`): a warm-up, a probe, then the best of 3 rounds of
    /// as many back-to-back launches as last 0.3 ms (a plan whose probe is 1.5× slower than
    /// the best so far is not timed further; the legacy favourite runs first for 8 ms to bring
    /// the clocks up, and is not timed again when that run was over 3× slower per launch than
    /// the best plan); the knob neighbourhoods of the
    /// [`Autotuner::with_refine_knobs`] fastest plans are built and timed the same way. Then the
    /// finals: up to six plans within 25% of the fastest, and the legacy favourite when it is
    /// that close, are timed again after 200 ms of the leader, each running alone for 25 ms
    /// before five rounds of at least 4 ms (the median counts), in two sweeps of opposite order
    /// (the mean counts): at the power limit a plan's sustained speed depends on its own power
    /// draw, which short interleaved rounds cannot see. The finals lengthen a contested
    /// search's first call ([`Autotuner::with_finalists`] and [`Autotuner::with_final_solo_ms`] set
    /// their size). A faster graph plan is
    /// remembered in the decision
    /// (and in the cache file as its engine configuration) and runs for every later call with
    /// `alpha = 1, beta = 0`; the graph computes the plain result only, so a forward, backward
    /// data or backward filter call with other `alpha`/`beta` runs it into scratch memory and
    /// adds the result into its output when the plan is at least
    /// [`COMPOSED_MIN_SPEEDUP`](super::COMPOSED_MIN_SPEEDUP) times faster than the legacy
    /// favourite (under [`GraphSearch::Prefer`], always), and a fused call needs `alpha1 = 1`
    /// and no `z`. Other calls, and problems the graph cannot express (f64, int8, mixed
    /// input/output types, vectorized filters), use the legacy ranking. When no plan builds or
    /// runs, the legacy decision stands (logged). A problem no legacy algorithm can run within
    /// the limit stays [`Error::NoAlgorithm`](crate::Error::NoAlgorithm). [`Policy::Heuristic`] and [`Policy::Fixed`] are
    /// legacy only. The build cost shows in [`Stats`] and the `info` log.
    ///
    /// Part of the cache key under the benchmark policies; [`GraphSearch::Union`] shares its key
    /// with the decisions of earlier versions, which searched legacy algorithms only: those keep
    /// working (legacy only).
    #[must_use]
    pub fn with_graph_search(mut self, mode: GraphSearch) -> Self {
        self.graph = mode;
        self.recent.clear();
        self
    }

    /// Most graph plans a union search builds and times per source (at least 1; default
    /// 24): up to this many from heuristics A, then up to this many new ones from heuristics B
    /// (when [`Autotuner::with_heuristics_b`] asks for it), from the fallback list and from the
    /// engine list. Fewer make a first call cheaper (each
    /// plan is built, and engines that compile at run time take long to build) at the risk of
    /// missing the fastest engine. Not part of the cache key: decisions already made stand.
    #[must_use]
    pub fn with_graph_plans(mut self, per_mode: usize) -> Self {
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
    pub fn with_refine_knobs(mut self, plans: usize) -> Self {
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
    pub fn with_heuristics_b(mut self, yes: bool) -> Self {
        self.heuristics_b = yes;
        self
    }

    /// Most graph plans a union search's finals time again (default [`DEFAULT_FINALISTS`]):
    /// the fastest plans of the first pass within 25 % of the best, plus the legacy favourite
    /// when it is that close. The finals run only when the first pass left more than one
    /// candidate that close; each finalist costs two sweeps of [`Autotuner::with_final_solo_ms`]
    /// alone and five timed rounds of at least 4 ms (about 0.1 s per finalist by default).
    /// 0 skips the finals: the first pass decides, which makes a contested first call cheaper
    /// and, where the fastest plans lie within a few percent of each other, the pick less
    /// sure. [`Stats::finalists`] counts what the finals timed. Not part of the
    /// cache key.
    ///
    /// ```no_run
    /// use cudnn_safe::Autotuner;
    /// use cudnn_safe::tune::Policy;
    /// // Many convolution shapes and a short job: let the first pass decide.
    /// let quick = Autotuner::new(Policy::Benchmark).with_finalists(0);
    /// // A long training run on few shapes: time more finalists, each alone for longer.
    /// let thorough = Autotuner::new(Policy::Benchmark).with_finalists(8).with_final_solo_ms(100.0);
    /// # let _ = (quick, thorough);
    /// ```
    #[must_use]
    pub fn with_finalists(mut self, plans: usize) -> Self {
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
    pub fn with_final_solo_ms(mut self, ms: f32) -> Self {
        self.final_solo_ms = if ms > 0.0 {
            ms.min(MAX_FINAL_SOLO_MS)
        } else {
            0.0
        };
        self
    }

    /// How much a benchmark policy's first call of a new problem searches (default
    /// [`SearchEffort::Thorough`]; the table at [`SearchEffort`] lists what each preset sets).
    /// Sets [`with_graph_plans`](Self::with_graph_plans),
    /// [`with_refine_knobs`](Self::with_refine_knobs) and [`with_finalists`](Self::with_finalists)
    /// to the preset's values: call those after this one to override them. Not part of the
    /// cache key: decisions already made (or read from a cache file) stand.
    ///
    /// ```no_run
    /// use cudnn_safe::tune::{Autotuner, Policy, SearchEffort};
    /// // A short job on a cold cache: a cheap first call, the heuristics' best proposals.
    /// let quick = Autotuner::new(Policy::Benchmark).with_effort(SearchEffort::Quick);
    /// // Quick, but with the finals on the few plans it times.
    /// let quick_finals = Autotuner::new(Policy::Benchmark)
    ///     .with_effort(SearchEffort::Quick)
    ///     .with_finalists(2);
    /// # let _ = (quick, quick_finals);
    /// ```
    #[must_use]
    pub fn with_effort(mut self, effort: SearchEffort) -> Self {
        self.effort = effort;
        let (plans, refine, finalists) = effort.knobs();
        self.graph_plans = plans;
        self.refine_knobs = refine;
        self.finalists = finalists;
        self
    }

    /// The search effort ([`Autotuner::with_effort`]).
    pub fn effort(&self) -> SearchEffort {
        self.effort
    }

    /// The graph search mode ([`Autotuner::with_graph_search`]).
    pub fn graph_search(&self) -> GraphSearch {
        self.graph
    }
    /// Most graph plans a union search builds per source ([`Autotuner::with_graph_plans`]).
    pub fn graph_plans(&self) -> usize {
        self.graph_plans
    }
    /// How many plans' knob neighbourhoods a union search searches
    /// ([`Autotuner::with_refine_knobs`]).
    pub fn refine_knobs(&self) -> usize {
        self.refine_knobs
    }
    /// Whether union searches ask heuristics mode B ([`Autotuner::with_heuristics_b`]).
    pub fn heuristics_b(&self) -> bool {
        self.heuristics_b
    }
    /// Most graph plans a union search's finals time again ([`Autotuner::with_finalists`]).
    pub fn finalists(&self) -> usize {
        self.finalists
    }
    /// Milliseconds each finalist runs alone before its timed rounds
    /// ([`Autotuner::with_final_solo_ms`]).
    pub fn final_solo_ms(&self) -> f32 {
        self.final_solo_ms
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
    /// The workspace limit in bytes ([`Autotuner::with_workspace_limit`]).
    pub fn workspace_limit(&self) -> usize {
        self.limit
    }
    /// The cache file, if any.
    pub fn cache_path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
    /// Number of cached decisions (all devices).
    pub fn cached_decisions(&self) -> usize {
        self.cache.len()
    }
    /// Hit/miss/benchmark/fallback counters and the union searches' costs.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Forgets every decision in memory (the file is left as it is).
    pub fn clear(&mut self) {
        self.cache.clear();
        self.held.clear();
        self.winners.clear();
        self.recent.clear();
    }
    /// Bytes of workspace currently held.
    pub fn workspace_bytes(&self) -> usize {
        self.workspace.as_ref().map_or(0, Workspace::capacity)
    }

    pub(super) fn device(&mut self, cudnn: &Cudnn) -> Arc<str> {
        let (ordinal, version) = (cudnn.context().ordinal(), cudnn.version());
        if let Some((_, _, d)) = self
            .devices
            .iter()
            .find(|(o, v, _)| *o == ordinal && *v == version)
        {
            return d.clone();
        }
        let fp: Arc<str> = cache::cudnn_device(cudnn).into();
        self.devices.push((ordinal, version, fp.clone()));
        fp
    }

    pub(super) fn workspace(&mut self, cudnn: &Cudnn) -> &mut Workspace {
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
    pub(super) fn prepare(
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
    pub(super) fn prepare_forward<X: DataType, Y: DataType>(
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
            |policy, limit| {
                let descs = (x_desc, w_desc, y_desc);
                call_key(ConvDirection::Forward, descs, conv, (policy, limit, gmode))
            },
        )
    }

    /// The decision of a forward problem under the current policy, if decided already.
    fn known_forward<X: DataType, Y: DataType>(
        &mut self,
        cudnn: &Cudnn,
        x_desc: &TensorDesc<X>,
        w_desc: &FilterDesc<X>,
        conv: &ConvDesc,
        y_desc: &TensorDesc<Y>,
    ) -> Option<Arc<Entry>> {
        match self.prepare_forward(cudnn, x_desc, w_desc, conv, y_desc) {
            Prepared::Known(_, entry) => Some(entry),
            _ => None,
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
        let entry = self.known_forward(cudnn, x_desc, w_desc, conv, y_desc)?;
        Some(decode(&entry.ranking))
    }

    /// The graph engine configuration remembered for a forward problem under the current policy
    /// and search mode, if a union search chose one (later calls run it, see
    /// [`Autotuner::with_graph_search`]).
    pub fn cached_forward_graph<X: DataType, Y: DataType>(
        &mut self,
        cudnn: &Cudnn,
        x_desc: &TensorDesc<X>,
        w_desc: &FilterDesc<X>,
        conv: &ConvDesc,
        y_desc: &TensorDesc<Y>,
    ) -> Option<Arc<EngineConfig>> {
        let entry = self.known_forward(cudnn, x_desc, w_desc, conv, y_desc)?;
        entry.graph.as_ref().map(|g| g.config.clone())
    }

    /// Saves the cache file if there is one (a failure is logged: the decision stays in memory).
    pub(super) fn persist(&self) {
        if self.path.is_some() {
            if let Err(e) = self.save() {
                log::warn!("autotune cache not saved: {e}");
            }
        }
    }
}

impl Drop for Autotuner {
    fn drop(&mut self) {
        // Decisions are saved as they are made; nothing can fail here.
        self.workspace = None;
    }
}
