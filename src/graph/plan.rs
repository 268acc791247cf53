//! Execution plans: asking the heuristics (or every engine) for configurations, filtering them,
//! building and keeping the plans ([`OperationGraph::plans`]), and rebuilding a known
//! configuration.
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use cudnn_safe_sys as sys;
use cudnn_safe_sys::Library;

use super::backend::{attr, kind, Desc};
use super::build::{GraphInner, OperationGraph};
use super::engine::{
    BehaviorNote, EngineConfig, HeurMode, KnobRange, NumericalNote, PlanFilter, PlanList, Skipped,
    MAX_KNOB_VALUES,
};
use super::parallel;
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::workspace::MAX_WORKSPACE_BYTES;

/// An engine configuration with the descriptors it refers to.
struct Candidate {
    cfg: Desc,
    knobs: Vec<Desc>,
    engine: Desc,
    config: EngineConfig,
    notes: Vec<NumericalNote>,
    behavior: Vec<BehaviorNote>,
}

/// Room for notes: more than cuDNN 9.14 defines of either kind.
const MAX_NOTES: usize = 64;

fn knob_count() -> usize {
    sys::cudnnBackendKnobType_t::CUDNN_KNOB_TYPE_COUNTS.0 as usize
}

/// Reads an engine's notes.
fn engine_notes(engine: &Desc) -> Result<(Vec<NumericalNote>, Vec<BehaviorNote>)> {
    let notes = engine
        .get(
            attr!(CUDNN_ATTR_ENGINE_NUMERICAL_NOTE),
            MAX_NOTES,
            sys::cudnnBackendNumericalNote_t(u32::MAX),
        )?
        .into_iter()
        .map(NumericalNote::from_raw)
        .collect();
    // Behaviour notes are informational; an engine that cannot report them has none we filter.
    let behavior = engine
        .get(
            attr!(CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE),
            MAX_NOTES,
            sys::cudnnBackendBehaviorNote_t(u32::MAX),
        )
        .unwrap_or_default()
        .into_iter()
        .map(BehaviorNote::from_raw)
        .collect();
    Ok((notes, behavior))
}

/// An engine's knob ranges (the engine descriptor is finalized).
fn knob_ranges_of(lib: &'static Library, engine: &Desc) -> Result<Vec<KnobRange>> {
    let mut infos = (0..knob_count())
        .map(|_| Desc::new(lib, kind!(CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR)))
        .collect::<Result<Vec<_>>>()?;
    let n = engine.get_descs(attr!(CUDNN_ATTR_ENGINE_KNOB_INFO), &mut infos)?;
    infos.truncate(n);
    let mut out = Vec::with_capacity(n);
    for i in &infos {
        let t = i.get(
            attr!(CUDNN_ATTR_KNOB_INFO_TYPE),
            1,
            sys::cudnnBackendKnobType_t(u32::MAX),
        )?;
        let Some(t) = t.first() else { continue };
        out.push(KnobRange {
            knob: t.0,
            min: i.get_i64(attr!(CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE))?,
            max: i.get_i64(attr!(CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE))?,
            stride: i.get_i64(attr!(CUDNN_ATTR_KNOB_INFO_STRIDE))?.max(1),
        });
    }
    Ok(out)
}

/// Describes a finalized engine configuration proposed by a heuristic.
/// Whether the candidate's engine compiles its kernel at run time (its plan is then worth
/// building on another thread, see [`parallel`]).
fn compiles(c: &Candidate) -> bool {
    c.behavior.contains(&BehaviorNote::RuntimeCompilation)
}

/// Finalizes the execution plan of candidate `c` of `graph` with `handle` (on any thread: see
/// [`parallel`]).
fn finalize(
    lib: &'static Library,
    handle: parallel::SharedHandle,
    graph: Arc<GraphInner>,
    c: Candidate,
) -> Result<Plan> {
    let mut p = Desc::new(lib, kind!(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR))?;
    p.set1(attr!(CUDNN_ATTR_EXECUTION_PLAN_HANDLE), handle.raw())?;
    p.set_descs(attr!(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG), &[&c.cfg])?;
    p.finalize()?;
    let ws = p.get_i64(attr!(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE))?;
    let workspace = usize::try_from(ws)
        .ok()
        .filter(|&w| w <= MAX_WORKSPACE_BYTES)
        .ok_or_else(|| {
            Error::invalid(
                "plan workspace size",
                format!("0 to {MAX_WORKSPACE_BYTES} bytes"),
                ws,
            )
        })?;
    Ok(Plan {
        plan: p,
        cfg: c.cfg,
        knobs: c.knobs,
        engine: c.engine,
        graph,
        workspace,
        config: c.config,
        notes: c.notes,
        behavior: c.behavior,
        pack: RefCell::new(None),
    })
}

