//! Engines and engine configurations: heuristic modes, numerical and behaviour notes, knobs and
//! their ranges, and the filter [`OperationGraph::plans`] applies (plans themselves:
//! `plan.rs`).
use std::fmt;
use std::str::FromStr;

use cudnn_safe_sys as sys;

#[cfg(doc)]
use super::build::OperationGraph;
// Plans are built in `plan.rs`; the path `engine::Plan` stays for the modules that import it so.
pub(crate) use super::plan::Plan;
use crate::error::{Error, Result};
use crate::workspace::MAX_WORKSPACE_BYTES;

/// A heuristic mode (`cudnnBackendHeurMode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HeurMode {
    /// The fastest query, least accurate ranking.
    Instant,
    /// The default heuristic (decision tree).
    A,
    /// A neural-network heuristic: slower to query, more accurate.
    B,
    /// Engines that run most graphs, without regard to speed.
    Fallback,
}

impl HeurMode {
    pub(crate) fn raw(self) -> sys::cudnnBackendHeurMode_t {
        use sys::cudnnBackendHeurMode_t as H;
        match self {
            HeurMode::Instant => H::CUDNN_HEUR_MODE_INSTANT,
            HeurMode::A => H::CUDNN_HEUR_MODE_A,
            HeurMode::B => H::CUDNN_HEUR_MODE_B,
            HeurMode::Fallback => H::CUDNN_HEUR_MODE_FALLBACK,
        }
    }
}

/// A numerical property of an engine (`cudnnBackendNumericalNote_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NumericalNote {
    /// Uses tensor cores (TF32 for f32 data: not strict fp32).
    TensorCore,
    /// Converts inputs to a narrower type before computing.
    DownConvertInputs,
    /// Accumulates in a narrower type than the compute type.
    ReducedPrecisionReduction,
    /// Uses an FFT.
    Fft,
    /// Results may differ from run to run (e.g. atomics).
    Nondeterministic,
    /// Uses a Winograd transform.
    Winograd,
    /// Propagates NaN strictly.
    StrictNanProp,
    /// A note this crate does not name (its raw value).
    Other(u32),
}

impl NumericalNote {
    pub(crate) fn from_raw(n: sys::cudnnBackendNumericalNote_t) -> NumericalNote {
        use sys::cudnnBackendNumericalNote_t as N;
        match n {
            N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE => NumericalNote::TensorCore,
            N::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS => NumericalNote::DownConvertInputs,
            N::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION => {
                NumericalNote::ReducedPrecisionReduction
            }
            N::CUDNN_NUMERICAL_NOTE_FFT => NumericalNote::Fft,
            N::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC => NumericalNote::Nondeterministic,
            N::CUDNN_NUMERICAL_NOTE_WINOGRAD => NumericalNote::Winograd,
            N::CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP => NumericalNote::StrictNanProp,
            other => NumericalNote::Other(other.0),
        }
    }
}

/// A behavioural property of an engine (`cudnnBackendBehaviorNote_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BehaviorNote {
    /// Compiles kernels at run time (the first plan build is slow).
    RuntimeCompilation,
    /// Supports cuDNN's native CUDA-graph API.
    SupportsCudaGraphNativeApi,
    /// A note this crate does not name (its raw value).
    Other(u32),
}

impl BehaviorNote {
    pub(crate) fn from_raw(n: sys::cudnnBackendBehaviorNote_t) -> BehaviorNote {
        use sys::cudnnBackendBehaviorNote_t as B;
        match n {
            B::CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION => BehaviorNote::RuntimeCompilation,
            B::CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API => {
                BehaviorNote::SupportsCudaGraphNativeApi
            }
            other => BehaviorNote::Other(other.0),
        }
    }
}

/// An engine and its knob settings: what identifies a plan of a given graph, and all that needs
/// persisting to rebuild it ([`OperationGraph::plan_from_config`]).
///
/// Written as cudnn-frontend writes plan tags: `eng12_k2=1_k5=0` (engine global index, then
/// `knob type = value` pairs); [`FromStr`] reads that form back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EngineConfig {
    /// The engine's global index (`CUDNN_ATTR_ENGINE_GLOBAL_INDEX`).
    pub engine: i64,
    /// Knob choices: (`cudnnBackendKnobType_t` value, knob value).
    pub knobs: Vec<(u32, i64)>,
}

impl fmt::Display for EngineConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "eng{}", self.engine)?;
        for (t, v) in &self.knobs {
            write!(f, "_k{t}={v}")?;
        }
        Ok(())
    }
}

