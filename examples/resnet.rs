//! ResNet-18/50 inference on cudnn-safe: every convolution with its folded batch norm, bias,
//! residual add and ReLU as one cuDNN graph, plans chosen by timing at the first forward, then
//! the whole forward captured once into a CUDA graph ([`Cudnn::capture`]) and replayed.
//!
//! ```text
//! cargo run --release --example resnet                       # random weights, two small cases
//! cargo run --release --example resnet -- --weights DIR --cases resnet50_fp16_b32,resnet50_bf16_b32
//! ```
//!
//! * `--weights DIR` reads `DIR/resnet18.safetensors` / `resnet50.safetensors`, written by
//!   `python3 benches/pytorch/resnet.py weights DIR` (torchvision's models, fixed seed): the
//!   logits of the file's 8 images are then compared with PyTorch's float32 logits (relative
//!   L2 error, same top-1 class): the error must stay within 2e-3 (fp16) / 2e-2 (bf16), or
//!   within twice PyTorch's own error in that type on these weights where that is larger (the
//!   file records it). Without it the weights are random.
//! * `--cases` lists `<resnet18|resnet50>_<fp16|bf16>_b<batch>` (channels-last).
//! * `--max-plans N` (default 4): candidate plans timed per graph at the first forward.
//! * `--cache FILE`: keep the chosen plans in a file; a later process builds only those.
//! * `--profile`: also time each convolution layer alone and list the slowest.
//!
//! Per case it prints the set-up's wall time (folding the batch norms into the weights,
//! uploading them), the first forward's wall time (graph builds, plan choice, first run; the
//! forward call alone, as PyTorch's first-iteration time), the
//! forward's time run call by call and as a replayed CUDA graph (median of 7 batches of 30), and
//! one JSON line per figure. Exit status: 0 when every check passes (replay equals the
//! call-by-call logits; logits within tolerance of PyTorch's), 1 otherwise, 2 without a GPU.
#[path = "common/mod.rs"]
mod common;
#[path = "common/resnet.rs"]
mod resnet;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use common::Timer;
use cudnn_safe::blas::lt::{BlasLt, Element};
use cudnn_safe::cudarc::driver::CudaStream;
use cudnn_safe::graph::PlanCache;
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::{Cudnn, DataType, Workspace};
use resnet::{Arch, Context, Res, ResNet, Tensors};

struct Options {
    weights: Option<PathBuf>,
    cases: Vec<String>,
    max_plans: usize,
    cache: Option<PathBuf>,
    profile: bool,
}

fn options() -> Res<Options> {
    let mut o = Options {
        weights: None,
        cases: vec!["resnet18_fp16_b32".into(), "resnet18_bf16_b8".into()],
        max_plans: 4,
        cache: None,
        profile: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--weights" => o.weights = Some(value()?.into()),
            "--cases" => o.cases = value()?.split(',').map(String::from).collect(),
            "--max-plans" => o.max_plans = value()?.parse()?,
            "--cache" => o.cache = Some(value()?.into()),
            "--profile" => o.profile = true,
            _ => {
                return Err(format!("unknown argument {a} (see the example's documentation)").into())
            }
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    // `RUST_LOG=cudnn_safe=info` lists every plan decision and warm-up entry.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let Some((default, _)) = common::open_gpu("resnet") else {
        return ExitCode::from(2);
    };
    println!("{}", common::device_line(&default));
    // The per-thread default stream: CUDA cannot capture the legacy default stream.
    let stream = default.context().per_thread_stream();
    let cudnn = match Cudnn::new(stream.clone()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("resnet: {}", common::chain(&e));
            return ExitCode::FAILURE;
        }
    };
    match options().and_then(|o| run(&stream, &cudnn, &o)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("resnet: {}", common::chain(&*e));
            ExitCode::FAILURE
        }
    }
}

