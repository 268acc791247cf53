//! Trains an LSTM on the GPU to output the running sum of its input, and plots the loss curve.
//!
//! Sequences of 10 to 40 values uniform in `[-1, 1]` (a variable-length batch, padded to 40
//! steps, sequence-major); at every step the target is `SCALE ×` the sum so far. A 2-layer LSTM
//! (hidden 64, f32) and a linear head `pred = h·w_head + b_head`, trained with SGD with momentum
//! on the mean squared error over the valid steps. The LSTM weights start uniform in
//! `±1/sqrt(hidden)` as PyTorch's `nn.LSTM`, set through a PyTorch-layout state dict
//! ([`Rnn::weights_from_pytorch`]).
//!
//! * cuDNN ([`Rnn`]): the training forward (its reserve reused across steps),
//!   [`Rnn::backward_data`] and [`Rnn::backward_weights`];
//! * cuBLAS ([`Blas`]): the head, its gradients and the momentum update of every weight, as
//!   rank-1 GEMMs (`v ← 0.9·v + g` and `p ← p − lr·v` are `C ← α·[1]·B + β·C`);
//! * the host: the data, the loss and its gradient, and the head's scalar bias.
//!
//! Writes `lstm_loss.svg` to `$CUDNN_SAFE_OUT_DIR` (else the current directory). Exit status: 1
//! if the training loss did not fall at least 4×, 2 without a GPU.
#[path = "common/mod.rs"]
mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use common::{drv, Rng};
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
/// Rows of the sequence-major output, `T·B`.
const ROWS: usize = MAX_LEN * BATCH;
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
    match run(&stream, &cudnn) {
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

fn batch(rng: &mut Rng) -> Batch {
    let (mut lens, mut x, mut targets) = (Vec::new(), vec![0f32; ROWS], Vec::new());
    for b in 0..BATCH {
        let u = (rng.signed_unit() + 1.0) / 2.0;
        let len = (MIN_LEN + (u * (MAX_LEN - MIN_LEN + 1) as f64) as usize).min(MAX_LEN);
        let mut sum = 0.0;
        let mut step = |t: usize| {
            x[t * BATCH + b] = rng.signed_unit() as f32;
            sum += f64::from(x[t * BATCH + b]);
            SCALE * sum
        };
        targets.push((0..len).map(&mut step).collect());
        lens.push(len);
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

/// A parameter tensor on the device with its gradient and momentum.
struct Param {
    value: CudaSlice<f32>,
    grad: CudaSlice<f32>,
    velocity: CudaSlice<f32>,
}

impl Param {
    fn new(stream: &Arc<CudaStream>, init: &[f32]) -> Result<Param> {
        let zeros = || stream.alloc_zeros::<f32>(init.len()).map_err(drv("allocating"));
        let value = stream.clone_htod(init).map_err(drv("uploading a parameter"))?;
        Ok(Param { value, grad: zeros()?, velocity: zeros()? })
    }

    /// `v ← momentum·v + g; p ← p − lr·v` on the device, as two rank-1 GEMMs (`[1]·g`).
    fn sgd(&mut self, blas: &Blas, one: &CudaSlice<f32>) -> Result<()> {
        let n = self.value.len();
        gemm(blas, false, (1, n, 1), 1.0, one, &self.grad, MOMENTUM, &mut self.velocity)?;
        gemm(blas, false, (1, n, 1), -LR, one, &self.velocity, 1.0, &mut self.value)
    }
}

/// The model and the optimizer's state: the LSTM's weight space, the head and its bias.
struct Model {
    rnn: Rnn<f32>,
    w: Param,
    head: Param,
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
    /// The loss gradient on the host.
    dpred_host: Vec<f32>,
    ws: Workspace,
    reserve: Option<RnnReserve<f32>>,
}

/// Row-major `c ← alpha·op(a)·b + beta·c` with `op(a)` of `m×k` (`a` stored transposed when
/// `ta`), `b` of `k×n`, all packed.
#[allow(clippy::too_many_arguments)] // a GEMM's operands
fn gemm(
    blas: &Blas,
    ta: bool,
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    a: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    beta: f32,
    c: &mut CudaSlice<f32>,
) -> Result<()> {
    let (m, n, k) = (m as i64, n as i64, k as i64);
    let (op_a, lda) = if ta { (Transpose::Yes, m) } else { (Transpose::No, k) };
    blas.matmul_row_major(op_a, Transpose::No, m, n, k, alpha, a, lda, b, n, beta, c, n)
}

/// Uploads a batch; its sequence descriptors: input (1 value per step), output (`HIDDEN`).
fn upload(s: &Arc<CudaStream>, buf: &mut Buffers, data: &Batch) -> Result<[SeqDataDesc<f32>; 2]> {
    s.memcpy_htod(&data.x, &mut buf.x).map_err(drv("uploading a batch"))?;
    let lens: Vec<i64> = data.lens.iter().map(|&l| l as i64).collect();
    let desc =
        |width: i64| SeqDataDesc::new(SeqLayout::SeqMajor, MAX_LEN as i64, width, &lens, 0.0);
    Ok([desc(1)?, desc(HIDDEN as i64)?])
}

/// The head, `pred [T·B × 1] = y [T·B × H] · w_head [H × 1]`, downloaded (before its bias).
fn predict(s: &Arc<CudaStream>, blas: &Blas, m: &Model, buf: &mut Buffers) -> Result<Vec<f32>> {
    gemm(blas, false, (ROWS, 1, HIDDEN), 1.0, &buf.y, &m.head.value, 0.0, &mut buf.pred)?;
    s.clone_dtoh(&buf.pred).map_err(drv("downloading predictions"))
}

/// One training step; returns the batch loss.
fn train_step(
    s: &Arc<CudaStream>,
    cudnn: &Cudnn,
    blas: &Blas,
    m: &mut Model,
    buf: &mut Buffers,
    data: &Batch,
) -> Result<f64> {
    let [x_d, y_d] = upload(s, buf, data)?;
    let args = Forward::new(&x_d, &buf.x, &y_d, &mut buf.y, &m.w.value);
    // The first step allocates the reserve (what backward needs); later steps reuse it.
    let mut reserve = match buf.reserve.take() {
        Some(old) => m.rnn.forward_training_reuse(cudnn, args, &mut buf.ws, old)?,
        None => m.rnn.forward_training(cudnn, args, &mut buf.ws)?,
    };
    let pred = predict(s, blas, m, buf)?;
    let (loss, dbias) = mse(&pred, m.head_bias, data, &mut buf.dpred_host);
    s.memcpy_htod(&buf.dpred_host, &mut buf.dpred).map_err(drv("uploading the loss gradient"))?;
    // dw_head [1 × H] = dpredᵀ [1 × T·B] · y [T·B × H]
    gemm(blas, true, (1, HIDDEN, ROWS), 1.0, &buf.dpred, &buf.y, 0.0, &mut m.head.grad)?;
    // dy [T·B × H] = dpred [T·B × 1] · w_headᵀ [1 × H] (zero at padding, where dpred is)
    gemm(blas, false, (ROWS, HIDDEN, 1), 1.0, &buf.dpred, &m.head.value, 0.0, &mut buf.dy)?;
    let data_args = BackwardData::new(&y_d, &buf.y, &buf.dy, &x_d, &mut buf.dx, &m.w.value);
    m.rnn.backward_data(cudnn, &mut reserve, data_args, &mut buf.ws)?;
    let weight_args = BackwardWeights::new(&x_d, &buf.x, &y_d, &buf.y, &mut m.w.grad);
    m.rnn.backward_weights(cudnn, &mut reserve, weight_args, &mut buf.ws)?;
    buf.reserve = Some(reserve);
    m.w.sgd(blas, &m.one)?;
    m.head.sgd(blas, &m.one)?;
    m.v_bias = MOMENTUM * m.v_bias + dbias as f32;
    m.head_bias -= LR * m.v_bias;
    Ok(loss)
}

fn run(stream: &Arc<CudaStream>, cudnn: &Cudnn) -> Result<bool> {
    let blas = &Blas::new(stream.clone())?;
    println!(
        "lstm_train: {}, cuDNN {}; {LAYERS}-layer LSTM (hidden {HIDDEN}, f32) + linear head, running sum \
         of {MIN_LEN}–{MAX_LEN} values, batch {BATCH}, SGD lr {LR} momentum {MOMENTUM}, {STEPS} steps",
        common::device_line(stream),
        cudnn_safe::format_version(cudnn.version()),
    );
    let mut rng = Rng::new(2024);
    let rnn =
        Rnn::<f32>::builder(CellMode::Lstm, 1, HIDDEN as i64).layers(LAYERS as i64).build(cudnn)?;
    // PyTorch's initialisation, through a PyTorch-layout state dict.
    let k = 1.0 / (HIDDEN as f64).sqrt();
    let tensors: Vec<(String, Vec<f32>)> = rnn
        .pytorch_params()
        .into_iter()
        .map(|p| {
            let data = (0..p.len()).map(|_| (k * rng.signed_unit()) as f32).collect();
            (p.name, data)
        })
        .collect();
    let state: Vec<(&str, &[f32])> = tensors.iter().map(|(n, d)| (n.as_str(), &d[..])).collect();
    let image = rnn.weights_from_pytorch(&state)?;
    let zeros = |n: usize| stream.alloc_zeros::<f32>(n).map_err(drv("allocating a buffer"));
    let head: Vec<f32> = (0..HIDDEN).map(|_| (k * rng.signed_unit()) as f32).collect();
    let mut model = Model {
        w: Param::new(stream, &image)?,
        head: Param::new(stream, &head)?,
        head_bias: 0.0,
        v_bias: 0.0,
        one: stream.clone_htod(&[1.0]).map_err(drv("uploading a one"))?,
        rnn,
    };
    let mut buf = Buffers {
        x: zeros(ROWS)?,
        y: zeros(ROWS * HIDDEN)?,
        pred: zeros(ROWS)?,
        dpred: zeros(ROWS)?,
        dy: zeros(ROWS * HIDDEN)?,
        dx: zeros(ROWS)?,
        dpred_host: vec![0.0; ROWS],
        ws: Workspace::new(stream.clone()),
        reserve: None,
    };
    let held_out = batch(&mut Rng::new(99));
    let evaluate = |m: &Model, buf: &mut Buffers| -> Result<(f64, Vec<f32>)> {
        let [x_d, y_d] = upload(stream, buf, &held_out)?;
        let args = Forward::new(&x_d, &buf.x, &y_d, &mut buf.y, &m.w.value);
        m.rnn.forward_inference(cudnn, args, &mut buf.ws)?;
        let pred = predict(stream, blas, m, buf)?;
        Ok((mse(&pred, m.head_bias, &held_out, &mut buf.dpred_host).0, pred))
    };
    let (eval0, _) = evaluate(&model, &mut buf)?;

    let mut curve = Vec::with_capacity(STEPS);
    let (mut window, mut window_start) = (Instant::now(), 0);
    for step in 0..STEPS {
        let data = batch(&mut rng);
        let loss = train_step(stream, cudnn, blas, &mut model, &mut buf, &data)?;
        if !loss.is_finite() {
            eprintln!("lstm_train: the loss diverged at step {step}");
            return Ok(false);
        }
        curve.push((step, loss));
        if step % REPORT_EVERY == 0 || step + 1 == STEPS {
            stream.synchronize().map_err(drv("synchronizing"))?;
            let ms = window.elapsed().as_secs_f64() * 1e3 / (step + 1 - window_start) as f64;
            println!("step {step:>3}  loss {loss:.5}  {ms:.3} ms/step");
            (window, window_start) = (Instant::now(), step + 1);
        }
    }
    let (eval1, pred) = evaluate(&model, &mut buf)?;
    println!("held-out loss: {eval0:.5} → {eval1:.5}");
    println!("held-out sequence 0 (length {}), target vs prediction:", held_out.lens[0]);
    for t in (0..held_out.lens[0]).step_by(5) {
        let (want, got) = (held_out.targets[0][t], pred[t * BATCH] + model.head_bias);
        println!("  step {t:>2}: {want:>7.3}  {got:>7.3}");
    }
    let caption = format!("{LAYERS}-layer LSTM (hidden {HIDDEN}), running sum, cuDNN + cuBLAS SGD");
    let y_desc = "training loss (mean squared error)";
    Ok(common::training_summary("lstm", &caption, y_desc, &curve, REQUIRED_DROP))
}
