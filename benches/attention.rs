//! Scaled dot-product attention through the graph API ([`Graph::sdpa`], [`Graph::sdpa_backward`]):
//! batch 8, 16 heads, sequence 4096, head dimension 128, causal, bf16, q / k / v stored
//! `[b, s, h, d]`. Each graph's plans are autotuned (CUDA events, fastest kept), then timed as the
//! median of batches of back-to-back executions.
//!
//! Prints one line per measurement, for scripts to grep:
//! `attention fwd bf16 b8 h16 s4096 d128 causal: X ms, Y TFLOP/s`, and the same for `fwd-train`
//! (with the statistics output), `bwd` and `fwd+bwd` (training forward plus backward), with
//! FLOPs counted as FlashAttention does: causal forward `4·b·h·s²·d / 2`, backward 2.5 times that.
//! `benches/pytorch/attention.py` prints the same lines for PyTorch's cuDNN attention backend.
//!
//! Knobs: `ATTENTION_BENCH_MAX_PLANS` (plans autotuned per graph, default 8),
//! `ATTENTION_BENCH_REFINE` (fastest plans whose knob neighbours are tried too, default 2),
//! `ATTENTION_BENCH_SEQ` (sequence length, default 4096), `ATTENTION_BENCH_KV_HEADS` (key and
//! value heads, dividing 16: grouped-query attention below 16, multi-query at 1; default 16; the
//! lines then read `h16 hkv4` etc.), `ATTENTION_BENCH_DETERMINISTIC=1` (the backward graph in
//! its deterministic form, [`SdpaOptions::deterministic`]; the lines then read `bwd-det` and
//! `fwd+bwd-det`), `ATTENTION_BENCH_WINDOW=w` (a sliding window of `w` keys,
//! [`SdpaOptions::sliding_window`]; the lines then end `causal swa{w}` and count the FLOPs of
//! the keys inside the window).
mod common;

use std::sync::Arc;

use common::*;
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::graph::{
    autotune, Args as GraphArgs, EngineConfig, Graph, OperationGraph, Plan, PlanFilter, SdpaOptions,
};
use cudnn_safe::half::bf16;
use cudnn_safe::tune;
use cudnn_safe::{Cudnn, DType, Workspace};

const B: i64 = 8;
const H: i64 = 16;
const D: i64 = 128;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `[b, h, s, d]` stored as `[b, s, h, d]`, for `h` heads.
fn bshd(s: i64, h: i64) -> [i64; 4] {
    [s * h * D, D, h * D, 1]
}

/// Key and value heads (`ATTENTION_BENCH_KV_HEADS`, dividing [`H`]).
fn kv_heads() -> BoxResult<i64> {
    let h = env_usize("ATTENTION_BENCH_KV_HEADS", H as usize) as i64;
    if h < 1 || H % h != 0 {
        return Err(format!("ATTENTION_BENCH_KV_HEADS={h} does not divide {H}").into());
    }
    Ok(h)
}

fn label(what: &str, s: i64, h_kv: i64) -> String {
    let kv = if h_kv == H {
        String::new()
    } else {
        format!(" hkv{h_kv}")
    };
    let swa = window().map_or(String::new(), |w| format!(" swa{w}"));
    format!("attention {what} bf16 b{B} h{H}{kv} s{s} d{D} causal{swa}")
}

