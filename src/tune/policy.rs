//! The tuner's public vocabulary: how it chooses ([`Policy`]), what it chose ([`Choice`],
//! [`Candidate`], [`Source`]), what it counted ([`Stats`]) and what a warm-up did ([`WarmUp`]).
use std::time::Duration;

use super::ConvApi;
use crate::conv::{ConvBwdDataAlgo, ConvBwdFilterAlgo, ConvFwdAlgo};
use crate::dtype::DType;

/// Most graph plans in a union search's finals by default (the fastest of the first pass; see
/// [`Autotuner::with_finalists`](super::Autotuner::with_finalists)).
pub const DEFAULT_FINALISTS: usize = 6;

/// Wall-clock milliseconds each finalist runs alone before it is timed in a sweep, by default
/// (at the power limit, a plan's sustained speed depends on its own power draw, which
/// interleaved short rounds cannot see; see [`Autotuner::with_final_solo_ms`](super::Autotuner::with_final_solo_ms)).
pub const DEFAULT_FINAL_SOLO_MS: f32 = 25.0;

/// Graph plans a union search builds and times per source by default (heuristics A, B when
/// [`Autotuner::with_heuristics_b`](super::Autotuner::with_heuristics_b) asks for it, the fallback list, every engine with its default
/// knobs). See [`Autotuner::with_graph_plans`](super::Autotuner::with_graph_plans).
pub const DEFAULT_GRAPH_PLANS: usize = 24;

/// Fastest graph plans of a union search's first pass whose knob neighbourhoods are searched by
/// default. See [`Autotuner::with_refine_knobs`](super::Autotuner::with_refine_knobs).
pub const DEFAULT_REFINE_KNOBS: usize = 2;

/// How many times faster than the legacy favourite (both timed as plain calls) a decision's
/// graph plan must be for a call with `alpha ≠ 1` or `beta ≠ 0` to run it: the plan writes into
/// scratch memory and `cudnnAddTensor` then computes `alpha·scratch + beta·out`, an extra pass
/// over the output that the legacy call, which accumulates itself, does not make. Below this
/// margin such calls run the legacy favourite.
pub const COMPOSED_MIN_SPEEDUP: f32 = 1.5;

/// How much a benchmark policy's first call of a new convolution problem searches
/// ([`Autotuner::with_effort`](super::Autotuner::with_effort)): the cost of a cold start
/// against the certainty of the steady-state pick. Each preset sets the knobs below it; a knob
/// set after the preset overrides it.
///
/// | | [`Thorough`](SearchEffort::Thorough) (default) | [`Quick`](SearchEffort::Quick) |
/// |---|---|---|
/// | legacy benchmark (`cudnnFind…`) | twice, each algorithm keeps its better time | once; none in f16/bf16 (see below) |
/// | graph plans from heuristics A ([`with_graph_plans`](super::Autotuner::with_graph_plans)) | 24 | 4 |
/// | fallback list | 24 more | only when A proposes nothing |
/// | engine list (every engine, default knobs) | 24 more | no |
/// | configurations that won this tuner's earlier searches of the same kind | no | yes |
/// | knob refinement ([`with_refine_knobs`](super::Autotuner::with_refine_knobs)) | 2 plans | none |
/// | finals ([`with_finalists`](super::Autotuner::with_finalists)) | 6 | none |
///
/// In f16 and bf16, where the graph engines (tensor cores, NHWC) beat the legacy algorithms by
/// far, `Quick` ranks the legacy algorithms by cuDNN's heuristics (`cudnnGet…_v7`) without
/// running them; the union search then times the first of them against the graph plans as
/// always. The legacy ranking serves the calls the graph path does not (no plan runs, or an
/// accumulating call whose plan is not [`COMPOSED_MIN_SPEEDUP`] times faster).
///
/// "The same kind" is the same direction, data types, compute type and math type: the engine
/// configurations that won a network's earlier layers are tried on its later ones (those that
/// do not support a problem fail to build and cost little). Neither preset changes what is
/// cached: a decision made under either serves both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SearchEffort {
    /// Every source, knob refinement and the finals: the surest steady-state pick, the
    /// slowest first call (a fraction of a second to a few seconds per problem).
    #[default]
    Thorough,
    /// The heuristics' first proposals, the winners of earlier problems and one legacy
    /// benchmark (none in half precision); the first pass decides: a first call several times
    /// cheaper.
    Quick,
}