impl FromStr for EngineConfig {
    type Err = Error;
    fn from_str(s: &str) -> Result<EngineConfig> {
        let bad = || Error::invalid("engine configuration", "eng<index>[_k<type>=<value>]...", s);
        let mut parts = s.split('_');
        let engine = parts
            .next()
            .and_then(|p| p.strip_prefix("eng"))
            .and_then(|n| n.parse::<i64>().ok())
            .filter(|&n| n >= 0)
            .ok_or_else(bad)?;
        let mut knobs = Vec::new();
        for p in parts {
            let (t, v) = p
                .strip_prefix('k')
                .and_then(|kv| kv.split_once('='))
                .ok_or_else(bad)?;
            knobs.push((
                t.parse::<u32>().map_err(|_| bad())?,
                v.parse::<i64>().map_err(|_| bad())?,
            ));
        }
        Ok(EngineConfig { engine, knobs })
    }
}

/// The values one knob of an engine accepts (`CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR`): `min` to
/// `max` in steps of `stride`. Read with [`OperationGraph::knob_ranges`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[doc(alias = "CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR")]
pub struct KnobRange {
    /// The knob (`cudnnBackendKnobType_t` value), as in [`EngineConfig::knobs`].
    pub knob: u32,
    /// The smallest value.
    pub min: i64,
    /// The largest value.
    pub max: i64,
    /// The step between values (at least 1).
    pub stride: i64,
}

/// Most values [`KnobRange::values_near`] returns.
pub const MAX_KNOB_VALUES: usize = 16;

impl KnobRange {
    /// Whether `v` is one of the knob's values.
    pub fn contains(&self, v: i64) -> bool {
        // i128: `v - min` of any two i64 values cannot overflow there.
        let stride = i128::from(self.stride.max(1));
        v >= self.min && v <= self.max && (i128::from(v) - i128::from(self.min)) % stride == 0
    }

    /// Up to `n` of the knob's values, those nearest `around` first (all of them, in order, for
    /// a knob with at most `n` values). An empty range (`max < min`) has none. `n` is capped at
    /// 65536: the result is never larger, whatever the range and `n`.
    pub fn values_near(&self, around: i64, n: usize) -> Vec<i64> {
        let n = n.min(1 << 16);
        // i128: `max - min` of an i64 range cannot overflow there.
        let (min, max, stride) = (
            i128::from(self.min),
            i128::from(self.max),
            i128::from(self.stride.max(1)),
        );
        if max < min || n == 0 {
            return Vec::new();
        }
        let count = (max - min) / stride + 1;
        let value = |i: i128| (min + i * stride) as i64;
        if count <= n as i128 {
            return (0..count).map(value).collect();
        }
        // The value at or below `around` in the range, then alternately above and below it.
        let centre = (i128::from(around).clamp(min, max) - min) / stride;
        let mut out = Vec::with_capacity(n);
        out.push(value(centre));
        let mut step = 1;
        while out.len() < n {
            let (up, down) = (centre + step, centre - step);
            if up >= count && down < 0 {
                break;
            }
            if up < count {
                out.push(value(up));
            }
            if down >= 0 && out.len() < n {
                out.push(value(down));
            }
            step += 1;
        }
        out
    }
}

impl EngineConfig {
    /// Checks the knob choices against the knobs an engine has (`ranges`, as
    /// [`OperationGraph::knob_ranges`] reads them): each knob chosen at most once, each one the
    /// engine has, each value in its range. [`Error::InvalidArgument`] naming the knob
    /// otherwise.
    pub fn check_knobs(&self, ranges: &[KnobRange]) -> Result<()> {
        for (i, &(t, v)) in self.knobs.iter().enumerate() {
            if self.knobs[..i].iter().any(|&(u, _)| u == t) {
                return Err(Error::invalid(
                    "engine configuration knob",
                    "each knob chosen once",
                    format!("knob {t} chosen twice in {self}"),
                ));
            }
            let Some(r) = ranges.iter().find(|r| r.knob == t) else {
                return Err(Error::invalid(
                    "engine configuration knob",
                    format!(
                        "a knob of engine {} (it has {:?})",
                        self.engine,
                        ranges.iter().map(|r| r.knob).collect::<Vec<_>>()
                    ),
                    format!("knob {t} in {self}"),
                ));
            };
            if !r.contains(v) {
                return Err(Error::invalid(
                    "engine configuration knob value",
                    format!(
                        "a value of knob {t} of engine {}: {}..={} in steps of {}",
                        self.engine,
                        r.min,
                        r.max,
                        r.stride.max(1)
                    ),
                    format!("{v} in {self}"),
                ));
            }
        }
        Ok(())
    }

    /// The value chosen for `knob`, if the configuration sets it.
    pub fn knob(&self, knob: u32) -> Option<i64> {
        self.knobs.iter().find(|(t, _)| *t == knob).map(|&(_, v)| v)
    }

