//! ResNet-18/50 training on cudnn-safe in bfloat16 with float32 master weights (PyTorch's autocast
//! recipe): batch norm in training mode with its ReLU and residual add fused, data and filter
//! gradients through the autotuner, SGD with momentum, the whole step captured once into a CUDA
//! graph ([`Cudnn::capture`]) and replayed.
//!
//! ```text
//! cargo run --release --example resnet_train                     # ResNet-18, batch 32, 30 steps
//! cargo run --release --example resnet_train -- --train resnet50_b32 --steps 40
//! cargo run --release --example resnet_train -- --check DIR      # gradients against PyTorch's
//! cargo run --release --example resnet_train -- --time resnet50_b128,resnet18_b128
//! ```
//!
//! * `--train <resnet18|resnet50>_b<batch>` (the default, `resnet18_b32`, when nothing else is
//!   asked): `--steps` steps (default 30) of SGD (lr `--lr`, default 0.02, momentum 0.9) on
//!   synthetic data, 4 fixed batches in turn. Each image is its class's pattern (10 classes, a
//!   random 8×8 grid per channel, upsampled) plus noise. The first step runs call by call (it
//!   chooses the algorithms); every later one is a replay of the captured step. Prints each
//!   step's loss and writes `resnet_train_loss.svg` to `$CUDNN_SAFE_OUT_DIR` (else the current
//!   directory). Passes when the loss falls at least 2×.
//! * `--check DIR`: reads `DIR/resnet18_train.safetensors` and/or `resnet50_train.safetensors`
//!   (`python3 benches/pytorch/resnet.py grads DIR`: torchvision's initial weights, a batch of
//!   16 images and labels, the loss and every parameter's gradient under autocast bfloat16, in
//!   float32 with cuDNN, and in float64 without it, the reference) and runs one step without
//!   the update twice: in bfloat16, compared with PyTorch's autocast loss and gradients
//!   (relative L2 error per tensor within 3e-2, or within twice PyTorch's own autocast error
//!   against float64 where that is larger: at initialization bfloat16 rounding moves these
//!   gradients by tens of percent), and in strict float32 (implicit-GEMM and ALGO_1
//!   convolutions with FMA math, no TF32; plain batch norm, ReLU and add as separate calls),
//!   compared with the float64 gradients (within 2e-3, or twice PyTorch's own float32 error
//!   where that is larger: PyTorch's float32 gradients are themselves up to ~8e-3 off float64
//!   here, and one ReLU that flips sign moves a last-block batch-norm gradient by about
//!   1/784). A replay of the captured step must reproduce the call-by-call gradients.
//! * `--time CASES` (`resnet50_b128,...`): the first step's wall time (algorithm choice
//!   included), then the step call by call and as a replayed CUDA graph (median of 5 batches of
//!   10 steps); one JSON line per figure.
//! * `--max-plans N` (default 4): graph plans the autotuner times per convolution direction and
//!   source; `--refine N` and `--finalists N` set its knob refinement and finals (the library's
//!   defaults otherwise; 0 turns them off); `--effort quick|thorough` its search effort
//!   (`SearchEffort`, set before the other three; default `quick`: a cold ResNet-50 step
//!   searches for seconds instead of a minute, to the same steady-state step time in the
//!   measurements of docs/BENCHMARKS.md). `--cache FILE`: keep its decisions in a file; a later
//!   process starts from them (the remembered plans are rebuilt at start-up).
//! * `--split-bn`: batch norm without the fused ReLU and add (separate calls instead).
//!
//! Exit status: 0 when every check passes, 1 otherwise, 2 without a GPU.
#[path = "common/mod.rs"]
mod common;
#[path = "common/resnet.rs"]
mod resnet;
#[path = "common/resnet_train.rs"]
mod resnet_train;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use common::{Rng, Timer};
use cudnn_safe::blas::Blas;
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::half::bf16;
use cudnn_safe::tune::{FixedAlgos, Policy, SearchEffort};
use cudnn_safe::{Autotuner, Cudnn, Workspace};
use resnet::{Arch, Res, Tensors};
use resnet_train::{Elem, Profile, Sgd, TrainCx, TrainNet, CLASSES};

