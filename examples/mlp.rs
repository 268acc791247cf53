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
//! Only the loss runs on the host: the 256×16 logits come down, softmax cross-entropy and its
//! gradient are computed there, and the gradient goes back up (a few kB per step).
//!
//! Prints the loss every 25 steps with the time per step, the held-out loss and accuracy before
//! and after, and writes `mlp_loss.svg` to `$CUDNN_SAFE_OUT_DIR` (else the current directory).
//! Exits with 1 if the training loss did not fall at least 2×, with 2 (one line on stderr)
//! without a GPU or cuBLASLt.
#[path = "common/mod.rs"]
mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use cudnn_safe::blas::lt::{BlasLt, Epilogue, EpilogueData, Matmul};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream, CudaView};
use cudnn_safe::{cuda_context, Error, Result};

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

fn drv(what: &'static str) -> impl Fn(cudnn_safe::cudarc::driver::DriverError) -> Error {
    move |e| Error::driver(what, e)
}

/// Points uniform in `[-1, 1]^64`, labelled by the argmax of a random `64 → 32 (tanh) → 16`
/// teacher network.
fn dataset(
    rng: &mut common::Rng,
    n: usize,
    teacher: &(Vec<f64>, Vec<f64>),
) -> (Vec<f32>, Vec<usize>) {
    let (t1, t2) = teacher;
    let x: Vec<f64> = (0..n * IN).map(|_| rng.signed_unit()).collect();
    let labels = (0..n)
        .map(|s| {
            let xs = &x[s * IN..(s + 1) * IN];
            let h: Vec<f64> = (0..TEACHER_HIDDEN)
                .map(|j| (0..IN).map(|i| xs[i] * t1[j * IN + i]).sum::<f64>().tanh())
                .collect();
            let logits: Vec<f64> = (0..CLASSES)
                .map(|o| {
                    (0..TEACHER_HIDDEN)
                        .map(|j| h[j] * t2[o * TEACHER_HIDDEN + j])
                        .sum()
                })
                .collect();
            argmax(&logits)
        })
        .collect();
    (x.iter().map(|&v| v as f32).collect(), labels)
}

fn argmax(v: &[f64]) -> usize {
    (0..v.len())
        .max_by(|&a, &b| v[a].total_cmp(&v[b]))
        .unwrap_or(0)
}

/// A linear layer's parameters on the device (PyTorch's default init: `U(±1/√fan_in)`).
struct Linear {
    w: CudaSlice<f32>,
    b: CudaSlice<f32>,
}

impl Linear {
    fn new(
        stream: &Arc<CudaStream>,
        rng: &mut common::Rng,
        inp: usize,
        out: usize,
    ) -> Result<Self> {
        let a = 1.0 / (inp as f64).sqrt();
        let mut init =
            |n: usize| -> Vec<f32> { (0..n).map(|_| (rng.signed_unit() * a) as f32).collect() };
        let w = init(out * inp);
        let b = init(out);
        Ok(Linear {
            w: stream.clone_htod(&w).map_err(drv("uploading a weight"))?,
            b: stream.clone_htod(&b).map_err(drv("uploading a bias"))?,
        })
    }
}

/// The problems of one training step (shapes fixed by the batch size).
struct Ops {
    fwd1: Matmul,
    fwd2: Matmul,
    fwd3: Matmul,
    /// `dpre = (dy·W) ⊙ gelu'(pre)` for the hidden layers (m = batch, n = hidden).
    dgelu_h3: Matmul,
    dgelu_h2: Matmul,
    /// `W ← W − lr·dyᵀ·x` (m = out, n = in, k = batch).
    upd3: Matmul,
    upd2: Matmul,
    upd1: Matmul,
    /// `b ← b − lr·1ᵀ·dy` (m = 1, n = out, k = batch).
    upd_b3: Matmul,
    upd_bh: Matmul,
}