    /// This configuration with `knob` set to `value` (replaced, or added in knob order).
    #[must_use]
    pub fn with_knob(&self, knob: u32, value: i64) -> EngineConfig {
        let mut c = self.clone();
        match c.knobs.iter_mut().find(|(t, _)| *t == knob) {
            Some(kv) => kv.1 = value,
            None => {
                c.knobs.push((knob, value));
                c.knobs.sort_by_key(|&(t, _)| t);
            }
        }
        c
    }
}

/// Which engine configurations [`OperationGraph::plans`] proposes and keeps.
///
/// The default asks heuristics A then fallback, keeps every configuration, and caps the
/// workspace at [`MAX_WORKSPACE_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PlanFilter {
    pub(crate) modes: Vec<HeurMode>,
    pub(crate) all_engines: bool,
    deterministic: bool,
    no_tensor_cores: bool,
    no_down_conversion: bool,
    no_reduced_precision: bool,
    no_runtime_compilation: bool,
    cuda_graph_native: bool,
    pub(crate) max_workspace: usize,
    pub(crate) max_plans: Option<usize>,
}

impl Default for PlanFilter {
    fn default() -> Self {
        PlanFilter {
            modes: vec![HeurMode::A, HeurMode::Fallback],
            all_engines: false,
            deterministic: false,
            no_tensor_cores: false,
            no_down_conversion: false,
            no_reduced_precision: false,
            no_runtime_compilation: false,
            cuda_graph_native: false,
            max_workspace: MAX_WORKSPACE_BYTES,
            max_plans: None,
        }
    }
}

impl PlanFilter {
    /// The default filter.
    pub fn new() -> Self {
        Self::default()
    }
    /// The heuristic modes asked, in order (their proposals are concatenated, duplicates
    /// dropped).
    #[must_use]
    pub fn with_heuristics(mut self, modes: &[HeurMode]) -> Self {
        self.modes = modes.to_vec();
        self
    }
    /// Also enumerates every engine of the graph (`0..engine_count`) with default knobs, after
    /// the heuristics' proposals.
    #[must_use]
    pub fn with_all_engines(mut self, yes: bool) -> Self {
        self.all_engines = yes;
        self
    }
    /// Keeps only deterministic engines (no [`NumericalNote::Nondeterministic`]).
    #[must_use]
    pub fn with_deterministic(mut self, yes: bool) -> Self {
        self.deterministic = yes;
        self
    }
    /// Drops tensor-core engines: strict fp32 for f32 data (PyTorch's `allow_tf32 = False`).
    #[must_use]
    pub fn with_no_tensor_cores(mut self, yes: bool) -> Self {
        self.no_tensor_cores = yes;
        self
    }
    /// Drops engines that convert inputs to a narrower type.
    #[must_use]
    pub fn with_no_down_conversion(mut self, yes: bool) -> Self {
        self.no_down_conversion = yes;
        self
    }
    /// Drops engines that accumulate in a narrower type than the compute type.
    #[must_use]
    pub fn with_no_reduced_precision(mut self, yes: bool) -> Self {
        self.no_reduced_precision = yes;
        self
    }
    /// Drops engines that compile kernels at run time.
    #[must_use]
    pub fn with_no_runtime_compilation(mut self, yes: bool) -> Self {
        self.no_runtime_compilation = yes;
        self
    }
    /// Keeps only engines with [`BehaviorNote::SupportsCudaGraphNativeApi`]: plans that
    /// [`Cudnn::populate_cuda_graph`](crate::Cudnn::populate_cuda_graph) accepts.
    #[must_use]
    #[doc(alias = "CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API")]
    pub fn with_cuda_graph_native(mut self, yes: bool) -> Self {
        self.cuda_graph_native = yes;
        self
    }
    /// Drops plans needing more workspace than `bytes` (capped at [`MAX_WORKSPACE_BYTES`]).
    #[must_use]
    pub fn with_workspace_limit(mut self, bytes: usize) -> Self {
        self.max_workspace = bytes.min(MAX_WORKSPACE_BYTES);
        self
    }
    /// Stops after this many plans are built (`None`: all).
    #[must_use]
    pub fn with_max_plans(mut self, n: Option<usize>) -> Self {
        self.max_plans = n;
        self
    }
    /// The workspace cap in bytes.
    pub fn workspace_limit(&self) -> usize {
        self.max_workspace
    }