struct Options {
    train: Option<String>,
    steps: usize,
    lr: f32,
    check: Option<PathBuf>,
    time: Vec<String>,
    max_plans: usize,
    refine: Option<usize>,
    finalists: Option<usize>,
    effort: SearchEffort,
    cache: Option<PathBuf>,
    split_bn: bool,
}

fn options() -> Res<Options> {
    let mut o = Options {
        train: None,
        steps: 30,
        lr: 0.02,
        check: None,
        time: Vec::new(),
        max_plans: 4,
        refine: None,
        finalists: None,
        effort: SearchEffort::Quick,
        cache: None,
        split_bn: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--train" => o.train = Some(value()?),
            "--steps" => o.steps = value()?.parse()?,
            "--lr" => o.lr = value()?.parse()?,
            "--check" => o.check = Some(value()?.into()),
            "--time" => o.time = value()?.split(',').map(String::from).collect(),
            "--max-plans" => o.max_plans = value()?.parse()?,
            "--refine" => o.refine = Some(value()?.parse()?),
            "--finalists" => o.finalists = Some(value()?.parse()?),
            "--effort" => o.effort = value()?.parse()?,
            "--cache" => o.cache = Some(value()?.into()),
            "--split-bn" => o.split_bn = true,
            _ => {
                return Err(format!("unknown argument {a} (see the example's documentation)").into())
            }
        }
    }
    if o.train.is_none() && o.check.is_none() && o.time.is_empty() {
        o.train = Some("resnet18_b32".into());
    }
    if o.steps < 2 {
        return Err("--steps must be at least 2".into());
    }
    Ok(o)
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let Some((default, _)) = common::open_gpu("resnet_train") else {
        return ExitCode::from(2);
    };
    println!("{}", common::device_line(&default));
    // The per-thread default stream: CUDA cannot capture the legacy default stream.
    let stream = default.context().per_thread_stream();
    match options().and_then(|o| run(&stream, &o)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("resnet_train: {}", common::chain(&*e));
            ExitCode::FAILURE
        }
    }
}

/// What every case shares: the handles, the autotuner, the workspace.
struct Shared {
    cudnn: Cudnn,
    blas: Blas,
    tuner: Autotuner,
    /// The float32 check's: implicit GEMM and ALGO_1, the GEMM-based algorithms (no FFT or
    /// Winograd transforms, whose rounding these gradients amplify).
    exact: Autotuner,
    ws: Workspace,
    split_bn: bool,
}

impl Shared {
    fn cx(&mut self) -> TrainCx<'_> {
        let (cudnn, blas) = (&self.cudnn, &self.blas);
        TrainCx { cudnn, blas, tuner: &mut self.tuner, ws: &mut self.ws, prof: None }
    }
    /// With the tuner a network of type `T` is checked with.
    fn check_cx<T: Elem>(&mut self) -> TrainCx<'_> {
        let exact = T::DTYPE == cudnn_safe::DType::F32;
        let tuner = if exact { &mut self.exact } else { &mut self.tuner };
        let (cudnn, blas) = (&self.cudnn, &self.blas);
        TrainCx { cudnn, blas, tuner, ws: &mut self.ws, prof: None }
    }
}