impl SearchEffort {
    /// Short name (`"thorough"`, `"quick"`).
    pub fn name(self) -> &'static str {
        match self {
            SearchEffort::Thorough => "thorough",
            SearchEffort::Quick => "quick",
        }
    }
    /// Times the legacy benchmark runs.
    pub(super) fn find_runs(self) -> usize {
        match self {
            SearchEffort::Thorough => 2,
            SearchEffort::Quick => 1,
        }
    }
    /// Whether the fallback list and the engine list add plans whatever heuristics A proposed.
    pub(super) fn every_source(self) -> bool {
        self == SearchEffort::Thorough
    }
    /// Whether a half-precision problem that the union search will time ranks its legacy
    /// algorithms by cuDNN's heuristics instead of the legacy benchmark.
    pub(super) fn untimed_legacy(self, dtype: DType) -> bool {
        self == SearchEffort::Quick && matches!(dtype, DType::F16 | DType::BF16)
    }
    /// Whether earlier winners of the same kind join a search.
    pub(super) fn carries_winners(self) -> bool {
        self == SearchEffort::Quick
    }
    /// The preset's `(graph plans, refined plans, finalists)`.
    pub(super) fn knobs(self) -> (usize, usize, usize) {
        match self {
            SearchEffort::Thorough => {
                (DEFAULT_GRAPH_PLANS, DEFAULT_REFINE_KNOBS, DEFAULT_FINALISTS)
            }
            SearchEffort::Quick => (QUICK_GRAPH_PLANS, 0, 0),
        }
    }
}

impl std::str::FromStr for SearchEffort {
    type Err = crate::Error;
    /// `"thorough"` or `"quick"` (as [`SearchEffort::name`] writes them).
    fn from_str(s: &str) -> crate::Result<Self> {
        match s {
            "thorough" => Ok(SearchEffort::Thorough),
            "quick" => Ok(SearchEffort::Quick),
            _ => Err(crate::Error::invalid(
                "search effort",
                "\"thorough\" or \"quick\"",
                s.to_string(),
            )),
        }
    }
}

/// Graph plans from heuristics A under [`SearchEffort::Quick`].
pub const QUICK_GRAPH_PLANS: usize = 4;

/// Most earlier winners of one kind [`SearchEffort::Quick`] carries into a search (the most
/// recent).
pub(super) const MAX_CARRIED: usize = 4;

/// How an [`Autotuner`](super::Autotuner) picks a convolution algorithm.
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
    pub(super) fn code(self) -> i64 {
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

/// What an [`Autotuner`](super::Autotuner) call ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice<A> {
    /// The legacy algorithm that ran; when a graph engine ran instead ([`Choice::api`] is
    /// [`ConvApi::Graph`]), the legacy algorithm ranked first for the problem (the one that runs
    /// whenever the graph path does not apply, e.g. a fused call with a residual `z`).
    pub algo: A,
    /// Where the ranking came from.
    pub source: Source,
    /// Its position in the ranking (0 unless earlier candidates could not run).
    pub rank: usize,
    /// Bytes of workspace the tuner holds after the call: at least what the algorithm used (the
    /// workspace only grows, so an earlier, larger request can make it bigger).
    pub workspace: usize,
    /// The API that ran: [`ConvApi::Legacy`] (`algo`), or [`ConvApi::Graph`] with the engine
    /// configuration of the graph plan a union search chose ([`Autotuner::with_graph_search`](super::Autotuner::with_graph_search)).
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

/// Counters of an [`Autotuner`](super::Autotuner).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
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
    /// contested or [`Autotuner::with_finalists`](super::Autotuner::with_finalists) is 0.
    pub finalists: u64,
    /// Wall time of the legacy benchmarks (`cudnnFind…`: every legacy algorithm run and timed).
    pub find: Duration,
    /// Wall time of the union searches' finals (part of `graph_search`).
    pub graph_finals: Duration,
    /// Graph plans a union search tried because they had won an earlier search of the same
    /// kind ([`SearchEffort::Quick`]; part of `graph_plans`).
    pub carried: u64,
    /// Union searches won by such a carried plan.
    pub carried_wins: u64,
}

/// What [`Autotuner::warm_up`](super::Autotuner::warm_up) did.
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
    /// Graph plans rebuilt before the replays, at once on [`crate::graph::build_threads`]
    /// threads.
    pub built: usize,
    /// Wall time of those builds (part of `elapsed`).
    pub building: Duration,
    /// Wall time of the warm-up, the GPU work included.
    pub elapsed: Duration,
}