    /// Why a configuration with these notes is refused, if it is.
    pub fn refuse(
        &self,
        notes: &[NumericalNote],
        behavior: &[BehaviorNote],
    ) -> Option<&'static str> {
        let has = |n: NumericalNote| notes.contains(&n);
        if self.deterministic && has(NumericalNote::Nondeterministic) {
            return Some("nondeterministic");
        }
        if self.no_tensor_cores && has(NumericalNote::TensorCore) {
            return Some("uses tensor cores");
        }
        if self.no_down_conversion && has(NumericalNote::DownConvertInputs) {
            return Some("down-converts inputs");
        }
        if self.no_reduced_precision && has(NumericalNote::ReducedPrecisionReduction) {
            return Some("reduced-precision reduction");
        }
        if self.no_runtime_compilation && behavior.contains(&BehaviorNote::RuntimeCompilation) {
            return Some("compiles at run time");
        }
        if self.cuda_graph_native && !behavior.contains(&BehaviorNote::SupportsCudaGraphNativeApi) {
            return Some("no native CUDA graph support");
        }
        None
    }
}

/// A configuration or plan that [`OperationGraph::plans`] did not keep, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The configuration ([`EngineConfig`]'s form), or the heuristic mode that failed.
    pub name: String,
    /// Why: a filter, the workspace limit, or the cuDNN error of a plan that did not finalize.
    pub reason: String,
}

/// The result of [`OperationGraph::plans`]: the plans built, in proposal order, and what was
/// skipped.
#[derive(Debug)]
pub struct PlanList {
    /// Finalized plans, in the order the heuristics ranked them.
    pub plans: Vec<Plan>,
    /// Configurations refused by the filter or that failed to build.
    pub skipped: Vec<Skipped>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_knob_ranges_list_every_value() {
        let r = KnobRange {
            knob: 2,
            min: 0,
            max: 6,
            stride: 2,
        };
        assert_eq!(r.values_near(4, 16), vec![0, 2, 4, 6]);
        assert!(r.contains(4) && !r.contains(3) && !r.contains(8) && !r.contains(-2));
        let empty = KnobRange {
            knob: 2,
            min: 3,
            max: 1,
            stride: 1,
        };
        assert!(empty.values_near(2, 16).is_empty());
        assert!(r.values_near(2, 0).is_empty());
    }

    #[test]
    fn large_knob_ranges_give_the_values_nearest_the_current_one() {
        let r = KnobRange {
            knob: 27,
            min: 1,
            max: 1000,
            stride: 1,
        };
        let v = r.values_near(500, 5);
        assert_eq!(v, vec![500, 501, 499, 502, 498]);
        // At the edge the values come from one side; outside the range, from the nearest edge.
        assert_eq!(r.values_near(1, 4), vec![1, 2, 3, 4]);
        assert_eq!(r.values_near(5000, 3), vec![1000, 999, 998]);
        // A huge range does not overflow the count.
        let huge = KnobRange {
            knob: 1,
            min: i64::MIN,
            max: i64::MAX,
            stride: 1,
        };
        assert_eq!(huge.values_near(0, 3), vec![0, 1, -1]);
        // A zero stride is read as 1.
        let zero = KnobRange {
            knob: 1,
            min: 0,
            max: 2,
            stride: 0,
        };
        assert_eq!(zero.values_near(0, 8), vec![0, 1, 2]);
    }

    #[test]
    fn knob_choices_are_checked_against_the_engine_ranges() {
        let ranges = [
            KnobRange {
                knob: 2,
                min: 0,
                max: 6,
                stride: 2,
            },
            KnobRange {
                knob: 27,
                min: -1,
                max: 1000,
                stride: 1,
            },
        ];
        let ok: EngineConfig = "eng3_k2=4_k27=-1".parse().unwrap();
        assert!(ok.check_knobs(&ranges).is_ok());
        for bad in [
            "eng3_k2=3",      // off the stride
            "eng3_k2=8",      // past the maximum
            "eng3_k27=-2",    // below the minimum
            "eng3_k5=0",      // a knob the engine does not have
            "eng3_k2=0_k2=2", // a knob chosen twice
            "eng3_k27=9223372036854775807",
        ] {
            let c: EngineConfig = bad.parse().unwrap();
            assert!(
                matches!(c.check_knobs(&ranges), Err(Error::InvalidArgument { .. })),
                "{bad}"
            );
        }
        // No knobs: nothing to refuse.
        assert!("eng3"
            .parse::<EngineConfig>()
            .unwrap()
            .check_knobs(&[])
            .is_ok());
    }

    #[test]
    fn with_knob_replaces_or_adds_in_knob_order() {
        let c: EngineConfig = "eng62_k2=7_k13=1_k27=4".parse().unwrap();
        assert_eq!(c.knob(13), Some(1));
        assert_eq!(c.knob(5), None);
        assert_eq!(c.with_knob(13, 0).to_string(), "eng62_k2=7_k13=0_k27=4");
        assert_eq!(
            c.with_knob(18, 3).to_string(),
            "eng62_k2=7_k13=1_k18=3_k27=4"
        );
        assert_eq!(
            EngineConfig {
                engine: 5,
                knobs: vec![]
            }
            .with_knob(1, 2)
            .to_string(),
            "eng5_k1=2"
        );
    }
}