/// The sliding window (`ATTENTION_BENCH_WINDOW`), if set.
fn window() -> Option<i64> {
    std::env::var("ATTENTION_BENCH_WINDOW")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// The options of the benchmarked graphs: causal, with the window if set.
fn options() -> SdpaOptions {
    let o = SdpaOptions::new().causal(true);
    window().map_or(o, |w| o.sliding_window(w))
}

fn report(what: &str, s: i64, h_kv: i64, ms: f64, flops: f64) {
    println!(
        "{}: {ms:.4} ms, {:.1} TFLOP/s",
        label(what, s, h_kv),
        tflops(flops, ms)
    );
}

fn upload(stream: &Arc<CudaStream>, n: usize, seed: usize) -> BoxResult<CudaSlice<bf16>> {
    // Small values: softmax stays well conditioned; `values` is deterministic.
    let v: Vec<bf16> = values::<bf16>(n + seed, 0.5)[seed..].to_vec();
    Ok(stream.clone_htod(&v)?)
}

/// Autotunes the graph's first `max` plans on the bound buffers, then the knob neighbours
/// ([`OperationGraph::knob_neighbours`]) of the `ATTENTION_BENCH_REFINE` fastest (default 2, at
/// most 24 built per plan) against the winner. Rounds of 10 executions (about 10 ms at this
/// size), so that candidates are compared at the clocks a steady run settles at.
fn tune(
    cudnn: &Cudnn,
    og: &OperationGraph,
    plans: Vec<Plan>,
    args: &GraphArgs<'_>,
    ws: &mut Workspace,
    what: &str,
) -> BoxResult<Plan> {
    let opts = tune::plan::Policy::new().with_rounds(3).with_iterations(10);
    let tuned = autotune(cudnn, plans, args, ws, &opts)?;
    for t in &tuned.candidates {
        eprintln!("  {what}: plan {} {:.4} ms", t.name, t.ms);
    }
    let refine = env_usize("ATTENTION_BENCH_REFINE", 2);
    let seeds: Vec<EngineConfig> = tuned
        .candidates
        .iter()
        .take(refine)
        .filter_map(|t| t.name.parse().ok())
        .collect();
    let mut candidates = vec![tuned.plan];
    for seed in seeds {
        let mut built = 0;
        for n in og.knob_neighbours(cudnn, &seed).unwrap_or_default() {
            if built == 24 {
                break;
            }
            if candidates.iter().any(|p| *p.config() == n) {
                continue;
            }
            if let Ok(p) = og.plan_from_config(cudnn, &n) {
                candidates.push(p);
                built += 1;
            }
        }
    }
    if candidates.len() == 1 {
        return Ok(candidates.pop().expect("one plan"));
    }
    let tuned = autotune(cudnn, candidates, args, ws, &opts)?;
    for t in tuned.candidates.iter().take(4) {
        eprintln!(
            "  {what}: with knob neighbours: plan {} {:.4} ms",
            t.name, t.ms
        );
    }
    Ok(tuned.plan)
}

fn run(stream: &Arc<CudaStream>, cudnn: &Cudnn, test: bool) -> BoxResult<()> {
    let s = env_usize("ATTENTION_BENCH_SEQ", 4096) as i64;
    let h_kv = kv_heads()?;
    let max_plans = env_usize("ATTENTION_BENCH_MAX_PLANS", 8);
    let dims = [B, H, s, D];
    let kv_dims = [B, h_kv, s, D];
    let n = (B * H * s * D) as usize;
    let n_kv = (B * h_kv * s * D) as usize;
    // 4·b·h·d per visible (query, key) pair: s²/2 of them causal, Σ_i min(i + 1, w) in a window.
    let pairs = match window() {
        Some(w) => (0..s).map(|i| (i + 1).min(w) as f64).sum::<f64>(),
        None => (s as f64).powi(2) / 2.0,
    };
    let fwd_flops = 4.0 * (B * H) as f64 * pairs * D as f64;
    let filter = PlanFilter::new().with_max_plans(Some(max_plans));
    let mut ws = Workspace::new(stream.clone());

    let qb = upload(stream, n, 0)?;
    let kb = upload(stream, n_kv, 1)?;
    let vb = upload(stream, n_kv, 2)?;
    let mut ob = stream.alloc_zeros::<bf16>(n)?;
    let mut statsb = stream.alloc_zeros::<f32>((B * H * s) as usize)?;

    // Forward, inference and training (statistics out).
    let mut fwd_train_ms = 0.0;
    for training in [false, true] {
        let what = if training { "fwd-train" } else { "fwd" };
        let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
        let q = g.tensor("q", &dims, &bshd(s, H), DType::BF16)?;
        let k = g.tensor("k", &kv_dims, &bshd(s, h_kv), DType::BF16)?;
        let v = g.tensor("v", &kv_dims, &bshd(s, h_kv), DType::BF16)?;
        let out = g.sdpa(q, k, v, &options().training(training))?;
        let og = g.build(cudnn)?;
        let plans = og.plans(cudnn, &filter)?.plans;
        let mut args = GraphArgs::new(cudnn);
        args.input(q, &qb)?.input(k, &kb)?.input(v, &vb)?;
        args.output(out.o, &mut ob)?;
        if let Some(st) = out.stats {
            args.output(st, &mut statsb)?;
        }
        let plan = tune(cudnn, &og, plans, &args, &mut ws, what)?;
        let ms = median_ms(stream, test, || Ok(cudnn.execute(&plan, &args, &mut ws)?))?;
        report(what, s, h_kv, ms, fwd_flops);
        if training {
            fwd_train_ms = ms;
        }
    }

    // Backward, reading the training forward's O and statistics.
    let dob = upload(stream, n, 3)?;
    let mut dqb = stream.alloc_zeros::<bf16>(n)?;
    let mut dkb = stream.alloc_zeros::<bf16>(n_kv)?;
    let mut dvb = stream.alloc_zeros::<bf16>(n_kv)?;
    let mut sumb = stream.alloc_zeros::<f32>((B * H * s) as usize)?;
    let mut accb = stream.alloc_zeros::<f32>(n)?;
    let det = env_usize("ATTENTION_BENCH_DETERMINISTIC", 0) != 0;
    let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    let q = g.tensor("q", &dims, &bshd(s, H), DType::BF16)?;
    let k = g.tensor("k", &kv_dims, &bshd(s, h_kv), DType::BF16)?;
    let v = g.tensor("v", &kv_dims, &bshd(s, h_kv), DType::BF16)?;
    let o = g.tensor("o", &dims, &bshd(s, H), DType::BF16)?;
    let d_o = g.tensor("dO", &dims, &bshd(s, H), DType::BF16)?;
    let stats = g.tensor_nchw("stats", &[B, H, s, 1], DType::F32)?;
    let opts = options().deterministic(det);
    let gr = g.sdpa_backward(q, k, v, o, d_o, stats, &opts)?;
    let og = g.build(cudnn)?;
    let mut plans = Some(og.plans(cudnn, &filter)?.plans);
    let (bwd, both) = if det {
        ("bwd-det", "fwd+bwd-det")
    } else {
        ("bwd", "fwd+bwd")
    };
    // Pass 0 tunes and times; passes 1 and 2 run the chosen plan once each and keep dQ, to
    // report whether two runs give the same bits (the f32 accumulation of the default form may
    // sum in another order each time; the deterministic form must not).
    let mut chosen = None;
    let mut runs = Vec::new();
    for pass in 0..3 {
        let mut args = GraphArgs::new(cudnn);
        args.input(q, &qb)?.input(k, &kb)?.input(v, &vb)?;
        args.input(o, &ob)?
            .input(d_o, &dob)?
            .input(stats, &statsb)?;
        args.output(gr.dq, &mut dqb)?
            .output(gr.dk, &mut dkb)?
            .output(gr.dv, &mut dvb)?;
        args.output(gr.softmax_sum, &mut sumb)?;
        if let Some(acc) = gr.dq_accum {
            args.output(acc, &mut accb)?;
        }
        match (pass, plans.take(), &chosen) {
            (0, Some(plans), _) => {
                let plan = tune(cudnn, &og, plans, &args, &mut ws, bwd)?;
                let bwd_ms = median_ms(stream, test, || Ok(cudnn.execute(&plan, &args, &mut ws)?))?;
                report(bwd, s, h_kv, bwd_ms, 2.5 * fwd_flops);
                report(both, s, h_kv, fwd_train_ms + bwd_ms, 3.5 * fwd_flops);
                chosen = Some(plan);
            }
            (_, _, Some(plan)) => {
                cudnn.execute(plan, &args, &mut ws)?;
                drop(args);
                stream.synchronize()?;
                runs.push(stream.clone_dtoh(&dqb)?);
            }
            _ => unreachable!("pass 0 chooses the plan"),
        }
    }
    let differ = runs[0]
        .iter()
        .zip(&runs[1])
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    println!(
        "{}: dQ of two runs differs in {differ} of {n} elements",
        label(bwd, s, h_kv)
    );
    Ok(())
}

fn main() {
    let _ = env_logger::try_init();
    let Some((stream, cudnn)) = setup_or_skip() else {
        return;
    };
    print_header(&stream, &cudnn);
    let args = Args::parse();
    if args.list || args.ignored {
        return;
    }
    let outcome = run(&stream, &cudnn, args.test);
    exit_on_error("attention", outcome);
}
