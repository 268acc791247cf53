//! One pre-norm transformer block in bf16, built from cuDNN graphs, checked against an f64 CPU
//! reference at a small size and timed at a realistic one.
//!
//! ```text
//! h1  = x  + Wo · attention(split_heads(Wqkv · LN1(x) + bqkv)) + bo
//! out = h1 + W2 · gelu(W1 · LN2(h1) + b1) + b2
//! ```
//!
//! Each line below is one graph (bf16 tensors, f32 accumulation and intermediates), autotuned
//! once and then executed with [`Cudnn::execute`]:
//!
//! 1. `ln1`: layer norm (cuDNN `NORM_FORWARD`, inference phase), bf16 scale and bias;
//! 2. `qkv`: matmul + bias, writing Q, K and V interleaved per token (`[B·S, 3·D]`);
//! 3. `attention`: causal scaled dot-product attention reading Q, K, V straight out of that
//!    buffer as `[B, H, S, hd]` strided views, writing `[B, S, H, hd]` = `[B·S, D]`;
//! 4. `proj`: matmul + bias + the residual x;
//! 5. `ln2`: layer norm;
//! 6. `mlp_up`: matmul + bias + GELU (erf form, PyTorch's default) fused;
//! 7. `mlp_down`: matmul + bias + the residual h1.
//!
//! The check runs each stage on the GPU, downloads its inputs and output, and compares the output
//! with an f64 CPU evaluation of that stage on the same (bf16) inputs, so errors do not compound
//! across stages; the tolerance is bf16's rounding of the stored output plus f32 accumulation.
//! The timed size (`--size realistic`, default: batch 8, sequence 2048, model 2048, 16 heads of
//! 128, MLP 8192) prints each stage's time and TFLOP/s and the whole block's, and writes
//! `transformer_block.svg` (time per stage). `benches/pytorch/transformer_block.py` times the same
//! block in PyTorch for a ratio.
//!
//! Options: `--size small|realistic|both` (default both). Exits with 1 when a check fails, 2 without a GPU.
#[path = "common/mod.rs"]
mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use common::{device_line, drv, open_gpu, options, out_dir, Rng, Timer};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::graph::{
    autotune, Args, Graph, OperationGraph, Plan, PlanFilter, PointwiseMode, SdpaOptions, TensorId,
};
use cudnn_safe::half::bf16;
use cudnn_safe::tune;
use cudnn_safe::{Cudnn, DType, Error, Result, Workspace};

const USAGE: &str = "usage: transformer_block [--size small|realistic|both]

Runs one bf16 transformer block (layer norm, QKV projection, causal attention, output
projection, layer norm, GELU MLP) as seven cuDNN graphs: checked against an f64 CPU reference
at a small size, timed at a realistic one.";

const EPS: f64 = 1e-5;

/// The block's sizes.
#[derive(Debug, Clone, Copy)]
struct Dims {
    batch: usize,
    seq: usize,
    model: usize,
    heads: usize,
    ff: usize,
}

impl Dims {
    const SMALL: Dims = Dims {
        batch: 2,
        seq: 64,
        model: 128,
        heads: 2,
        ff: 256,
    };
    const REALISTIC: Dims = Dims {
        batch: 8,
        seq: 2048,
        model: 2048,
        heads: 16,
        ff: 8192,
    };
    fn tokens(&self) -> usize {
        self.batch * self.seq
    }
    fn head_dim(&self) -> usize {
        self.model / self.heads
    }
    fn label(&self) -> String {
        format!(
            "batch {} x seq {}, model {}, {} heads of {}, MLP {}",
            self.batch,
            self.seq,
            self.model,
            self.heads,
            self.head_dim(),
            self.ff
        )
    }
}

fn i(v: usize) -> i64 {
    v as i64
}

/// The seven stages of the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Ln1,
    Qkv,
    Attention,
    Proj,
    Ln2,
    MlpUp,
    MlpDown,
}