fn describe(lib: &'static Library, cfg: Desc) -> Result<Candidate> {
    let mut engine = vec![Desc::new(lib, kind!(CUDNN_BACKEND_ENGINE_DESCRIPTOR))?];
    let n = cfg.get_descs(attr!(CUDNN_ATTR_ENGINECFG_ENGINE), &mut engine)?;
    let (1, Some(engine)) = (n, engine.pop()) else {
        return Err(Error::Cudnn {
            status: crate::Status::BAD_PARAM,
            function: "cudnnBackendGetAttribute",
            message: "CUDNN_ATTR_ENGINECFG_ENGINE returned no engine".into(),
        });
    };
    let id = engine.get_i64(attr!(CUDNN_ATTR_ENGINE_GLOBAL_INDEX))?;
    let (notes, behavior) = engine_notes(&engine)?;
    let mut knobs = (0..knob_count())
        .map(|_| Desc::new(lib, kind!(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR)))
        .collect::<Result<Vec<_>>>()?;
    let n = cfg.get_descs(attr!(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES), &mut knobs)?;
    knobs.truncate(n);
    let mut pairs = Vec::with_capacity(n);
    for k in &knobs {
        let t = k.get(
            attr!(CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE),
            1,
            sys::cudnnBackendKnobType_t(u32::MAX),
        )?;
        let v = k.get_i64(attr!(CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE))?;
        if let Some(t) = t.first() {
            pairs.push((t.0, v));
        }
    }
    Ok(Candidate {
        cfg,
        knobs,
        engine,
        config: EngineConfig {
            engine: id,
            knobs: pairs,
        },
        notes,
        behavior,
    })
}

/// An execution plan (`CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR`): a graph bound to one engine
/// configuration on one handle, ready for [`Cudnn::execute`].
///
/// It keeps its graph, engine and configuration alive. It is `Send` but not `Sync` (it caches
/// the variant pack of its last execution); it runs only on the handle it was built on.
pub struct Plan {
    pub(crate) plan: Desc,
    #[allow(dead_code)] // kept alive: the plan refers to it
    cfg: Desc,
    #[allow(dead_code)] // kept alive: the configuration refers to them
    knobs: Vec<Desc>,
    #[allow(dead_code)] // kept alive: the configuration refers to it
    engine: Desc,
    pub(crate) graph: Arc<GraphInner>,
    workspace: usize,
    config: EngineConfig,
    notes: Vec<NumericalNote>,
    behavior: Vec<BehaviorNote>,
    /// The variant pack of the last execution, reused while its pointers stay the same.
    pub(crate) pack: RefCell<Option<super::exec::PackCache>>,
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan")
            .field("config", &self.config.to_string())
            .field("workspace", &self.workspace)
            .field("notes", &self.notes)
            .finish()
    }
}

impl Plan {
    /// Workspace bytes an execution needs (`CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE`).
    #[doc(alias = "CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE")]
    pub fn workspace_size(&self) -> usize {
        self.workspace
    }
    /// The engine's global index.
    pub fn engine_id(&self) -> i64 {
        self.config.engine
    }
    /// The engine configuration (engine and knobs).
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }
    /// The plan's tag, cudnn-frontend style (`eng12_k2=1_k5=0`).
    pub fn name(&self) -> String {
        self.config.to_string()
    }
    /// The engine's numerical notes.
    pub fn numerical_notes(&self) -> &[NumericalNote] {
        &self.notes
    }
    /// The engine's behaviour notes.
    pub fn behavior_notes(&self) -> &[BehaviorNote] {
        &self.behavior
    }
    /// Whether the engine is deterministic.
    pub fn is_deterministic(&self) -> bool {
        !self.notes.contains(&NumericalNote::Nondeterministic)
    }
    /// Whether the engine uses tensor cores.
    pub fn uses_tensor_cores(&self) -> bool {
        self.notes.contains(&NumericalNote::TensorCore)
    }
    /// The signature of the graph the plan runs.
    pub fn signature(&self) -> &str {
        &self.graph.signature
    }

    /// Lets the plan execute with the tensor ids of `og`, another graph of the same signature
    /// (e.g. the same layer's graph rebuilt, receiving a plan from a [`super::PlanCache`], which
    /// calls this on every hit). Errors if the signatures differ.
    pub fn share_with(&self, og: &OperationGraph) -> Result<()> {
        self.graph.add_alias(&og.inner)
    }

    /// cuDNN's JSON serialization of the plan (`CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION`).
    #[doc(alias = "CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION")]
    pub fn json(&self, cudnn: &Cudnn) -> Result<String> {
        self.graph.check_handle(cudnn)?;
        let a = attr!(CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION);
        let n = self
            .plan
            .count(a, sys::cudnnBackendAttributeType_t::CUDNN_TYPE_CHAR)?;
        let bytes = self.plan.get::<u8>(a, n, 0)?;
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
    }

    /// The raw plan descriptor, for backend calls this crate does not wrap. It stays owned by
    /// `self`.
    pub fn as_raw(&self) -> sys::cudnnBackendDescriptor_t {
        self.plan.as_raw()
    }
}

