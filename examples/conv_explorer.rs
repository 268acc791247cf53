//! The convolution algorithm explorer: for one layer, what cuDNN's heuristics propose, what
//! benchmarking every forward algorithm finds, and what each [`Policy`] of the [`Autotuner`]
//! then runs.
//!
//! ```text
//! cargo run --release --example conv_explorer
//! ```
//!
//! The layer is ResNet's `32×64×56×56 → 128`, 3×3, padding 1, in fp16 NHWC with tensor-op math.
//!
//! 1. [`Cudnn::conv_forward_heuristics`] (`cudnnGetConvolutionForwardAlgorithm_v7`) ranks the
//!    algorithms without running anything;
//! 2. [`Cudnn::conv_forward_find`] (`cudnnFindConvolutionForwardAlgorithmEx`) runs each one and
//!    reports its time, workspace and determinism, or why cuDNN refused it;
//! 3. three fresh autotuners, one per policy (PyTorch's `cudnn.benchmark = False`, `= True` and
//!    `cudnn.deterministic = True`), each run once: the first call includes the decision, the
//!    following ones reuse it. The benchmark policy times legacy algorithms and graph engines
//!    together (the union search), here capped at 8 graph plans per heuristic source.
//!
//! The seven-layer, four-precision sweep with TSV tables and SVG plots is a tool:
//! `cargo run --release -p cudnn-safe-tools --bin conv_explorer`.
//!
//! Exit status: 0 when everything ran, 1 on an error, 2 without a GPU.
#[path = "common/mod.rs"]
mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use common::{bytes, drv, Rng, Timer};
use cudnn_safe::conv::{ConvDesc, ConvFwdAlgo, MathType};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::half::f16;
use cudnn_safe::tune::Policy;
use cudnn_safe::{Autotuner, Cudnn, FilterDesc, Result, TensorDesc, TensorFormat, Workspace};

fn main() -> ExitCode {
    let Some((stream, cudnn)) = common::open_gpu("conv_explorer") else {
        return ExitCode::from(2);
    };
    println!("{}", common::device_line(&stream));
    match run(&stream, &cudnn) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("conv_explorer: {}", common::chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The layer's descriptors and buffers.
struct Layer {
    x_d: TensorDesc<f16>,
    w_d: FilterDesc<f16>,
    conv: ConvDesc,
    y_d: TensorDesc<f16>,
    x: CudaSlice<f16>,
    w: CudaSlice<f16>,
    y: CudaSlice<f16>,
}

impl Layer {
    fn new(stream: &Arc<CudaStream>) -> Result<Layer> {
        let x_d = TensorDesc::<f16>::nhwc(32, 64, 56, 56)?;
        let w_d = FilterDesc::<f16>::new(&[128, 64, 3, 3], TensorFormat::Nhwc)?;
        let conv = ConvDesc::builder(2).pads(&[1, 1]).math(MathType::TensorOp).build::<f16>()?;
        let y_d = TensorDesc::<f16>::nhwc_nd(&conv.output_dims(x_d.dims(), w_d.dims())?)?;
        let mut rng = Rng::new(1);
        let up = |v: Vec<f16>| stream.clone_htod(&v).map_err(drv("uploading"));
        Ok(Layer {
            x: up(rng.values(x_d.span()))?,
            w: up(rng.values(w_d.span()))?,
            y: stream.alloc_zeros(y_d.span()).map_err(drv("allocating y"))?,
            x_d,
            w_d,
            conv,
            y_d,
        })
    }

    /// Floating-point operations of one call (2 per multiply-add).
    fn flops(&self) -> f64 {
        let (y, w) = (self.y_d.dims(), self.w_d.dims());
        2.0 * (y.iter().product::<i64>() * w[1] * w[2] * w[3]) as f64
    }
}

fn run(stream: &Arc<CudaStream>, cudnn: &Cudnn) -> Result<()> {
    let mut l = Layer::new(stream)?;
    println!("layer: fp16 NHWC {:?} -> {:?}, 3x3, padding 1\n", l.x_d.dims(), l.y_d.dims());

    // 1. Heuristics: a ranking, nothing runs.
    let heuristics = cudnn.conv_forward_heuristics(&l.x_d, &l.w_d, &l.conv, &l.y_d)?;
    let rank = |algo: ConvFwdAlgo| {
        heuristics.iter().filter(|p| p.is_supported()).position(|p| p.algo == algo)
    };

    // 2. Benchmarking: cuDNN runs every algorithm on our buffers.
    let mut ws = Workspace::new(stream.clone());
    let mut found =
        cudnn.conv_forward_find(&l.x_d, &l.x, &l.w_d, &l.w, &l.conv, &l.y_d, &mut l.y, &mut ws)?;
    // Fastest first, refused ones last.
    found.sort_by(|a, b| {
        b.is_supported().cmp(&a.is_supported()).then(a.time_ms.total_cmp(&b.time_ms))
    });
    println!(
        "{:<24} {:>9} {:>10} {:>8} {:>12} {:>14}",
        "algorithm", "heur rank", "find ms", "TFLOP/s", "workspace", "deterministic"
    );
    for p in &found {
        let heur = rank(p.algo).map_or("-".into(), |r| r.to_string());
        if p.is_supported() {
            let tflops = l.flops() / (f64::from(p.time_ms) * 1e9);
            println!(
                "{:<24} {heur:>9} {:>10.4} {tflops:>8.1} {:>12} {:>14}",
                p.algo.to_string(),
                p.time_ms,
                bytes(p.workspace),
                p.deterministic
            );
        } else {
            println!("{:<24} {heur:>9} {:>10}", p.algo.to_string(), p.status.name());
        }
    }
    let best = found.iter().find(|p| p.is_supported());
    if let (Some(top), Some(best)) = (heuristics.iter().find(|p| p.is_supported()), best) {
        let top_ms = found.iter().find(|p| p.algo == top.algo).map(|p| p.time_ms);
        println!(
            "\nheuristic pick {} ({}), fastest {} ({:.4} ms)\n",
            top.algo,
            top_ms.map_or("not timed".into(), |ms| format!("{ms:.4} ms")),
            best.algo,
            best.time_ms
        );
    }

    // 3. The autotuner's policies, each deciding afresh (no cache file).
    let timer = Timer::new(stream)?;
    println!("{:<14} {:<36} {:>14} {:>12}", "policy", "ran", "first call ms", "then ms");
    for (name, policy) in [
        ("heuristic", Policy::Heuristic),
        ("benchmark", Policy::Benchmark),
        ("deterministic", Policy::Deterministic),
    ] {
        // At most 8 graph plans per heuristic source (the library's default is 24): a quicker
        // first call of the benchmark policy, at the risk of missing the fastest engine.
        let mut tuner = Autotuner::new(policy).without_cache_file().with_graph_plans(8);
        tuner.clear(); // forget what $CUDNN_SAFE_AUTOTUNE_CACHE may have loaded
        let mut call = |tuner: &mut Autotuner| {
            tuner.forward(cudnn, 1.0, &l.x_d, &l.x, &l.w_d, &l.w, &l.conv, 0.0, &l.y_d, &mut l.y)
        };
        let started = Instant::now();
        let choice = call(&mut tuner)?;
        stream.synchronize().map_err(drv("synchronizing"))?;
        let first_ms = started.elapsed().as_secs_f64() * 1e3;
        let then_ms = timer.per_call_ms(&mut || call(&mut tuner).map(drop))?;
        println!("{name:<14} {:<36} {first_ms:>14.2} {then_ms:>12.4}", choice.describe());
    }
    Ok(())
}
