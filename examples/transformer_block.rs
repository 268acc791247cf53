//! One pre-norm transformer block in bf16 as seven cuDNN graphs, each stage checked against an
//! f64 CPU evaluation of the same stage.
//!
//! ```text
//! cargo run --release --example transformer_block
//!
//! h1  = x  + Wo · attention(split_heads(Wqkv · LN1(x) + bqkv)) + bo
//! out = h1 + W2 · gelu(W1 · LN2(h1) + b1) + b2
//! ```
//!
//! The stages (bf16 tensors, f32 accumulation): `ln1` (layer norm), `qkv` (matmul + bias,
//! Q, K and V interleaved per token), `attention` (causal scaled dot-product attention reading
//! Q, K and V straight out of that buffer as strided `[B, H, S, hd]` views), `proj` (matmul +
//! bias + the residual x), `ln2`, `mlp_up` (matmul + bias + GELU, erf form), `mlp_down`
//! (matmul + bias + the residual h1). Each graph runs the first plan cuDNN's heuristics offer.
//!
//! The size is small (batch 2, sequence 64, model 128, 2 heads, MLP 256) so the CPU check is
//! quick. The realistic size, with autotuned plans, TFLOP/s per stage and a plot, is a tool:
//! `cargo run --release -p cudnn-safe-tools --bin transformer_block`.
//!
//! Exit status: 0 when every stage matches, 1 otherwise, 2 without a GPU.
#[path = "common/mod.rs"]
mod common;

use std::process::ExitCode;
use std::sync::Arc;

use common::{drv, Rng};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::graph::{Args, Graph, Plan, PlanFilter, PointwiseMode, SdpaOptions, TensorId};
use cudnn_safe::half::bf16;
use cudnn_safe::{Cudnn, DType, Error, Result, Workspace};

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

/// One stage: its graph's plan, its tensors (inputs, then the output), where the inputs come
/// from, and its output buffer.
struct Stage {
    name: &'static str,
    plan: Plan,
    ids: Vec<TensorId>,
    srcs: Vec<Src>,
    out: CudaSlice<bf16>,
}

/// Layer norm over rows of D: tensors x, scale, bias, y.
fn ln_graph() -> Result<(Graph, Vec<TensorId>)> {
    let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    let x = g.tensor_nhwc("x", &[M, D, 1, 1], DType::BF16)?;
    let scale = g.tensor_nhwc("scale", &[1, D, 1, 1], DType::BF16)?;
    let bias = g.tensor_nhwc("bias", &[1, D, 1, 1], DType::BF16)?;
    let y = g.layer_norm(x, scale, bias, EPS, false)?.y;
    g.mark_output(y)?;
    Ok((g, vec![x, scale, bias, y]))
}

/// `c = a·w + bias` (`m×k · k×n`), then GELU, then `+ residual`.
fn linear_graph(k: i64, n: i64, gelu: bool, residual: bool) -> Result<(Graph, Vec<TensorId>)> {
    let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    let a = g.tensor_nchw("a", &[1, M, k], DType::BF16)?;
    let w = g.tensor_nchw("w", &[1, k, n], DType::BF16)?;
    let bias = g.tensor_nchw("bias", &[1, 1, n], DType::BF16)?;
    let mut c = g.matmul(a, w)?;
    c = g.bias(c, bias)?;
    if gelu {
        c = g.pointwise(PointwiseMode::Gelu, c, None)?;
    }
    let mut ids = vec![a, w, bias];
    if residual {
        let r = g.tensor_nchw("residual", &[1, M, n], DType::BF16)?;
        c = g.pointwise(PointwiseMode::Add, c, Some(r))?;
        ids.push(r);
    }
    g.mark_output(c)?;
    ids.push(c);
    Ok((g, ids))
}

/// Causal attention: q, k, v are strided views of the `[M, 3·D]` QKV rows; o is `[B, H, S, hd]`
/// laid out as `[B, S, H, hd]` = `[M, D]`.
fn attention_graph() -> Result<(Graph, Vec<TensorId>)> {
    let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    let (dims, strides) = ([B, H, S, HD], [S * 3 * D, HD, 3 * D, 1]);
    let q = g.tensor("q", &dims, &strides, DType::BF16)?;
    let k = g.tensor("k", &dims, &strides, DType::BF16)?;
    let v = g.tensor("v", &dims, &strides, DType::BF16)?;
    let opts = SdpaOptions::new()
        .causal(true)
        .scale(1.0 / (HD as f64).sqrt());
    let o = g.sdpa(q, k, v, &opts)?.o;
    g.mark_output_strided(o, DType::BF16, &[S * D, HD, D, 1])?;
    Ok((g, vec![q, k, v, o]))
}