const STAGES: [Stage; 7] = [
    Stage::Ln1,
    Stage::Qkv,
    Stage::Attention,
    Stage::Proj,
    Stage::Ln2,
    Stage::MlpUp,
    Stage::MlpDown,
];

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Stage::Ln1 => "ln1",
            Stage::Qkv => "qkv",
            Stage::Attention => "attention",
            Stage::Proj => "proj",
            Stage::Ln2 => "ln2",
            Stage::MlpUp => "mlp_up",
            Stage::MlpDown => "mlp_down",
        }
    }

    /// Floating-point operations (2 per multiply-add; causal attention counts the half of the
    /// score matrix it computes).
    fn flops(self, d: &Dims) -> f64 {
        let m = d.tokens() as f64;
        let (dm, ff) = (d.model as f64, d.ff as f64);
        match self {
            Stage::Ln1 | Stage::Ln2 => 0.0,
            Stage::Qkv => 2.0 * m * dm * 3.0 * dm,
            Stage::Attention => {
                let s = d.seq as f64;
                4.0 * (d.batch * d.heads) as f64 * s * s * d.head_dim() as f64 / 2.0
            }
            Stage::Proj => 2.0 * m * dm * dm,
            Stage::MlpUp | Stage::MlpDown => 2.0 * m * dm * ff,
        }
    }
}

/// Host copies of the parameters (bf16 values, kept as bf16 so the reference reads exactly what
/// the GPU reads).
struct Params {
    ln1_g: Vec<bf16>,
    ln1_b: Vec<bf16>,
    wqkv: Vec<bf16>,
    bqkv: Vec<bf16>,
    wo: Vec<bf16>,
    bo: Vec<bf16>,
    ln2_g: Vec<bf16>,
    ln2_b: Vec<bf16>,
    w1: Vec<bf16>,
    b1: Vec<bf16>,
    w2: Vec<bf16>,
    b2: Vec<bf16>,
}

/// `n` values uniform in `[-scale, scale)` as bf16.
fn bf16s(rng: &mut Rng, n: usize, scale: f64) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f64(rng.signed_unit() * scale))
        .collect()
}

/// `n` values uniform in `[center − spread, center + spread)` as bf16.
fn around(rng: &mut Rng, n: usize, center: f64, spread: f64) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f64(center + rng.signed_unit() * spread))
        .collect()
}

impl Params {
    /// Weights scaled by 1/√fan-in so every stage's output stays of order 1.
    fn random(d: &Dims, rng: &mut Rng) -> Params {
        let (dm, ff) = (d.model, d.ff);
        let s_in = 1.0 / (dm as f64).sqrt();
        let s_ff = 1.0 / (ff as f64).sqrt();
        Params {
            ln1_g: around(rng, dm, 1.0, 0.2),
            ln1_b: around(rng, dm, 0.0, 0.2),
            wqkv: bf16s(rng, dm * 3 * dm, s_in),
            bqkv: bf16s(rng, 3 * dm, 0.1),
            wo: bf16s(rng, dm * dm, s_in),
            bo: bf16s(rng, dm, 0.1),
            ln2_g: around(rng, dm, 1.0, 0.2),
            ln2_b: around(rng, dm, 0.0, 0.2),
            w1: bf16s(rng, dm * ff, s_in),
            b1: bf16s(rng, ff, 0.1),
            w2: bf16s(rng, ff * dm, s_ff),
            b2: bf16s(rng, dm, 0.1),
        }
    }
}

/// Device buffers of the block (activations are `[tokens, features]`, row-major).
struct Buffers {
    x: CudaSlice<bf16>,
    ln1_g: CudaSlice<bf16>,
    ln1_b: CudaSlice<bf16>,
    y1: CudaSlice<bf16>,
    wqkv: CudaSlice<bf16>,
    bqkv: CudaSlice<bf16>,
    qkv: CudaSlice<bf16>,
    o: CudaSlice<bf16>,
    wo: CudaSlice<bf16>,
    bo: CudaSlice<bf16>,
    h1: CudaSlice<bf16>,
    ln2_g: CudaSlice<bf16>,
    ln2_b: CudaSlice<bf16>,
    y2: CudaSlice<bf16>,
    w1: CudaSlice<bf16>,
    b1: CudaSlice<bf16>,
    u: CudaSlice<bf16>,
    w2: CudaSlice<bf16>,
    b2: CudaSlice<bf16>,
    out: CudaSlice<bf16>,
}