impl Ops {
    fn new() -> Result<Self> {
        // Matrix dimensions are i64 in cudnn_safe::blas; buffer lengths usize.
        let [in_, hidden, classes, batch] = [IN, HIDDEN, CLASSES, BATCH].map(|v| v as i64);
        Ok(Ops {
            fwd1: Matmul::linear(batch, in_, hidden)?.with_epilogue(Epilogue::BiasGeluAux),
            fwd2: Matmul::linear(batch, hidden, hidden)?.with_epilogue(Epilogue::BiasGeluAux),
            fwd3: Matmul::linear(batch, hidden, classes)?.with_epilogue(Epilogue::Bias),
            dgelu_h3: Matmul::new(batch, hidden, classes)?.with_epilogue(Epilogue::DGelu),
            dgelu_h2: Matmul::new(batch, hidden, hidden)?.with_epilogue(Epilogue::DGelu),
            upd3: Matmul::new(classes, hidden, batch)?.with_transpose_a(true),
            upd2: Matmul::new(hidden, hidden, batch)?.with_transpose_a(true),
            upd1: Matmul::new(hidden, in_, batch)?.with_transpose_a(true),
            upd_b3: Matmul::new(1, classes, batch)?,
            upd_bh: Matmul::new(1, hidden, batch)?,
        })
    }
}

/// Device buffers of a batch: activations, GELU inputs (aux) and gradients.
struct Buffers {
    pre1: CudaSlice<f32>,
    h1: CudaSlice<f32>,
    pre2: CudaSlice<f32>,
    h2: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    dlogits: CudaSlice<f32>,
    dpre2: CudaSlice<f32>,
    dpre1: CudaSlice<f32>,
    ones: CudaSlice<f32>,
}

struct Model {
    l1: Linear,
    l2: Linear,
    l3: Linear,
}

impl Model {
    /// Logits of a batch `x` (BATCH × IN) into `buf.logits`; keeps what the backward pass needs.
    fn forward(
        &self,
        lt: &mut BlasLt,
        ops: &Ops,
        x: &CudaView<'_, f32>,
        buf: &mut Buffers,
    ) -> Result<()> {
        lt.matmul(
            &ops.fwd1,
            1.0,
            x,
            &self.l1.w,
            0.0,
            &mut buf.h1,
            EpilogueData::bias_aux(&self.l1.b, &mut buf.pre1),
        )?;
        lt.matmul(
            &ops.fwd2,
            1.0,
            &buf.h1,
            &self.l2.w,
            0.0,
            &mut buf.h2,
            EpilogueData::bias_aux(&self.l2.b, &mut buf.pre2),
        )?;
        lt.matmul(
            &ops.fwd3,
            1.0,
            &buf.h2,
            &self.l3.w,
            0.0,
            &mut buf.logits,
            EpilogueData::bias(&self.l3.b),
        )?;
        Ok(())
    }

    /// Backward from `buf.dlogits` and the SGD update of every parameter. Each layer's input
    /// gradient is computed before that layer's weight is updated.
    fn backward_and_update(
        &mut self,
        lt: &mut BlasLt,
        ops: &Ops,
        x: &CudaView<'_, f32>,
        buf: &mut Buffers,
    ) -> Result<()> {
        // Layer 3.
        lt.matmul(
            &ops.dgelu_h3,
            1.0,
            &buf.dlogits,
            &self.l3.w,
            0.0,
            &mut buf.dpre2,
            EpilogueData::aux(&buf.pre2),
        )?;
        lt.matmul(
            &ops.upd3,
            -LR,
            &buf.dlogits,
            &buf.h2,
            1.0,
            &mut self.l3.w,
            EpilogueData::None,
        )?;
        lt.matmul(
            &ops.upd_b3,
            -LR,
            &buf.ones,
            &buf.dlogits,
            1.0,
            &mut self.l3.b,
            EpilogueData::None,
        )?;
        // Layer 2.
        lt.matmul(
            &ops.dgelu_h2,
            1.0,
            &buf.dpre2,
            &self.l2.w,
            0.0,
            &mut buf.dpre1,
            EpilogueData::aux(&buf.pre1),
        )?;
        lt.matmul(
            &ops.upd2,
            -LR,
            &buf.dpre2,
            &buf.h1,
            1.0,
            &mut self.l2.w,
            EpilogueData::None,
        )?;
        lt.matmul(
            &ops.upd_bh,
            -LR,
            &buf.ones,
            &buf.dpre2,
            1.0,
            &mut self.l2.b,
            EpilogueData::None,
        )?;
        // Layer 1 (no input gradient needed).
        lt.matmul(
            &ops.upd1,
            -LR,
            &buf.dpre1,
            x,
            1.0,
            &mut self.l1.w,
            EpilogueData::None,
        )?;
        lt.matmul(
            &ops.upd_bh,
            -LR,
            &buf.ones,
            &buf.dpre1,
            1.0,
            &mut self.l1.b,
            EpilogueData::None,
        )?;
        Ok(())
    }
}