fn run(stream: &Arc<CudaStream>, cudnn: &Cudnn, o: &Options) -> Res<bool> {
    let mut plans = match &o.cache {
        Some(f) => PlanCache::new().try_cache_file(f)?,
        None => PlanCache::new(),
    };
    let mut lt = BlasLt::new(stream.clone())?;
    let mut ws = Workspace::new(stream.clone());
    if o.cache.is_some() {
        // A process that starts with plans: open cuDNN's sub-libraries and rebuild them now, so
        // that the first forward builds nothing.
        let p = cudnn_safe::graph::preload(cudnn)?;
        let w = plans.warm_up(cudnn, &mut ws)?;
        println!(
            "start-up: preload {:.3} s (sub-libraries {:.3} s), warm-up {:.3} s ({} plans, built in {:.3} s on {} threads; {} skipped)",
            (p.open + p.engines).as_secs_f64(),
            p.open.as_secs_f64(),
            w.elapsed.as_secs_f64(),
            w.replayed,
            w.building.as_secs_f64(),
            cudnn_safe::graph::build_threads(),
            w.skipped.len()
        );
    }
    let mut ok = true;
    println!(
        "{:<22} {:>9} {:>9} {:>10} {:>10} {:>9} {:>9} {:>6}",
        "case", "set-up s", "first s", "eager ms", "graph ms", "img/s", "rel err", "top1"
    );
    for case in &o.cases {
        let parts: Vec<&str> = case.split('_').collect();
        let (arch, batch) = match parts[..] {
            [a, _, b] => (Arch::parse(a), b.strip_prefix('b').and_then(|b| b.parse::<i64>().ok())),
            _ => (None, None),
        };
        let (Some(arch), Some(batch)) = (arch, batch) else {
            return Err(format!(
                "case `{case}`: expected <resnet18|resnet50>_<fp16|bf16>_b<batch>"
            )
            .into());
        };
        let weights = match &o.weights {
            Some(dir) => Tensors::read(&dir.join(format!("{}.safetensors", arch.name())))?,
            None => {
                let mut rng = common::Rng::new(7);
                Tensors::random(arch, &mut || rng.signed_unit())
            }
        };
        let mut cx = Context { cudnn, lt: &mut lt, plans: &mut plans, ws: &mut ws };
        ok &= match parts[1] {
            "fp16" => case_run::<f16>(&mut cx, case, arch, batch, &weights, o, 2e-3)?,
            "bf16" => case_run::<bf16>(&mut cx, case, arch, batch, &weights, o, 2e-2)?,
            t => {
                return Err(format!("case `{case}`: element type {t}, expected fp16 or bf16").into())
            }
        };
    }
    Ok(ok)
}

/// Median milliseconds per call over 7 batches of 30 calls, after 10 warm-up calls.
fn bench(stream: &Arc<CudaStream>, f: &mut dyn FnMut() -> cudnn_safe::Result<()>) -> Res<f64> {
    let timer = Timer::new(stream)?;
    timer.batch(10, f)?;
    let mut t = (0..7).map(|_| timer.batch(30, f)).collect::<cudnn_safe::Result<Vec<f64>>>()?;
    t.sort_by(f64::total_cmp);
    Ok(t[3])
}

