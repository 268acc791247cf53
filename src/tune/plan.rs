//! The graph plan tuner: [`autotune`] times candidate plans and keeps the fastest;
//! [`PlanCache`] keeps the chosen plan of each graph, persists the choices with their graphs
//! in the shared cache-file format, and replays them at start-up ([`PlanCache::warm_up`]).
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::graph::{exec, Args, EngineConfig, OperationGraph, Plan, PlanFilter, Skipped};
use crate::handle::Cudnn;
use crate::timing;
use crate::tune::{self, Format};
use crate::workspace::Workspace;

/// Counters of a [`PlanCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Lookups that found a plan.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
}

/// Between the device, the filter and the graph signature of a key.
const SEPARATOR: &str = " | ";

/// The graph plan cache's file.
const FORMAT: Format = Format {
    kind: "graph",
    columns: "device<TAB>filter | graph signature<TAB>engine config<TAB>graph (JSON)",
};

/// A persisted choice: the engine configuration and, where it could be written, its graph.
type Persisted = (EngineConfig, Option<String>);

/// The choices in the file at `path`, by key (none when there is no file).
fn load_file(path: &Path) -> Result<Vec<(String, Persisted)>> {
    FORMAT.load(path, parse_line)
}

/// One line of the file: what [`format_line`] writes.
fn parse_line(line: &str) -> Option<(String, Persisted)> {
    let mut fields = line.splitn(4, '\t');
    let (device, key, config) = (fields.next()?, fields.next()?, fields.next()?);
    if device.is_empty() || key.is_empty() {
        return None;
    }
    let config = config.parse::<EngineConfig>().ok()?;
    let graph = fields.next().filter(|g| !g.is_empty()).map(str::to_string);
    Some((format!("{device}{SEPARATOR}{key}"), (config, graph)))
}

/// One line of the file for the choice under `key`; `None` for a key without a device part.
fn format_line(key: &str, config: &EngineConfig, graph: Option<&String>) -> Option<String> {
    let (device, rest) = key.split_once(SEPARATOR)?;
    let clean = |s: &str| s.replace(['\n', '\t'], " ");
    let line = format!("{}\t{}\t{config}", clean(device), clean(rest));
    Some(match graph {
        Some(g) => format!("{line}\t{}", clean(g)),
        None => line,
    })
}

/// How [`autotune`] chooses: how it times candidates.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Policy {
    rounds: usize,
    iterations: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            rounds: 3,
            iterations: 5,
        }
    }
}

impl Policy {
    /// Defaults: 3 rounds of 5 executions, after one warm-up execution.
    pub fn new() -> Self {
        Self::default()
    }
    /// Timed rounds per candidate (the best round counts), at least 1.
    #[must_use]
    pub fn with_rounds(mut self, n: usize) -> Self {
        self.rounds = n.max(1);
        self
    }
    /// Executions per round, at least 1.
    #[must_use]
    pub fn with_iterations(mut self, n: usize) -> Self {
        self.iterations = n.max(1);
        self
    }
    /// Timed rounds per candidate ([`Policy::with_rounds`]).
    pub fn rounds(&self) -> usize {
        self.rounds
    }
    /// Executions per round ([`Policy::with_iterations`]).
    pub fn iterations(&self) -> usize {
        self.iterations
    }
}

/// One timed candidate of [`autotune`].
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The plan's name ([`Plan::name`]).
    pub name: String,
    /// Milliseconds per execution, best round.
    pub ms: f32,
}

/// What [`autotune`] chose.
#[derive(Debug)]
pub struct Choice {
    /// The fastest plan.
    pub plan: Plan,
    /// Every candidate that ran, fastest first.
    pub candidates: Vec<Candidate>,
    /// Candidates that could not run (workspace limit, execution error).
    pub failed: Vec<Skipped>,
}