fn run(stream: &Arc<CudaStream>, o: &Options) -> Res<bool> {
    let mut tuner =
        Autotuner::new(Policy::Benchmark).with_effort(o.effort).with_graph_plans(o.max_plans);
    if let Some(n) = o.refine {
        tuner = tuner.with_refine_knobs(n);
    }
    if let Some(n) = o.finalists {
        tuner = tuner.with_finalists(n);
    }
    let tuner = match &o.cache {
        Some(f) => tuner.try_cache_file(f)?,
        None => tuner.without_cache_file(),
    };
    let mut sh = Shared {
        cudnn: Cudnn::new(stream.clone())?,
        blas: Blas::new(stream.clone())?,
        tuner,
        exact: Autotuner::new(Policy::Fixed(FixedAlgos::default())).without_cache_file(),
        ws: Workspace::new(stream.clone()),
        split_bn: o.split_bn,
    };
    if o.cache.is_some() {
        // A process that starts with decisions: open cuDNN's sub-libraries and rebuild the
        // remembered plans now, so that the first step builds nothing.
        let p = cudnn_safe::graph::preload(&sh.cudnn)?;
        let w = sh.tuner.warm_up(&sh.cudnn)?;
        println!(
            "start-up: preload {:.3} s (sub-libraries {:.3} s), warm-up {:.3} s ({} decisions, {} graph plans rebuilt on {} threads in {:.3} s)",
            (p.open + p.engines).as_secs_f64(),
            p.open.as_secs_f64(),
            w.elapsed.as_secs_f64(),
            w.replayed,
            w.built,
            cudnn_safe::graph::build_threads(),
            w.building.as_secs_f64()
        );
    }
    let mut ok = true;
    for case in &o.time {
        let (arch, batch) = parse_case(case)?;
        ok &= time(&mut sh, arch, batch)?;
    }
    if let Some(case) = &o.train {
        let (arch, batch) = parse_case(case)?;
        ok &= train(&mut sh, arch, batch, o)?;
    }
    if let Some(dir) = &o.check {
        let mut found = false;
        for arch in [Arch::ResNet18, Arch::ResNet50] {
            let file = dir.join(format!("{}_train.safetensors", arch.name()));
            if !file.exists() {
                continue;
            }
            found = true;
            let tensors = Tensors::read(&file)?;
            ok &= check::<bf16>(&mut sh, arch, &tensors)?;
            ok &= check::<f32>(&mut sh, arch, &tensors)?;
        }
        if !found {
            return Err(format!(
                "no resnet18_train.safetensors or resnet50_train.safetensors in {}",
                dir.display()
            )
            .into());
        }
    }
    Ok(ok)
}

fn parse_case(case: &str) -> Res<(Arch, i64)> {
    let parsed = case.split_once('_').and_then(|(a, b)| {
        Some((Arch::parse(a)?, b.strip_prefix('b').and_then(|b| b.parse::<i64>().ok())?))
    });
    parsed.ok_or_else(|| format!("case `{case}`: expected <resnet18|resnet50>_b<batch>").into())
}

#[allow(clippy::too_many_arguments)] // the network's description and the step's buffers
/// A network whose first step runs: the stem reads 3 channels where an engine takes them, else
/// zero-padded ones. Returns the network, its input (from `nchw`) and the first step's seconds
/// (the step alone: the network's weights are uploaded before).
fn first_step<T: Elem>(
    sh: &mut Shared,
    arch: Arch,
    batch: i64,
    weights: &Tensors,
    nchw: &[f32],
    onehot: &CudaSlice<f32>,
    nll: &mut CudaSlice<f32>,
    sgd: Option<Sgd>,
) -> Res<(TrainNet<T>, CudaSlice<T>, f64)> {
    let stream = sh.cudnn.stream().clone();
    let n = batch as usize;
    for cp in [3, 4, 8] {
        let mut net = TrainNet::new(&sh.cudnn, arch, batch, cp, weights, sh.split_bn)?;
        let x = stream.clone_htod(&resnet::to_input::<T>(nchw, n, cp as usize))?;
        stream.synchronize()?;
        let started = Instant::now();
        match net.step(&mut sh.check_cx::<T>(), &x, onehot, nll, sgd) {
            Ok(()) => {
                stream.synchronize()?;
                // An error cudarc recorded instead of returning would not show otherwise.
                stream.context().check_err()?;
                return Ok((net, x, started.elapsed().as_secs_f64()));
            }
            Err(e) if cp < 8 => println!("with {cp} input channels: {e}; padding the input"),
            Err(e) => return Err(e.into()),
        }
    }
    Err("no input layout ran".into())
}

/// One-hot rows of `[n, 1000]` for `labels`.
fn one_hot(labels: &[usize]) -> Vec<f32> {
    let mut v = vec![0.0; labels.len() * CLASSES as usize];
    for (i, &l) in labels.iter().enumerate() {
        v[i * CLASSES as usize + l] = 1.0;
    }
    v
}

/// `‖a − b‖ / ‖b‖`; NaN when anything is not finite.
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() || a.iter().chain(b).any(|v| !v.is_finite()) {
        return f64::NAN;
    }
    let d: f64 = a.iter().zip(b).map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2)).sum();
    let r: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (d / r.max(f64::MIN_POSITIVE)).sqrt()
}