fn run(stream: &Arc<CudaStream>, cudnn: &Cudnn) -> Result<bool> {
    use Src::{Param as P, Stage as St};
    let mut rng = Rng::new(7);
    let host: Vec<Vec<bf16>> = PARAMS
        .iter()
        .map(|&(_, n, centre, spread)| {
            (0..n)
                .map(|_| bf16::from_f64(centre + spread * rng.signed_unit()))
                .collect()
        })
        .collect();
    let params = host
        .iter()
        .map(|v| stream.clone_htod(v).map_err(drv("uploading parameters")))
        .collect::<Result<Vec<_>>>()?;

    let d = D as usize;
    let table = [
        ("ln1", ln_graph()?, vec![P(0), P(1), P(2)]),
        (
            "qkv",
            linear_graph(D, 3 * D, false, false)?,
            vec![St(0, 0), P(3), P(4)],
        ),
        (
            "attention",
            attention_graph()?,
            vec![St(1, 0), St(1, d), St(1, 2 * d)],
        ),
        (
            "proj",
            linear_graph(D, D, false, true)?,
            vec![St(2, 0), P(5), P(6), P(0)],
        ),
        ("ln2", ln_graph()?, vec![St(3, 0), P(7), P(8)]),
        (
            "mlp_up",
            linear_graph(D, FF, true, false)?,
            vec![St(4, 0), P(9), P(10)],
        ),
        (
            "mlp_down",
            linear_graph(FF, D, false, true)?,
            vec![St(5, 0), P(11), P(12), St(3, 0)],
        ),
    ];
    let mut stages = Vec::new();
    for (name, (graph, ids), srcs) in table {
        let og = graph.build(cudnn)?;
        let plan = og
            .plans(cudnn, &PlanFilter::new().max_plans(Some(1)))?
            .plans
            .into_iter()
            .next();
        let plan = plan.ok_or_else(|| Error::NoAlgorithm {
            op: "transformer block stage",
            detail: format!("no plan for {name}"),
        })?;
        let out_len = og.span(ids[ids.len() - 1])?;
        // NaN first, so anything a stage fails to write shows in the check.
        let out = stream
            .clone_htod(&vec![bf16::NAN; out_len])
            .map_err(drv("allocating"))?;
        println!("  {name:<10} plan {}", plan.name());
        stages.push(Stage {
            name,
            plan,
            ids,
            srcs,
            out,
        });
    }

    // The block: each stage reads parameters and earlier stages' outputs.
    let mut ws = Workspace::new(stream.clone());
    for s in 0..stages.len() {
        let (done, rest) = stages.split_at_mut(s);
        let stage = &mut rest[0];
        let views = stage.srcs.iter().map(|&src| match src {
            Src::Param(p) => params[p].slice(0..),
            Src::Stage(t, offset) => done[t].out.slice(offset..),
        });
        let views: Vec<_> = views.collect();
        let mut args = Args::new(cudnn);
        for (&id, view) in stage.ids.iter().zip(&views) {
            args.input(id, view)?;
        }
        args.output(stage.ids[views.len()], &mut stage.out)?;
        cudnn.execute(&stage.plan, &args, &mut ws)?;
    }

    // Each stage against f64 on its own (downloaded) inputs, so errors do not compound.
    let f64s = |v: &[bf16]| -> Vec<f64> { v.iter().map(|x| x.to_f64()).collect() };
    let mut outs = Vec::new();
    for stage in &stages {
        outs.push(f64s(
            &stream.clone_dtoh(&stage.out).map_err(drv("downloading"))?,
        ));
    }
    let p = |i: usize| f64s(&host[i]);
    let ff = FF as usize;
    let wanted = [
        layer_norm(&p(0), &p(1), &p(2)),
        linear(&outs[0], &p(3), &p(4), 3 * d, false, None),
        attention(&outs[1]),
        linear(&outs[2], &p(5), &p(6), d, false, Some(&p(0))),
        layer_norm(&outs[3], &p(7), &p(8)),
        linear(&outs[4], &p(9), &p(10), ff, true, None),
        linear(&outs[5], &p(11), &p(12), d, false, Some(&outs[3])),
    ];
    let mut ok = true;
    for ((stage, got), want) in stages.iter().zip(&outs).zip(&wanted) {
        let err = scaled_error(got, want);
        ok &= err <= TOLERANCE;
        let verdict = if err <= TOLERANCE { "ok" } else { "FAILED" };
        println!(
            "  check {:<10} scaled error {err:.2e} (tolerance {TOLERANCE:.1e}) {verdict}",
            stage.name
        );
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
        y.extend(
            row.iter()
                .zip(g.iter().zip(b))
                .map(|(v, (g, b))| (v - mean) * inv * g + b),
        );
    }
    y
}

/// `a·w + bias` (`w` is `k×n`), then GELU (erf form), then `+ residual`.
fn linear(
    a: &[f64],
    w: &[f64],
    bias: &[f64],
    n: usize,
    gelu: bool,
    res: Option<&[f64]>,
) -> Vec<f64> {
    let k = w.len() / n;
    let mut c = Vec::with_capacity(a.len() / k * n);
    for (r, row) in a.chunks(k).enumerate() {
        for j in 0..n {
            let mut v = bias[j]
                + row
                    .iter()
                    .enumerate()
                    .map(|(q, x)| x * w[q * n + j])
                    .sum::<f64>();
            if gelu {
                v = 0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2));
            }
            c.push(v + res.map_or(0.0, |res| res[r * n + j]));
        }
    }
    c
}

/// erf to about 1e-7 (Abramowitz and Stegun 7.1.26), far below bf16's resolution.
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    x.signum() * (1.0 - poly * (-x * x).exp())
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
        let scores: Vec<f64> = (0..=t)
            .map(|j| {
                q.iter()
                    .zip(at(b, j, 1, h))
                    .map(|(x, y)| x * y)
                    .sum::<f64>()
                    / (hd as f64).sqrt()
            })
            .collect();
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
    let errors = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / (w.abs() + rms));
    errors.fold(0.0, f64::max)
}
