//! The convolution algorithm explorer: for seven ResNet-like layers in four precision modes, what
//! cuDNN's heuristics pick, what benchmarking finds, how fast every forward algorithm really is,
//! and what each [`Policy`] of the [`Autotuner`] costs on the first call and afterwards.
//!
//! ```text
//! cargo run --release -p cudnn-safe-tools --bin conv_explorer                      # everything (~1-2 min on an H200)
//! cargo run --release -p cudnn-safe-tools --bin conv_explorer -- --quick           # 2 layers, fp32 + fp16
//! cargo run --release -p cudnn-safe-tools --bin conv_explorer -- --modes fp16,bf16 # chosen modes only
//! cargo run --release -p cudnn-safe-tools --bin conv_explorer -- --graph-plans 24  # the library's union cap
//! ```
//!
//! Modes: `fp32` (f32 NCHW, FMA math: strict fp32), `tf32` (f32 NCHW, default math: TF32 tensor
//! cores allowed), `fp16` and `bf16` (NHWC tensors, KRSC filters, tensor-op math, f32
//! accumulation). Every layer is a cross-correlation with padding `kernel / 2` on random inputs
//! in `[-1, 1]`.
//!
//! For each layer and mode it prints a table of every [`ConvFwdAlgo`]: its heuristic rank
//! (`cudnnGetConvolutionForwardAlgorithm_v7`), the time `cudnnFindConvolutionForwardAlgorithmEx`
//! measured, the time this program measures itself (CUDA events around back-to-back calls:
//! 3 warm-up calls, then the median of 5 batches of up to 10 calls), TFLOP/s, workspace and
//! determinism — or cuDNN's status when it refuses the algorithm. Beside them, one row per
//! graph (backend) engine configuration the union search considers (`g:` + the engine
//! configuration tag, e.g. `g:eng12_k2=1`): up to `--graph-plans` (default 8) proposed by
//! heuristics A and as many new ones from the fallback list, under the filter the
//! [`Autotuner`] applies for the mode's math type, each timed the same way, with its workspace,
//! determinism and numerical notes; the union winner (what the benchmark tuner runs, legacy or
//! graph) is marked `union pick`. Then the heuristic pick
//! against the fastest, the wall time of the find call (the decision cost of benchmark mode),
//! and three fresh autotuners (heuristic, benchmark, deterministic; no cache file; the union
//! search capped at `--graph-plans` per heuristic mode, `0` for legacy only): first call
//! (wall clock, decision included — in this process every kernel is loaded by then), the API
//! and algorithm or engine that ran, and steady-state time per call. A summary table closes (per layer and mode: heuristic pick and
//! its time, fastest algorithm and its time, their ratio, fastest deterministic time, and the
//! benchmark tuner's first call).
//!
//! Files (in `$CUDNN_SAFE_OUT_DIR`, else the current directory):
//! * `conv_explorer.svg`: one panel per mode, every algorithm's time per layer (log scale),
//!   heuristic picks boxed, the fastest graph plan as a black triangle, the union pick crossed;
//! * `conv_explorer.tsv`: one row per layer, mode and legacy algorithm or graph engine
//!   configuration: `config mode algo status ms workspace_bytes deterministic is_heuristic_top
//!   is_find_best heuristic_rank find_ms api heuristic notes is_union_pick` (`api` is `legacy`
//!   or `graph`; for graph rows `algo` is the engine configuration, `heuristic` the mode that
//!   proposed it (`A` or `fallback`) and `heuristic_rank` its position there; `status` is `ok`
//!   or cuDNN's status name; empty fields are unknown or not applicable);
//! * `conv_explorer_policies.tsv`: one row per layer, mode and policy: `config mode policy algo
//!   source first_call_ms ms find_wall_ms error api` (`api`: `legacy <algo>` or
//!   `graph <engine config>`);
//! * `conv_explorer_autotune.txt`: the autotune cache of the first-call measurement.
//!
//! First call in a fresh process: the program runs itself again
//! (`--first-call <cache file> [--fixed ALGO]`, an internal flag) on the first layer in strict
//! fp32 and times, after creating the CUDA context, `Cudnn::new` (library load + handle) and the
//! first `Autotuner::forward` up to a synchronize: once with the benchmark policy and an empty
//! cache file (cold: heuristics, find, then the launch), then five times each, alternating, with
//! the cache now filled (warm: the cached algorithm's launch) and with `Policy::Fixed` on that
//! same algorithm and no cache (the floor: what any first launch costs, cuDNN's lazily loaded
//! kernels included). Fresh-process times vary by tens of milliseconds run to run, hence the
//! repetitions. It prints `first-call: cold-cache X ms, warm-cache Y ms, fixed-algo floor Z ms
//! (library load+handle W ms); warm cache beyond the floor D ms (medians ...)`, where D is the
//! median of the paired differences.
//! Skip it with `--no-first-call`.
//!
//! Progress goes to stderr; `RUST_LOG=info` shows the autotuner's decisions. Exit status: 0 when
//! everything ran, 1 when a layer or an output failed (the rest still runs), 2 for bad arguments
//! or without a GPU (after printing `conv_explorer needs an NVIDIA GPU: <why>`).
//!
//! `cargo test -p cudnn-safe-tools --bin conv_explorer` checks the table and chart writers on
//! made-up numbers (no GPU needed).
use std::collections::HashMap;
use std::error::Error as StdError;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use cudnn_safe::conv::{AlgoPerf, ConvAlgorithm, ConvFwdAlgo, MathType};
use cudnn_safe::graph::{Args, ConvParams, Graph, HeurMode, NumericalNote, PlanFilter};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::tune::{ConvApi, FixedAlgos, GraphSearch, Policy, Source, CACHE_ENV};
use cudnn_safe::{cuda_context, format_version, Autotuner, Cudnn, DType, Result, Workspace};

#[path = "common/mod.rs"]
mod common;
use common::{bytes, drv, refusal, Element, Mode, Problem, Rng, Timer, CONFIGS};

const USAGE: &str = "usage: conv_explorer [--quick] [--modes fp32,tf32,fp16,bf16] [--graph-plans N] [--no-first-call]";

/// Graph plans listed (and searched by the tuners) per heuristic mode unless `--graph-plans`
/// says otherwise: fewer than the library's default (24) to keep the whole run short.
const GRAPH_PLANS: usize = 8;

/// The internal flag the program re-executes itself with.
const FIRST_CALL_FLAG: &str = "--first-call";
/// Warm-cache and fixed-algorithm fresh processes run (alternately) for the first-call medians.
const FIRST_CALL_REPEATS: usize = 5;
/// Prefix of the one line a `--first-call` child prints for its parent.
const CHILD_TAG: &str = "first-call-result";

