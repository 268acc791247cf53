//! The union search: a convolution's graph plans timed against its legacy favourite, the
//! plan of a graph decision held and run, and what a refused plan means for the decision.
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use super::cache::GraphPick;
use super::key::{kind_of, Key};
use super::policy::MAX_CARRIED;
use super::run::{alloc, falls_back, Decided};
use super::union::{self as gunion, ConvGraph, Ids};
use super::{Autotuner, Choice, ConvApi, GraphSearch, Policy, Source};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::conv::graph::UnionGraph;
use crate::conv::ConvDesc;
use crate::dtype::{DataType, Scalar};
use crate::error::{Error, Result};
use crate::graph::{EngineConfig, Plan};
use crate::handle::Cudnn;
use crate::timing;
use crate::workspace::Workspace;

/// A union search's finals take the graph plans and the legacy favourite within this factor of
/// the first pass's best (a clear winner needs no second look).
const RETIME_WITHIN: f32 = 1.25;

/// Sweeps over the finalists, the second in reverse order; each finalist keeps the mean of its
/// sweeps, so that a slow drift of the clocks during the finals weighs on all of them alike.
const FINAL_SWEEPS: usize = 2;

/// Timed rounds per finalist and sweep (the median counts).
const FINAL_ROUNDS: usize = 5;
/// Least duration of one timed round in the finals, in ms.
const FINAL_TARGET_MS: f32 = 4.0;
/// Wall-clock milliseconds the leader runs back to back before the finals, so they time the
/// settled clocks of a busy GPU (the first pass runs in bursts between plan builds, at the
/// higher clocks of a GPU that was idle, where a long kernel runs faster than it will in a
/// busy program, and close candidates can swap places between the two states).
const FINAL_HEAT_MS: f32 = 200.0;
/// Wall-clock milliseconds the legacy favourite runs before a union search's first pass (at
/// least one launch), bringing the clocks back up after the plan builds.
const WARM_UP_MS: f32 = 8.0;

/// A legacy favourite whose warm-up ran this many times slower per launch than the first
/// pass's best plan is not timed again: it cannot win, and the legacy algorithms of some
/// problems run hundreds of times slower than the graph engines (bf16 backward data's ALGO_0,
/// 7–19 ms per launch against 0.01–0.04 ms), where timing them would be most of a search.
/// Three times [`timing::HOPELESS`]'s margin: the warm-up's time is one batch, not a timing.
const LEGACY_HOPELESS: f32 = 3.0;

/// A finalist's time from its sweeps: their mean (`None` when no sweep timed it).
pub(super) fn final_ms(sweeps: &[f32]) -> Option<f32> {
    (!sweeps.is_empty()).then(|| sweeps.iter().sum::<f32>() / sweeps.len() as f32)
}

/// Most neighbour configurations one union search tries while refining knobs.
const MAX_REFINE_CONFIGS: usize = 64;

/// A built plan of a graph decision, kept so that repeated calls build nothing: the plan caches
/// its variant pack, rebuilt only when a buffer address changes.
pub(super) struct HeldPlan {
    pub(super) plan: Plan,
    pub(super) ids: Ids,
    pub(super) config: Arc<EngineConfig>,
}

impl std::fmt::Debug for HeldPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.plan.fmt(f)
    }
}

/// A candidate a union search times: a graph plan with the ids its buffers bind to, or the
/// legacy favourite.
#[derive(Clone, Copy)]
pub(super) enum Trial<'p> {
    Plan(&'p Plan, Ids),
    Legacy,
}

impl Autotuner {
    /// Whether the policy and search mode search graph engines.
    pub(super) fn union_on(&self) -> bool {
        self.graph != GraphSearch::Off
            && matches!(self.policy, Policy::Benchmark | Policy::Deterministic)
    }

    /// Builds the graph, builds and times its plans and the legacy favourite (`trial`), and
    /// records a faster plan (any plan that runs, under [`GraphSearch::Prefer`]) in the decision
    /// under `key`, keeping the plan built. Never fails the call: when the graph side cannot
    /// build or run, the legacy decision stands (logged).
    #[allow(clippy::too_many_arguments)] // the parts of one search
    pub(super) fn union_search(
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
        let kind = kind_of(key);
        let found = self.union_time(cudnn, op, kind, &legacy, conv, build, &mut trial);
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
        remember_winner(self.winners.entry(kind).or_default(), &pick.config);
        self.held.insert((**key).clone(), held);
        if let Some(entry) = self.cache.get_mut(&**key) {
            Arc::make_mut(entry).graph = Some(pick.clone());
        }
        self.recent.clear();
        self.persist();
        Some(pick)
    }

