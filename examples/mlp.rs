//! Trains a small MLP on the GPU with cuBLASLt fused layers, and plots its loss curve.
//!
//! The network is `64 → 256 → 256 → 16` with tanh-GELU, all in f32 (weights, activations and
//! gradients; strict f32 math, no TF32), trained with plain SGD (lr 0.5, batch 256, 300 steps) to
//! classify points from a random teacher network (8192 training samples, 1024 held out; 16
//! classes, a multiple of 8 like every dimension here, which the fused epilogues prefer).
//!
//! Every matrix operation is one cuBLASLt call through [`BlasLt`], on device buffers only:
//!
//! * forward: `h = gelu(x·Wᵀ + b)` in one call per hidden layer
//!   ([`Epilogue::BiasGeluAux`], which also stores the GELU input for the backward pass), the
//!   logits with [`Epilogue::Bias`];
//! * backward: the gradient through each GELU layer in one call,
//!   `dpre = (dy·W) ⊙ gelu'(pre)` ([`Epilogue::DGelu`] reading the stored GELU input);
//! * SGD update fused into the weight-gradient GEMM: `W ← W − lr·dyᵀ·x` is a matmul with
//!   `alpha = −lr`, `beta = 1` accumulating into `W` itself, and the bias update
//!   `b ← b − lr·1ᵀ·dy` the same with a ones vector (the column sums of `dy`, the bias gradient).
//!
//! Only the loss runs on the host (softmax cross-entropy of the 256×16 logits and its gradient).
//!
//! Prints the loss every 25 steps, the held-out loss and accuracy before and after, and writes
//! `mlp_loss.svg` to `$CUDNN_SAFE_OUT_DIR` (else the current directory). Exit status: 1 if the
//! training loss did not fall at least 2×, 2 without a GPU or cuBLASLt.
#[path = "common/mod.rs"]
mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use common::{drv, Rng};
use cudnn_safe::blas::lt::EpilogueData::{self, None as Plain};
use cudnn_safe::blas::lt::{Epilogue, Matmul};
use cudnn_safe::blas::BlasLt;
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream, CudaView};
use cudnn_safe::{cuda_context, Result};

const IN: usize = 64;
const HIDDEN: usize = 256;
const CLASSES: usize = 16;
const TEACHER_HIDDEN: usize = 32;
const BATCH: usize = 256;
const SAMPLES: usize = 8192;
const HELD_OUT: usize = 1024;
const STEPS: usize = 300;
const LR: f32 = 0.5;
const REPORT_EVERY: usize = 25;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let opened = cuda_context(0).and_then(|ctx| {
        let stream = ctx.default_stream();
        BlasLt::new(stream.clone()).map(|lt| (stream, lt))
    });
    let (stream, mut lt) = match opened {
        Ok(v) => v,
        Err(e) => {
            eprintln!("mlp: no usable GPU: {}", common::chain(&e));
            return ExitCode::from(2);
        }
    };
    println!(
        "mlp: {}, cuBLASLt {}; f32 MLP {IN} → {HIDDEN} → {HIDDEN} → {CLASSES} (GELU), batch {BATCH}, SGD lr {LR}, {STEPS} steps",
        common::device_line(&stream),
        lt.version()
    );
    match run(&stream, &mut lt) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("mlp: {}", common::chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// `n` points uniform in `[-1, 1]^64`, labelled by the argmax of a random `64 → 32 (tanh) → 16`
/// teacher network (`t1`, `t2`: row-major weights).
fn dataset(rng: &mut Rng, n: usize, t1: &[f64], t2: &[f64]) -> (Vec<f32>, Vec<usize>) {
    let x: Vec<f64> = (0..n * IN).map(|_| rng.signed_unit()).collect();
    let matvec = |w: &[f64], v: &[f64]| -> Vec<f64> {
        let dot = |row: &[f64]| row.iter().zip(v).map(|(a, b)| a * b).sum();
        w.chunks(v.len()).map(dot).collect()
    };
    let label = |xs: &[f64]| {
        argmax(&matvec(t2, &matvec(t1, xs).iter().map(|h| h.tanh()).collect::<Vec<_>>()))
    };
    let labels = x.chunks(IN).map(label).collect();
    (x.iter().map(|&v| v as f32).collect(), labels)
}

fn argmax(v: &[f64]) -> usize {
    (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap_or(0)
}

/// One linear layer (PyTorch's default init: `U(±1/√fan_in)`): its parameters, the matmuls of
/// a training step and its activations and gradient, all on the device.
struct Layer {
    w: CudaSlice<f32>,
    b: CudaSlice<f32>,
    /// `y = gelu(x·Wᵀ + b)` storing the GELU input in `pre` (hidden layers), or `x·Wᵀ + b`.
    fwd: Matmul,
    /// The previous layer's gradient, `dpre_prev = (dy·W) ⊙ gelu'(pre_prev)` (m = batch).
    back: Matmul,
    /// `W ← W − lr·dyᵀ·x` (m = out, n = in, k = batch) and `b ← b − lr·1ᵀ·dy` (m = 1).
    upd_w: Matmul,
    upd_b: Matmul,
    pre: Option<CudaSlice<f32>>,
    y: CudaSlice<f32>,
    /// The loss gradient with respect to this layer's output (before its GELU).
    dy: CudaSlice<f32>,
}

impl Layer {
    fn new(
        stream: &Arc<CudaStream>,
        rng: &mut Rng,
        inp: usize,
        out: usize,
        hidden: bool,
    ) -> Result<Self> {
        let a = 1.0 / (inp as f64).sqrt();
        let mut init =
            |n: usize| -> Vec<f32> { (0..n).map(|_| (rng.signed_unit() * a) as f32).collect() };
        let up = |v: Vec<f32>| stream.clone_htod(&v).map_err(drv("uploading parameters"));
        let zeros = |n: usize| stream.alloc_zeros::<f32>(n).map_err(drv("allocating"));
        let (gelu, bias) = (Epilogue::BiasGeluAux, Epilogue::Bias);
        let (batch, i, o) = (BATCH as i64, inp as i64, out as i64);
        let fwd = Matmul::linear(batch, i, o)?.with_epilogue(if hidden { gelu } else { bias });
        Ok(Layer {
            w: up(init(out * inp))?,
            b: up(init(out))?,
            back: Matmul::new(batch, i, o)?.with_epilogue(Epilogue::DGelu),
            upd_w: Matmul::new(o, i, batch)?.with_transpose_a(true),
            upd_b: Matmul::new(1, o, batch)?,
            pre: hidden.then(|| zeros(fwd.aux_len())).transpose()?,
            y: zeros(BATCH * out)?,
            dy: zeros(BATCH * out)?,
            fwd,
        })
    }
}

/// A layer's input: the previous layer's output, or the batch `x` for the first layer.
fn input_of<'a>(before: &'a [Layer], x: &'a CudaView<'_, f32>) -> CudaView<'a, f32> {
    before.last().map_or_else(|| x.slice(0..), |p| p.y.as_view())
}