/// One step without the update on the file's batch; gradients compared with PyTorch's (see the
/// module documentation): in bfloat16 within 3e-2 of its autocast gradients, or twice
/// autocast's own error against float64 where that is larger; in float32 within 2e-3 of its
/// float64 gradients, or twice PyTorch's own float32 error where that is larger.
fn check<T: Elem>(sh: &mut Shared, arch: Arch, file: &Tensors) -> Res<bool> {
    let half = T::DTYPE != cudnn_safe::DType::F32;
    let (tag, prefix, loss_name) =
        if half { ("bf16", "grad.", "loss") } else { ("f32", "grad64.", "loss64") };
    let stream = sh.cudnn.stream().clone();
    let (shape, images) = file.get("input")?;
    let batch = shape[0];
    let labels: Vec<usize> = file.get("labels")?.1.iter().map(|&l| l as usize).collect();
    let onehot = stream.clone_htod(&one_hot(&labels))?;
    let mut nll = stream.alloc_zeros::<f32>(labels.len() * CLASSES as usize)?;
    let (mut net, x, first_s) =
        first_step::<T>(sh, arch, batch as i64, file, images, &onehot, &mut nll, None)?;
    let loss = stream.clone_dtoh(&nll)?.iter().map(|&v| f64::from(v)).sum::<f64>() / batch as f64;
    let grads = stream.clone_dtoh(&net.params.grad)?;
    let torch_loss = f64::from(file.get(loss_name)?.1[0]);
    println!(
        "{} {tag} b{batch} gradients (first step {first_s:.2} s, {} input channels): loss {loss:.5}, PyTorch's {torch_loss:.5}",
        arch.name(),
        net.in_channels
    );
    let loss_tolerance = if half { 2e-2 } else { 1e-4 };
    let mut ok = (loss - torch_loss).abs() <= loss_tolerance * torch_loss.abs().max(1.0);
    let target: f64 = if half { 3e-2 } else { 2e-3 };
    let mut rows = Vec::new();
    for e in &net.params.entries {
        let ours = e.to_torch(&grads[e.range.clone()]);
        let want = &file.get(&format!("{prefix}{}", e.name))?.1;
        // PyTorch's own error in this type against float64.
        let theirs = &file.get(&format!("{}{}", if half { "grad." } else { "grad32." }, e.name))?.1;
        let truth = &file.get(&format!("grad64.{}", e.name))?.1;
        let (err, own, ours64) = (rel_l2(&ours, want), rel_l2(theirs, truth), rel_l2(&ours, truth));
        let tolerance = target.max(2.0 * own);
        ok &= err <= tolerance;
        rows.push((e.name.clone(), err, own, ours64, err <= tolerance));
    }
    let over = rows.iter().filter(|r| r.1.is_nan() || r.1 > target).count();
    let failed = rows.iter().filter(|r| !r.4).count();
    let worst = rows.iter().map(|r| r.1).fold(0.0, f64::max);
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    let vs = if half { "autocast" } else { "float64" };
    println!(
        "  {} tensors: worst rel err vs PyTorch's {vs} gradients {worst:.2e}; {over} above {target:e}, {failed} above their tolerance; the largest:",
        rows.len()
    );
    let own_label = if half { "torch autocast vs f64" } else { "torch f32 vs f64" };
    println!("  {:<30} {:>12} {own_label:>24} {:>12}", "tensor", format!("vs {vs}"), "ours vs f64");
    for (i, (name, err, own, o64, pass)) in rows.iter().enumerate() {
        if i >= 8 && *pass {
            continue;
        }
        let mark = if *pass { "" } else { "  FAILED" };
        println!("  {name:<30} {err:>12.2e} {own:>24.2e} {o64:>12.2e}{mark}");
    }
    println!(
        "{{\"op\": \"{}_{tag}_train_grads_b{batch}\", \"worst_rel_err\": {worst:.3e}, \"above_target\": {over}, \"failed\": {failed}, \"loss\": {loss:.6}, \"torch_loss\": {torch_loss:.6}}}",
        arch.name()
    );

    // A replay of the captured step computes the same gradients.
    let mut cx = sh.check_cx::<T>();
    // SAFETY: the closure reaches device memory through `buffers`, `&mut` borrows and shared
    // borrows of the network, which holds none behind interior mutability; all outlive the graph.
    let replayed = unsafe {
        cx.cudnn.capture((x, onehot, nll), |_, (x, onehot, nll)| {
            net.step(&mut cx, x, onehot, nll, None)
        })
    }
    .and_then(|graph| graph.launch());
    match replayed {
        Ok(()) => {
            stream.synchronize()?;
            let replayed = stream.clone_dtoh(&net.params.grad)?;
            let replay_diff = rel_l2(&replayed, &grads);
            println!(
                "  replayed step: gradients differ from the call-by-call step by {replay_diff:.2e}"
            );
            ok &= replay_diff <= 1e-2;
        }
        Err(e) => {
            println!("  capturing the step failed: {e}");
            ok = false;
        }
    }
    if !ok {
        println!("{} {tag}: gradient check FAILED", arch.name());
    }
    Ok(ok)
}