    /// The measuring part of [`Autotuner::union_search`]: the winning plan, if a graph plan wins.
    #[allow(clippy::too_many_arguments)] // the parts of one search
    fn union_time(
        &mut self,
        cudnn: &Cudnn,
        op: &'static str,
        kind: [i64; 5],
        (legacy_name, legacy_find_ms): &(String, f32),
        conv: &ConvDesc,
        build: impl FnOnce() -> Result<ConvGraph>,
        trial: &mut impl FnMut(Trial<'_>, &mut Workspace) -> Result<()>,
    ) -> Result<Option<(GraphPick, HeldPlan)>> {
        let started = Instant::now();
        let cg = build()?;
        let deterministic = self.policy == Policy::Deterministic;
        let (mut plans, skipped, mut build_time) = gunion::search_plans(
            cudnn,
            &cg.og,
            conv,
            deterministic,
            self.limit,
            self.graph_plans,
            self.heuristics_b,
            self.effort.every_source(),
        )?;
        let mut carried_configs = HashSet::new();
        if self.effort.carries_winners() {
            let carrying = Instant::now();
            let winners = self.winners.get(&kind).cloned().unwrap_or_default();
            let filter = gunion::filter(conv, deterministic, self.limit, &[], 1);
            for config in winners.iter().rev() {
                if plans.iter().any(|p| p.config() == &**config) {
                    continue;
                }
                // A winner of another problem that this one's engine does not support fails to
                // build: not logged.
                let Ok(plan) = cg.og.plan_from_config(cudnn, config) else {
                    continue;
                };
                if filter
                    .refuse(plan.numerical_notes(), plan.behavior_notes())
                    .is_none()
                    && plan.workspace_size() <= self.limit
                {
                    carried_configs.insert(plan.config().clone());
                    plans.push(plan);
                }
            }
            build_time += carrying.elapsed();
        }
        self.stats.carried += carried_configs.len() as u64;
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
        let heated = timing::heat(cudnn.stream(), WARM_UP_MS, *legacy_find_ms, || {
            trial(Trial::Legacy, ws)
        })
        .unwrap_or(f32::NAN);
        let mut t = Trials {
            cudnn,
            ids: cg.ids,
            ws,
            trial,
            bound: None,
            timed: Vec::new(),
        };
        for plan in plans {
            t.time_plan(plan, "")?;
        }
        let refined = t.refine(&cg, conv, deterministic, limit, refine)?;
        let built = built + refined;
        if t.timed.is_empty() {
            log::info!(
                "conv {op} union search: no graph plan ran ({built} built in {:.1} ms, {skipped} skipped); legacy {legacy_name} stands",
                build_time.as_secs_f64() * 1e3
            );
            return Ok(None);
        }
        let hopeless = legacy_hopeless(t.bound, heated);
        let mut legacy_ms = if hopeless {
            log::debug!(
                "union search: legacy {legacy_name} {heated:.4} ms in the warm-up: not timed again"
            );
            heated
        } else {
            match timing::time_ms(cudnn.stream(), None, || (t.trial)(Trial::Legacy, t.ws)) {
                Ok(ms) => ms,
                Err(e) => {
                    log::debug!("union search: legacy {legacy_name} not timed: {e}");
                    *legacy_find_ms
                }
            }
        };
        let finals_started = Instant::now();
        let finals_timed = t.finals(&mut legacy_ms, prefer, finalists, solo_ms)?;
        let finals_time = finals_started.elapsed();
        let (ids, mut timed) = (t.ids, t.timed);
        self.stats.graph_plans += refined as u64;
        self.stats.finalists += finals_timed as u64;
        if finals_timed > 0 {
            self.stats.graph_finals += finals_time;
        }
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
        if carried_configs.contains(&*config) {
            self.stats.carried_wins += 1;
        }
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
    pub(super) fn ensure_held(
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
        let rebuilt = build().and_then(|cg| {
            let plan = cg.og.plan_from_config(cudnn, &pick.config);
            Ok((cg.ids, plan?))
        });
        self.hold(key, op, conv, &pick.config, rebuilt)
    }

    /// Holds `rebuilt`, the plan of the graph decision under `key` rebuilt from its remembered
    /// configuration `config`, when the current filter accepts it (the cache file is trusted for
    /// the choice only) and its workspace is within the limit; otherwise drops the graph choice
    /// from the decision. `false` when nothing is held.
    pub(super) fn hold(
        &mut self,
        key: &Arc<Key>,
        op: &'static str,
        conv: &ConvDesc,
        config: &Arc<EngineConfig>,
        rebuilt: Result<(Ids, Plan)>,
    ) -> bool {
        let deterministic = self.policy == Policy::Deterministic;
        let limit = self.limit;
        let rebuilt = rebuilt.and_then(|(ids, plan)| {
            let filter = gunion::filter(conv, deterministic, limit, &[], 1);
            if let Some(why) = filter.refuse(plan.numerical_notes(), plan.behavior_notes()) {
                return Err(Error::invalid(
                    "remembered graph plan",
                    "a plan the policy's filter accepts",
                    format!("{config}: {why}"),
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
                ids,
                config: config.clone(),
            })
        });
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
    pub(super) fn drop_graph(&mut self, key: &Arc<Key>) {
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
    pub(super) fn exec_held(
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
    pub(super) fn graph_failed(
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

    /// The graph result of a call whose decision `d` may hold a graph engine: searches on a new
    /// benchmark decision (`search`), then, for a plain call (`plain`: `alpha = 1, beta = 0`, no
    /// residual), makes sure the plan is held (searching again when it no longer builds) and
    /// executes it on `out`. `Some(config)` when the graph ran.
    #[allow(clippy::too_many_arguments)] // the parts of one call
    pub(super) fn graph_call<O>(
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

    /// What a call that ran the graph plan `config` reports: `algo` is the legacy favourite of
    /// the decision from `source`.
    pub(super) fn graph_choice<A>(
        &self,
        algo: A,
        source: Source,
        config: Arc<EngineConfig>,
    ) -> Choice<A> {
        Choice {
            algo,
            source,
            rank: 0,
            workspace: self.workspace_bytes(),
            api: ConvApi::Graph(config),
        }
    }
}

/// The candidates of one union search as they are timed: the graph plans that ran, with their
/// times, and the best time so far (the bound a later plan's probe is held against).
struct Trials<'t, F> {
    cudnn: &'t Cudnn,
    ids: Ids,
    ws: &'t mut Workspace,
    trial: &'t mut F,
    bound: Option<f32>,
    timed: Vec<(f32, Plan)>,
}

impl<F: FnMut(Trial<'_>, &mut Workspace) -> Result<()>> Trials<'_, F> {
    /// Times `plan` against the bound and keeps it when it ran; a plan that fails in a way
    /// another candidate may not is skipped, any other error ends the search.
    fn time_plan(&mut self, plan: Plan, tag: &str) -> Result<()> {
        let (ids, ws, trial) = (self.ids, &mut *self.ws, &mut *self.trial);
        match timing::time_ms(self.cudnn.stream(), self.bound, || {
            trial(Trial::Plan(&plan, ids), ws)
        }) {
            Ok(ms) => {
                log::debug!("union search: graph {}{tag} {ms:.4} ms", plan.name());
                self.bound = Some(self.bound.map_or(ms, |b| b.min(ms)));
                self.timed.push((ms, plan));
                Ok(())
            }
            Err(e) if falls_back(&e) => {
                log::debug!("union search: graph {}{tag} failed: {e}", plan.name());
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Knob refinement: the neighbours of the `refine` fastest plans, timed against the same
    /// bound (at most [`MAX_REFINE_CONFIGS`] tried). Returns how many plans it built.
    fn refine(
        &mut self,
        cg: &ConvGraph,
        conv: &ConvDesc,
        deterministic: bool,
        limit: usize,
        refine: usize,
    ) -> Result<usize> {
        let mut refined = 0;
        if refine == 0 || self.timed.is_empty() {
            return Ok(refined);
        }
        self.timed.sort_by(|a, b| a.0.total_cmp(&b.0));
        let seeds: Vec<EngineConfig> = self
            .timed
            .iter()
            .take(refine)
            .map(|(_, p)| p.config().clone())
            .collect();
        let mut seen: HashSet<EngineConfig> =
            self.timed.iter().map(|(_, p)| p.config().clone()).collect();
        let refuse = gunion::filter(conv, deterministic, limit, &[], 1);
        let mut tried = 0;
        'seeds: for seed in seeds {
            let neighbours = match cg.og.knob_neighbours(self.cudnn, &seed) {
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
                let Ok(plan) = cg.og.plan_from_config(self.cudnn, &config) else {
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
                self.time_plan(plan, " (knobs)")?;
            }
        }
        Ok(refined)
    }

    /// The finals, on the first pass's times (`timed` not empty): the first pass timed each
    /// candidate once, apart from the others, in short bursts (a clock change in between can
    /// tip a close call: a 0.17 ms fp16 convolution was seen picked 10 % slower than the legacy
    /// algorithm it beat in that pass). The graph plans within `RETIME_WITHIN` of the best, and
    /// the legacy favourite when it is that close, run again after `FINAL_HEAT_MS` of the
    /// leader (settled clocks): each alone for `solo_ms`, then timed (its sustained speed), in
    /// `FINAL_SWEEPS` sweeps of alternating order; each keeps the mean of its sweeps. At most
    /// `finalists` graph plans; none (the first pass decides) with 0. Leaves `timed` sorted,
    /// fastest first, and `legacy_ms` updated; returns how many candidates it timed.
    fn finals(
        &mut self,
        legacy_ms: &mut f32,
        prefer: bool,
        finalists: usize,
        solo_ms: f32,
    ) -> Result<usize> {
        let (cudnn, ids) = (self.cudnn, self.ids);
        let (ws, trial, timed) = (&mut *self.ws, &mut *self.trial, &mut self.timed);
        timed.sort_by(|a, b| a.0.total_cmp(&b.0));
        timed.truncate(finalists.max(1));
        let leader = timed[0].0;
        let close =
            |ms: f32| ms > 0.0 && ms < leader * RETIME_WITHIN && ms * RETIME_WITHIN > leader;
        let legacy_in = !prefer && close(*legacy_ms);
        timed.retain(|(ms, _)| close(*ms) || *ms == leader);
        if finalists == 0 || (timed.len() <= 1 && !legacy_in) {
            return Ok(0);
        }
        let finals_timed = timed.len() + usize::from(legacy_in);
        let (leader_plan, leader_ms) = (&timed[0].1, timed[0].0);
        let _ = timing::heat(cudnn.stream(), FINAL_HEAT_MS, leader_ms, || {
            trial(Trial::Plan(leader_plan, ids), ws)
        });
        // Entry 0 is the legacy favourite (timed only when it is in the finals).
        let entries = timed.len() + 1;
        let mut sweeps: Vec<Vec<f32>> = vec![Vec::new(); entries];
        for sweep in 0..FINAL_SWEEPS {
            for i in 0..entries {
                let k = if sweep % 2 == 0 { i } else { entries - 1 - i };
                let candidate = match k {
                    0 if !legacy_in => continue,
                    0 => Trial::Legacy,
                    _ => Trial::Plan(&timed[k - 1].1, ids),
                };
                let ms = timing::sustained_ms(
                    cudnn.stream(),
                    solo_ms,
                    FINAL_ROUNDS,
                    FINAL_TARGET_MS,
                    || trial(candidate, ws),
                );
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
            *legacy_ms = m;
        }
        for ((ms, plan), times) in timed.iter_mut().zip(&sweeps[1..]) {
            if let Some(m) = final_ms(times) {
                log::debug!("union search finals: graph {} {m:.4} ms", plan.name());
                *ms = m;
            }
        }
        timed.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(finals_timed)
    }
}

/// Scratch memory for a union search's trials when the caller's output must be kept; `None`
/// (logged: the legacy decision stands) when it cannot be allocated.
pub(super) fn scratch<T: DataType>(
    cudnn: &Cudnn,
    len: usize,
) -> Option<cudarc::driver::CudaSlice<T>> {
    alloc::<T>(cudnn, len)
        .map_err(|e| log::info!("union search skipped: {e}"))
        .ok()
}

/// The trials of a union search writing `out`: a graph plan, or the legacy favourite `algo` with
/// `alpha = 1, beta = 0` as the graph computes.
pub(super) fn trial<
    'a,
    C: UnionGraph,
    A: DeviceBuffer<C::In>,
    B: DeviceBuffer<C::In>,
    O: DeviceBufferMut<C::Out>,
>(
    cudnn: &'a Cudnn,
    op: &'a C,
    inputs: (&'a A, &'a B),
    algo: C::Algo,
    out: &'a mut O,
) -> impl FnMut(Trial<'_>, &mut Workspace) -> Result<()> + 'a {
    let (one, zero) = (C::Scalar::from_f64(1.0), C::Scalar::from_f64(0.0));
    move |t, ws| match t {
        Trial::Plan(plan, ids) => op.exec(cudnn, plan, ids, ws, inputs, &mut *out),
        Trial::Legacy => op.launch(cudnn, algo, (one, zero), inputs, ws, &mut *out),
    }
}

/// Whether the legacy favourite, `heated` ms per launch in its warm-up (NaN when the warm-up
/// failed), cannot beat the first pass's best plan (`bound`): [`LEGACY_HOPELESS`] times slower.
pub(super) fn legacy_hopeless(bound: Option<f32>, heated: f32) -> bool {
    bound.is_some_and(|b| b > 0.0 && heated > b * LEGACY_HOPELESS)
}

/// Adds `config` to the winners of one kind (most recent last, at most [`MAX_CARRIED`]: the
/// oldest leaves first); a configuration already there moves to the end.
pub(super) fn remember_winner(won: &mut Vec<Arc<EngineConfig>>, config: &Arc<EngineConfig>) {
    won.retain(|c| **c != **config);
    if won.len() >= MAX_CARRIED {
        won.remove(0);
    }
    won.push(config.clone());
}

/// A refusal specific to the graph path, after which the legacy call can still run: the
/// backend's 16-byte alignment of every buffer (legacy calls take element-aligned views).
pub(super) fn is_graph_only_refusal(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument { what, .. } if *what == "graph buffer alignment")
}