/// Mean softmax cross-entropy and accuracy of a batch of logits; fills `grad` with
/// `d(mean loss)/d(logits) = (softmax − onehot) / batch`.
fn cross_entropy(logits: &[f32], labels: &[usize], grad: &mut [f32]) -> (f64, f64) {
    let (mut loss, mut correct) = (0.0, 0);
    let n = labels.len();
    for (r, &label) in labels.iter().enumerate() {
        let row: Vec<f64> = logits[r * CLASSES..(r + 1) * CLASSES]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = row.iter().map(|v| (v - max).exp()).sum();
        loss -= row[label] - max - z.ln();
        if argmax(&row) == label {
            correct += 1;
        }
        for (o, g) in grad[r * CLASSES..(r + 1) * CLASSES].iter_mut().enumerate() {
            let p = (row[o] - max).exp() / z;
            *g = ((p - if o == label { 1.0 } else { 0.0 }) / n as f64) as f32;
        }
    }
    (loss / n as f64, correct as f64 / n as f64)
}

/// Loss and accuracy on the held-out set (forward only, batch by batch).
fn evaluate(
    stream: &Arc<CudaStream>,
    lt: &mut BlasLt,
    ops: &Ops,
    model: &Model,
    buf: &mut Buffers,
    x: &CudaSlice<f32>,
    labels: &[usize],
) -> Result<(f64, f64)> {
    let mut grad = vec![0f32; BATCH * CLASSES];
    let (mut loss, mut acc) = (0.0, 0.0);
    let batches = labels.len() / BATCH;
    for i in 0..batches {
        let xb = x.slice(i * BATCH * IN..(i + 1) * BATCH * IN);
        model.forward(lt, ops, &xb, buf)?;
        let logits = stream
            .clone_dtoh(&buf.logits)
            .map_err(drv("downloading logits"))?;
        let (l, a) = cross_entropy(&logits, &labels[i * BATCH..(i + 1) * BATCH], &mut grad);
        loss += l;
        acc += a;
    }
    Ok((loss / batches as f64, acc / batches as f64))
}