/// Times each plan on the bound buffers (CUDA events around `iterations` executions, best of
/// `rounds`, after a warm-up) and returns the fastest.
///
/// The outputs bound in `args` are overwritten by every candidate: bind scratch buffers if their
/// contents matter. A candidate whose workspace does not fit `ws`'s limit, or that fails to
/// execute, is skipped; [`Error::NoAlgorithm`] when none runs.
pub fn autotune(
    cudnn: &Cudnn,
    plans: Vec<Plan>,
    args: &Args<'_>,
    ws: &mut Workspace,
    policy: &Policy,
) -> Result<Choice> {
    crate::capture::refuse_during_capture(
        cudnn.stream(),
        "timing candidate plans (a first decision for this graph)",
    )?;
    let mut best: Option<(f32, Plan)> = None;
    let mut candidates = Vec::new();
    let mut failed = Vec::new();
    for plan in plans {
        let name = plan.name();
        let run = |ws: &mut Workspace| -> Result<f32> {
            let mut launch = || cudnn.execute(&plan, args, ws);
            launch()?;
            timing::fastest_round(
                cudnn.stream(),
                policy.rounds,
                policy.iterations,
                &mut launch,
            )
        };
        match run(ws) {
            Ok(ms) => {
                log::debug!("graph autotune: {name} {ms:.4} ms");
                candidates.push(Candidate { name, ms });
                if best.as_ref().map_or(true, |(b, _)| ms < *b) {
                    best = Some((ms, plan));
                }
            }
            Err(e) => {
                // An argument error is the caller's, not the candidate's: report it.
                if matches!(
                    e,
                    Error::BufferTooSmall { .. }
                        | Error::ForeignContext { .. }
                        | Error::OverlappingOutput { .. }
                        | Error::UnsupportedDataType { .. }
                        | Error::Capture { .. }
                ) || matches!(e, Error::InvalidArgument { what, .. } if what.starts_with("graph") || what == "cuDNN handle")
                {
                    return Err(e);
                }
                log::debug!("graph autotune: {name} failed: {e}");
                failed.push(Skipped {
                    name,
                    reason: e.to_string(),
                });
            }
        }
    }
    candidates.sort_by(|a, b| a.ms.total_cmp(&b.ms));
    match best {
        Some((_, plan)) => Ok(Choice {
            plan,
            candidates,
            failed,
        }),
        None => Err(Error::NoAlgorithm {
            op: "graph autotune",
            detail: failed
                .iter()
                .map(|s| format!("{}: {}", s.name, s.reason))
                .collect::<Vec<_>>()
                .join("; "),
        }),
    }
}

/// Plans kept by graph signature, filter, GPU and cuDNN version, so that a graph seen before
/// reuses its plan instead of asking the heuristics (or autotuning) again.
///
/// Plans run only on the handle they were built on: an entry built on another handle counts as
/// a miss and is replaced. With a file ([`PlanCache::cache_file`]) the chosen engine
/// configurations persist with their graphs ([`Graph::to_json`](crate::graph::Graph::to_json)), and a new process rebuilds
/// only the chosen plan ([`OperationGraph::plan_from_config`]). [`PlanCache::warm_up`] does that
/// at start-up for every graph in the file and executes each plan once, so that the first call
/// of the process finds its plan held and its kernel loaded.
///
/// ```no_run
/// # use cudnn_safe::graph::{Graph, PlanFilter};
/// # use cudnn_safe::tune::plan::PlanCache;
/// # fn f(cudnn: &cudnn_safe::Cudnn, g: &Graph) -> cudnn_safe::Result<()> {
/// let mut cache = PlanCache::new().try_cache_file("/tmp/graph-plans.txt")?;
/// let og = g.build(cudnn)?;
/// let plan = cache.get_or_build(cudnn, &og, &PlanFilter::default())?;
/// println!("{} needs {} workspace bytes", plan.name(), plan.workspace_size());
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct PlanCache {
    plans: HashMap<String, Plan>,
    configs: HashMap<String, EngineConfig>,
    /// The graph of each persisted configuration ([`Graph::to_json`](crate::graph::Graph::to_json)), where it could be written.
    graphs: HashMap<String, String>,
    path: Option<PathBuf>,
    stats: Stats,
}

