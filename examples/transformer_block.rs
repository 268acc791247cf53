//! One pre-norm transformer block in bf16 as seven cuDNN graphs, each stage checked against an
//! f64 CPU evaluation of the same stage on the same inputs (errors do not compound).
//!
//! ```text
//! cargo run --release --example transformer_block
//!
//! h1  = x  + Wo · attention(split_heads(Wqkv · LN1(x) + bqkv)) + bo
//! out = h1 + W2 · gelu(W1 · LN2(h1) + b1) + b2
//! ```
//!
//! Stages (bf16 tensors, f32 accumulation): `ln1`; `qkv` (matmul + bias, Q, K and V interleaved
//! per token); `attention` (causal SDPA reading Q, K and V out of that buffer as strided
//! `[B, H, S, hd]` views); `proj` (matmul + bias + x); `ln2`; `mlp_up` (matmul + bias + GELU,
//! erf form); `mlp_down` (matmul + bias + h1). Each runs the plan cuDNN's heuristics rank first,
//! held by a [`PlanCache`]. The size is small (batch 2, sequence 64, model 128, 2 heads, MLP
//! 256); the realistic one, autotuned and timed with a plot, is a tool:
//! `cargo run --release -p cudnn-safe-tools --bin transformer_block`.
//!
//! Exit status: 0 when every stage matches, 1 otherwise, 2 without a GPU.
#[path = "common/mod.rs"]
mod common;

use std::process::ExitCode;
use std::sync::Arc;

use common::{drv, Rng};
use cudnn_safe::cudarc::driver::CudaStream;
use cudnn_safe::graph::{Args, Graph, PlanCache, PlanFilter, PointwiseMode, SdpaOptions, TensorId};
use cudnn_safe::half::bf16;
use cudnn_safe::{Cudnn, DType, Result, Workspace};

const B: i64 = 2;
const S: i64 = 64;
const D: i64 = 128;
const H: i64 = 2;
const FF: i64 = 256;
const M: i64 = B * S; // tokens
const HD: i64 = D / H;
const EPS: f64 = 1e-5;
/// bf16 keeps 8 significant bits; f32 accumulation in another order adds little.
const TOLERANCE: f64 = 1.5e-2;