fn up<T: cudnn_safe::cudarc::driver::DeviceRepr>(
    s: &Arc<CudaStream>,
    v: &[T],
) -> Result<CudaSlice<T>> {
    s.clone_htod(v).map_err(drv("uploading block data"))
}

/// An activation buffer filled with NaN, so that anything a stage fails to write shows.
fn poisoned(s: &Arc<CudaStream>, n: usize) -> Result<CudaSlice<bf16>> {
    up(s, &vec![bf16::NAN; n])
}

fn down<T: cudnn_safe::cudarc::driver::DeviceRepr>(
    s: &Arc<CudaStream>,
    b: &CudaSlice<T>,
) -> Result<Vec<T>> {
    s.clone_dtoh(b).map_err(drv("downloading block data"))
}

impl Buffers {
    fn new(s: &Arc<CudaStream>, d: &Dims, p: &Params, x: &[bf16]) -> Result<Buffers> {
        let (m, dm, ff) = (d.tokens(), d.model, d.ff);
        Ok(Buffers {
            x: up(s, x)?,
            ln1_g: up(s, &p.ln1_g)?,
            ln1_b: up(s, &p.ln1_b)?,
            y1: poisoned(s, m * dm)?,
            wqkv: up(s, &p.wqkv)?,
            bqkv: up(s, &p.bqkv)?,
            qkv: poisoned(s, m * 3 * dm)?,
            o: poisoned(s, m * dm)?,
            wo: up(s, &p.wo)?,
            bo: up(s, &p.bo)?,
            h1: poisoned(s, m * dm)?,
            ln2_g: up(s, &p.ln2_g)?,
            ln2_b: up(s, &p.ln2_b)?,
            y2: poisoned(s, m * dm)?,
            w1: up(s, &p.w1)?,
            b1: up(s, &p.b1)?,
            u: poisoned(s, m * ff)?,
            w2: up(s, &p.w2)?,
            b2: up(s, &p.b2)?,
            out: poisoned(s, m * dm)?,
        })
    }
}

/// A stage's graph, its tensors (in the order [`bind_and`] binds them) and its tuned plan.
struct Built {
    stage: Stage,
    og: OperationGraph,
    ids: Vec<TensorId>,
    plan: Option<Plan>,
    candidates: usize,
}

/// Layer norm over rows of `d.model`: tensors x, scale, bias, y.
fn ln_graph(d: &Dims) -> Result<(Graph, Vec<TensorId>)> {
    let (m, dm) = (i(d.tokens()), i(d.model));
    let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    let x = g.tensor_nhwc("x", &[m, dm, 1, 1], DType::BF16)?;
    // Scale and bias in bf16 like x: with f32 parameters cuDNN (9.14 and 9.19, H200) offers
    // one generic engine for a bf16 layer norm, 4.3x slower (0.164 vs 0.038 ms at 16384x2048).
    let scale = g.tensor_nhwc("scale", &[1, dm, 1, 1], DType::BF16)?;
    let bias = g.tensor_nhwc("bias", &[1, dm, 1, 1], DType::BF16)?;
    let out = g.layer_norm(x, scale, bias, EPS, false)?;
    g.mark_output(out.y)?;
    Ok((g, vec![x, scale, bias, out.y]))
}

/// `c = a·w + bias` (then GELU, then `+ residual`): tensors a, w, bias, `[residual]`, c.
fn linear_graph(
    m: usize,
    k: usize,
    n: usize,
    gelu: bool,
    residual: bool,
) -> Result<(Graph, Vec<TensorId>)> {
    let (m, k, n) = (i(m), i(k), i(n));
    let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    let a = g.tensor_nchw("a", &[1, m, k], DType::BF16)?;
    let w = g.tensor_nchw("w", &[1, k, n], DType::BF16)?;
    let bias = g.tensor_nchw("bias", &[1, 1, n], DType::BF16)?;
    let mut c = g.matmul(a, w)?;
    c = g.bias(c, bias)?;
    if gelu {
        c = g.pointwise(PointwiseMode::Gelu, c, None)?;
    }
    let mut ids = vec![a, w, bias];
    if residual {
        let r = g.tensor_nchw("residual", &[1, m, n], DType::BF16)?;
        c = g.pointwise(PointwiseMode::Add, c, Some(r))?;
        ids.push(r);
    }
    g.mark_output(c)?;
    ids.push(c);
    Ok((g, ids))
}