/// What [`PlanCache::warm_up`] did.
#[derive(Debug, Clone, Default)]
pub struct WarmUp {
    /// Entries whose plan was rebuilt from the recorded graph, executed once on scratch buffers
    /// and is now held by the cache.
    pub replayed: usize,
    /// Entries of this GPU and cuDNN version whose plan was already held on this handle.
    pub held: usize,
    /// Entries of this GPU and cuDNN version not replayed, with why (no recorded graph, a record
    /// that does not read back, a plan that no longer builds or runs).
    pub skipped: Vec<Skipped>,
    /// Entries of other GPUs or cuDNN versions (left alone).
    pub other: usize,
    /// Largest workspace a replayed plan needs (the workspace was grown to it).
    pub workspace: usize,
    /// Wall time of building the replayed entries' plans, all at once (those of engines that
    /// compile at run time on [`crate::graph::build_threads`] threads): part of `elapsed`.
    pub building: Duration,
    /// Wall time of the warm-up, the GPU work included.
    pub elapsed: Duration,
}

impl PlanCache {
    /// An empty in-memory cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Persists choices to `path` (read now if it exists; rewritten, merged with what another
    /// process wrote meanwhile, after each new choice). Each entry is one line: device, filter
    /// and graph signature, engine configuration and the graph as [`Graph::to_json`](crate::graph::Graph::to_json) writes it
    /// (an entry without one is still read, for its choice only); unreadable lines are skipped
    /// with a warning, a file of another format whole. A configuration read from the file is
    /// checked against its engine's knobs when its plan is built
    /// ([`OperationGraph::plan_from_config`]); one that fails is logged and replaced.
    ///
    /// A file that exists but cannot be read is logged and left alone: the cache starts without
    /// its entries and [`save`](Self::save) reports the error ([`Error::Io`]) instead of
    /// overwriting it. [`try_cache_file`](Self::try_cache_file) returns that error at once.
    #[must_use]
    pub fn cache_file(self, path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let loaded = tune::or_empty("graph plan", load_file(&path));
        self.with_loaded(path, loaded)
    }

    /// [`cache_file`](Self::cache_file), returning [`Error::Io`] (the path and the operating
    /// system's error) when the file exists but cannot be read (not a regular file, no
    /// permission, larger than 64 MiB). A missing file is an empty cache.
    pub fn try_cache_file(self, path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let loaded = load_file(&path)?;
        Ok(self.with_loaded(path, loaded))
    }

    fn with_loaded(mut self, path: PathBuf, loaded: Vec<(String, Persisted)>) -> Self {
        for (key, (config, graph)) in loaded {
            if let Some(g) = graph {
                self.graphs.insert(key.clone(), g);
            }
            self.configs.insert(key, config);
        }
        self.path = Some(path);
        self
    }

    /// Keeps choices in memory only: forgets the cache file and the choices read from it.
    #[must_use]
    pub fn without_cache_file(mut self) -> Self {
        if self.path.take().is_some() {
            self.configs.clear();
            self.graphs.clear();
        }
        self
    }

    /// The cache file, if any.
    pub fn cache_path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Number of remembered choices (engine configurations, all devices), persisted or not.
    pub fn cached_decisions(&self) -> usize {
        self.configs.len()
    }

    /// The start of every key of this handle's GPU and cuDNN version.
    fn key_prefix(cudnn: &Cudnn) -> String {
        format!("{}{SEPARATOR}", tune::cudnn_device(cudnn))
    }

    /// The key of a graph under a filter on this handle's GPU and cuDNN version.
    pub fn key(cudnn: &Cudnn, og: &OperationGraph, filter: &PlanFilter) -> String {
        format!(
            "{}{filter:?}{SEPARATOR}{}",
            Self::key_prefix(cudnn),
            og.signature()
        )
    }

