//! Manual algorithm testing: force every forward, backward-data and backward-filter algorithm in
//! turn, the classic way to see what cuDNN supports for a layer, what each algorithm costs, and
//! whether it computes the right thing.
//!
//! ```text
//! cargo run --release --example conv_manual
//! ```
//!
//! Layers: `32x64x56x56->128 3x3/1`, the `1x3x224x224->64 7x7/2` stem and the
//! `64x64x56x56->64 1x1/1` projection, each in strict fp32 (f32 NCHW, FMA math) and fp16 NHWC
//! (tensor-op math), cross-correlation with padding `kernel / 2`, random inputs in `[-1, 1]`.
//!
//! For each algorithm it prints the workspace cuDNN asks for and the time per call (CUDA events,
//! median of batches after warm-up), or — when cuDNN refuses it — the error, which names the
//! status and carries cuDNN's own last-error message. Each result that ran is compared with a
//! reference algorithm's result on the same inputs (forward: `IMPLICIT_GEMM`; backward data and
//! filter: `ALGO_1`; the next that runs if the reference is refused): the output is filled with
//! NaN before each call, so an element an algorithm fails to write shows up, and the largest
//! absolute difference is printed with a verdict against a tolerance relative to the largest
//! reference magnitude (fp32 1e-3, fp16 2e-2). "Runs" therefore means "runs and is correct".
//!
//! Exit status: 0 when every algorithm that ran matched its reference, 1 otherwise, 2 without a
//! GPU (after printing `conv_manual needs an NVIDIA GPU: <why>`).
use std::process::ExitCode;

use cudnn_safe::conv::{ConvAlgorithm, ConvBwdDataAlgo, ConvBwdFilterAlgo, ConvFwdAlgo};
use cudnn_safe::cudarc::driver::CudaSlice;
use cudnn_safe::half::f16;
use cudnn_safe::{format_version, Cudnn, DataType, Result, Workspace};

#[path = "common/mod.rs"]
mod common;
#[path = "common/conv.rs"]
mod conv;
use common::{bytes, drv, Rng, Timer};
use conv::{Element, Mode, Problem, CONFIGS};

