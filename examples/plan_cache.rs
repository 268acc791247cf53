//! A graph plan chosen once, kept in a file, and found again by the next process: what
//! [`PlanCache`] saves and what [`PlanCache::warm_up`] does at start-up.
//!
//! ```text
//! cargo run --release --example plan_cache
//! ```
//!
//! The graph is `y = conv(x, w)`, f16 NHWC `32×64×56×56 → 128`, 3×3, padding 1, f32 inside.
//!
//! 1. **First run**: build the graph, build a few plans (heuristics A, then the fallback list),
//!    time them ([`autotune`]) and store the fastest in a [`PlanCache::try_cache_file`], which
//!    writes the file (the engine configuration and the graph it belongs to).
//! 2. **Next run** (a second cache on the same file, as a new process would open it):
//!    [`PlanCache::warm_up`] at start-up rebuilds the recorded plan and executes it once on
//!    scratch buffers, so that the first real call builds nothing, runs no heuristics and loads
//!    no kernel: [`PlanCache::get_or_build`] finds the plan held.
//!
//! Both outputs are compared (bit for bit when the engine is deterministic). What a first call
//! costs in a fresh process, cold and warm, measured in child processes, is a tool:
//! `cargo run --release -p cudnn-safe-tools --bin plan_cache`.
//!
//! Exit status: 0 when the outputs agree, 1 otherwise, 2 without a GPU.
#[path = "common/mod.rs"]
mod common;

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use common::{drv, Rng};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::graph::{
    autotune, Args, ConvParams, Graph, OperationGraph, Plan, PlanCache, PlanFilter, TensorId,
};
use cudnn_safe::half::f16;
use cudnn_safe::{Cudnn, DType, Result, Workspace};

const X: [i64; 4] = [32, 64, 56, 56];
const W: [i64; 4] = [128, 64, 3, 3];
/// Plans built and timed in the first run.
const CANDIDATES: usize = 4;