    /// The cached plan for this graph and filter on this handle, if any (counts a hit or a miss).
    /// A plan found for another graph of the same signature is shared with `og`
    /// ([`Plan::share_with`]), so it executes with `og`'s tensor ids. A plan `filter` refuses
    /// (one a warm-up built from a file's choice) is no hit.
    pub fn get(
        &mut self,
        cudnn: &Cudnn,
        og: &OperationGraph,
        filter: &PlanFilter,
    ) -> Option<&Plan> {
        let key = Self::key(cudnn, og, filter);
        let hit = self.plans.get(&key).is_some_and(|p| {
            p.graph.check_handle(cudnn).is_ok()
                && filter
                    .refuse(p.numerical_notes(), p.behavior_notes())
                    .is_none()
                && p.workspace_size() <= filter.workspace_limit()
                && p.share_with(og).is_ok()
        });
        if hit {
            self.stats.hits += 1;
            self.plans.get(&key)
        } else {
            self.stats.misses += 1;
            None
        }
    }

    /// Stores a plan for this graph and filter (replacing any), persisting its configuration and
    /// graph when the cache has a file.
    pub fn insert(
        &mut self,
        cudnn: &Cudnn,
        og: &OperationGraph,
        filter: &PlanFilter,
        plan: Plan,
    ) -> Result<&Plan> {
        if plan.signature() != og.signature() {
            return Err(Error::invalid(
                "graph plan cache entry",
                "a plan of the graph it is stored under",
                "a plan of another graph",
            ));
        }
        let key = Self::key(cudnn, og, filter);
        let record = match og.graph().to_json() {
            Ok(r) => Some(r),
            Err(e) => {
                log::debug!("graph plan cache: the graph is kept without its record: {e}");
                None
            }
        };
        let changed = self.configs.get(&key) != Some(plan.config())
            || self.graphs.get(&key) != record.as_ref();
        self.configs.insert(key.clone(), plan.config().clone());
        match record {
            Some(r) => self.graphs.insert(key.clone(), r),
            None => self.graphs.remove(&key),
        };
        if changed {
            self.save()?;
        }
        self.plans.insert(key.clone(), plan);
        Ok(&self.plans[&key])
    }

    /// The cached plan, or the persisted configuration's plan, or the first plan the filter
    /// yields (the heuristics' favourite), stored for next time.
    pub fn get_or_build(
        &mut self,
        cudnn: &Cudnn,
        og: &OperationGraph,
        filter: &PlanFilter,
    ) -> Result<&Plan> {
        self.get_or_make(cudnn, og, filter, || {
            Ok(og
                .plans(cudnn, &filter.clone().with_max_plans(Some(1)))?
                .plans
                .swap_remove(0))
        })
    }

    /// The cached plan, or the persisted configuration's plan, or the fastest of the filter's
    /// plans timed by [`autotune`] on `args` (whose outputs are overwritten), stored for next
    /// time.
    pub fn get_or_autotune(
        &mut self,
        cudnn: &Cudnn,
        og: &OperationGraph,
        filter: &PlanFilter,
        args: &Args<'_>,
        ws: &mut Workspace,
        policy: &Policy,
    ) -> Result<&Plan> {
        self.get_or_make(cudnn, og, filter, || {
            Ok(autotune(cudnn, og.plans(cudnn, filter)?.plans, args, ws, policy)?.plan)
        })
    }