impl OperationGraph {
    /// Engine configurations proposed by one heuristic mode.
    fn heuristic(&self, lib: &'static Library, mode: HeurMode) -> Result<Vec<Desc>> {
        let mut h = Desc::new(lib, kind!(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR))?;
        h.set_descs(
            attr!(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH),
            &[&self.inner.graph],
        )?;
        h.set1(attr!(CUDNN_ATTR_ENGINEHEUR_MODE), mode.raw())?;
        h.finalize()?;
        let a = attr!(CUDNN_ATTR_ENGINEHEUR_RESULTS);
        let n = h.count(
            a,
            sys::cudnnBackendAttributeType_t::CUDNN_TYPE_BACKEND_DESCRIPTOR,
        )?;
        let mut cfgs = (0..n)
            .map(|_| Desc::new(lib, kind!(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)))
            .collect::<Result<Vec<_>>>()?;
        if n > 0 {
            let got = h.get_descs(a, &mut cfgs)?;
            cfgs.truncate(got);
        }
        Ok(cfgs)
    }

    /// An engine configuration built here: engine `id` of this graph with the given knobs.
    /// The finalized engine descriptor of engine `id` for this graph.
    fn engine_desc(&self, lib: &'static Library, id: i64) -> Result<Desc> {
        let mut engine = Desc::new(lib, kind!(CUDNN_BACKEND_ENGINE_DESCRIPTOR))?;
        engine.set_descs(
            attr!(CUDNN_ATTR_ENGINE_OPERATION_GRAPH),
            &[&self.inner.graph],
        )?;
        engine.set1(attr!(CUDNN_ATTR_ENGINE_GLOBAL_INDEX), id)?;
        engine.finalize()?;
        Ok(engine)
    }

    fn configure(&self, lib: &'static Library, config: &EngineConfig) -> Result<Candidate> {
        let engine = self.engine_desc(lib, config.engine)?;
        let mut knobs = Vec::with_capacity(config.knobs.len());
        for &(t, v) in &config.knobs {
            let mut k = Desc::new(lib, kind!(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR))?;
            k.set1(
                attr!(CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE),
                sys::cudnnBackendKnobType_t(t),
            )?;
            k.set1(attr!(CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE), v)?;
            k.finalize()?;
            knobs.push(k);
        }
        let mut cfg = Desc::new(lib, kind!(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))?;
        cfg.set_descs(attr!(CUDNN_ATTR_ENGINECFG_ENGINE), &[&engine])?;
        if !knobs.is_empty() {
            let refs: Vec<&Desc> = knobs.iter().collect();
            cfg.set_descs(attr!(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES), &refs)?;
        }
        cfg.finalize()?;
        let (notes, behavior) = engine_notes(&engine)?;
        Ok(Candidate {
            cfg,
            knobs,
            engine,
            config: config.clone(),
            notes,
            behavior,
        })
    }

    /// Finalizes a plan for a candidate on `cudnn`.
    fn finish(&self, cudnn: &Cudnn, c: Candidate) -> Result<Plan> {
        let handle = parallel::SharedHandle::of(cudnn);
        finalize(cudnn.lib(), handle, self.inner.clone(), c)
    }