/// Synthetic classification data: `count` batches of `batch` images (NCHW float32) and labels.
fn synthetic(batch: usize, count: usize, seed: u64) -> Vec<(Vec<f32>, Vec<usize>)> {
    const KINDS: usize = 10;
    let mut rng = Rng::new(seed);
    let patterns: Vec<Vec<f32>> = (0..KINDS).map(|_| rng.values::<f32>(3 * 8 * 8)).collect();
    (0..count)
        .map(|_| {
            let labels: Vec<usize> = (0..batch).map(|_| rng.below(KINDS)).collect();
            let mut x = Vec::with_capacity(batch * 3 * 224 * 224);
            for &l in &labels {
                for c in 0..3 {
                    for h in 0..224 {
                        for w in 0..224 {
                            let p = patterns[l][(c * 8 + h / 28) * 8 + w / 28];
                            x.push(p + 0.5 * rng.signed_unit() as f32);
                        }
                    }
                }
            }
            (x, labels)
        })
        .collect()
}

fn train(sh: &mut Shared, arch: Arch, batch: i64, o: &Options) -> Res<bool> {
    let stream = sh.cudnn.stream().clone();
    let n = batch as usize;
    let data = synthetic(n, 4, 11);
    let mut rng = Rng::new(5);
    let weights = Tensors::random(arch, &mut || rng.signed_unit());
    let sgd = Some(Sgd { lr: o.lr, momentum: 0.9 });
    let onehot = stream.clone_htod(&one_hot(&data[0].1))?;
    let mut nll = stream.alloc_zeros::<f32>(n * CLASSES as usize)?;
    let (mut net, x, first_s) =
        first_step::<bf16>(sh, arch, batch, &weights, &data[0].0, &onehot, &mut nll, sgd)?;
    let loss_of = |nll: &CudaSlice<f32>| -> Res<f64> {
        let v = stream.clone_dtoh(nll)?;
        Ok(v.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64)
    };
    let mut curve = vec![(1, loss_of(&nll)?)];
    println!(
        "{} b{batch}: training {} steps on synthetic data (lr {}, momentum 0.9); step 1 took {first_s:.2} s (choosing algorithms)",
        arch.name(),
        o.steps,
        o.lr
    );
    println!("  step {:>3}/{}  loss {:.4}", 1, o.steps, curve[0].1);
    let cp = net.in_channels as usize;
    let inputs: Vec<Vec<bf16>> = data.iter().map(|(x, _)| resnet::to_input(x, n, cp)).collect();
    let mut cx = sh.cx();
    // SAFETY: the closure reaches device memory through `buffers`, `&mut` borrows and shared
    // borrows of the network, which holds none behind interior mutability; all outlive the graph.
    let mut graph = unsafe {
        cx.cudnn
            .capture((x, onehot, nll), |_, (x, onehot, nll)| net.step(&mut cx, x, onehot, nll, sgd))
    }?;
    for step in 2..=o.steps {
        let b = (step - 1) % data.len();
        {
            let (x, onehot, _) = graph.buffers_mut();
            stream.memcpy_htod(&inputs[b], x)?;
            stream.memcpy_htod(&one_hot(&data[b].1), onehot)?;
        }
        let started = Instant::now();
        graph.launch()?;
        let loss = loss_of(&graph.buffers().2)?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        curve.push((step, loss));
        println!(
            "  step {step:>3}/{}  loss {loss:.4}  ({ms:.1} ms with the loss read back)",
            o.steps
        );
    }
    drop(graph);
    let caption = format!("{} bf16 training, batch {batch}, synthetic data", arch.name());
    Ok(common::training_summary("resnet_train", &caption, "cross-entropy", &curve, 2.0))
}