/// The logits of a batch `x` (BATCH × IN) into the last layer's `y`.
fn forward(lt: &mut BlasLt, layers: &mut [Layer], x: &CudaView<'_, f32>) -> Result<()> {
    for i in 0..layers.len() {
        let (done, rest) = layers.split_at_mut(i);
        let l = &mut rest[0];
        let input = input_of(done, x);
        let epi = match &mut l.pre {
            Some(pre) => EpilogueData::bias_aux(&l.b, pre),
            None => EpilogueData::bias(&l.b),
        };
        lt.matmul(&l.fwd, 1.0, &input, &l.w, 0.0, &mut l.y, epi)?;
    }
    Ok(())
}

/// Backward from the last layer's `dy` with the SGD update of every parameter, last layer
/// first; each layer's input gradient is computed before its weight changes.
fn backward_and_update(
    lt: &mut BlasLt,
    layers: &mut [Layer],
    x: &CudaView<'_, f32>,
    ones: &CudaSlice<f32>,
) -> Result<()> {
    for i in (0..layers.len()).rev() {
        let (before, rest) = layers.split_at_mut(i);
        let l = &mut rest[0];
        if let Some(Layer { pre: Some(pre), dy, .. }) = before.last_mut() {
            lt.matmul(&l.back, 1.0, &l.dy, &l.w, 0.0, dy, EpilogueData::aux(&*pre))?;
        }
        let input = input_of(before, x);
        lt.matmul(&l.upd_w, -LR, &l.dy, &input, 1.0, &mut l.w, Plain)?;
        lt.matmul(&l.upd_b, -LR, ones, &l.dy, 1.0, &mut l.b, Plain)?;
    }
    Ok(())
}

/// Mean softmax cross-entropy and accuracy of a batch of logits; fills `grad` with
/// `d(mean loss)/d(logits) = (softmax − onehot) / batch`.
fn cross_entropy(logits: &[f32], labels: &[usize], grad: &mut [f32]) -> (f64, f64) {
    let (mut loss, mut correct, n) = (0.0, 0, labels.len());
    let rows = logits.chunks(CLASSES).zip(grad.chunks_mut(CLASSES));
    for ((row, grad), &label) in rows.zip(labels) {
        let row: Vec<f64> = row.iter().map(|&v| v.into()).collect();
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = row.iter().map(|v| (v - max).exp()).sum();
        loss -= row[label] - max - z.ln();
        correct += usize::from(argmax(&row) == label);
        for (o, g) in grad.iter_mut().enumerate() {
            let target = if o == label { 1.0 } else { 0.0 };
            *g = (((row[o] - max).exp() / z - target) / n as f64) as f32;
        }
    }
    (loss / n as f64, correct as f64 / n as f64)
}