    /// The cached plan, or the persisted configuration's plan, or the plan of `make`, stored
    /// for next time.
    fn get_or_make(
        &mut self,
        cudnn: &Cudnn,
        og: &OperationGraph,
        filter: &PlanFilter,
        make: impl FnOnce() -> Result<Plan>,
    ) -> Result<&Plan> {
        let key = Self::key(cudnn, og, filter);
        if self.get(cudnn, og, filter).is_some() {
            return self.plans.get(&key).ok_or_else(|| {
                Error::invalid(
                    "graph plan cache",
                    "the plan just found under its key",
                    format!("no plan under {key}"),
                )
            });
        }
        // Building plans loads (and dropping the losers unloads) kernels, which a capture cannot
        // record: refuse before building any.
        crate::capture::refuse_during_capture(
            cudnn.stream(),
            "building plans (a first decision for this graph)",
        )?;
        let plan = match self.persisted(cudnn, og, &key, filter) {
            Some(p) => p,
            None => make()?,
        };
        self.insert(cudnn, og, filter, plan)
    }

    /// The plan of the persisted configuration for `key`, if there is one, it still builds and
    /// `filter` accepts it (its notes and its workspace): a file is not trusted to have
    /// respected the filter.
    fn persisted(
        &self,
        cudnn: &Cudnn,
        og: &OperationGraph,
        key: &str,
        filter: &PlanFilter,
    ) -> Option<Plan> {
        let cfg = self.configs.get(key)?;
        match og.plan_from_config(cudnn, cfg) {
            Ok(p) => {
                if let Some(why) = filter.refuse(p.numerical_notes(), p.behavior_notes()) {
                    log::warn!("graph plan cache: persisted {cfg} refused by the filter: {why}");
                    return None;
                }
                if p.workspace_size() > filter.workspace_limit() {
                    log::warn!(
                        "graph plan cache: persisted {cfg} needs {} workspace bytes, limit {}",
                        p.workspace_size(),
                        filter.workspace_limit()
                    );
                    return None;
                }
                Some(p)
            }
            Err(e) => {
                log::warn!("graph plan cache: persisted {cfg} no longer builds: {e}");
                None
            }
        }
    }

    /// Start-up work for a cache read from a file: for every persisted entry of this handle's
    /// GPU and cuDNN version, reads its graph back ([`Graph::from_json`](crate::graph::Graph::from_json), checked) and builds it;
    /// then builds the chosen plans ([`OperationGraph::plan_from_config`]) all at once (those of
    /// engines that compile at run time on [`crate::graph::build_threads`] threads); then
    /// executes each plan once on zero-filled scratch buffers (one per tensor, of its span;
    /// freed afterwards) with `ws` (grown to the plan's workspace size), and holds it. A later [`PlanCache::get`] of a
    /// graph with the same signature finds it, and its first execution finds its kernel loaded:
    /// CUDA loads a kernel lazily at its first launch, so without this warm-up the first real
    /// call pays for it (after [`graph::preload`](crate::graph::preload), that is what remains of a new process's first
    /// call).
    ///
    /// The file is trusted for the choice and the graph description only: the graph passes the
    /// record checks and cuDNN's validation, a key whose signature is not its graph's is
    /// skipped, and the scratch execution is checked like every [`Cudnn::execute`]. An entry
    /// that fails is reported in [`WarmUp::skipped`] (and logged) and left for
    /// [`PlanCache::get_or_build`]. Each entry is logged at `info` level as it finishes.
    ///
    /// ```no_run
    /// # use cudnn_safe::tune::plan::PlanCache;
    /// # fn f(cudnn: &cudnn_safe::Cudnn) -> cudnn_safe::Result<()> {
    /// cudnn_safe::graph::preload(cudnn)?;
    /// let mut cache = PlanCache::new().try_cache_file("/tmp/graph-plans.txt")?;
    /// let mut ws = cudnn_safe::Workspace::new(cudnn.stream().clone());
    /// let w = cache.warm_up(cudnn, &mut ws)?;
    /// println!("{} plans ready in {:?}, {} skipped", w.replayed, w.elapsed, w.skipped.len());
    /// # Ok(()) }
    /// ```
    pub fn warm_up(&mut self, cudnn: &Cudnn, ws: &mut Workspace) -> Result<WarmUp> {
        self.warm_up_within(cudnn, ws, usize::MAX)
    }