fn time(sh: &mut Shared, arch: Arch, batch: i64) -> Res<bool> {
    let stream = sh.cudnn.stream().clone();
    let n = batch as usize;
    let data = synthetic(n, 1, 21);
    let mut rng = Rng::new(5);
    let weights = Tensors::random(arch, &mut || rng.signed_unit());
    let sgd = Some(Sgd { lr: 1e-3, momentum: 0.9 });
    let onehot = stream.clone_htod(&one_hot(&data[0].1))?;
    let mut nll = stream.alloc_zeros::<f32>(n * CLASSES as usize)?;
    let (mut net, x, first_s) =
        first_step::<bf16>(sh, arch, batch, &weights, &data[0].0, &onehot, &mut nll, sgd)?;
    let st = sh.tuner.stats();
    println!(
        "first step {first_s:.3} s ({} effort): {} legacy benchmarks in {:.3} s; {} union searches ({} graph plans built, {} of them carried from earlier winners, which won {}; {:.3} s building on {} threads, {:.3} s in finals, {:.3} s searching in all), {} plans rebuilt, {} cache hits",
        sh.tuner.effort().name(),
        st.benchmarks,
        st.find.as_secs_f64(),
        st.graph_searches,
        st.graph_plans,
        st.carried,
        st.carried_wins,
        st.graph_build.as_secs_f64(),
        cudnn_safe::graph::build_threads(),
        st.graph_finals.as_secs_f64(),
        st.graph_search.as_secs_f64(),
        st.plan_builds,
        st.hits
    );
    let timer = Timer::new(&stream)?;
    let eager_ms = {
        let mut cx = sh.cx();
        let mut f = || net.step(&mut cx, &x, &onehot, &mut nll, sgd);
        timer.batch(2, &mut f)?;
        let mut t =
            (0..3).map(|_| timer.batch(5, &mut f)).collect::<cudnn_safe::Result<Vec<_>>>()?;
        t.sort_by(f64::total_cmp);
        t[1]
    };
    // Device time per kind of call in one step run call by call.
    let mut prof = Profile::new(&stream);
    prof.begin()?;
    {
        let mut cx = sh.cx();
        cx.prof = Some(&mut prof);
        net.step(&mut cx, &x, &onehot, &mut nll, sgd)?;
    }
    stream.synchronize()?;
    let totals = prof.totals()?;
    let mut cx = sh.cx();
    // SAFETY: the closure reaches device memory through `buffers`, `&mut` borrows and shared
    // borrows of the network, which holds none behind interior mutability; all outlive the graph.
    let graph = unsafe {
        cx.cudnn
            .capture((x, onehot, nll), |_, (x, onehot, nll)| net.step(&mut cx, x, onehot, nll, sgd))
    }?;
    graph.upload()?;
    let mut f = || graph.launch();
    timer.batch(3, &mut f)?;
    let mut t = (0..5).map(|_| timer.batch(10, &mut f)).collect::<cudnn_safe::Result<Vec<_>>>()?;
    t.sort_by(f64::total_cmp);
    let graph_ms = t[2];
    let loss = {
        let v = stream.clone_dtoh(&graph.buffers().2)?;
        v.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64
    };
    drop(graph);
    let case = format!("{}_bf16_train_b{batch}", arch.name());
    let ips = batch as f64 / graph_ms * 1e3;
    println!(
        "{case}: first step {first_s:.2} s; step {eager_ms:.3} ms call by call, {graph_ms:.3} ms as a CUDA graph ({ips:.0} img/s); {} convolutions, batch norm {}",
        net.conv_layers(),
        if net.fused { "fused with ReLU/add" } else { "split" }
    );
    let sum: f64 = totals.iter().map(|t| t.1).sum();
    println!("  one step call by call, device time per kind of call ({sum:.3} ms in all):");
    for (label, ms, calls) in &totals {
        println!("    {label:<42} {calls:>4} calls {ms:>9.3} ms");
    }
    println!("{{\"op\": \"{case}_eager\", \"ms\": {eager_ms:.4}}}");
    println!("{{\"op\": \"{case}_cudagraph\", \"ms\": {graph_ms:.4}, \"ips\": {ips:.0}, \"first_s\": {first_s:.3}}}");
    Ok(loss.is_finite())
}