fn main() -> ExitCode {
    let Some((stream, cudnn)) = common::open_gpu("transformer_block") else {
        return ExitCode::from(2);
    };
    println!("{}", common::device_line(&stream));
    match run(&stream, &cudnn) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("transformer_block: {}", common::chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// Where a stage reads an input: a parameter (x included), or an earlier stage's output from
/// an element offset on.
#[derive(Clone, Copy)]
enum Src {
    Param(usize),
    Stage(usize, usize),
}

/// The parameters, in [`Src::Param`] order: (name, length, centre, spread).
const PARAMS: [(&str, i64, f64, f64); 13] = [
    ("x", M * D, 0.0, 1.0),
    ("ln1_g", D, 1.0, 0.2),
    ("ln1_b", D, 0.0, 0.2),
    ("wqkv", D * 3 * D, 0.0, 0.0884), // 1/√D
    ("bqkv", 3 * D, 0.0, 0.1),
    ("wo", D * D, 0.0, 0.0884),
    ("bo", D, 0.0, 0.1),
    ("ln2_g", D, 1.0, 0.2),
    ("ln2_b", D, 0.0, 0.2),
    ("w1", D * FF, 0.0, 0.0884),
    ("b1", FF, 0.0, 0.1),
    ("w2", FF * D, 0.0, 0.0625), // 1/√FF
    ("b2", D, 0.0, 0.1),
];

/// What a stage computes.
#[derive(Clone, Copy)]
enum Kind {
    LayerNorm,
    /// `a·w + bias` with `w` of `k×n`, then GELU if asked, then `+ residual` if a fourth input
    /// is given.
    Linear(i64, i64, bool),
    Attention,
}

/// The block, stage by stage: name, kind, inputs (the graph's tensors in this order).
#[rustfmt::skip] // a table
fn stages() -> [(&'static str, Kind, Vec<Src>); 7] {
    use Kind::*;
    use Src::{Param as P, Stage as St};
    let d = D as usize;
    [
        ("ln1",       LayerNorm,               vec![P(0), P(1), P(2)]),
        ("qkv",       Linear(D, 3 * D, false), vec![St(0, 0), P(3), P(4)]),
        ("attention", Attention,               vec![St(1, 0), St(1, d), St(1, 2 * d)]),
        ("proj",      Linear(D, D, false),     vec![St(2, 0), P(5), P(6), P(0)]),
        ("ln2",       LayerNorm,               vec![St(3, 0), P(7), P(8)]),
        ("mlp_up",    Linear(D, FF, true),     vec![St(4, 0), P(9), P(10)]),
        ("mlp_down",  Linear(FF, D, false),    vec![St(5, 0), P(11), P(12), St(3, 0)]),
    ]
}

/// A stage's graph; its tensors are the inputs in [`stages`] order, then the output.
fn graph(kind: Kind, residual: bool) -> Result<(Graph, Vec<TensorId>)> {
    let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    let bf = DType::BF16;
    let mut ids = Vec::new();
    let out = match kind {
        Kind::LayerNorm => {
            ids.push(g.tensor_nhwc("x", &[M, D, 1, 1], bf)?);
            ids.push(g.tensor_nhwc("scale", &[1, D, 1, 1], bf)?);
            ids.push(g.tensor_nhwc("bias", &[1, D, 1, 1], bf)?);
            g.layer_norm(ids[0], ids[1], ids[2], EPS, false)?.y
        }
        Kind::Linear(k, n, gelu) => {
            ids.push(g.tensor_nchw("a", &[1, M, k], bf)?);
            ids.push(g.tensor_nchw("w", &[1, k, n], bf)?);
            ids.push(g.tensor_nchw("bias", &[1, 1, n], bf)?);
            let mut c = g.matmul(ids[0], ids[1])?;
            c = g.bias(c, ids[2])?;
            if gelu {
                c = g.pointwise(PointwiseMode::Gelu, c, None)?;
            }
            if residual {
                ids.push(g.tensor_nchw("residual", &[1, M, n], bf)?);
                c = g.pointwise(PointwiseMode::Add, c, Some(ids[3]))?;
            }
            c
        }
        Kind::Attention => {
            // q, k, v: strided views of the [M, 3·D] QKV rows; o: [B, H, S, hd] laid out as
            // [B, S, H, hd] = [M, D].
            let (dims, strides) = ([B, H, S, HD], [S * 3 * D, HD, 3 * D, 1]);
            for name in ["q", "k", "v"] {
                ids.push(g.tensor(name, &dims, &strides, bf)?);
            }
            let opts = SdpaOptions::new().causal(true).scale(1.0 / (HD as f64).sqrt());
            let o = g.sdpa(ids[0], ids[1], ids[2], &opts)?.o;
            g.mark_output_strided(o, bf, &[S * D, HD, D, 1])?;
            ids.push(o);
            return Ok((g, ids));
        }
    };
    g.mark_output(out)?;
    ids.push(out);
    Ok((g, ids))
}

/// The f64 evaluation of a stage on its inputs (each from its [`Src`] offset on).
fn reference(kind: Kind, ins: &[&[f64]]) -> Vec<f64> {
    match kind {
        Kind::LayerNorm => layer_norm(ins[0], ins[1], ins[2]),
        Kind::Linear(_, n, gelu) => linear(ins[0], ins[1], ins[2], n as usize, gelu, ins.get(3)),
        Kind::Attention => attention(ins[0]),
    }
}

fn run(stream: &Arc<CudaStream>, cudnn: &Cudnn) -> Result<bool> {
    let mut rng = Rng::new(7);
    let mut draw = |&(_, n, centre, spread): &(&str, i64, f64, f64)| -> Vec<bf16> {
        let mut value = || bf16::from_f64(centre + spread * rng.signed_unit());
        (0..n).map(|_| value()).collect()
    };
    let host: Vec<Vec<bf16>> = PARAMS.iter().map(&mut draw).collect();
    let up = |v: &Vec<bf16>| stream.clone_htod(v).map_err(drv("uploading"));
    let params = host.iter().map(up).collect::<Result<Vec<_>>>()?;

    // Build each graph; a plan cache holds the plan the heuristics rank first for each.
    let (mut cache, filter) = (PlanCache::new(), PlanFilter::new());
    let (mut graphs, mut outs) = (Vec::new(), Vec::new());
    for (name, kind, srcs) in stages() {
        let (graph, ids) = graph(kind, srcs.len() == 4)?;
        let og = graph.build(cudnn)?;
        let plan = cache.get_or_build(cudnn, &og, &filter)?;
        println!("  {name:<10} plan {}", plan.name());
        // NaN first, so anything a stage fails to write shows in the check.
        outs.push(up(&vec![bf16::NAN; og.span(ids[ids.len() - 1])?])?);
        graphs.push((og, ids));
    }

    // The block: each stage reads parameters and earlier stages' outputs.
    let mut ws = Workspace::new(stream.clone());
    for (s, ((_, _, srcs), (og, ids))) in stages().iter().zip(&graphs).enumerate() {
        let (done, rest) = outs.split_at_mut(s);
        let views: Vec<_> = srcs
            .iter()
            .map(|&src| match src {
                Src::Param(p) => params[p].slice(0..),
                Src::Stage(t, offset) => done[t].slice(offset..),
            })
            .collect();
        let mut args = Args::new(cudnn);
        for (&id, view) in ids.iter().zip(&views) {
            args.input(id, view)?;
        }
        args.output(ids[views.len()], &mut rest[0])?;
        cudnn.execute(cache.get_or_build(cudnn, og, &filter)?, &args, &mut ws)?;
    }

    // Each stage against f64 on its own (downloaded) inputs.
    let f64s = |v: &[bf16]| -> Vec<f64> { v.iter().map(|x| x.to_f64()).collect() };
    let host: Vec<Vec<f64>> = host.iter().map(|v| f64s(v)).collect();
    let mut got = Vec::new();
    for out in &outs {
        got.push(f64s(&stream.clone_dtoh(out).map_err(drv("downloading"))?));
    }
    let mut ok = true;
    for (s, (name, kind, srcs)) in stages().into_iter().enumerate() {
        let ins: Vec<&[f64]> = srcs
            .iter()
            .map(|&src| match src {
                Src::Param(p) => &host[p][..],
                Src::Stage(t, offset) => &got[t][offset..],
            })
            .collect();
        let err = scaled_error(&got[s], &reference(kind, &ins));
        ok &= err <= TOLERANCE;
        let verdict = if err <= TOLERANCE { "ok" } else { "FAILED" };
        println!("  check {name:<10} scaled error {err:.2e} (tolerance {TOLERANCE:.1e}) {verdict}");
    }
    Ok(ok)
}

/// Layer norm of each row of `x` (biased variance).
fn layer_norm(x: &[f64], g: &[f64], b: &[f64]) -> Vec<f64> {
    let n = g.len();
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let mean = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        let inv = 1.0 / (var + EPS).sqrt();
        y.extend((0..n).map(|j| (row[j] - mean) * inv * g[j] + b[j]));
    }
    y
}

/// `a·w + bias` (`w` is `k×n`), then GELU, then `+ residual`.
fn linear(a: &[f64], w: &[f64], b: &[f64], n: usize, gelu: bool, res: Option<&&[f64]>) -> Vec<f64> {
    let mut c = Vec::with_capacity(a.len() / (w.len() / n) * n);
    for (r, row) in a.chunks(w.len() / n).enumerate() {
        for j in 0..n {
            let v = b[j] + (0..row.len()).map(|q| row[q] * w[q * n + j]).sum::<f64>();
            let v = if gelu { gelu_erf(v) } else { v };
            c.push(v + res.map_or(0.0, |res| res[r * n + j]));
        }
    }
    c
}

/// GELU, erf form (PyTorch's default); erf to about 1e-7 (Abramowitz and Stegun 7.1.26).
fn gelu_erf(v: f64) -> f64 {
    let x = v / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let coefficients = [1.0614054, -1.4531520, 1.4214137, -0.2844967, 0.2548296];
    let poly = coefficients.iter().fold(0.0, |acc, c| acc * t + c) * t;
    0.5 * v * (1.0 + x.signum() * (1.0 - poly * (-x * x).exp()))
}

/// Causal attention per head over the `[M, 3·D]` QKV rows; output `[M, D]`.
fn attention(qkv: &[f64]) -> Vec<f64> {
    let (s, d, hd) = (S as usize, D as usize, HD as usize);
    let mut o = vec![0.0; M as usize * d];
    let at = |b: usize, t: usize, part: usize, h: usize| {
        &qkv[(b * s + t) * 3 * d + part * d + h * hd..][..hd]
    };
    for (b, h, t) in (0..B as usize)
        .flat_map(|b| (0..H as usize).flat_map(move |h| (0..s).map(move |t| (b, h, t))))
    {
        let q = at(b, t, 0, h);
        let dot = |k: &[f64]| (0..hd).map(|i| q[i] * k[i]).sum::<f64>() / (hd as f64).sqrt();
        let scores: Vec<f64> = (0..=t).map(|j| dot(at(b, j, 1, h))).collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|v| (v - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        let out = &mut o[(b * s + t) * d + h * hd..][..hd];
        for (j, ej) in e.iter().enumerate() {
            for (ov, vv) in out.iter_mut().zip(at(b, j, 2, h)) {
                *ov += ej / sum * vv;
            }
        }
    }
    o
}

/// Largest `|got − want| / (|want| + rms(want))`; NaN when an output is not finite or the
/// lengths differ.
fn scaled_error(got: &[f64], want: &[f64]) -> f64 {
    if got.len() != want.len() || got.iter().any(|g| !g.is_finite()) {
        return f64::NAN;
    }
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len() as f64).sqrt();
    let errors = got.iter().zip(want).map(|(g, w)| (g - w).abs() / (w.abs() + rms));
    errors.fold(0.0, f64::max)
}