fn main() -> ExitCode {
    let Some((stream, cudnn)) = common::open_gpu("plan_cache") else {
        return ExitCode::from(2);
    };
    println!("{}", common::device_line(&stream));
    let dir = std::env::temp_dir().join(format!("cudnn-safe-plan-cache-{}", std::process::id()));
    let result = std::fs::create_dir_all(&dir)
        .map_err(|source| cudnn_safe::Error::Io { path: dir.clone(), source })
        .and_then(|()| run(&stream, &cudnn, &dir.join("plans.txt")));
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("plan_cache: {}", common::chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The graph and its tensors `x`, `w`, `y`.
fn conv_graph(cudnn: &Cudnn) -> Result<(OperationGraph, [TensorId; 3])> {
    let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    let x = g.tensor_nhwc("x", &X, DType::F16)?;
    let w = g.tensor_nhwc("w", &W, DType::F16)?;
    let y = g.conv_fprop(x, w, &ConvParams::new(2).with_padding(&[1, 1]))?;
    g.set_name(y, "y")?;
    g.mark_output(y)?;
    Ok((g.build(cudnn)?, [x, w, y]))
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn run(stream: &Arc<CudaStream>, cudnn: &Cudnn, file: &Path) -> Result<bool> {
    let mut rng = Rng::new(3);
    let up = |v: Vec<f16>| stream.clone_htod(&v).map_err(drv("uploading"));
    let x = up(rng.values((X.iter().product::<i64>()) as usize))?;
    let w_host: Vec<f16> = rng
        .values::<f32>(W.iter().product::<i64>() as usize)
        .iter()
        .map(|v| f16::from_f32(v / 8.0))
        .collect();
    let w = up(w_host)?;
    let filter = PlanFilter::new(); // part of the cache key: the same in every run

    // 1. First run: autotune a few plans, keep the fastest in the file.
    let started = Instant::now();
    let (og, [xt, wt, yt]) = conv_graph(cudnn)?;
    let mut y_first = stream.alloc_zeros::<f16>(og.span(yt)?).map_err(drv("allocating y"))?;
    let mut ws = Workspace::new(stream.clone());
    let list = og.plans(cudnn, &filter.clone().with_max_plans(Some(CANDIDATES)))?;
    let tuned = {
        let mut args = Args::new(cudnn);
        args.input(xt, &x)?.input(wt, &w)?.output(yt, &mut y_first)?;
        autotune(cudnn, list.plans, &args, &mut ws, &cudnn_safe::tune::plan::Policy::new())?
    };
    for t in &tuned.candidates {
        println!("  candidate {:<40} {:.4} ms", t.name, t.ms);
    }
    let mut cache = PlanCache::new().try_cache_file(file)?;
    let plan = cache.insert(cudnn, &og, &filter, tuned.plan)?;
    let (config, deterministic) = (plan.name(), plan.is_deterministic());
    execute(cudnn, plan, [xt, wt, yt], &x, &w, &mut y_first, &mut ws)?;
    println!(
        "first run: {config} chosen and saved in {:.1} ms ({} line(s) in {})",
        ms_since(started),
        std::fs::read_to_string(file).map_or(0, |s| s.lines().count()),
        file.display()
    );

    // 2. Next run: a fresh cache on the file, warmed up at start-up.
    let started = Instant::now();
    let mut cache = PlanCache::new().try_cache_file(file)?;
    let mut ws = Workspace::new(stream.clone());
    let warm = cache.warm_up(cudnn, &mut ws)?;
    println!(
        "next run: warm-up replayed {} plan(s) in {:.1} ms (skipped {})",
        warm.replayed,
        ms_since(started),
        warm.skipped.len()
    );
    let started = Instant::now();
    let (og, ids) = conv_graph(cudnn)?;
    let plan = cache.get_or_build(cudnn, &og, &filter)?;
    let mut y_next = stream.alloc_zeros::<f16>(og.span(ids[2])?).map_err(drv("allocating y"))?;
    execute(cudnn, plan, ids, &x, &w, &mut y_next, &mut ws)?;
    let name = plan.name();
    println!(
        "next run: first call (graph, cached plan, execute) {:.3} ms, running {name}; cache hits \
         {}, misses {}",
        ms_since(started),
        cache.stats().hits,
        cache.stats().misses
    );

    // Same engine configuration, same inputs: the same output.
    let down = |y: &CudaSlice<f16>| stream.clone_dtoh(y).map_err(drv("downloading y"));
    let (a, b) = (down(&y_first)?, down(&y_next)?);
    let scale = a.iter().map(|v| v.to_f32().abs()).fold(0.0, f32::max);
    let diff = a.iter().zip(&b).map(|(p, q)| (p.to_f32() - q.to_f32()).abs()).fold(0.0, f32::max);
    let written = scale > 0.0 && a.iter().chain(&b).all(|v| v.is_finite());
    let ok = written && if deterministic { a == b } else { diff <= 2e-2 * scale };
    println!(
        "outputs: largest difference {diff:e} ({}) -> {}",
        if deterministic { "deterministic engine: must be 0" } else { "fp16 tolerance" },
        if ok { "ok" } else { "MISMATCH" }
    );
    Ok(ok && name == config)
}

/// Binds x, w and y to the graph's tensors and executes `plan`, then waits for it.
#[allow(clippy::too_many_arguments)] // one graph's buffers
fn execute(
    cudnn: &Cudnn,
    plan: &Plan,
    [xt, wt, yt]: [TensorId; 3],
    x: &CudaSlice<f16>,
    w: &CudaSlice<f16>,
    y: &mut CudaSlice<f16>,
    ws: &mut Workspace,
) -> Result<()> {
    let mut args = Args::new(cudnn);
    args.input(xt, x)?.input(wt, w)?.output(yt, y)?;
    cudnn.execute(plan, &args, ws)?;
    cudnn.stream().synchronize().map_err(drv("synchronizing"))
}