/// Indices into [`CONFIGS`]: the first layer, the 7x7/2 stem and the 1x1 projection.
const LAYERS: [usize; 3] = [0, 1, 2];
const MODES: [Mode; 2] = [Mode::Fp32, Mode::Fp16];

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let Some((stream, cudnn)) = common::open_gpu("conv_manual") else {
        return ExitCode::from(2);
    };
    println!(
        "conv_manual: {}, cuDNN {} ({})",
        common::device_line(&stream),
        format_version(cudnn.version()),
        cudnn.library_origin()
    );
    match run(&cudnn) {
        Ok(tally) => {
            println!(
                "\n{} algorithm runs matched their reference, {} did not, {} refused by cuDNN",
                tally.matched, tally.mismatched, tally.refused
            );
            if tally.mismatched == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("conv_manual: {}", common::chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// Counts over the whole run.
#[derive(Default)]
struct Tally {
    matched: usize,
    mismatched: usize,
    refused: usize,
}

fn run(cudnn: &Cudnn) -> Result<Tally> {
    let timer = Timer::new(cudnn.stream())?;
    let mut rng = Rng::new(0x5EED);
    let mut tally = Tally::default();
    for mode in MODES {
        for layer in LAYERS {
            println!(
                "\n== {} {} (math {}) ==",
                CONFIGS[layer].label(),
                mode.name(),
                mode.math().name()
            );
            match mode {
                Mode::Fp32 => layer_all::<f32>(cudnn, &timer, layer, mode, &mut rng, &mut tally)?,
                Mode::Fp16 => layer_all::<f16>(cudnn, &timer, layer, mode, &mut rng, &mut tally)?,
            }
        }
    }
    Ok(tally)
}

/// The outcome of one forced algorithm.
enum Trial {
    /// cuDNN refused it (workspace query or launch): the error's text.
    Refused(String),
    /// It ran: workspace bytes, ms per call, and its output on the host.
    Ran { workspace: usize, ms: f64, output: Vec<f64> },
}

/// Runs one algorithm through `launch` (output poisoned with NaN first), reads the output back,
/// then times it. `workspace_size` is cuDNN's query for the algorithm (where refusals show).
fn trial<T: Element>(
    timer: &Timer,
    output: &mut CudaSlice<T>,
    workspace_size: impl FnOnce() -> Result<usize>,
    mut launch: impl FnMut(&mut CudaSlice<T>) -> Result<()>,
) -> Result<Trial> {
    let workspace = match workspace_size() {
        Ok(b) => b,
        Err(e) => return Ok(Trial::Refused(one_line(&e))),
    };
    let stream = output.stream().clone();
    let poison = vec![T::nan(); output.len()];
    stream.memcpy_htod(&poison, output).map_err(drv("poisoning the output"))?;
    if let Err(e) = launch(output) {
        return Ok(Trial::Refused(one_line(&e)));
    }
    let host: Vec<f64> = stream
        .clone_dtoh(output)
        .map_err(drv("reading the output"))?
        .into_iter()
        .map(DataType::to_f64)
        .collect();
    let ms = timer.per_call_ms(&mut || launch(output))?;
    Ok(Trial::Ran { workspace, ms, output: host })
}

fn one_line(e: &cudnn_safe::Error) -> String {
    e.to_string().replace('\n', " ")
}

/// Prints one direction's table: every algorithm of `A`, with the reference (`preferred`, or
/// the first that runs) compared against.
fn report<A: ConvAlgorithm>(
    direction: &str,
    preferred: A,
    trials: Vec<(A, Trial)>,
    tolerance: f64,
    tally: &mut Tally,
) {
    let reference = trials
        .iter()
        .find(|(a, t)| *a == preferred && matches!(t, Trial::Ran { .. }))
        .or_else(|| trials.iter().find(|(_, t)| matches!(t, Trial::Ran { .. })));
    let Some((ref_algo, Trial::Ran { output: want, .. })) = reference else {
        println!("{direction}: no algorithm ran");
        for (algo, t) in &trials {
            if let Trial::Refused(why) = t {
                tally.refused += 1;
                println!("  {:<20} refused: {why}", algo.name());
            }
        }
        return;
    };
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    println!(
        "{direction} (reference {}, max |ref| {scale:.3e}, tolerance {:.0e} relative)",
        ref_algo.name(),
        tolerance
    );
    for (algo, t) in &trials {
        match t {
            Trial::Refused(why) => {
                tally.refused += 1;
                println!("  {:<20} refused: {why}", algo.name());
            }
            Trial::Ran { workspace, ms, output } => {
                let unwritten = output.iter().filter(|v| v.is_nan()).count();
                let diff = output
                    .iter()
                    .zip(want)
                    .filter(|(v, _)| !v.is_nan())
                    .fold(0.0f64, |m, (v, w)| m.max((v - w).abs()));
                let ok = unwritten == 0 && diff <= tolerance * scale;
                let verdict = match (ok, unwritten) {
                    (true, _) if algo == ref_algo => "ok (reference)".to_string(),
                    (true, _) => "ok".to_string(),
                    (false, 0) => format!("MISMATCH (> {:.2e})", tolerance * scale),
                    (false, n) => format!("MISMATCH ({n} elements NaN or unwritten)"),
                };
                if ok {
                    tally.matched += 1;
                } else {
                    tally.mismatched += 1;
                }
                println!(
                    "  {:<20} ws {:>10}  {:>9.3} ms  max|diff| {diff:.2e}  {verdict}",
                    algo.name(),
                    bytes(*workspace),
                    ms
                );
            }
        }
    }
}

/// Forces every algorithm of the three directions for one layer in one mode.
fn layer_all<T: Element>(
    cudnn: &Cudnn,
    timer: &Timer,
    layer: usize,
    mode: Mode,
    rng: &mut Rng,
    tally: &mut Tally,
) -> Result<()> {
    let stream = cudnn.stream();
    let mut p = Problem::<T>::new(stream, &CONFIGS[layer], mode, rng)?;
    // Backward inputs and outputs: dy like y, dx like x, dw like w.
    let dy = stream.clone_htod(&rng.values::<T>(p.y_d.span())).map_err(drv("uploading dy"))?;
    let alloc = drv("allocating gradients");
    let mut dx = stream.alloc_zeros::<T>(p.x_d.span()).map_err(&alloc)?;
    let mut dw = stream.alloc_zeros::<T>(p.w_d.span()).map_err(&alloc)?;
    let mut ws = Workspace::new(stream.clone());
    let tol = mode.tolerance();

    let mut fwd = Vec::new();
    for &algo in ConvFwdAlgo::ALL {
        let t = trial(
            timer,
            &mut p.y,
            || cudnn.conv_forward_workspace_size(&p.x_d, &p.w_d, &p.conv, &p.y_d, algo),
            |y| {
                cudnn.conv_forward(
                    1.0, &p.x_d, &p.x, &p.w_d, &p.w, &p.conv, algo, &mut ws, 0.0, &p.y_d, y,
                )
            },
        )?;
        fwd.push((algo, t));
    }
    report("forward", ConvFwdAlgo::ImplicitGemm, fwd, tol, tally);

    let mut bwd_data = Vec::new();
    for &algo in ConvBwdDataAlgo::ALL {
        let t = trial(
            timer,
            &mut dx,
            || cudnn.conv_backward_data_workspace_size(&p.w_d, &p.y_d, &p.conv, &p.x_d, algo),
            |dx| {
                cudnn.conv_backward_data(
                    1.0, &p.w_d, &p.w, &p.y_d, &dy, &p.conv, algo, &mut ws, 0.0, &p.x_d, dx,
                )
            },
        )?;
        bwd_data.push((algo, t));
    }
    report("backward data", ConvBwdDataAlgo::Algo1, bwd_data, tol, tally);

    let mut bwd_filter = Vec::new();
    for &algo in ConvBwdFilterAlgo::ALL {
        let t = trial(
            timer,
            &mut dw,
            || cudnn.conv_backward_filter_workspace_size(&p.x_d, &p.y_d, &p.conv, &p.w_d, algo),
            |dw| {
                cudnn.conv_backward_filter(
                    1.0, &p.x_d, &p.x, &p.y_d, &dy, &p.conv, algo, &mut ws, 0.0, &p.w_d, dw,
                )
            },
        )?;
        bwd_filter.push((algo, t));
    }
    report("backward filter", ConvBwdFilterAlgo::Algo1, bwd_filter, tol, tally);
    Ok(())
}