/// Loss and accuracy on the held-out set (forward only, batch by batch).
fn evaluate(
    stream: &Arc<CudaStream>,
    lt: &mut BlasLt,
    layers: &mut [Layer],
    x: &CudaSlice<f32>,
    labels: &[usize],
) -> Result<(f64, f64)> {
    let mut grad = vec![0f32; BATCH * CLASSES];
    let (mut loss, mut acc) = (0.0, 0.0);
    let batches = labels.len() / BATCH;
    for i in 0..batches {
        forward(lt, layers, &x.slice(i * BATCH * IN..(i + 1) * BATCH * IN))?;
        let logits = download_logits(stream, layers)?;
        let (l, a) = cross_entropy(&logits, &labels[i * BATCH..(i + 1) * BATCH], &mut grad);
        (loss, acc) = (loss + l, acc + a);
    }
    Ok((loss / batches as f64, acc / batches as f64))
}

fn download_logits(stream: &Arc<CudaStream>, layers: &[Layer]) -> Result<Vec<f32>> {
    let last = &layers[layers.len() - 1];
    stream.clone_dtoh(&last.y).map_err(drv("downloading logits"))
}

fn run(stream: &Arc<CudaStream>, lt: &mut BlasLt) -> Result<bool> {
    let mut rng = Rng::new(7);
    let mut teacher = |n: usize, fan_in: usize| -> Vec<f64> {
        let scale = 3.0 / (fan_in as f64).sqrt();
        (0..n).map(|_| rng.signed_unit() * scale).collect()
    };
    let (t1, t2) =
        (teacher(TEACHER_HIDDEN * IN, IN), teacher(CLASSES * TEACHER_HIDDEN, TEACHER_HIDDEN));
    let (train_x, train_y) = dataset(&mut rng, SAMPLES, &t1, &t2);
    let (eval_x, eval_y) = dataset(&mut rng, HELD_OUT, &t1, &t2);
    let up = |v: &[f32]| stream.clone_htod(v).map_err(drv("uploading"));
    let (train_x, eval_x, ones) = (up(&train_x)?, up(&eval_x)?, up(&[1.0; BATCH])?);

    let mut layers = [
        Layer::new(stream, &mut rng, IN, HIDDEN, true)?,
        Layer::new(stream, &mut rng, HIDDEN, HIDDEN, true)?,
        Layer::new(stream, &mut rng, HIDDEN, CLASSES, false)?,
    ];

    let (eval_loss0, eval_acc0) = evaluate(stream, lt, &mut layers, &eval_x, &eval_y)?;
    let mut grad = vec![0f32; BATCH * CLASSES];
    let mut curve = Vec::with_capacity(STEPS);
    let (mut window, mut window_start) = (Instant::now(), 0);
    for step in 0..STEPS {
        let first = (step * BATCH) % SAMPLES;
        let x = train_x.slice(first * IN..(first + BATCH) * IN);
        forward(lt, &mut layers, &x)?;
        let logits = download_logits(stream, &layers)?;
        let (loss, acc) = cross_entropy(&logits, &train_y[first..first + BATCH], &mut grad);
        let dlogits = &mut layers[2].dy;
        stream.memcpy_htod(&grad, dlogits).map_err(drv("uploading the loss gradient"))?;
        backward_and_update(lt, &mut layers, &x, &ones)?;
        curve.push((step, loss));
        if step % REPORT_EVERY == 0 || step + 1 == STEPS {
            stream.synchronize().map_err(drv("synchronizing"))?;
            let ms = window.elapsed().as_secs_f64() * 1e3 / (step + 1 - window_start) as f64;
            let acc = acc * 100.0;
            println!("step {step:>3}  loss {loss:.4}  batch accuracy {acc:>5.1}%  {ms:.3} ms/step");
            (window, window_start) = (Instant::now(), step + 1);
        }
    }
    let (eval_loss, eval_acc) = evaluate(stream, lt, &mut layers, &eval_x, &eval_y)?;
    let (acc0, acc) = (eval_acc0 * 100.0, eval_acc * 100.0);
    println!("held-out: loss {eval_loss0:.4} → {eval_loss:.4}, accuracy {acc0:.1}% → {acc:.1}%");
    let (s, ws) = (lt.stats(), lt.workspace_bytes());
    println!("cuBLASLt: {} decisions, {} cached calls, {ws} B of workspace", s.misses, s.hits);
    let caption =
        format!("MLP {IN}→{HIDDEN}→{HIDDEN}→{CLASSES}, cuBLASLt fused bias+GELU, f32 SGD");
    let y_desc = "training loss (softmax cross-entropy)";
    Ok(common::training_summary("mlp", &caption, y_desc, &curve, 2.0))
}