/// Causal attention over the interleaved QKV buffer: tensors q, k, v (strided views of one
/// `[tokens, 3·model]` buffer at offsets 0, model, 2·model) and o (`[B, H, S, hd]` laid out as
/// `[B, S, H, hd]`).
fn attention_graph(d: &Dims) -> Result<(Graph, Vec<TensorId>)> {
    let (b, h, s, hd, dm) = (
        i(d.batch),
        i(d.heads),
        i(d.seq),
        i(d.head_dim()),
        i(d.model),
    );
    let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    let dims = [b, h, s, hd];
    let in_strides = [s * 3 * dm, hd, 3 * dm, 1];
    let q = g.tensor("q", &dims, &in_strides, DType::BF16)?;
    let k = g.tensor("k", &dims, &in_strides, DType::BF16)?;
    let v = g.tensor("v", &dims, &in_strides, DType::BF16)?;
    let opts = SdpaOptions::new()
        .causal(true)
        .scale(1.0 / (d.head_dim() as f64).sqrt());
    let out = g.sdpa(q, k, v, &opts)?;
    g.mark_output_strided(out.o, DType::BF16, &[s * dm, hd, dm, 1])?;
    Ok((g, vec![q, k, v, out.o]))
}

fn stage_graph(st: Stage, d: &Dims) -> Result<(Graph, Vec<TensorId>)> {
    let (m, dm, ff) = (d.tokens(), d.model, d.ff);
    match st {
        Stage::Ln1 | Stage::Ln2 => ln_graph(d),
        Stage::Qkv => linear_graph(m, dm, 3 * dm, false, false),
        Stage::Attention => attention_graph(d),
        Stage::Proj => linear_graph(m, dm, dm, false, true),
        Stage::MlpUp => linear_graph(m, dm, ff, true, false),
        Stage::MlpDown => linear_graph(m, ff, dm, false, true),
    }
}