    /// Finalizes plans for `candidates` on [`parallel::build_threads`] threads; the results in
    /// the candidates' order.
    fn finish_all(&self, cudnn: &Cudnn, candidates: Vec<Candidate>) -> Vec<Result<Plan>> {
        let lib = cudnn.lib();
        let threads = parallel::build_threads();
        parallel::run(cudnn, candidates, threads, compiles, |h, c| {
            finalize(lib, h, self.inner.clone(), c)
        })
    }

    /// Asks the heuristics (and, if the filter says so, every engine) for configurations, drops
    /// those the filter refuses, and builds a plan for each of the others; configurations whose
    /// plan does not finalize or needs more workspace than the filter allows are skipped (logged
    /// at debug level and listed in [`PlanList::skipped`]).
    ///
    /// The list returned holds at least one plan. When none remains: cuDNN's own error when
    /// every refusal came from cuDNN (e.g. `CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN`, so callers
    /// can match its status), else [`Error::NoEngine`] naming the graph's operations and listing
    /// what was skipped and why.
    #[doc(alias = "CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR")]
    #[doc(alias = "CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR")]
    pub fn plans(&self, cudnn: &Cudnn, filter: &PlanFilter) -> Result<PlanList> {
        self.inner.check_handle(cudnn)?;
        cudnn.bind()?;
        let mut s = Search {
            og: self,
            cudnn,
            filter,
            plans: Vec::new(),
            skipped: Vec::new(),
            seen: HashSet::new(),
            pending: Vec::new(),
            last_error: None,
        };
        for &mode in &filter.modes {
            s.heuristic(mode);
        }
        if filter.all_engines {
            s.every_engine()?;
        }
        s.flush();
        s.finish()
    }

    /// The first plan [`OperationGraph::plans`] would list (the heuristics' best that builds
    /// and passes `filter`), building no other: the same errors when there is none.
    ///
    /// ```no_run
    /// # fn f(cudnn: &cudnn_safe::Cudnn, og: &cudnn_safe::graph::OperationGraph)
    /// #     -> cudnn_safe::Result<()> {
    /// use cudnn_safe::graph::PlanFilter;
    /// let plan = og.plan(cudnn, &PlanFilter::default())?;
    /// println!("{} needs {} workspace bytes", plan.name(), plan.workspace_size());
    /// # Ok(()) }
    /// ```
    pub fn plan(&self, cudnn: &Cudnn, filter: &PlanFilter) -> Result<Plan> {
        let first = filter.clone().with_max_plans(Some(1));
        let list = self.plans(cudnn, &first)?;
        list.plans
            .into_iter()
            .next()
            .ok_or_else(|| self.no_engine(&list.skipped))
    }

    /// [`Error::NoEngine`] for this graph, with what was skipped.
    fn no_engine(&self, skipped: &[Skipped]) -> Error {
        let mut detail: Vec<String> = skipped
            .iter()
            .map(|s| format!("{}: {}", s.name, s.reason))
            .collect();
        if detail.is_empty() {
            detail.push("the heuristics proposed no engine configuration".into());
        }
        Error::NoEngine {
            graph: self.graph().op_names(),
            detail: detail.join("; "),
        }
    }

    /// The knobs of engine `engine` for this graph and the values each accepts
    /// (`CUDNN_ATTR_ENGINE_KNOB_INFO`). Errors when the engine does not support the graph.
    #[doc(alias = "CUDNN_ATTR_ENGINE_KNOB_INFO")]
    pub fn knob_ranges(&self, cudnn: &Cudnn, engine: i64) -> Result<Vec<KnobRange>> {
        self.inner.check_handle(cudnn)?;
        // The engine alone: a configuration without knob choices does not finalize for every
        // engine (the SDPA backward engines want a kernel configuration).
        let e = self.engine_desc(cudnn.lib(), engine)?;
        knob_ranges_of(cudnn.lib(), &e)
    }