/// The policies compared, each with a fresh tuner.
const POLICIES: [Policy; 3] = [Policy::Heuristic, Policy::Benchmark, Policy::Deterministic];

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(FIRST_CALL_FLAG) {
        return first_call_child(&args[1..]);
    }
    let opts = match common::options("conv_explorer", USAGE, &args, Options::parse) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let Some((_stream, cudnn)) = common::open_gpu("conv_explorer") else {
        return ExitCode::from(2);
    };
    match explore_all(&cudnn, &opts) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("conv_explorer: {}", common::chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// Command-line options.
struct Options {
    /// Indices into [`CONFIGS`].
    configs: Vec<usize>,
    modes: Vec<Mode>,
    first_call: bool,
    /// Graph plans per heuristic mode (rows and tuners); 0: legacy only.
    graph_plans: usize,
}

impl Options {
    fn parse(args: &[String]) -> std::result::Result<Options, String> {
        let mut quick = false;
        let mut modes = None;
        let mut first_call = true;
        let mut graph_plans = GRAPH_PLANS;
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--quick" => quick = true,
                "--no-first-call" => first_call = false,
                "--modes" => {
                    let list = it.next().ok_or("--modes needs a list such as fp32,fp16")?;
                    modes = Some(parse_modes(list)?);
                }
                s if s.starts_with("--modes=") => modes = Some(parse_modes(&s[8..])?),
                "--graph-plans" => {
                    let n = it.next().ok_or("--graph-plans needs a count")?;
                    graph_plans = n
                        .parse()
                        .map_err(|_| format!("--graph-plans: `{n}` is not a count"))?;
                }
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        let configs = if quick {
            vec![0, 1]
        } else {
            (0..CONFIGS.len()).collect()
        };
        let modes = modes.unwrap_or_else(|| {
            if quick {
                vec![Mode::Fp32, Mode::Fp16]
            } else {
                Mode::ALL.to_vec()
            }
        });
        Ok(Options {
            configs,
            modes,
            first_call,
            graph_plans,
        })
    }
}

fn parse_modes(list: &str) -> std::result::Result<Vec<Mode>, String> {
    let mut modes = Vec::new();
    for key in list.split(',').filter(|k| !k.trim().is_empty()) {
        let mode = Mode::from_key(key)
            .ok_or_else(|| format!("unknown mode `{key}` (fp32, tf32, fp16 or bf16)"))?;
        if !modes.contains(&mode) {
            modes.push(mode);
        }
    }
    if modes.is_empty() {
        return Err("--modes needs at least one mode".into());
    }
    Ok(modes)
}

// ---------------------------------------------------------------------------------------------
// One layer in one mode
// ---------------------------------------------------------------------------------------------

/// What happened when an algorithm was forced.
enum Outcome {
    /// It ran: median time per call.
    Ran { ms: f64 },
    /// cuDNN refused it (status name) or the call failed.
    Refused(String),
}

/// One algorithm of one layer and mode.
struct AlgoRow {
    algo: ConvFwdAlgo,
    /// 1-based rank among the algorithms the heuristics list as supported.
    heuristic_rank: Option<usize>,
    /// Time the find call measured (supported entries only).
    find_ms: Option<f32>,
    /// Workspace bytes cuDNN asks for (when it supports the case).
    workspace: Option<usize>,
    /// cuDNN's determinism flag (from the find or heuristic record).
    deterministic: Option<bool>,
    outcome: Outcome,
}

/// One graph engine configuration of one layer and mode: a candidate of the union search.
struct GraphRow {
    /// The engine configuration (`eng12_k2=1`).
    config: String,
    /// The heuristic mode that proposed it: `A` or `fallback`.
    heuristic: &'static str,
    /// 1-based position among the plans listed from that mode.
    rank: usize,
    workspace: usize,
    deterministic: bool,
    /// The engine's numerical notes, short (`tc`, `down`, `winograd`, `fft`, ...).
    notes: String,
    outcome: Outcome,
}

impl GraphRow {
    fn ms(&self) -> Option<f64> {
        match self.outcome {
            Outcome::Ran { ms } => Some(ms),
            Outcome::Refused(_) => None,
        }
    }
}

/// One policy's fresh-tuner run.
struct PolicyRun {
    algo: ConvFwdAlgo,
    /// The API that ran ([`ConvApi::Graph`] when the union search chose a graph engine).
    api: ConvApi,
    source: Source,
    /// Wall clock of the first call, decision and synchronize included.
    first_ms: f64,
    /// Median time per later call (CUDA events).
    steady_ms: f64,
}

/// Everything measured for one layer in one mode.
struct Case {
    config: usize,
    mode: Mode,
    rows: Vec<AlgoRow>,
    /// The union search's graph candidates.
    graph_rows: Vec<GraphRow>,
    /// Supported heuristic entries, best first.
    heuristic_order: Vec<ConvFwdAlgo>,
    find_best: Option<ConvFwdAlgo>,
    /// Wall clock of `conv_forward_find`.
    find_wall_ms: f64,
    policies: Vec<(Policy, std::result::Result<PolicyRun, String>)>,
    /// Heuristic or find queries that failed.
    problems: Vec<String>,
}

impl Case {
    fn heuristic_top(&self) -> Option<ConvFwdAlgo> {
        self.heuristic_order.first().copied()
    }

    fn ms(&self, algo: ConvFwdAlgo) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.algo == algo)
            .and_then(|r| match r.outcome {
                Outcome::Ran { ms } => Some(ms),
                Outcome::Refused(_) => None,
            })
    }

    /// Fastest algorithm by this program's measurement, among those `keep` accepts.
    fn fastest_where(&self, keep: impl Fn(&AlgoRow) -> bool) -> Option<(ConvFwdAlgo, f64)> {
        self.rows
            .iter()
            .filter(|r| keep(r))
            .filter_map(|r| match r.outcome {
                Outcome::Ran { ms } => Some((r.algo, ms)),
                Outcome::Refused(_) => None,
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    fn fastest(&self) -> Option<(ConvFwdAlgo, f64)> {
        self.fastest_where(|_| true)
    }

    fn fastest_deterministic(&self) -> Option<(ConvFwdAlgo, f64)> {
        self.fastest_where(|r| r.deterministic == Some(true))
    }

    fn policy(&self, policy: Policy) -> Option<&PolicyRun> {
        self.policies
            .iter()
            .find(|(p, _)| *p == policy)
            .and_then(|(_, r)| r.as_ref().ok())
    }

    /// The fastest graph plan by this program's measurement.
    fn fastest_graph(&self) -> Option<(&str, f64)> {
        self.graph_rows
            .iter()
            .filter_map(|r| Some((r.config.as_str(), r.ms()?)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// What the benchmark tuner (the union search) runs.
    fn union_pick(&self) -> Option<&ConvApi> {
        self.policy(Policy::Benchmark).map(|r| &r.api)
    }

    /// Whether the union pick is the legacy `algo`.
    fn union_picks_legacy(&self, algo: ConvFwdAlgo) -> bool {
        self.policy(Policy::Benchmark)
            .is_some_and(|r| r.api == ConvApi::Legacy && r.algo == algo)
    }

    /// Whether the union pick is the graph engine `config`.
    fn union_picks_graph(&self, config: &str) -> bool {
        matches!(self.union_pick(), Some(ConvApi::Graph(c)) if c.to_string() == config)
    }
}

impl PolicyRun {
    /// `legacy <algo>` or `graph <engine config>`.
    fn what(&self) -> String {
        match &self.api {
            ConvApi::Graph(c) => format!("graph {c}"),
            _ => format!("legacy {}", self.algo.name()),
        }
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Heuristics, find, every algorithm forced and timed, then the three policies.
fn explore<T: Element>(
    cudnn: &Cudnn,
    timer: &Timer,
    config: usize,
    mode: Mode,
    rng: &mut Rng,
    graph_plans: usize,
) -> Result<Case> {
    let stream = cudnn.stream();
    let mut p = Problem::<T>::in_mode(stream, &CONFIGS[config], mode, rng)?;

    // A failed query is reported with the case; the algorithms are still forced one by one.
    let mut problems = Vec::new();
    let heuristics = cudnn
        .conv_forward_heuristics(&p.x_d, &p.w_d, &p.conv, &p.y_d)
        .unwrap_or_else(|e| {
            problems.push(format!("heuristics failed: {e}"));
            Vec::new()
        });
    let mut heuristic_order: Vec<ConvFwdAlgo> = Vec::new();
    for h in heuristics.iter().filter(|h| h.is_supported()) {
        if !heuristic_order.contains(&h.algo) {
            heuristic_order.push(h.algo);
        }
    }

    // Benchmark mode's decision: every algorithm run and timed by cuDNN.
    let mut ws = Workspace::new(stream.clone());
    let started = Instant::now();
    let found = cudnn
        .conv_forward_find(
            &p.x_d, &p.x, &p.w_d, &p.w, &p.conv, &p.y_d, &mut p.y, &mut ws,
        )
        .unwrap_or_else(|e| {
            problems.push(format!("find failed: {e}"));
            Vec::new()
        });
    stream.synchronize().map_err(drv("synchronizing"))?;
    let find_wall_ms = ms_since(started);
    let find_best = found.iter().find(|f| f.is_supported()).map(|f| f.algo);

    // cuDNN may list an algorithm more than once (per math type): its first entry counts.
    let first = |list: &[AlgoPerf<ConvFwdAlgo>], algo: ConvFwdAlgo| {
        list.iter().position(|q| q.algo == algo)
    };
    let mut rows = Vec::with_capacity(ConvFwdAlgo::ALL.len());
    for &algo in ConvFwdAlgo::ALL {
        let heuristic_rank = heuristic_order
            .iter()
            .position(|&a| a == algo)
            .map(|i| i + 1);
        let found_entry = first(&found, algo).map(|i| &found[i]);
        let find_ms = found_entry.filter(|f| f.is_supported()).map(|f| f.time_ms);
        let deterministic = found_entry
            .or_else(|| first(&heuristics, algo).map(|i| &heuristics[i]))
            .map(|q| q.deterministic);
        let (workspace, outcome) =
            match cudnn.conv_forward_workspace_size(&p.x_d, &p.w_d, &p.conv, &p.y_d, algo) {
                Err(e) => (None, Outcome::Refused(refusal(&e))),
                Ok(needed) => {
                    let mut call = || {
                        cudnn.conv_forward(
                            1.0, &p.x_d, &p.x, &p.w_d, &p.w, &p.conv, algo, &mut ws, 0.0, &p.y_d,
                            &mut p.y,
                        )
                    };
                    let outcome = match timer.per_call_ms(&mut call) {
                        Ok(ms) => Outcome::Ran { ms },
                        Err(e) => Outcome::Refused(refusal(&e)),
                    };
                    (Some(needed), outcome)
                }
            };
        rows.push(AlgoRow {
            algo,
            heuristic_rank,
            find_ms,
            workspace,
            deterministic,
            outcome,
        });
    }
    let graph_rows = graph_rows(cudnn, timer, &mut p, &mut ws, graph_plans, &mut problems);
    // The tuners own their workspaces: free this one (it can be gigabytes for FFT).
    drop(ws);

    let policies = POLICIES
        .iter()
        .map(|&policy| {
            let run =
                run_policy(cudnn, timer, &mut p, policy, graph_plans).map_err(|e| e.to_string());
            (policy, run)
        })
        .collect();

    Ok(Case {
        config,
        mode,
        rows,
        graph_rows,
        heuristic_order,
        find_best,
        find_wall_ms,
        policies,
        problems,
    })
}

/// The problem as a one-operation graph (`conv_fprop`, the descriptors' dims, strides and
/// types), its plans listed as the union search lists them (up to `per_mode` from heuristics
/// A, then as many new ones from fallback, under the numerics filter of the mode's math type),
/// each timed like the legacy algorithms. A graph that does not build is reported in
/// `problems`.
fn graph_rows<T: Element>(
    cudnn: &Cudnn,
    timer: &Timer,
    p: &mut Problem<T>,
    ws: &mut Workspace,
    per_mode: usize,
    problems: &mut Vec<String>,
) -> Vec<GraphRow> {
    if per_mode == 0 {
        return Vec::new();
    }
    let built = (|| -> Result<_> {
        let dt = T::DTYPE;
        let mut g = Graph::new(dt, DType::F32, p.conv.compute());
        let x = g.tensor("x", p.x_d.dims(), p.x_d.layout().strides(), dt)?;
        let w = g.tensor("w", p.w_d.dims(), p.w_d.layout().strides(), dt)?;
        let params = ConvParams::new(p.conv.spatial_rank())
            .with_padding(p.conv.pads())
            .with_strides(p.conv.strides())
            .with_dilations(p.conv.dilations())
            .with_mode(p.conv.mode());
        let y = g.conv_fprop(x, w, &params)?;
        g.mark_output_strided(y, dt, p.y_d.layout().strides())?;
        Ok((g.build(cudnn)?, x, w, y))
    })();
    let (og, x, w, y) = match built {
        Ok(b) => b,
        Err(e) => {
            problems.push(format!("graph not built: {e}"));
            return Vec::new();
        }
    };
    let math = p.conv.math();
    let mut rows: Vec<GraphRow> = Vec::new();
    for (mode, heuristic) in [(HeurMode::A, "A"), (HeurMode::Fallback, "fallback")] {
        let filter = PlanFilter::new()
            .with_heuristics(&[mode])
            .with_no_tensor_cores(math == MathType::Fma)
            .with_no_down_conversion(math != MathType::TensorOpAllowConversion)
            .with_no_reduced_precision(p.conv.compute() == DType::F32)
            .with_max_plans(Some(per_mode + rows.len()));
        let plans = match og.plans(cudnn, &filter) {
            Ok(list) => list.plans,
            Err(e) => {
                problems.push(format!("graph heuristics {heuristic}: {}", refusal(&e)));
                continue;
            }
        };
        let mut added = 0;
        for plan in plans {
            let config = plan.name();
            if added == per_mode || rows.iter().any(|r| r.config == config) {
                continue;
            }
            added += 1;
            let outcome = (|| -> Result<f64> {
                let mut args = Args::new(cudnn);
                args.input(x, &p.x)?.input(w, &p.w)?.output(y, &mut p.y)?;
                timer.per_call_ms(&mut || cudnn.execute(&plan, &args, ws))
            })();
            let notes: Vec<&str> = plan
                .numerical_notes()
                .iter()
                .filter_map(|n| match n {
                    NumericalNote::TensorCore => Some("tc"),
                    NumericalNote::DownConvertInputs => Some("down"),
                    NumericalNote::ReducedPrecisionReduction => Some("reduced"),
                    NumericalNote::Fft => Some("fft"),
                    NumericalNote::Winograd => Some("winograd"),
                    NumericalNote::Nondeterministic => Some("nondet"),
                    _ => None,
                })
                .collect();
            rows.push(GraphRow {
                config,
                heuristic,
                rank: added,
                workspace: plan.workspace_size(),
                deterministic: plan.is_deterministic(),
                notes: notes.join(","),
                outcome: match outcome {
                    Ok(ms) => Outcome::Ran { ms },
                    Err(e) => Outcome::Refused(refusal(&e)),
                },
            });
        }
    }
    rows
}

/// A fresh tuner under `policy` (union search capped at `graph_plans` per heuristic mode, off
/// for 0): first call (wall clock, including the decision and a synchronize), then the
/// steady-state time per call.
fn run_policy<T: Element>(
    cudnn: &Cudnn,
    timer: &Timer,
    p: &mut Problem<T>,
    policy: Policy,
    graph_plans: usize,
) -> Result<PolicyRun> {
    // `Autotuner::new` loads $CUDNN_SAFE_AUTOTUNE_CACHE when it is set; `without_cache_file`
    // only stops saving, so also forget what was loaded: every decision here is made afresh.
    let search = if graph_plans == 0 {
        GraphSearch::Off
    } else {
        GraphSearch::Union
    };
    let mut tuner = Autotuner::new(policy)
        .without_cache_file()
        .with_graph_search(search)
        .with_graph_plans(graph_plans);
    tuner.clear();
    let started = Instant::now();
    let choice = tuner.forward(
        cudnn, 1.0, &p.x_d, &p.x, &p.w_d, &p.w, &p.conv, 0.0, &p.y_d, &mut p.y,
    )?;
    cudnn.stream().synchronize().map_err(drv("synchronizing"))?;
    let first_ms = ms_since(started);
    let steady_ms = timer.per_call_ms(&mut || {
        tuner
            .forward(
                cudnn, 1.0, &p.x_d, &p.x, &p.w_d, &p.w, &p.conv, 0.0, &p.y_d, &mut p.y,
            )
            .map(drop)
    })?;
    Ok(PolicyRun {
        algo: choice.algo,
        api: choice.api,
        source: choice.source,
        first_ms,
        steady_ms,
    })
}

// ---------------------------------------------------------------------------------------------
// The whole run
// ---------------------------------------------------------------------------------------------

/// Runs every selected layer and mode, prints the tables and writes the files. `Ok(false)` when
/// some layer or output failed (the rest still ran).
fn explore_all(cudnn: &Cudnn, opts: &Options) -> Result<bool> {
    let stream = cudnn.stream();
    println!(
        "conv_explorer: {}, cuDNN {} ({})",
        common::device_line(stream),
        format_version(cudnn.version()),
        cudnn.library_origin()
    );
    let timer = Timer::new(stream)?;
    let mut rng = Rng::new(0x00C0_FFEE);
    let jobs: Vec<(usize, Mode)> = opts
        .modes
        .iter()
        .flat_map(|&m| opts.configs.iter().map(move |&c| (c, m)))
        .collect();
    let started = Instant::now();
    let mut cases = Vec::new();
    let mut ok = true;
    for (i, &(config, mode)) in jobs.iter().enumerate() {
        eprintln!(
            "[{:>2}/{}] {} {} ... (t+{:.1} s)",
            i + 1,
            jobs.len(),
            mode.name(),
            CONFIGS[config].label(),
            started.elapsed().as_secs_f64()
        );
        let _ = std::io::stderr().flush();
        let case = match mode {
            Mode::Fp32 | Mode::Tf32 => {
                explore::<f32>(cudnn, &timer, config, mode, &mut rng, opts.graph_plans)
            }
            Mode::Fp16 => explore::<f16>(cudnn, &timer, config, mode, &mut rng, opts.graph_plans),
            Mode::Bf16 => explore::<bf16>(cudnn, &timer, config, mode, &mut rng, opts.graph_plans),
        };
        match case {
            Ok(case) => {
                print_case(&case);
                cases.push(case);
            }
            Err(e) => {
                ok = false;
                println!(
                    "\n== {} {}: failed: {e}",
                    mode.name(),
                    CONFIGS[config].label()
                );
            }
        }
    }
    print_summary(&cases);
    eprintln!(
        "all layers done in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let dir = match common::out_dir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("conv_explorer: no output directory: {e}");
            return Ok(false);
        }
    };
    let outputs: [(&str, WriteFn); 3] = [
        ("conv_explorer.tsv", write_tsv),
        ("conv_explorer_policies.tsv", write_policies_tsv),
        ("conv_explorer.svg", write_svg),
    ];
    for (name, write) in outputs {
        let path = dir.join(name);
        match write(&path, &cases, opts) {
            Ok(()) => println!("wrote {}", path.display()),
            Err(e) => {
                ok = false;
                eprintln!("conv_explorer: {} not written: {e}", path.display());
            }
        }
    }

    if opts.first_call {
        if let Err(e) = first_call_report(&dir) {
            ok = false;
            println!("first-call: not measured: {e}");
        }
    }
    Ok(ok)
}

fn fmt_ms(ms: Option<f64>) -> String {
    ms.map_or_else(|| "-".into(), |v| format!("{v:.3}"))
}

/// One line of [`print_case`]'s table: `name`, then the heuristic rank, find time, workspace
/// and determinism `columns` around the measured time and TFLOP/s (`flops` per call); a refused
/// `outcome` leaves those two `-` and adds `<refused>: <why>` to the `notes`.
fn print_algo_line(
    name: &str,
    [heur, find_ms, workspace, det]: [&str; 4],
    outcome: &Outcome,
    flops: f64,
    refused: &str,
    mut notes: Vec<String>,
) {
    let (ms, tflops) = match outcome {
        Outcome::Ran { ms } => (
            format!("{ms:.3}"),
            format!("{:.1}", flops / (ms * 1e-3) / 1e12),
        ),
        Outcome::Refused(why) => {
            notes.push(format!("{refused}: {why}"));
            ("-".into(), "-".into())
        }
    };
    println!(
        "{:<22} {:>4} {:>9} {:>9} {:>8} {:>10} {:>4}  {}",
        name,
        heur,
        find_ms,
        ms,
        tflops,
        workspace,
        det,
        notes.join(", ")
    );
}

fn print_case(case: &Case) {
    let cfg = &CONFIGS[case.config];
    let fastest = case.fastest();
    println!();
    println!(
        "== {} {}  ({:.2} GFLOP per call) ==",
        case.mode.name(),
        cfg.label(),
        cfg.flops() / 1e9
    );
    let ranking: Vec<String> = case
        .heuristic_order
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}.{a}", i + 1))
        .collect();
    println!("heuristic ranking: {}", ranking.join("  "));
    println!(
        "{:<22} {:>4} {:>9} {:>9} {:>8} {:>10} {:>4}  note",
        "algorithm", "heur", "find ms", "ms/call", "TFLOP/s", "workspace", "det"
    );
    for r in &case.rows {
        let heur = r
            .heuristic_rank
            .map_or_else(|| "-".into(), |rank| rank.to_string());
        let det = match r.deterministic {
            Some(true) => "yes",
            Some(false) => "no",
            None => "-",
        };
        let mut notes = Vec::new();
        if case.heuristic_top() == Some(r.algo) {
            notes.push("heuristic pick".to_string());
        }
        if case.find_best == Some(r.algo) {
            notes.push("find's pick".to_string());
        }
        if fastest.map(|f| f.0) == Some(r.algo) {
            notes.push("fastest".to_string());
        }
        if case.union_picks_legacy(r.algo) {
            notes.push("union pick".to_string());
        }
        let ws = r.workspace.map_or_else(|| "-".into(), bytes);
        let find_ms = r.find_ms.map_or_else(|| "-".into(), |v| format!("{v:.3}"));
        let columns = [heur.as_str(), &find_ms, &ws, det];
        print_algo_line(
            r.algo.name(),
            columns,
            &r.outcome,
            cfg.flops(),
            "refused",
            notes,
        );
    }
    let fastest_graph = case.fastest_graph();
    for r in &case.graph_rows {
        let mut notes = vec![format!("heuristics {} #{}", r.heuristic, r.rank)];
        if !r.notes.is_empty() {
            notes.push(r.notes.clone());
        }
        if fastest_graph.map(|f| f.0) == Some(r.config.as_str()) {
            notes.push("fastest graph".to_string());
        }
        if case.union_picks_graph(&r.config) {
            notes.push("union pick".to_string());
        }
        let det = if r.deterministic { "yes" } else { "no" };
        let columns = ["-", "-", &bytes(r.workspace), det];
        let name = format!("g:{}", r.config);
        print_algo_line(&name, columns, &r.outcome, cfg.flops(), "failed", notes);
    }
    if let (Some((g, g_ms)), Some((f, f_ms))) = (fastest_graph, fastest) {
        println!(
            "fastest graph plan {g} {g_ms:.3} ms vs fastest legacy {f} {f_ms:.3} ms: {:.2}x",
            f_ms / g_ms
        );
    }
    match (case.heuristic_top(), fastest) {
        (Some(h), Some((f, f_ms))) => {
            let h_ms = case.ms(h);
            println!(
                "heuristic pick {h} {} ms vs fastest {f} {f_ms:.3} ms: {}; find's pick {}",
                fmt_ms(h_ms),
                h_ms.map_or_else(
                    || "heuristic pick did not run".into(),
                    |h| format!("{:.2}x", h / f_ms)
                ),
                case.find_best
                    .map_or_else(|| "-".into(), |b| format!("{b} {} ms", fmt_ms(case.ms(b)))),
            );
        }
        _ => println!("no algorithm ran"),
    }
    println!(
        "find call (benchmark-mode decision): {:.1} ms wall",
        case.find_wall_ms
    );
    for problem in &case.problems {
        println!("{problem}");
    }
    // In this process every kernel is loaded by now: the first calls below show the decision
    // cost; the fresh-process measurement at the end shows the whole first-call cost.
    println!(
        "{:<14} {:<32} {:<10} {:>14} {:>9} {:>11}",
        "fresh tuner", "ran", "source", "1st call ms", "ms/call", "vs fastest"
    );
    for (policy, run) in &case.policies {
        match run {
            Ok(r) => println!(
                "{:<14} {:<32} {:<10} {:>14.2} {:>9.3} {:>11}",
                policy.name(),
                r.what(),
                format!("{:?}", r.source).to_lowercase(),
                r.first_ms,
                r.steady_ms,
                fastest.map_or_else(|| "-".into(), |(_, f)| format!("{:.2}x", r.steady_ms / f)),
            ),
            Err(e) => println!("{:<14} failed: {e}", policy.name()),
        }
    }
    let _ = std::io::stdout().flush();
}

fn print_summary(cases: &[Case]) {
    println!();
    println!("== summary (ms per call, CUDA events; bench 1st = benchmark tuner's first call, wall clock) ==");
    println!(
        "{:<24} {:<10} {:<22} {:>8} {:<22} {:>8} {:>9} {:>10} {:>10} {:>12} {:>12}",
        "config",
        "mode",
        "heuristic pick",
        "ms",
        "fastest",
        "ms",
        "heur/best",
        "det best",
        "graph best",
        "union ms",
        "bench 1st"
    );
    for c in cases {
        let heur = c.heuristic_top();
        let heur_ms = heur.and_then(|h| c.ms(h));
        let best = c.fastest();
        let ratio = match (heur_ms, best) {
            (Some(h), Some((_, b))) => format!("{:.2}", h / b),
            _ => "-".into(),
        };
        let union = c.policy(Policy::Benchmark).map_or_else(
            || "-".into(),
            |r| {
                format!(
                    "{:.3}{}",
                    r.steady_ms,
                    if r.api.is_graph() { " g" } else { "" }
                )
            },
        );
        println!(
            "{:<24} {:<10} {:<22} {:>8} {:<22} {:>8} {:>9} {:>10} {:>10} {:>12} {:>12}",
            CONFIGS[c.config].label(),
            c.mode.name(),
            heur.map_or("-", |a| a.name()),
            fmt_ms(heur_ms),
            best.map_or("-", |b| b.0.name()),
            fmt_ms(best.map(|b| b.1)),
            ratio,
            fmt_ms(c.fastest_deterministic().map(|b| b.1)),
            fmt_ms(c.fastest_graph().map(|g| g.1)),
            union,
            c.policy(Policy::Benchmark)
                .map_or_else(|| "-".into(), |r| format!("{:.1}", r.first_ms)),
        );
    }
    let _ = std::io::stdout().flush();
}

// ---------------------------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------------------------

type WriteResult = std::result::Result<(), Box<dyn StdError>>;
type WriteFn = fn(&Path, &[Case], &Options) -> WriteResult;

fn flag(b: bool) -> &'static str {
    if b {
        "1"
    } else {
        "0"
    }
}

fn write_tsv(path: &Path, cases: &[Case], _: &Options) -> WriteResult {
    let mut out = String::from(
        "config\tmode\talgo\tstatus\tms\tworkspace_bytes\tdeterministic\tis_heuristic_top\tis_find_best\theuristic_rank\tfind_ms\tapi\theuristic\tnotes\tis_union_pick\n",
    );
    for c in cases {
        for r in &c.rows {
            let (status, ms) = match &r.outcome {
                Outcome::Ran { ms } => ("ok".to_string(), format!("{ms:.6}")),
                Outcome::Refused(why) => (why.replace(['\t', '\n'], " "), String::new()),
            };
            out.push_str(&format!(
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\tlegacy\t\t\t{}\n",
                CONFIGS[c.config].label(),
                c.mode.key(),
                r.algo.name(),
                status,
                ms,
                r.workspace.map_or_else(String::new, |w| w.to_string()),
                r.deterministic.map_or("", flag),
                flag(c.heuristic_top() == Some(r.algo)),
                flag(c.find_best == Some(r.algo)),
                r.heuristic_rank
                    .map_or_else(String::new, |rank| rank.to_string()),
                r.find_ms.map_or_else(String::new, |v| format!("{v:.6}")),
                flag(c.union_picks_legacy(r.algo)),
            ));
        }
        for r in &c.graph_rows {
            let (status, ms) = match &r.outcome {
                Outcome::Ran { ms } => ("ok".to_string(), format!("{ms:.6}")),
                Outcome::Refused(why) => (why.replace(['\t', '\n'], " "), String::new()),
            };
            out.push_str(&format!(
                "{}\t{}\t{}\t{status}\t{ms}\t{}\t{}\t0\t0\t{}\t\tgraph\t{}\t{}\t{}\n",
                CONFIGS[c.config].label(),
                c.mode.key(),
                r.config,
                r.workspace,
                flag(r.deterministic),
                r.rank,
                r.heuristic,
                r.notes,
                flag(c.union_picks_graph(&r.config)),
            ));
        }
    }
    std::fs::write(path, out)?;
    Ok(())
}

fn write_policies_tsv(path: &Path, cases: &[Case], _: &Options) -> WriteResult {
    let mut out = String::from(
        "config\tmode\tpolicy\talgo\tsource\tfirst_call_ms\tms\tfind_wall_ms\terror\tapi\n",
    );
    for c in cases {
        for (policy, run) in &c.policies {
            let (algo, source, first, steady, error, api) = match run {
                Ok(r) => (
                    r.algo.name(),
                    format!("{:?}", r.source),
                    format!("{:.6}", r.first_ms),
                    format!("{:.6}", r.steady_ms),
                    String::new(),
                    r.what(),
                ),
                Err(e) => (
                    "",
                    String::new(),
                    String::new(),
                    String::new(),
                    e.replace(['\t', '\n'], " "),
                    String::new(),
                ),
            };
            out.push_str(&format!(
                "{}\t{}\t{}\t{algo}\t{source}\t{first}\t{steady}\t{:.3}\t{error}\t{api}\n",
                CONFIGS[c.config].label(),
                c.mode.key(),
                policy.name(),
                c.find_wall_ms,
            ));
        }
    }
    std::fs::write(path, out)?;
    Ok(())
}

/// Colours of the eight forward algorithms (matplotlib's tab10).
const PALETTE: [(u8, u8, u8); 8] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (23, 190, 207),
];

/// Log-axis ticks at 1, 2 and 5 times powers of ten within `lo..=hi` (finer when that gives
/// fewer than two): plotters' own log-axis ticks crowd at the top of each decade.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let within = |mantissas: &[f64]| {
        let mut ticks = Vec::new();
        for decade in lo.log10().floor() as i32..=hi.log10().ceil() as i32 {
            for m in mantissas {
                let v = m * 10f64.powi(decade);
                if (lo..=hi).contains(&v) {
                    ticks.push(v);
                }
            }
        }
        ticks
    };
    let ticks = within(&[1.0, 2.0, 5.0]);
    if ticks.len() >= 2 {
        ticks
    } else {
        within(&[1.0, 1.5, 2.0, 3.0, 5.0, 7.0])
    }
}

/// `0.05`, `2`, `10`: a tick value without trailing zeros.
fn tick_label(v: f64) -> String {
    let s = format!("{v:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// One panel per mode: x = layer, y = ms per call (log), one colour per algorithm, heuristic
/// picks boxed, the fastest graph plan a black triangle, the union pick crossed; a shared legend
/// and the layer names below.
fn write_svg(path: &Path, cases: &[Case], opts: &Options) -> WriteResult {
    use plotters::prelude::*;

    const PANEL: (u32, u32) = (820, 420);
    const LINE: i32 = 24;
    const LEGEND_ENTRY: i32 = 200;
    const NAME_ENTRY: i32 = 330;
    let modes = &opts.modes;
    let n = opts.configs.len();
    let cols = modes.len().min(2);
    let rows = modes.len().div_ceil(2);
    let width = PANEL.0 * cols as u32;
    // Legend: the algorithms, the heuristic-pick box, the graph triangle and the union cross;
    // then the layer names.
    const MARKS: usize = 3;
    let per_line = ((width as i32 - 40) / LEGEND_ENTRY).max(1) as usize;
    let legend_lines = (ConvFwdAlgo::ALL.len() + MARKS).div_ceil(per_line);
    let names_per_line = ((width as i32 - 40) / NAME_ENTRY).max(1) as usize;
    let footer_lines = legend_lines + n.div_ceil(names_per_line);
    let footer_height = LINE as u32 * footer_lines as u32 + 16;
    let root = SVGBackend::new(path, (width, PANEL.1 * rows as u32 + 40 + footer_height))
        .into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "cuDNN forward convolution: time per call of every algorithm (CUDA events, median)",
        ("sans-serif", 22),
    )?;
    let height = root.dim_in_pixel().1;
    let (grid, footer) = root.split_vertically(height - footer_height);

    let color = |i: usize| {
        let (r, g, b) = PALETTE[i % PALETTE.len()];
        RGBColor(r, g, b)
    };
    let font = ("sans-serif", 15).into_font();
    let algos = ConvFwdAlgo::ALL.len();
    for i in 0..algos + MARKS {
        let x = 30 + LEGEND_ENTRY * (i % per_line) as i32;
        let y = 14 + LINE * (i / per_line) as i32;
        let label = match ConvFwdAlgo::ALL.get(i) {
            Some(algo) => {
                footer.draw(&Circle::new((x, y), 5, color(i).filled()))?;
                algo.name()
            }
            None if i == algos => {
                footer.draw(&Rectangle::new(
                    [(x - 7, y - 7), (x + 7, y + 7)],
                    BLACK.stroke_width(1),
                ))?;
                "heuristic pick"
            }
            None if i == algos + 1 => {
                footer.draw(&TriangleMarker::new((x, y), 6, BLACK.filled()))?;
                "graph (fastest plan)"
            }
            None => {
                footer.draw(&Cross::new((x, y), 6, RED.stroke_width(2)))?;
                "union pick"
            }
        };
        footer.draw(&Text::new(label, (x + 12, y - 8), font.clone()))?;
    }
    for (i, &c) in opts.configs.iter().enumerate() {
        let x = 20 + NAME_ENTRY * (i % names_per_line) as i32;
        let y = 6 + LINE * (legend_lines + i / names_per_line) as i32;
        let name = format!("#{} {}", i + 1, CONFIGS[c].label());
        footer.draw(&Text::new(name, (x, y), font.clone()))?;
    }

    for (panel, &mode) in grid.split_evenly((rows, cols)).iter().zip(modes) {
        let mode_cases: Vec<(usize, &Case)> = opts
            .configs
            .iter()
            .enumerate()
            .filter_map(|(x, &cfg)| {
                cases
                    .iter()
                    .find(|c| c.config == cfg && c.mode == mode)
                    .map(|c| (x, c))
            })
            .collect();
        let all_ms: Vec<f64> = mode_cases
            .iter()
            .flat_map(|(_, c)| {
                c.rows
                    .iter()
                    .filter_map(|r| c.ms(r.algo))
                    .chain(c.fastest_graph().map(|g| g.1))
            })
            .collect();
        if all_ms.is_empty() {
            panel.draw(&Text::new(
                format!("{}: no data", mode.name()),
                (40, 40),
                ("sans-serif", 18),
            ))?;
            continue;
        }
        let lo = all_ms.iter().copied().fold(f64::INFINITY, f64::min) * 0.7;
        let hi = all_ms.iter().copied().fold(0.0, f64::max) * 1.5;
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{} ({} math)", mode.name(), mode.math().name()),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(64)
            .build_cartesian_2d(
                -0.5f64..n as f64 - 0.5,
                (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
            )?;
        let x_label = |x: &f64| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n {
                format!("#{}", i as usize + 1)
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n + 1)
            .x_label_formatter(&x_label)
            .y_label_formatter(&|v| tick_label(*v))
            .y_desc("ms per call (log)")
            .draw()?;

        // Spread the algorithms of one layer side by side.
        let x_of = |x: usize, algo: usize| x as f64 + (algo as f64 - 3.5) * 0.1;
        for (ai, &algo) in ConvFwdAlgo::ALL.iter().enumerate() {
            let c = color(ai);
            chart.draw_series(
                mode_cases
                    .iter()
                    .filter_map(|&(x, case)| case.ms(algo).map(|ms| (x_of(x, ai), ms)))
                    .map(|p| Circle::new(p, 4, c.filled())),
            )?;
        }
        chart.draw_series(mode_cases.iter().filter_map(|&(x, c)| {
            let h = c.heuristic_top()?;
            let ai = ConvFwdAlgo::ALL.iter().position(|&a| a == h)?;
            Some(
                EmptyElement::at((x_of(x, ai), c.ms(h)?))
                    + Rectangle::new([(-7, -7), (7, 7)], BLACK.stroke_width(1)),
            )
        }))?;
        // The graph plans right of the algorithms (slot 8).
        chart.draw_series(mode_cases.iter().filter_map(|&(x, c)| {
            let (_, ms) = c.fastest_graph()?;
            Some(TriangleMarker::new((x_of(x, algos), ms), 6, BLACK.filled()))
        }))?;
        chart.draw_series(mode_cases.iter().filter_map(|&(x, c)| {
            let at = match c.union_pick()? {
                ConvApi::Graph(cfg) => {
                    let cfg = cfg.to_string();
                    let row = c.graph_rows.iter().find(|r| r.config == cfg)?;
                    (x_of(x, algos), row.ms()?)
                }
                _ => {
                    let algo = c.policy(Policy::Benchmark)?.algo;
                    let ai = ConvFwdAlgo::ALL.iter().position(|&a| a == algo)?;
                    (x_of(x, ai), c.ms(algo)?)
                }
            };
            Some(Cross::new(at, 6, RED.stroke_width(2)))
        }))?;
    }
    root.present()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// First call in a fresh process
// ---------------------------------------------------------------------------------------------

/// What a `--first-call` child measured.
struct ChildReport {
    ctx_ms: f64,
    load_ms: f64,
    first_ms: f64,
    second_ms: f64,
    algo: String,
    source: String,
}

impl ChildReport {
    fn parse(line: &str) -> std::result::Result<ChildReport, String> {
        let fields: HashMap<&str, &str> = line
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .collect();
        let text = |k: &str| {
            fields
                .get(k)
                .map(|v| v.to_string())
                .ok_or_else(|| format!("`{k}` missing in `{line}`"))
        };
        let num = |k: &str| {
            text(k)?
                .parse::<f64>()
                .map_err(|e| format!("`{k}` in `{line}`: {e}"))
        };
        Ok(ChildReport {
            ctx_ms: num("ctx_ms")?,
            load_ms: num("load_ms")?,
            first_ms: num("first_ms")?,
            second_ms: num("second_ms")?,
            algo: text("algo")?,
            source: text("source")?,
        })
    }
}

/// Runs this program again with `--first-call` and reads its report line.
fn run_child(
    exe: &Path,
    cache: &Path,
    fixed: Option<&str>,
) -> std::result::Result<ChildReport, String> {
    let mut cmd = Command::new(exe);
    cmd.arg(FIRST_CALL_FLAG)
        .arg(cache)
        // Only the cache file named here may feed the child's tuner.
        .env_remove(CACHE_ENV)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(algo) = fixed {
        cmd.arg("--fixed").arg(algo);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("could not run {}: {e}", exe.display()))?;
    if !out.status.success() {
        return Err(format!("child process exited with {}", out.status));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with(CHILD_TAG))
        .ok_or_else(|| format!("child process printed no `{CHILD_TAG}` line"))?;
    ChildReport::parse(line)
}

/// Cold cache once, then warm cache and fixed algorithm alternately, each in a fresh process.
fn first_call_report(dir: &Path) -> std::result::Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("own executable not found: {e}"))?;
    let cache: PathBuf = dir.join("conv_explorer_autotune.txt");
    match std::fs::remove_file(&cache) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{} not removed: {e}", cache.display())),
    }
    eprintln!(
        "[first call] fresh processes on {} strict fp32: cold cache, warm cache, fixed algorithm ...",
        CONFIGS[0].label()
    );
    let cold = run_child(&exe, &cache, None)?;
    // Fresh-process first calls vary run to run (lazy loading of cuDNN's kernels, the page
    // cache), so warm-cache and fixed-algorithm processes alternate and the medians are shown.
    let (mut warm_runs, mut fixed_runs) = (Vec::new(), Vec::new());
    for _ in 0..FIRST_CALL_REPEATS {
        warm_runs.push(run_child(&exe, &cache, None)?);
        fixed_runs.push(run_child(&exe, &cache, Some(&cold.algo))?);
    }
    let median = |mut v: Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let range = |v: &[ChildReport], f: fn(&ChildReport) -> f64| -> (f64, f64) {
        let vals: Vec<f64> = v.iter().map(f).collect();
        (
            vals.iter().copied().fold(f64::INFINITY, f64::min),
            vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        )
    };
    let warm_ms = median(warm_runs.iter().map(|r| r.first_ms).collect());
    let fixed_ms = median(fixed_runs.iter().map(|r| r.first_ms).collect());
    let load_ms = median(warm_runs.iter().map(|r| r.load_ms).collect());
    let beyond = median(
        warm_runs
            .iter()
            .zip(&fixed_runs)
            .map(|(w, f)| w.first_ms - f.first_ms)
            .collect(),
    );
    let (wlo, whi) = range(&warm_runs, |r| r.first_ms);
    let (flo, fhi) = range(&fixed_runs, |r| r.first_ms);
    let warm = &warm_runs[0];
    let fixed = &fixed_runs[0];
    println!();
    println!(
        "first-call: cold-cache {:.1} ms, warm-cache {warm_ms:.1} ms, fixed-algo floor {fixed_ms:.1} ms \
         (library load+handle {load_ms:.1} ms); warm cache beyond the floor {beyond:+.1} ms \
         (medians of {FIRST_CALL_REPEATS} alternating fresh processes; warm {wlo:.1}-{whi:.1}, \
         fixed {flo:.1}-{fhi:.1})",
        cold.first_ms
    );
    let missed = warm_runs.iter().filter(|r| r.source != "Cache").count();
    println!(
        "  {} strict fp32, fresh process each; cold: {} ({}), warm: {} ({}){}, fixed: {}; \
         CUDA context {:.1}/{:.1}/{:.1} ms; second call {:.3}/{:.3}/{:.3} ms; cache {}",
        CONFIGS[0].label(),
        cold.algo,
        cold.source,
        warm.algo,
        warm.source,
        if missed == 0 {
            String::new()
        } else {
            format!(" [cache NOT used in {missed} runs]")
        },
        fixed.algo,
        cold.ctx_ms,
        warm.ctx_ms,
        fixed.ctx_ms,
        cold.second_ms,
        warm.second_ms,
        fixed.second_ms,
        cache.display()
    );
    Ok(())
}

/// `--first-call <cache file> [--fixed ALGO]`: one timed first call in this fresh process.
fn first_call_child(args: &[String]) -> ExitCode {
    let (cache, fixed) = match args {
        [cache] => (cache, None),
        [cache, flag, algo] if flag == "--fixed" => match ConvFwdAlgo::from_name(algo) {
            Some(a) => (cache, Some(a)),
            None => {
                eprintln!("conv_explorer {FIRST_CALL_FLAG}: unknown algorithm `{algo}`");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("usage: conv_explorer {FIRST_CALL_FLAG} <cache file> [--fixed ALGO]");
            return ExitCode::from(2);
        }
    };
    match first_call_measure(Path::new(cache), fixed) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("conv_explorer {FIRST_CALL_FLAG}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn first_call_measure(cache: &Path, fixed: Option<ConvFwdAlgo>) -> Result<String> {
    let started = Instant::now();
    let ctx = cuda_context(0)?;
    let stream = ctx.default_stream();
    let ctx_ms = ms_since(started);

    // The first cuDNN call of the process: loads the library, then creates the handle.
    let started = Instant::now();
    let cudnn = Cudnn::new(stream.clone())?;
    let load_ms = ms_since(started);

    let mut p = Problem::<f32>::in_mode(&stream, &CONFIGS[0], Mode::Fp32, &mut Rng::new(7))?;
    stream.synchronize().map_err(drv("synchronizing"))?;
    let mut tuner = match fixed {
        Some(forward) => Autotuner::new(Policy::Fixed(FixedAlgos {
            forward,
            ..FixedAlgos::default()
        })),
        None => Autotuner::new(Policy::Benchmark).cache_file(cache),
    };
    let mut call = || -> Result<(f64, ConvFwdAlgo, Source)> {
        let started = Instant::now();
        let choice = tuner.forward(
            &cudnn, 1.0, &p.x_d, &p.x, &p.w_d, &p.w, &p.conv, 0.0, &p.y_d, &mut p.y,
        )?;
        stream.synchronize().map_err(drv("synchronizing"))?;
        Ok((ms_since(started), choice.algo, choice.source))
    };
    let (first_ms, algo, source) = call()?;
    let (second_ms, _, _) = call()?;
    Ok(format!(
        "{CHILD_TAG} ctx_ms={ctx_ms:.3} load_ms={load_ms:.3} first_ms={first_ms:.3} \
         second_ms={second_ms:.3} algo={} source={source:?}",
        algo.name()
    ))
}

/// The file writers on made-up measurements (no GPU needed):
/// `cargo test -p cudnn-safe-tools --bin conv_explorer`.
#[cfg(test)]
mod tests {
    use super::*;
    use cudnn_safe::graph::EngineConfig;
    use cudnn_safe::Status;
    use std::sync::Arc;

    fn fake_case(config: usize, mode: Mode) -> Case {
        let rows = ConvFwdAlgo::ALL
            .iter()
            .enumerate()
            .map(|(i, &algo)| AlgoRow {
                algo,
                heuristic_rank: (i < 5).then_some(i + 1),
                find_ms: (i < 5).then_some(0.5 + i as f32),
                workspace: (i < 5).then_some(i << 20),
                deterministic: Some(i != 4),
                outcome: if i < 5 {
                    Outcome::Ran {
                        ms: (0.2 + i as f64) * (config + 1) as f64,
                    }
                } else {
                    Outcome::Refused(Status::NOT_SUPPORTED.name())
                },
            })
            .collect();
        let graph_rows = vec![
            GraphRow {
                config: "eng12_k2=1_k5=0".into(),
                heuristic: "A",
                rank: 1,
                workspace: 4096,
                deterministic: true,
                notes: "tc".into(),
                outcome: Outcome::Ran {
                    ms: 0.1 * (config + 1) as f64,
                },
            },
            GraphRow {
                config: "eng0".into(),
                heuristic: "fallback",
                rank: 1,
                workspace: 0,
                deterministic: false,
                notes: String::new(),
                outcome: Outcome::Refused(Status::NOT_SUPPORTED.name()),
            },
        ];
        let pick: EngineConfig = "eng12_k2=1_k5=0".parse().unwrap();
        Case {
            config,
            mode,
            rows,
            graph_rows,
            heuristic_order: vec![ConvFwdAlgo::Gemm, ConvFwdAlgo::ImplicitGemm],
            find_best: Some(ConvFwdAlgo::ImplicitGemm),
            find_wall_ms: 12.5,
            problems: Vec::new(),
            policies: vec![
                (
                    Policy::Heuristic,
                    Ok(PolicyRun {
                        algo: ConvFwdAlgo::Gemm,
                        api: ConvApi::Legacy,
                        source: Source::Heuristic,
                        first_ms: 1.5,
                        steady_ms: 2.2,
                    }),
                ),
                (
                    Policy::Benchmark,
                    if config == 1 {
                        Err("no\tluck".into())
                    } else {
                        Ok(PolicyRun {
                            algo: ConvFwdAlgo::ImplicitGemm,
                            api: ConvApi::Graph(Arc::new(pick)),
                            source: Source::Benchmark,
                            first_ms: 30.0,
                            steady_ms: 0.1,
                        })
                    },
                ),
            ],
        }
    }

    #[test]
    fn writers_produce_complete_files() {
        let opts = Options::parse(&[]).unwrap();
        assert_eq!((opts.configs.len(), opts.modes.len()), (7, 4));
        let cases: Vec<Case> = opts
            .modes
            .iter()
            .flat_map(|&m| opts.configs.iter().map(move |&c| fake_case(c, m)))
            .collect();
        let dir = std::env::temp_dir().join(format!("conv-explorer-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();

        let tsv = dir.join("a.tsv");
        write_tsv(&tsv, &cases, &opts).unwrap();
        let text = std::fs::read_to_string(&tsv).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + cases.len() * (ConvFwdAlgo::ALL.len() + 2));
        assert!(lines.iter().all(|l| l.split('\t').count() == 15), "{text}");
        assert!(text.contains("32x64x56x56->128 3x3/1\tfp32\tGEMM\tok\t"));
        assert!(text.contains("\tFFT_TILING\tCUDNN_STATUS_NOT_SUPPORTED\t\t"));
        // Graph rows, the union pick marked on the graph row (the benchmark tuner ran it).
        assert!(text.contains(
            "\tfp32\teng12_k2=1_k5=0\tok\t0.100000\t4096\t1\t0\t0\t1\t\tgraph\tA\ttc\t1\n"
        ));
        assert!(text.contains(
            "\teng0\tCUDNN_STATUS_NOT_SUPPORTED\t\t0\t0\t0\t0\t1\t\tgraph\tfallback\t\t0\n"
        ));
        assert!(!lines
            .iter()
            .any(|l| l.contains("\tlegacy\t") && l.ends_with("\t1")));

        let policies = dir.join("p.tsv");
        write_policies_tsv(&policies, &cases, &opts).unwrap();
        let text = std::fs::read_to_string(&policies).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + cases.len() * 2);
        assert!(lines.iter().all(|l| l.split('\t').count() == 10), "{text}");
        assert!(text.contains(
            "\tfp16\theuristic\tGEMM\tHeuristic\t1.500000\t2.200000\t12.500\t\tlegacy GEMM\n"
        ));
        assert!(text.contains("\tbenchmark\t\t\t\t\t12.500\tno luck\t\n"));
        assert!(text.contains("\tbenchmark\tIMPLICIT_GEMM\tBenchmark\t30.000000\t0.100000\t12.500\t\tgraph eng12_k2=1_k5=0\n"));

        let svg = dir.join("c.svg");
        write_svg(&svg, &cases, &opts).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.starts_with("<svg"));
        for needle in [
            "fp32-nchw",
            "fp16-nhwc",
            "IMPLICIT_GEMM",
            "heuristic pick",
            "graph (fastest plan)",
            "union pick",
            "#2 16x256x28x28",
        ] {
            assert!(text.contains(needle), "{needle} missing from the chart");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn log_ticks_label_every_range() {
        assert_eq!(log_ticks(0.15, 12.0), [0.2, 0.5, 1.0, 2.0, 5.0, 10.0]);
        assert_eq!(log_ticks(2.1, 4.5), [3.0]);
        assert_eq!(tick_label(0.05), "0.05");
        assert_eq!(tick_label(20.0), "20");
    }

    #[test]
    fn child_report_parses_and_rejects() {
        let r = ChildReport::parse(
            "first-call-result ctx_ms=1.5 load_ms=2 first_ms=3.25 second_ms=0.5 algo=GEMM source=Cache",
        )
        .unwrap();
        assert_eq!(
            (r.ctx_ms, r.load_ms, r.first_ms, r.second_ms),
            (1.5, 2.0, 3.25, 0.5)
        );
        assert_eq!((r.algo.as_str(), r.source.as_str()), ("GEMM", "Cache"));
        assert!(ChildReport::parse("first-call-result ctx_ms=x").is_err());
        let quick = Options::parse(&["--quick".into(), "--no-first-call".into()]).unwrap();
        assert_eq!(quick.configs, [0, 1]);
        assert_eq!(quick.modes, [Mode::Fp32, Mode::Fp16]);
        assert!(!quick.first_call);
        assert_eq!(quick.graph_plans, GRAPH_PLANS);
        let legacy = Options::parse(&["--graph-plans".into(), "0".into()]).unwrap();
        assert_eq!(legacy.graph_plans, 0);
        assert!(Options::parse(&["--graph-plans".into(), "many".into()]).is_err());
        assert!(Options::parse(&["--graph-plans".into()]).is_err());
        assert!(Options::parse(&["--modes".into(), "fp16,bogus".into()]).is_err());
        assert_eq!(
            Options::parse(&["--modes=bf16,tf32,bf16".into()])
                .unwrap()
                .modes,
            [Mode::Bf16, Mode::Tf32]
        );
    }
}
