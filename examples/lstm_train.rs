//! Trains an LSTM on the GPU to output the running sum of its input, and plots the loss curve.
//!
//! The task: sequences of 10 to 40 random values uniform in `[-1, 1]` (a different length per
//! sequence: the batch is variable-length, padded to 40 steps, sequence-major); at every step
//! the target is `SCALE ×` the sum of the values so far. The model is a 2-layer LSTM (hidden 64,
//! f32) followed by a linear head `pred = h·w_head + b_head`, trained with SGD with momentum
//! (lr 0.05, momentum 0.9) on the mean squared error over the valid steps, batch 64, 300 steps.
//!
//! What runs where:
//! * cuDNN ([`Rnn`]): the training forward ([`Rnn::forward_training_reuse`], which keeps one
//!   reserve allocation across steps), [`Rnn::backward_data`] and [`Rnn::backward_weights`];
//! * cuBLAS ([`Blas`]): the head (`pred = y·w_head`), its gradients (`dw_head = dpredᵀ·y`,
//!   `dy = dpred·w_headᵀ`), and the momentum SGD update of every weight, as rank-1 GEMMs
//!   (`v ← 0.9·v + g` and `p ← p − lr·v` are `C ← α·[1]·B + β·C`);
//! * the host: data generation, the loss and its gradient with respect to the predictions
//!   (`T·B` floats each way per step) and the head's scalar bias.
//!
//! The LSTM weights start uniform in `±1/sqrt(hidden)` as PyTorch's `nn.LSTM`, set through a
//! PyTorch-layout state dict ([`Rnn::weights_from_pytorch`]).
//!
//! Prints the loss every 25 steps with the time per step, the held-out loss before and after,
//! one held-out sequence's predictions, and writes `lstm_loss.svg` to `$CUDNN_SAFE_OUT_DIR`
//! (else the current directory). Exits with 1 if the training loss did not fall at least 4×,
//! with 2 (one line on stderr) without a GPU or cuBLAS.
#[path = "common/mod.rs"]
mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use cudnn_safe::blas::{Blas, Transpose};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::rnn::{
    BackwardData, BackwardWeights, CellMode, Forward, Rnn, RnnReserve, SeqDataDesc, SeqLayout,
};
use cudnn_safe::{Cudnn, Result, Workspace};