fn run(stream: &Arc<CudaStream>, lt: &mut BlasLt) -> Result<bool> {
    let mut rng = common::Rng::new(7);
    let teacher = (
        (0..TEACHER_HIDDEN * IN)
            .map(|_| rng.signed_unit() * 3.0 / (IN as f64).sqrt())
            .collect::<Vec<_>>(),
        (0..CLASSES * TEACHER_HIDDEN)
            .map(|_| rng.signed_unit() * 3.0 / (TEACHER_HIDDEN as f64).sqrt())
            .collect::<Vec<_>>(),
    );
    let (train_x, train_y) = dataset(&mut rng, SAMPLES, &teacher);
    let (eval_x, eval_y) = dataset(&mut rng, HELD_OUT, &teacher);
    let train_x = stream
        .clone_htod(&train_x)
        .map_err(drv("uploading the training set"))?;
    let eval_x = stream
        .clone_htod(&eval_x)
        .map_err(drv("uploading the held-out set"))?;

    let ops = Ops::new()?;
    let mut model = Model {
        l1: Linear::new(stream, &mut rng, IN, HIDDEN)?,
        l2: Linear::new(stream, &mut rng, HIDDEN, HIDDEN)?,
        l3: Linear::new(stream, &mut rng, HIDDEN, CLASSES)?,
    };
    let zeros = |n: usize| {
        stream
            .alloc_zeros::<f32>(n)
            .map_err(drv("allocating activations"))
    };
    let mut buf = Buffers {
        pre1: zeros(ops.fwd1.aux_len())?,
        h1: zeros(BATCH * HIDDEN)?,
        pre2: zeros(ops.fwd2.aux_len())?,
        h2: zeros(BATCH * HIDDEN)?,
        logits: zeros(BATCH * CLASSES)?,
        dlogits: zeros(BATCH * CLASSES)?,
        dpre2: zeros(BATCH * HIDDEN)?,
        dpre1: zeros(BATCH * HIDDEN)?,
        ones: stream
            .clone_htod(&vec![1.0f32; BATCH])
            .map_err(drv("uploading ones"))?,
    };

    let (eval_loss0, eval_acc0) = evaluate(stream, lt, &ops, &model, &mut buf, &eval_x, &eval_y)?;
    let mut grad = vec![0f32; BATCH * CLASSES];
    let mut curve = Vec::with_capacity(STEPS);
    let mut window = Instant::now();
    let mut window_start = 0;
    for step in 0..STEPS {
        let first = (step * BATCH) % SAMPLES;
        let x = train_x.slice(first * IN..(first + BATCH) * IN);
        model.forward(lt, &ops, &x, &mut buf)?;
        let logits = stream
            .clone_dtoh(&buf.logits)
            .map_err(drv("downloading logits"))?;
        let (loss, acc) = cross_entropy(&logits, &train_y[first..first + BATCH], &mut grad);
        stream
            .memcpy_htod(&grad, &mut buf.dlogits)
            .map_err(drv("uploading the loss gradient"))?;
        model.backward_and_update(lt, &ops, &x, &mut buf)?;
        curve.push((step, loss));
        if step % REPORT_EVERY == 0 || step + 1 == STEPS {
            stream.synchronize().map_err(drv("synchronizing"))?;
            let steps = (step + 1 - window_start).max(1);
            let ms = window.elapsed().as_secs_f64() * 1e3 / steps as f64;
            println!(
                "step {step:>3}  loss {loss:.4}  batch accuracy {:>5.1}%  {ms:.3} ms/step",
                acc * 100.0
            );
            window = Instant::now();
            window_start = step + 1;
        }
    }
    let (eval_loss, eval_acc) = evaluate(stream, lt, &ops, &model, &mut buf, &eval_x, &eval_y)?;
    let initial = curve[0].1;
    let tail = &curve[curve.len().saturating_sub(10)..];
    let final_loss = tail.iter().map(|p| p.1).sum::<f64>() / tail.len() as f64;
    println!(
        "held-out: loss {eval_loss0:.4} → {eval_loss:.4}, accuracy {:.1}% → {:.1}%",
        eval_acc0 * 100.0,
        eval_acc * 100.0
    );
    println!(
        "training loss: initial {initial:.4}, final {final_loss:.4} (mean of the last {} steps), {:.2}× lower",
        tail.len(),
        initial / final_loss
    );
    let s = lt.stats();
    println!(
        "cuBLASLt: {} decisions (policy {}), {} cached calls, {} bytes of workspace",
        s.misses,
        lt.policy().name(),
        s.hits,
        lt.workspace_bytes()
    );
    let caption = format!(
        "MLP {IN}→{HIDDEN}→{HIDDEN}→{CLASSES}, cuBLASLt fused bias+GELU, f32 SGD: loss {initial:.3} → {final_loss:.3}"
    );
    let y_desc = "training loss (softmax cross-entropy)";
    match common::write_loss_svg("mlp_loss.svg", &caption, y_desc, &curve) {
        Ok(path) => println!("loss curve: {}", path.display()),
        Err(e) => eprintln!("mlp: loss curve not written: {e}"),
    }
    let learned = final_loss * 2.0 < initial;
    if !learned {
        eprintln!("mlp: the loss did not fall at least 2× ({initial:.4} → {final_loss:.4})");
    }
    Ok(learned)
}