    /// [`PlanCache::warm_up`] within a memory limit: an entry whose scratch memory (the
    /// buffers of all its graph's tensors plus its plan's workspace, in bytes) would exceed
    /// `max_scratch_bytes` is skipped (reported in [`WarmUp::skipped`] with its size, and
    /// left for [`PlanCache::get_or_build`]) instead of allocated (a bf16 attention graph of
    /// 8×16×4096×128 needs about 0.5 GB of scratch forward and 1.4 GB backward). The buffers
    /// are checked before the plan is built, the workspace after.
    ///
    /// ```no_run
    /// # use cudnn_safe::tune::plan::PlanCache;
    /// # fn f(cudnn: &cudnn_safe::Cudnn) -> cudnn_safe::Result<()> {
    /// let mut cache = PlanCache::new().try_cache_file("/tmp/graph-plans.txt")?;
    /// let mut ws = cudnn_safe::Workspace::new(cudnn.stream().clone());
    /// // Replay only graphs that fit in 256 MiB of scratch.
    /// let w = cache.warm_up_within(cudnn, &mut ws, 256 << 20)?;
    /// for s in &w.skipped {
    ///     println!("not warmed up: {} ({})", s.name, s.reason);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn warm_up_within(
        &mut self,
        cudnn: &Cudnn,
        ws: &mut Workspace,
        max_scratch_bytes: usize,
    ) -> Result<WarmUp> {
        let started = Instant::now();
        let mut done = WarmUp::default();
        let prefix = Self::key_prefix(cudnn);
        let mut keys: Vec<String> = self.configs.keys().cloned().collect();
        keys.sort();
        let total = keys.iter().filter(|k| k.starts_with(&prefix)).count();
        // Read back every entry not held yet, build their plans all at once (those of engines
        // that compile at run time on `graph::build_threads` threads), then execute each once.
        let mut seen = 0;
        let mut ready = Vec::new();
        let mut failed = Vec::new();
        for key in keys {
            if !key.starts_with(&prefix) {
                done.other += 1;
                continue;
            }
            seen += 1;
            let cfg = self.configs[&key].clone();
            if self
                .plans
                .get(&key)
                .is_some_and(|p| p.graph.check_handle(cudnn).is_ok())
            {
                done.held += 1;
                continue;
            }
            let prepared = match self.graphs.get(&key) {
                Some(record) => exec::Replay::prepare(cudnn, &key, record, max_scratch_bytes),
                None => Err(Error::invalid(
                    "graph plan cache entry",
                    "a recorded graph",
                    "a configuration only (written before graphs were recorded, or a graph \
                     JSON cannot hold)",
                )),
            };
            match prepared {
                Ok(r) => ready.push((seen, key, cfg, r)),
                Err(e) => failed.push((seen, cfg, e)),
            }
        }
        let t = Instant::now();
        let plans = {
            let jobs: Vec<_> = ready.iter().map(|(_, _, cfg, r)| (&r.og, cfg)).collect();
            crate::graph::plans_from_configs(cudnn, &jobs)
        };
        done.building = t.elapsed();
        for ((n, key, cfg, r), plan) in ready.into_iter().zip(plans) {
            let t = Instant::now();
            match plan.and_then(|p| r.run(cudnn, ws, p)) {
                Ok(plan) => {
                    log::info!(
                        "graph plan cache warm-up [{n}/{total}]: {cfg} ready, executed in {:.1} ms",
                        t.elapsed().as_secs_f64() * 1e3
                    );
                    done.replayed += 1;
                    done.workspace = done.workspace.max(plan.workspace_size());
                    self.plans.insert(key, plan);
                }
                Err(e) => failed.push((n, cfg, e)),
            }
        }
        failed.sort_by_key(|f| f.0);
        for (n, cfg, e) in failed {
            log::info!("graph plan cache warm-up [{n}/{total}]: {cfg} skipped: {e}");
            done.skipped.push(Skipped {
                name: cfg.to_string(),
                reason: e.to_string(),
            });
        }
        cudnn
            .stream()
            .synchronize()
            .map_err(|e| Error::driver("synchronizing after the plan cache warm-up", e))?;
        done.elapsed = started.elapsed();
        log::info!(
            "graph plan cache warm-up: {} plans replayed, {} held, {} skipped, {} of other \
             devices or versions, {:.1} ms ({:.1} ms building plans)",
            done.replayed,
            done.held,
            done.skipped.len(),
            done.other,
            done.elapsed.as_secs_f64() * 1e3,
            done.building.as_secs_f64() * 1e3
        );
        Ok(done)
    }

    /// Writes the persisted configurations (no-op without a file), merged with the entries
    /// another process wrote meanwhile, atomically: readers see the old file or the new one.
    /// Errors: [`Error::Io`] (the path and the operating system's error) when the file cannot be
    /// read for the merge or cannot be written; the file is then left as it was.
    pub fn save(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let lines = self
            .configs
            .iter()
            .filter_map(|(k, c)| format_line(k, c, self.graphs.get(k)));
        FORMAT.save(path, lines, |l| parse_line(l).is_some())
    }

    /// Number of plans held in memory.
    pub fn len(&self) -> usize {
        self.plans.len()
    }
    /// Whether no plan is held in memory.
    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }
    /// Lookups that found a plan and lookups that found none.
    pub fn stats(&self) -> Stats {
        self.stats
    }
    /// Forgets every decision in memory: the chosen configurations, their graphs and the plans
    /// held (the file is left as it is), as the other tuners' `clear` does.
    /// [`drop_plans`](Self::drop_plans) keeps the decisions.
    pub fn clear(&mut self) {
        self.plans.clear();
        self.configs.clear();
        self.graphs.clear();
    }
    /// Drops the plans held in memory and keeps the decisions (configurations and graphs): the
    /// next lookup of a graph, or a [`warm_up`](Self::warm_up), rebuilds its plan from them.
    pub fn drop_plans(&mut self) {
        self.plans.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_with_and_without_their_graph() {
        let config: EngineConfig = "eng12_k2=1_k5=0".parse().unwrap();
        let key = "GPU X|sm90|cudnn91400 | PlanFilter { .. } | sig\twith tab";
        for graph in [Some("{\"tensors\":[]}".to_string()), None] {
            let line = format_line(key, &config, graph.as_ref()).unwrap();
            assert_eq!(
                line.split('\t').count(),
                3 + usize::from(graph.is_some()),
                "{line}"
            );
            let (k, (c, g)) = parse_line(&line).unwrap();
            // Tabs and newlines inside a field become spaces.
            assert_eq!(k, key.replace('\t', " "));
            assert_eq!((c, g), (config.clone(), graph));
        }
        assert_eq!(format_line("no device part", &config, None), None);
        assert!(parse_line("GPU\tkey\tnot a config").is_none());
        assert!(parse_line("\tkey\teng0").is_none());
    }

    #[test]
    fn clear_forgets_the_decisions_and_drop_plans_keeps_them() {
        // Entries as read from a file (none is read or written here); holding plans needs a GPU.
        let path = PathBuf::from("plans.txt");
        let config: EngineConfig = "eng12_k2=1_k5=0".parse().unwrap();
        let loaded = vec![(
            "GPU X | filter | sig".to_string(),
            (config, Some("{}".into())),
        )];
        let mut cache = PlanCache::new().with_loaded(path.clone(), loaded);
        assert_eq!((cache.cached_decisions(), cache.graphs.len()), (1, 1));
        cache.drop_plans();
        assert_eq!((cache.cached_decisions(), cache.graphs.len()), (1, 1));
        cache.clear();
        assert_eq!((cache.cached_decisions(), cache.graphs.len()), (0, 0));
        assert!(cache.is_empty());
        assert_eq!(
            cache.cache_path(),
            Some(path.as_path()),
            "the file stays named"
        );
    }
}