/// Binds the stage's buffers to its tensors and hands the bindings to `f`.
fn bind_and<R>(
    cudnn: &Cudnn,
    st: Stage,
    ids: &[TensorId],
    d: &Dims,
    b: &mut Buffers,
    f: impl FnOnce(&Args<'_>) -> Result<R>,
) -> Result<R> {
    let mut args = Args::new(cudnn);
    match st {
        Stage::Ln1 => {
            args.input(ids[0], &b.x)?
                .input(ids[1], &b.ln1_g)?
                .input(ids[2], &b.ln1_b)?
                .output(ids[3], &mut b.y1)?;
            f(&args)
        }
        Stage::Qkv => {
            args.input(ids[0], &b.y1)?
                .input(ids[1], &b.wqkv)?
                .input(ids[2], &b.bqkv)?
                .output(ids[3], &mut b.qkv)?;
            f(&args)
        }
        Stage::Attention => {
            // Q, K and V are the three column blocks of each token's row.
            let q = b.qkv.slice(0..);
            let k = b.qkv.slice(d.model..);
            let v = b.qkv.slice(2 * d.model..);
            let mut args = Args::new(cudnn);
            args.input(ids[0], &q)?
                .input(ids[1], &k)?
                .input(ids[2], &v)?
                .output(ids[3], &mut b.o)?;
            f(&args)
        }
        Stage::Proj => {
            args.input(ids[0], &b.o)?
                .input(ids[1], &b.wo)?
                .input(ids[2], &b.bo)?
                .input(ids[3], &b.x)?
                .output(ids[4], &mut b.h1)?;
            f(&args)
        }
        Stage::Ln2 => {
            args.input(ids[0], &b.h1)?
                .input(ids[1], &b.ln2_g)?
                .input(ids[2], &b.ln2_b)?
                .output(ids[3], &mut b.y2)?;
            f(&args)
        }
        Stage::MlpUp => {
            args.input(ids[0], &b.y2)?
                .input(ids[1], &b.w1)?
                .input(ids[2], &b.b1)?
                .output(ids[3], &mut b.u)?;
            f(&args)
        }
        Stage::MlpDown => {
            args.input(ids[0], &b.u)?
                .input(ids[1], &b.w2)?
                .input(ids[2], &b.b2)?
                .input(ids[3], &b.h1)?
                .output(ids[4], &mut b.out)?;
            f(&args)
        }
    }
}

/// The block on one GPU: its graphs, tuned plans and buffers.
struct Block {
    dims: Dims,
    built: Vec<Built>,
    bufs: Buffers,
    ws: Workspace,
}

/// Plans timed per stage when tuning.
const TUNE_PLANS: usize = 6;

impl Block {
    fn new(
        stream: &Arc<CudaStream>,
        cudnn: &Cudnn,
        dims: Dims,
        params: &Params,
        x: &[bf16],
    ) -> Result<Block> {
        let bufs = Buffers::new(stream, &dims, params, x)?;
        let mut built = Vec::new();
        for st in STAGES {
            let (g, ids) = stage_graph(st, &dims)?;
            let og = g.build(cudnn)?;
            built.push(Built {
                stage: st,
                og,
                ids,
                plan: None,
                candidates: 0,
            });
        }
        Ok(Block {
            dims,
            built,
            bufs,
            ws: Workspace::new(stream.clone()),
        })
    }

    /// Builds each stage's plans and keeps the fastest, stage by stage in block order (each
    /// stage's input is then the previous stage's real output). Prints progress: the first
    /// plan builds of some stages compile kernels at run time and take seconds.
    fn tune(&mut self, cudnn: &Cudnn) -> Result<()> {
        let n = self.built.len();
        for idx in 0..n {
            let b = &mut self.built[idx];
            let started = Instant::now();
            print!("  tuning {}/{n} {:<9} ", idx + 1, b.stage.name());
            use std::io::Write;
            let _ = std::io::stdout().flush();
            let filter = PlanFilter::new().with_max_plans(Some(TUNE_PLANS));
            let list = b.og.plans(cudnn, &filter)?;
            b.candidates = list.plans.len();
            let built_s = started.elapsed().as_secs_f64();
            let tuned = bind_and(cudnn, b.stage, &b.ids, &self.dims, &mut self.bufs, |args| {
                autotune(
                    cudnn,
                    list.plans,
                    args,
                    &mut self.ws,
                    &tune::plan::Policy::new(),
                )
            })?;
            println!(
                "{} plans built in {built_s:.1} s, tuned in {:.1} s: {}",
                b.candidates,
                started.elapsed().as_secs_f64() - built_s,
                tuned.plan.name()
            );
            b.plan = Some(tuned.plan);
            // Leave this stage's real output for the next stage's tuning.
            self.run(cudnn, idx)?;
        }
        Ok(())
    }

    /// Executes stage `idx` with its tuned plan.
    fn run(&mut self, cudnn: &Cudnn, idx: usize) -> Result<()> {
        let b = &self.built[idx];
        let plan = b.plan.as_ref().ok_or_else(|| Error::NoAlgorithm {
            op: "transformer block stage",
            detail: format!("{} ran before it was tuned", b.stage.name()),
        })?;
        bind_and(cudnn, b.stage, &b.ids, &self.dims, &mut self.bufs, |args| {
            cudnn.execute(plan, args, &mut self.ws)
        })
    }

    /// The whole block, stage after stage.
    fn run_all(&mut self, cudnn: &Cudnn) -> Result<()> {
        for idx in 0..self.built.len() {
            self.run(cudnn, idx)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// f64 CPU reference, one stage at a time
// ---------------------------------------------------------------------------------------------

fn f64s<T: cudnn_safe::DataType>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Layer norm of each row of `x` (`rows × n`), biased variance.
fn ref_ln(x: &[f64], n: usize, g: &[bf16], b: &[bf16]) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for (row, out) in x.chunks(n).zip(y.chunks_mut(n)) {
        let mean = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        let inv = 1.0 / (var + EPS).sqrt();
        for j in 0..n {
            out[j] = (row[j] - mean) * inv * g[j].to_f64() + b[j].to_f64();
        }
    }
    y
}

fn erf(x: f64) -> f64 {
    // Abramowitz–Stegun 7.1.26 is too coarse for a 1e-3 check; use the series / continued
    // fraction split: the Taylor series converges fast for |x| < 3, erfc ≈ 1 beyond.
    if x.abs() >= 6.0 {
        return x.signum();
    }
    let mut sum = x;
    let mut term = x;
    let x2 = x * x;
    let mut k = 0.0;
    loop {
        k += 1.0;
        term *= -x2 / k;
        let add = term / (2.0 * k + 1.0);
        sum += add;
        if add.abs() < 1e-17 * sum.abs().max(1e-300) {
            break;
        }
        if k > 200.0 {
            break;
        }
    }
    2.0 / std::f64::consts::PI.sqrt() * sum
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
}

/// `a (m×k) · w (k×n) + bias`, then GELU, then `+ residual`.
fn ref_linear(
    a: &[f64],
    w: &[f64],
    bias: &[f64],
    (m, k, n): (usize, usize, usize),
    gelu_after: bool,
    residual: Option<&[f64]>,
) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for r in 0..m {
        let row = &mut c[r * n..(r + 1) * n];
        row.copy_from_slice(bias);
        for q in 0..k {
            let av = a[r * k + q];
            for (cv, wv) in row.iter_mut().zip(&w[q * n..(q + 1) * n]) {
                *cv += av * wv;
            }
        }
        if gelu_after {
            row.iter_mut().for_each(|v| *v = gelu(*v));
        }
        if let Some(res) = residual {
            for (cv, rv) in row.iter_mut().zip(&res[r * n..(r + 1) * n]) {
                *cv += rv;
            }
        }
    }
    c
}

/// Causal attention per head over the interleaved `[tokens, 3·model]` QKV rows; output
/// `[tokens, model]` with head h in columns `h·hd..(h+1)·hd`.
fn ref_attention(qkv: &[f64], d: &Dims) -> Vec<f64> {
    let (s, dm, hd) = (d.seq, d.model, d.head_dim());
    let scale = 1.0 / (hd as f64).sqrt();
    let mut o = vec![0.0; d.tokens() * dm];
    let row = |b: usize, t: usize| (b * s + t) * 3 * dm;
    for b in 0..d.batch {
        for h in 0..d.heads {
            for t in 0..s {
                let q = &qkv[row(b, t) + h * hd..][..hd];
                let scores: Vec<f64> = (0..=t)
                    .map(|j| {
                        let k = &qkv[row(b, j) + dm + h * hd..][..hd];
                        q.iter().zip(k).map(|(a, c)| a * c).sum::<f64>() * scale
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|v| (v - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                let out = &mut o[(b * s + t) * dm + h * hd..][..hd];
                for (j, ej) in e.iter().enumerate() {
                    let v = &qkv[row(b, j) + 2 * dm + h * hd..][..hd];
                    for (ov, vv) in out.iter_mut().zip(v) {
                        *ov += ej / sum * vv;
                    }
                }
            }
        }
    }
    o
}

/// Largest `|got − want| / (|want| + rms(want))`; NaN if any output is not finite.
fn scaled_error(got: &[f64], want: &[f64]) -> f64 {
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len() as f64).sqrt();
    got.iter().zip(want).fold(0.0, |worst: f64, (g, w)| {
        if !g.is_finite() {
            f64::NAN
        } else {
            worst.max((g - w).abs() / (w.abs() + rms))
        }
    })
}

/// bf16 keeps 8 significant bits: storing the output costs up to 2⁻⁹ relative, and each stage
/// reads bf16 operands the GPU may round once more internally (attention's probabilities, the
/// GELU input); f32 accumulation in a different order adds little.
const TOLERANCE: f64 = 1.5e-2;

/// Runs every stage once, then checks each stage's output against the f64 reference of that
/// stage evaluated on the stage's own GPU inputs. Returns the number of failed checks.
fn check(stream: &Arc<CudaStream>, cudnn: &Cudnn, block: &mut Block, p: &Params) -> Result<usize> {
    block.run_all(cudnn)?;
    let d = block.dims;
    let (m, dm, ff) = (d.tokens(), d.model, d.ff);
    let b = &block.bufs;
    let x = f64s(&down(stream, &b.x)?);
    let y1 = f64s(&down(stream, &b.y1)?);
    let qkv = f64s(&down(stream, &b.qkv)?);
    let o = f64s(&down(stream, &b.o)?);
    let h1 = f64s(&down(stream, &b.h1)?);
    let y2 = f64s(&down(stream, &b.y2)?);
    let u = f64s(&down(stream, &b.u)?);
    let out = f64s(&down(stream, &b.out)?);
    let checks: [(Stage, &[f64], Vec<f64>); 7] = [
        (Stage::Ln1, &y1, ref_ln(&x, dm, &p.ln1_g, &p.ln1_b)),
        (
            Stage::Qkv,
            &qkv,
            ref_linear(
                &y1,
                &f64s(&p.wqkv),
                &f64s(&p.bqkv),
                (m, dm, 3 * dm),
                false,
                None,
            ),
        ),
        (Stage::Attention, &o, ref_attention(&qkv, &d)),
        (
            Stage::Proj,
            &h1,
            ref_linear(&o, &f64s(&p.wo), &f64s(&p.bo), (m, dm, dm), false, Some(&x)),
        ),
        (Stage::Ln2, &y2, ref_ln(&h1, dm, &p.ln2_g, &p.ln2_b)),
        (
            Stage::MlpUp,
            &u,
            ref_linear(&y2, &f64s(&p.w1), &f64s(&p.b1), (m, dm, ff), true, None),
        ),
        (
            Stage::MlpDown,
            &out,
            ref_linear(
                &u,
                &f64s(&p.w2),
                &f64s(&p.b2),
                (m, ff, dm),
                false,
                Some(&h1),
            ),
        ),
    ];
    let mut failed = 0;
    for (st, got, want) in checks {
        let err = scaled_error(got, &want);
        let ok = err <= TOLERANCE;
        failed += usize::from(!ok);
        println!(
            "  check {:<9} max scaled error {err:.2e} (tolerance {TOLERANCE:.1e}) {}",
            st.name(),
            if ok { "ok" } else { "FAILED" }
        );
    }
    Ok(failed)
}

// ---------------------------------------------------------------------------------------------
// Timing, plot, main
// ---------------------------------------------------------------------------------------------

/// Milliseconds per call of each stage, then of the whole block.
fn time_block(stream: &Arc<CudaStream>, cudnn: &Cudnn, block: &mut Block) -> Result<Vec<f64>> {
    let timer = Timer::new(stream)?;
    let mut ms = Vec::new();
    for idx in 0..block.built.len() {
        ms.push(timer.per_call_ms(&mut || block.run(cudnn, idx))?);
    }
    ms.push(timer.per_call_ms(&mut || block.run_all(cudnn))?);
    Ok(ms)
}

/// Horizontal bars of the stage times.
fn write_svg(
    file: &str,
    caption: &str,
    rows: &[(String, f64)],
) -> std::result::Result<std::path::PathBuf, Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let path = out_dir()?.join(file);
    let root = SVGBackend::new(&path, (900, 60 + 44 * rows.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = rows.iter().map(|r| r.1).fold(0.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(110)
        .build_cartesian_2d(0.0..max, (0..rows.len()).into_segmented())?;
    let labels: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("ms per call")
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .draw()?;
    chart.draw_series(rows.iter().enumerate().map(|(i, r)| {
        let mut bar = Rectangle::new(
            [
                (0.0, SegmentValue::Exact(i)),
                (r.1, SegmentValue::Exact(i + 1)),
            ],
            BLUE.mix(0.6).filled(),
        );
        bar.set_margin(6, 6, 0, 0);
        bar
    }))?;
    root.present()?;
    drop(chart);
    drop(root);
    Ok(path)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Size {
    Small,
    Realistic,
    Both,
}

fn parse(args: &[String]) -> std::result::Result<Size, String> {
    let mut size = Size::Both;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--size" => {
                size = match it.next().map(String::as_str) {
                    Some("small") => Size::Small,
                    Some("realistic") => Size::Realistic,
                    Some("both") => Size::Both,
                    other => {
                        return Err(format!("--size takes small|realistic|both, not {other:?}"))
                    }
                }
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(size)
}

/// The small size: every stage checked against the reference.
fn run_small(stream: &Arc<CudaStream>, cudnn: &Cudnn) -> Result<usize> {
    let d = Dims::SMALL;
    println!("small block ({}): checked against f64", d.label());
    let mut rng = Rng::new(7);
    let params = Params::random(&d, &mut rng);
    let x = bf16s(&mut rng, d.tokens() * d.model, 1.0);
    let mut block = Block::new(stream, cudnn, d, &params, &x)?;
    block.tune(cudnn)?;
    check(stream, cudnn, &mut block, &params)
}

/// The realistic size: timed; outputs checked to be finite (NaN poison overwritten).
fn run_realistic(stream: &Arc<CudaStream>, cudnn: &Cudnn) -> Result<usize> {
    let d = Dims::REALISTIC;
    println!("realistic block ({}): timed", d.label());
    let mut rng = Rng::new(11);
    let params = Params::random(&d, &mut rng);
    let x = bf16s(&mut rng, d.tokens() * d.model, 1.0);
    let mut block = Block::new(stream, cudnn, d, &params, &x)?;
    block.tune(cudnn)?;
    block.run_all(cudnn)?;
    let out = down(stream, &block.bufs.out)?;
    let bad = out.iter().filter(|v| !v.to_f64().is_finite()).count();
    if bad > 0 {
        println!("  output: {bad} of {} values not finite: FAILED", out.len());
    }
    let ms = time_block(stream, cudnn, &mut block)?;
    println!("  {:<10} {:>9} {:>9}  plan", "stage", "ms", "TFLOP/s");
    let mut rows = Vec::new();
    let mut total_flops = 0.0;
    for (b, t) in block.built.iter().zip(&ms) {
        let f = b.stage.flops(&d);
        total_flops += f;
        let tf = if f > 0.0 {
            format!("{:.0}", f / (t * 1e-3) / 1e12)
        } else {
            "-".into()
        };
        let plan = b.plan.as_ref().map_or("-".into(), Plan::name);
        println!(
            "  {:<10} {t:>9.4} {tf:>9}  {plan} (of {})",
            b.stage.name(),
            b.candidates
        );
        println!("transformer_block {} {t:.4} ms", b.stage.name());
        rows.push((b.stage.name().to_string(), *t));
    }
    let total = ms[ms.len() - 1];
    let sum: f64 = ms[..ms.len() - 1].iter().sum();
    println!(
        "  {:<10} {total:>9.4} {:>9.0}  (sum of stages {sum:.4} ms)",
        "block",
        total_flops / (total * 1e-3) / 1e12
    );
    println!("transformer_block block {total:.4} ms");
    rows.push(("block".into(), total));
    match write_svg(
        "transformer_block.svg",
        &format!("bf16 transformer block, {} — ms per call", d.label()),
        &rows,
    ) {
        Ok(p) => println!("  wrote {}", p.display()),
        Err(e) => eprintln!("  could not write the plot: {e}"),
    }
    Ok(usize::from(bad > 0))
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let size = match options("transformer_block", USAGE, &args, parse) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let Some((stream, cudnn)) = open_gpu("transformer_block") else {
        return ExitCode::from(2);
    };
    println!(
        "transformer_block on {}, cuDNN {}",
        device_line(&stream),
        cudnn.version()
    );
    let mut failed = 0;
    let result = (|| -> Result<()> {
        if size != Size::Realistic {
            failed += run_small(&stream, &cudnn)?;
        }
        if size != Size::Small {
            failed += run_realistic(&stream, &cudnn)?;
        }
        Ok(())
    })();
    match result {
        Err(e) => {
            eprintln!("transformer_block: {}", common::chain(&e));
            ExitCode::from(1)
        }
        Ok(()) if failed > 0 => {
            println!("transformer_block: {failed} check(s) failed");
            ExitCode::from(1)
        }
        Ok(()) => {
            println!("transformer_block: every check passed");
            ExitCode::SUCCESS
        }
    }
}