const HIDDEN: usize = 64;
const LAYERS: usize = 2;
const BATCH: usize = 64;
const MIN_LEN: usize = 10;
const MAX_LEN: usize = 40;
const STEPS: usize = 300;
const LR: f32 = 0.05;
const MOMENTUM: f32 = 0.9;
/// Targets are the running sums times this (keeps them within a few units).
const SCALE: f64 = 0.25;
const REPORT_EVERY: usize = 25;
/// The loss must fall at least this many times for the run to count as learning.
const REQUIRED_DROP: f64 = 4.0;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let Some((stream, cudnn)) = common::open_gpu("lstm_train") else {
        return ExitCode::from(2);
    };
    let blas = match Blas::new(stream.clone()) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("lstm_train needs cuBLAS: {}", common::chain(&e));
            return ExitCode::from(2);
        }
    };
    println!(
        "lstm_train: {}, cuDNN {}; {LAYERS}-layer LSTM (hidden {HIDDEN}, f32) + linear head, running sum \
         of {MIN_LEN}–{MAX_LEN} values, batch {BATCH}, SGD lr {LR} momentum {MOMENTUM}, {STEPS} steps",
        common::device_line(&stream),
        cudnn_safe::format_version(cudnn.version()),
    );
    match run(&stream, &cudnn, &blas) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("lstm_train: {}", common::chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// One batch: lengths, the padded input `[MAX_LEN, BATCH, 1]` and the per-step targets.
struct Batch {
    lens: Vec<usize>,
    x: Vec<f32>,
    /// `targets[b][t]` for `t < lens[b]`.
    targets: Vec<Vec<f64>>,
}

fn batch(rng: &mut common::Rng) -> Batch {
    let mut lens = Vec::with_capacity(BATCH);
    let mut x = vec![0f32; MAX_LEN * BATCH];
    let mut targets = Vec::with_capacity(BATCH);
    for b in 0..BATCH {
        let u = (rng.signed_unit() + 1.0) / 2.0;
        let len = (MIN_LEN + (u * (MAX_LEN - MIN_LEN + 1) as f64) as usize).min(MAX_LEN);
        let mut sum = 0.0;
        let mut t_b = Vec::with_capacity(len);
        for t in 0..len {
            let v = rng.signed_unit() as f32;
            x[t * BATCH + b] = v;
            sum += f64::from(v);
            t_b.push(SCALE * sum);
        }
        lens.push(len);
        targets.push(t_b);
    }
    Batch { lens, x, targets }
}

/// Mean squared error over the valid steps of `pred` (`[MAX_LEN, BATCH]`, before the head bias),
/// and its gradient with respect to `pred` (zero at padding) and to the head bias.
fn mse(pred: &[f32], bias: f32, b: &Batch, dpred: &mut [f32]) -> (f64, f64) {
    let count: usize = b.lens.iter().sum();
    dpred.fill(0.0);
    let (mut loss, mut dbias) = (0.0, 0.0);
    for (bi, targets) in b.targets.iter().enumerate() {
        for (t, &target) in targets.iter().enumerate() {
            let i = t * BATCH + bi;
            let e = f64::from(pred[i] + bias) - target;
            loss += e * e;
            let g = 2.0 * e / count as f64;
            dpred[i] = g as f32;
            dbias += g;
        }
    }
    (loss / count as f64, dbias)
}

/// Device state of the model and the optimizer.
struct Model {
    rnn: Rnn<f32>,
    w: CudaSlice<f32>,
    dw: CudaSlice<f32>,
    vw: CudaSlice<f32>,
    head: CudaSlice<f32>,
    dhead: CudaSlice<f32>,
    vhead: CudaSlice<f32>,
    head_bias: f32,
    v_bias: f32,
    one: CudaSlice<f32>,
}

/// Per-step device buffers (sized for `MAX_LEN × BATCH`, reused).
struct Buffers {
    x: CudaSlice<f32>,
    y: CudaSlice<f32>,
    pred: CudaSlice<f32>,
    dpred: CudaSlice<f32>,
    dy: CudaSlice<f32>,
    dx: CudaSlice<f32>,
    ws: Workspace,
    reserve: Option<RnnReserve<f32>>,
}

/// `v ← momentum·v + g; p ← p − lr·v` on the device, as two rank-1 GEMMs (`[1]·g`).
fn sgd_momentum(
    blas: &Blas,
    one: &CudaSlice<f32>,
    p: &mut CudaSlice<f32>,
    v: &mut CudaSlice<f32>,
    g: &CudaSlice<f32>,
) -> Result<()> {
    let n = p.len() as i64;
    let (no, one_x1) = (Transpose::No, 1);
    blas.matmul_row_major(no, no, 1, n, 1, 1.0, one, one_x1, g, n, MOMENTUM, v, n)?;
    blas.matmul_row_major(no, no, 1, n, 1, -LR, one, one_x1, &*v, n, 1.0, p, n)
}

/// Sequence descriptors for `lens`: input (1 value per step) and output (`HIDDEN` values).
fn descriptors(lens: &[usize]) -> Result<(SeqDataDesc<f32>, SeqDataDesc<f32>)> {
    let lens: Vec<i64> = lens.iter().map(|&l| l as i64).collect();
    let (max_len, hidden) = (MAX_LEN as i64, HIDDEN as i64);
    Ok((
        SeqDataDesc::new(SeqLayout::SeqMajor, max_len, 1, &lens, 0.0)?,
        SeqDataDesc::new(SeqLayout::SeqMajor, max_len, hidden, &lens, 0.0)?,
    ))
}

/// LSTM forward (training or inference) and the head: fills `buf.y` and `buf.pred`, returns the
/// predictions on the host.
fn forward(
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    blas: &Blas,
    m: &Model,
    buf: &mut Buffers,
    data: &Batch,
    training: bool,
) -> Result<(SeqDataDesc<f32>, SeqDataDesc<f32>, Vec<f32>)> {
    let (x_d, y_d) = descriptors(&data.lens)?;
    stream
        .memcpy_htod(&data.x, &mut buf.x)
        .map_err(common::drv("uploading a batch"))?;
    let args = Forward::new(&x_d, &buf.x, &y_d, &mut buf.y, &m.w);
    if training {
        buf.reserve = Some(match buf.reserve.take() {
            Some(old) => m
                .rnn
                .forward_training_reuse(cudnn, args, &mut buf.ws, old)?,
            None => m.rnn.forward_training(cudnn, args, &mut buf.ws)?,
        });
    } else {
        m.rnn.forward_inference(cudnn, args, &mut buf.ws)?;
    }
    let (rows, h) = ((MAX_LEN * BATCH) as i64, HIDDEN as i64);
    let no = Transpose::No;
    // pred [T·B × 1] = y [T·B × H] · w_head [H × 1]
    blas.matmul_row_major(
        no,
        no,
        rows,
        1,
        h,
        1.0,
        &buf.y,
        h,
        &m.head,
        1,
        0.0,
        &mut buf.pred,
        1,
    )?;
    let pred = stream
        .clone_dtoh(&buf.pred)
        .map_err(common::drv("downloading predictions"))?;
    Ok((x_d, y_d, pred))
}

/// One training step; returns the batch loss.
fn train_step(
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    blas: &Blas,
    m: &mut Model,
    buf: &mut Buffers,
    data: &Batch,
    dpred_host: &mut [f32],
) -> Result<f64> {
    let (x_d, y_d, pred) = forward(stream, cudnn, blas, m, buf, data, true)?;
    let (loss, dbias) = mse(&pred, m.head_bias, data, dpred_host);
    stream
        .memcpy_htod(dpred_host, &mut buf.dpred)
        .map_err(common::drv("uploading the loss gradient"))?;
    let (rows, h) = ((MAX_LEN * BATCH) as i64, HIDDEN as i64);
    let (no, yes) = (Transpose::No, Transpose::Yes);
    // dw_head [1 × H] = dpredᵀ [1 × T·B] · y [T·B × H]
    blas.matmul_row_major(
        yes,
        no,
        1,
        h,
        rows,
        1.0,
        &buf.dpred,
        1,
        &buf.y,
        h,
        0.0,
        &mut m.dhead,
        h,
    )?;
    // dy [T·B × H] = dpred [T·B × 1] · w_headᵀ [1 × H] (zero at padding, where dpred is)
    blas.matmul_row_major(
        no,
        no,
        rows,
        h,
        1,
        1.0,
        &buf.dpred,
        1,
        &m.head,
        h,
        0.0,
        &mut buf.dy,
        h,
    )?;
    let reserve = buf
        .reserve
        .as_mut()
        .expect("a training forward left its reserve");
    m.rnn.backward_data(
        cudnn,
        reserve,
        BackwardData::new(&y_d, &buf.y, &buf.dy, &x_d, &mut buf.dx, &m.w),
        &mut buf.ws,
    )?;
    m.rnn.backward_weights(
        cudnn,
        reserve,
        BackwardWeights::new(&x_d, &buf.x, &y_d, &buf.y, &mut m.dw),
        &mut buf.ws,
    )?;
    sgd_momentum(blas, &m.one, &mut m.w, &mut m.vw, &m.dw)?;
    sgd_momentum(blas, &m.one, &mut m.head, &mut m.vhead, &m.dhead)?;
    m.v_bias = MOMENTUM * m.v_bias + dbias as f32;
    m.head_bias -= LR * m.v_bias;
    Ok(loss)
}

fn run(stream: &Arc<CudaStream>, cudnn: &Cudnn, blas: &Blas) -> Result<bool> {
    let mut rng = common::Rng::new(2024);
    let rnn = Rnn::<f32>::builder(CellMode::Lstm, 1, HIDDEN as i64)
        .layers(LAYERS as i64)
        .build(cudnn)?;
    // PyTorch's initialisation, through a PyTorch-layout state dict.
    let k = 1.0 / (HIDDEN as f64).sqrt();
    let tensors: Vec<(String, Vec<f32>)> = rnn
        .pytorch_params()
        .into_iter()
        .map(|p| {
            let data = (0..p.len())
                .map(|_| (k * rng.signed_unit()) as f32)
                .collect();
            (p.name, data)
        })
        .collect();
    let state: Vec<(&str, &[f32])> = tensors.iter().map(|(n, d)| (n.as_str(), &d[..])).collect();
    let image = rnn.weights_from_pytorch(&state)?;
    println!(
        "weights: {} parameters in a {}-element weight space ({} tensors: {})",
        tensors.iter().map(|t| t.1.len()).sum::<usize>(),
        rnn.weight_space_len(),
        tensors.len(),
        tensors
            .iter()
            .map(|t| t.0.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let up = |v: &[f32], what: &'static str| stream.clone_htod(v).map_err(common::drv(what));
    let zeros = |n: usize| {
        stream
            .alloc_zeros::<f32>(n)
            .map_err(common::drv("allocating a buffer"))
    };
    let head: Vec<f32> = (0..HIDDEN)
        .map(|_| (k * rng.signed_unit()) as f32)
        .collect();
    let n = rnn.weight_space_len();
    let mut model = Model {
        w: up(&image, "uploading the weights")?,
        dw: zeros(n)?,
        vw: zeros(n)?,
        head: up(&head, "uploading the head")?,
        dhead: zeros(HIDDEN)?,
        vhead: zeros(HIDDEN)?,
        head_bias: 0.0,
        v_bias: 0.0,
        one: up(&[1.0], "uploading a one")?,
        rnn,
    };
    let rows = MAX_LEN * BATCH;
    let mut buf = Buffers {
        x: zeros(rows)?,
        y: zeros(rows * HIDDEN)?,
        pred: zeros(rows)?,
        dpred: zeros(rows)?,
        dy: zeros(rows * HIDDEN)?,
        dx: zeros(rows)?,
        ws: Workspace::new(stream.clone()),
        reserve: None,
    };
    let mut dpred = vec![0f32; rows];
    let held_out = batch(&mut common::Rng::new(99));
    let evaluate = |m: &Model, buf: &mut Buffers, scratch: &mut [f32]| -> Result<(f64, Vec<f32>)> {
        let (_, _, pred) = forward(stream, cudnn, blas, m, buf, &held_out, false)?;
        Ok((mse(&pred, m.head_bias, &held_out, scratch).0, pred))
    };
    let (eval0, _) = evaluate(&model, &mut buf, &mut dpred)?;

    let mut curve = Vec::with_capacity(STEPS);
    let mut window = Instant::now();
    let mut window_start = 0;
    for step in 0..STEPS {
        let data = batch(&mut rng);
        let loss = train_step(stream, cudnn, blas, &mut model, &mut buf, &data, &mut dpred)?;
        if !loss.is_finite() {
            eprintln!("lstm_train: the loss diverged at step {step}");
            return Ok(false);
        }
        curve.push((step, loss));
        if step % REPORT_EVERY == 0 || step + 1 == STEPS {
            stream.synchronize().map_err(common::drv("synchronizing"))?;
            let steps = (step + 1 - window_start).max(1);
            let ms = window.elapsed().as_secs_f64() * 1e3 / steps as f64;
            println!("step {step:>3}  loss {loss:.5}  {ms:.3} ms/step");
            window = Instant::now();
            window_start = step + 1;
        }
    }
    let (eval1, pred) = evaluate(&model, &mut buf, &mut dpred)?;
    let initial = curve[0].1;
    let tail = &curve[curve.len().saturating_sub(10)..];
    let final_loss = tail.iter().map(|p| p.1).sum::<f64>() / tail.len() as f64;
    println!("held-out loss: {eval0:.5} → {eval1:.5}");
    println!(
        "training loss: initial {initial:.5}, final {final_loss:.5} (mean of the last {} steps), {:.1}× lower",
        tail.len(),
        initial / final_loss
    );
    let b = 0;
    println!(
        "held-out sequence 0 (length {}), target vs prediction:",
        held_out.lens[b]
    );
    for t in (0..held_out.lens[b]).step_by(5) {
        println!(
            "  step {t:>2}: {:>7.3}  {:>7.3}",
            held_out.targets[b][t],
            pred[t * BATCH + b] + model.head_bias
        );
    }
    let caption = format!(
        "{LAYERS}-layer LSTM (hidden {HIDDEN}), running sum, cuDNN + cuBLAS SGD: loss {initial:.3} → {final_loss:.4}"
    );
    let y_desc = "training loss (mean squared error)";
    match common::write_loss_svg("lstm_loss.svg", &caption, y_desc, &curve) {
        Ok(path) => println!("loss curve: {}", path.display()),
        Err(e) => eprintln!("lstm_train: loss curve not written: {e}"),
    }
    let learned = final_loss * REQUIRED_DROP < initial;
    if !learned {
        eprintln!(
            "lstm_train: the loss did not fall at least {REQUIRED_DROP}× ({initial:.5} → {final_loss:.5})"
        );
    }
    Ok(learned)
}