fn case_run<T: Element>(
    cx: &mut Context<'_>,
    case: &str,
    arch: Arch,
    batch: i64,
    weights: &Tensors,
    o: &Options,
    tolerance: f64,
) -> Res<bool> {
    let max_plans = o.max_plans;
    let stream = cx.cudnn.stream().clone();
    let start = Instant::now();
    // Images: the file's 8 (cycled over the batch) or random ones.
    let (images, reference) = match (weights.get("input"), weights.get("logits")) {
        (Ok(i), Ok(l)) => (i.1.clone(), Some(l.1.clone())),
        _ => (common::Rng::new(3).values::<f32>(8 * 3 * 224 * 224), None),
    };
    let n = batch as usize;
    let nchw: Vec<f32> = (0..n)
        .flat_map(|i| images[(i % 8) * 150_528..(i % 8 + 1) * 150_528].iter().copied())
        .collect();
    // The stem reads 3 channels; engines that need more get them zero-padded.
    // The first forward's time counts the forward calls only (plan search included), as
    // PyTorch's first-iteration time does; building the network (folding and uploading the
    // weights) is set-up.
    let mut attempt = None;
    let mut forward_s = 0.0;
    for cp in [3, 4, 8] {
        let net = ResNet::<T>::new(cx.cudnn, arch, batch, cp, max_plans, weights)?;
        let x = stream.clone_htod(&resnet::to_input::<T>(&nchw, n, cp as usize))?;
        let mut scratch = net.scratch(&stream)?;
        let mut logits = stream.alloc_zeros::<T>(net.logits_len())?;
        stream.synchronize()?;
        let forward_start = Instant::now();
        let ran = net.forward(cx, &x, &mut scratch, &mut logits);
        stream.synchronize()?;
        forward_s += forward_start.elapsed().as_secs_f64();
        match ran {
            Ok(()) => {
                attempt = Some((net, x, scratch, logits));
                break;
            }
            Err(e) if cp < 8 => {
                println!("{case}: with {cp} input channels: {e}; padding the input")
            }
            Err(e) => return Err(e.into()),
        }
    }
    let (net, x, mut scratch, mut logits) = attempt.ok_or("no input layout ran")?;
    let first_s = forward_s;
    let setup_s = start.elapsed().as_secs_f64() - forward_s;
    // An error cudarc recorded instead of returning (a failed event or free) would not show
    // otherwise.
    stream.context().check_err()?;
    let eager = stream.clone_dtoh(&logits)?;

    let cudnn = cx.cudnn;
    let eager_ms = bench(&stream, &mut || net.forward(cx, &x, &mut scratch, &mut logits))?;
    // Capture one forward; the input and the logits travel with the graph.
    // SAFETY: the closure reaches device memory through `buffers`, `&mut` borrows and shared
    // borrows of the network, which holds none behind interior mutability; all outlive the graph.
    let mut graph = unsafe {
        cudnn.capture((x, logits), |_, (x, logits)| net.forward(cx, x, &mut scratch, logits))
    }?;
    graph.upload()?;
    let graph_ms = bench(&stream, &mut || graph.launch())?;
    let replayed = stream.clone_dtoh(&graph.buffers_mut().1)?;
    let replay_diff = rel_l2(&to_f64(&replayed), &to_f64(&eager), usize::MAX);

    let mut ok = replay_diff <= 1e-2;
    let tag = if T::DTYPE == cudnn_safe::DType::F16 { "fp16" } else { "bf16" };
    let torch_err = weights.get(&format!("torch_rel_err_{tag}")).ok().map(|t| f64::from(t.1[0]));
    let tolerance = torch_err.map_or(tolerance, |t| tolerance.max(2.0 * t));
    let (rel, top1) = match &reference {
        Some(r) => {
            let rows = n.min(8);
            let got = to_f64(&eager);
            let want: Vec<f64> = r.iter().map(|&v| f64::from(v)).collect();
            let rel = rel_l2(&got, &want, rows * 1000);
            let same = (0..rows)
                .filter(|&i| argmax(&got[i * 1000..][..1000]) == argmax(&want[i * 1000..][..1000]))
                .count();
            ok &= rel <= tolerance && same == rows;
            (format!("{rel:.2e}"), format!("{same}/{rows}"))
        }
        None => ("-".into(), "-".into()),
    };
    let ips = batch as f64 / graph_ms * 1e3;
    println!(
        "{case:<22} {setup_s:>9.2} {first_s:>9.3} {eager_ms:>10.3} {graph_ms:>10.3} {ips:>9.0} {rel:>9} {top1:>6}"
    );
    println!("{{\"op\": \"{case}_eager\", \"ms\": {eager_ms:.4}}}");
    if let Some(t) = torch_err {
        println!("{{\"op\": \"{case}_logits\", \"rel_err\": \"{rel}\", \"torch_rel_err\": {t:.2e}, \"top1\": \"{top1}\"}}");
    }
    println!("{{\"op\": \"{case}_cudagraph\", \"ms\": {graph_ms:.4}, \"ips\": {ips:.0}, \"first_s\": {first_s:.3}, \"setup_s\": {setup_s:.3}, \"in_channels\": {}, \"replay_diff\": {replay_diff:.2e}}}", net.in_channels);
    drop(graph);
    if o.profile {
        let timer = Timer::new(&stream)?;
        let rows = net.profile(cx, &mut scratch, &|calls, f| timer.batch(calls, f))?;
        let total: f64 = rows.iter().map(|r| r.2).sum();
        println!("{case}: convolutions run alone sum to {total:.3} ms; the slowest:");
        for (name, dims, ms) in rows.iter().take(12) {
            println!("  {name:<24} {dims:?} {ms:.4} ms");
        }
    }
    if !ok {
        println!("{case}: FAILED (replay differs from the call-by-call forward by {replay_diff:.2e}; logits error {rel}, top-1 {top1}, tolerance {tolerance:e})");
    }
    Ok(ok)
}

fn to_f64<T: DataType>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// `‖a − b‖ / ‖b‖` over the first `len` values; NaN when anything is not finite.
fn rel_l2(a: &[f64], b: &[f64], len: usize) -> f64 {
    let (a, b) = (&a[..len.min(a.len())], &b[..len.min(b.len())]);
    if a.iter().chain(b).any(|v| !v.is_finite()) {
        return f64::NAN;
    }
    let d: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let r: f64 = b.iter().map(|y| y * y).sum();
    (d / r.max(f64::MIN_POSITIVE)).sqrt()
}

fn argmax(v: &[f64]) -> usize {
    (0..v.len()).max_by(|&i, &j| v[i].total_cmp(&v[j])).unwrap_or(0)
}