    /// The configurations that differ from `config` in one knob: for each knob of its engine,
    /// up to [`MAX_KNOB_VALUES`] values nearest the current one (or the knob's smallest value
    /// when `config` leaves it unset). Heuristics propose a few points of this space; a search
    /// around the fastest of them (as the union autotune does,
    /// [`Autotuner::with_refine_knobs`](crate::Autotuner::with_refine_knobs)) times kernels no heuristic
    /// proposed. Not every neighbour builds: [`OperationGraph::plan_from_config`] refuses those
    /// the engine does not support for this graph.
    ///
    /// ```no_run
    /// # fn f(cudnn: &cudnn_safe::Cudnn, og: &cudnn_safe::graph::OperationGraph,
    /// #      plan: &cudnn_safe::graph::Plan) -> cudnn_safe::Result<()> {
    /// for config in og.knob_neighbours(cudnn, plan.config())? {
    ///     if let Ok(p) = og.plan_from_config(cudnn, &config) {
    ///         println!("{} needs {} workspace bytes", p.name(), p.workspace_size());
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn knob_neighbours(
        &self,
        cudnn: &Cudnn,
        config: &EngineConfig,
    ) -> Result<Vec<EngineConfig>> {
        let ranges = self.knob_ranges(cudnn, config.engine)?;
        let mut out = Vec::new();
        for r in ranges {
            let current = config.knob(r.knob);
            for v in r.values_near(current.unwrap_or(r.min), MAX_KNOB_VALUES) {
                if Some(v) != current {
                    out.push(config.with_knob(r.knob, v));
                }
            }
        }
        Ok(out)
    }

    /// Rebuilds the plan of a known engine configuration (e.g. one persisted by a
    /// [`super::PlanCache`] or read from [`Plan::config`]) without asking the heuristics.
    ///
    /// The configuration is data to check, not to trust (it may come from a file): its engine
    /// index must be one of the graph's engines and its knobs must pass
    /// [`EngineConfig::check_knobs`] against the engine's own knob ranges, else
    /// [`Error::InvalidArgument`] before any knob reaches cuDNN.
    pub fn plan_from_config(&self, cudnn: &Cudnn, config: &EngineConfig) -> Result<Plan> {
        let c = self.candidate_from_config(cudnn, config)?;
        self.finish(cudnn, c)
    }

    /// The candidate of [`Self::plan_from_config`], not finalized yet.
    fn candidate_from_config(&self, cudnn: &Cudnn, config: &EngineConfig) -> Result<Candidate> {
        self.inner.check_handle(cudnn)?;
        cudnn.bind()?;
        let lib = cudnn.lib();
        let count = self
            .inner
            .graph
            .get_i64(attr!(CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT))?;
        if !(0..count).contains(&config.engine) {
            return Err(Error::invalid(
                "engine configuration engine",
                format!("an engine index in 0..{count} (the graph's engines)"),
                config.engine,
            ));
        }
        let engine = self.engine_desc(lib, config.engine)?;
        config.check_knobs(&knob_ranges_of(lib, &engine)?)?;
        self.configure(lib, config)
    }
}

/// [`OperationGraph::plan_from_config`] for several graphs and configurations, the plans
/// finalized at once on [`parallel::build_threads`] threads; the results in the jobs' order.
pub(crate) fn plans_from_configs(
    cudnn: &Cudnn,
    jobs: &[(&OperationGraph, &EngineConfig)],
) -> Vec<Result<Plan>> {
    let mut out: Vec<Result<Plan>> = Vec::with_capacity(jobs.len());
    let (mut slots, mut todo) = (Vec::new(), Vec::new());
    for (i, (og, config)) in jobs.iter().enumerate() {
        match og.candidate_from_config(cudnn, config) {
            Ok(c) => {
                slots.push(i);
                todo.push((og.inner.clone(), c));
                // Replaced by the build's result below.
                out.push(Err(Error::invalid(
                    "plan build",
                    "a finished build",
                    "none",
                )));
            }
            Err(e) => out.push(Err(e)),
        }
    }
    let lib = cudnn.lib();
    let threads = parallel::build_threads();
    let built = parallel::run(
        cudnn,
        todo,
        threads,
        |(_, c)| compiles(c),
        |h, (graph, c)| finalize(lib, h, graph, c),
    );
    for (i, plan) in slots.into_iter().zip(built) {
        out[i] = plan;
    }
    out
}

/// The state of one [`OperationGraph::plans`] call: the plans built so far and what was
/// skipped, in proposal order.
struct Search<'a> {
    og: &'a OperationGraph,
    cudnn: &'a Cudnn,
    filter: &'a PlanFilter,
    plans: Vec<Plan>,
    skipped: Vec<Skipped>,
    /// Configurations already considered (a later heuristic mode may propose them again).
    seen: HashSet<String>,
    /// Candidates the filter accepts, not built yet.
    pending: Vec<Candidate>,
    /// The last error a configuration or heuristic failed with.
    last_error: Option<Error>,
}

impl Search<'_> {
    /// Whether the filter's plan count is reached.
    fn full(&self) -> bool {
        self.filter.max_plans.is_some_and(|m| self.plans.len() >= m)
    }

    fn skip(&mut self, name: String, reason: String) {
        log::debug!("graph plan {name} skipped: {reason}");
        self.skipped.push(Skipped { name, reason });
    }

    /// How many more plans the filter asks for (`None`: no limit).
    fn wanted(&self) -> Option<usize> {
        self.filter
            .max_plans
            .map(|m| m.saturating_sub(self.plans.len() + self.pending.len()))
    }

    /// Queues a candidate unless it was seen before or the filter refuses it; builds the queue
    /// once it holds as many candidates as plans are still wanted.
    fn consider(&mut self, c: Candidate) {
        let name = c.config.to_string();
        if !self.seen.insert(name.clone()) {
            return;
        }
        if let Some(why) = self.filter.refuse(&c.notes, &c.behavior) {
            return self.skip(name, why.into());
        }
        self.pending.push(c);
        if self.wanted() == Some(0) {
            self.flush();
        }
    }

    /// Builds the queued candidates (at once, see [`parallel`]) and keeps, in order, the plans
    /// that built within the filter's workspace.
    fn flush(&mut self) {
        let batch = std::mem::take(&mut self.pending);
        let names: Vec<String> = batch.iter().map(|c| c.config.to_string()).collect();
        for (name, built) in names.into_iter().zip(self.og.finish_all(self.cudnn, batch)) {
            match built {
                Ok(p) if p.workspace > self.filter.max_workspace => {
                    let reason = format!(
                        "needs {} workspace bytes, limit {}",
                        p.workspace, self.filter.max_workspace
                    );
                    self.skip(name, reason);
                }
                Ok(p) => self.plans.push(p),
                Err(e) => {
                    self.skip(name, e.to_string());
                    self.last_error = Some(e);
                }
            }
        }
    }

    /// The configurations one heuristic mode proposes.
    fn heuristic(&mut self, mode: HeurMode) {
        if self.full() {
            return;
        }
        let lib = self.cudnn.lib();
        let cfgs = match self.og.heuristic(lib, mode) {
            Ok(c) => c,
            Err(e) => {
                log::debug!("graph heuristic {mode:?} failed: {e}");
                self.skipped.push(Skipped {
                    name: format!("heuristic {mode:?}"),
                    reason: e.to_string(),
                });
                self.last_error = Some(e);
                return;
            }
        };
        for cfg in cfgs {
            if self.full() {
                break;
            }
            match describe(lib, cfg) {
                Ok(c) => self.consider(c),
                Err(e) => self.skipped.push(Skipped {
                    name: format!("a {mode:?} configuration"),
                    reason: e.to_string(),
                }),
            }
        }
    }

    /// Every engine of the graph, without knob choices.
    fn every_engine(&mut self) -> Result<()> {
        if self.full() {
            return Ok(());
        }
        let count = self
            .og
            .inner
            .graph
            .get_i64(attr!(CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT))?;
        for id in 0..count {
            if self.full() {
                break;
            }
            let config = EngineConfig {
                engine: id,
                knobs: Vec::new(),
            };
            // Most engines do not support a given graph: their engine descriptor does not
            // finalize, which is not worth reporting.
            if let Ok(c) = self.og.configure(self.cudnn.lib(), &config) {
                self.consider(c);
            }
        }
        Ok(())
    }

    /// The plans, or the error that says why there are none.
    fn finish(self) -> Result<PlanList> {
        if !self.plans.is_empty() {
            return Ok(PlanList {
                plans: self.plans,
                skipped: self.skipped,
            });
        }
        let err = self.og.no_engine(&self.skipped);
        // A graph no engine supports is reported as cuDNN's own error when there is one
        // (e.g. CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN), so callers can match its status.
        if let Some(Error::Cudnn {
            status,
            function,
            message,
        }) = self.last_error
        {
            if self.skipped.iter().all(|s| !s.reason.contains("workspace")) {
                let Error::NoEngine { detail, .. } = err else {
                    return Err(err);
                };
                return Err(Error::Cudnn {
                    status,
                    function,
                    message: format!("no plan for the graph: {message} (all tried: {detail})"),
                });
            }
        }
        Err(err)
    }
}
