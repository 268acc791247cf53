//! A pre-norm transformer block (RMS norm, causal self-attention, RMS norm, SiLU MLP) in candle,
//! run twice on the same weights: with candle's own operations (its fused RMS-norm and softmax
//! kernels, attention as matmul + mask + softmax + matmul, as candle-transformers' models
//! write it) and with this crate's `rms_norm` and `sdpa` (cuDNN's flash attention). Prints the
//! time per forward pass of each, of the attention alone, the speed-ups, and how far the two
//! outputs are apart.
//!
//! ```text
//! cargo run --example attention_block -- [--batch 8] [--heads 16] [--seq 4096] [--head-dim 128] [--iters 10] [--f16]
//!                                         [--export DIR]
//! ```
//!
//! Needs a CUDA GPU; bf16 by default (`--f16` for f16). Weights are random. `--export DIR`
//! writes `DIR/block.safetensors`: the input `x`, the weights (`norm1`, `qkv` `[model, 3·model]`,
//! `out`, `norm2`, `up`, `down`, each as the block multiplies by it) and both outputs
//! (`y_candle`, `y_cudnn_safe`), in the block's dtype, so another framework can run the same
//! block on the same input and compare.
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};

struct Args {
    batch: usize,
    heads: usize,
    seq: usize,
    head_dim: usize,
    iters: usize,
    dtype: DType,
    export: Option<PathBuf>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        batch: 8,
        heads: 16,
        seq: 4096,
        head_dim: 128,
        iters: 10,
        dtype: DType::BF16,
        export: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--f16" {
            a.dtype = DType::F16;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if flag == "--export" {
            a.export = Some(PathBuf::from(value));
            continue;
        }
        let value = value.parse::<usize>().map_err(|e| format!("{flag}: {e}"))?;
        match flag.as_str() {
            "--batch" => a.batch = value,
            "--heads" => a.heads = value,
            "--seq" => a.seq = value,
            "--head-dim" => a.head_dim = value,
            "--iters" => a.iters = value.max(1),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

/// The block's weights.
struct Weights {
    norm1: Tensor,
    norm2: Tensor,
    qkv: Tensor,
    out: Tensor,
    up: Tensor,
    down: Tensor,
}

impl Weights {
    fn new(model: usize, dtype: DType, dev: &Device) -> candle_core::Result<Weights> {
        let w = |rows: usize, cols: usize| -> candle_core::Result<Tensor> {
            Tensor::randn(0f32, (1.0 / rows as f64).sqrt() as f32, (rows, cols), dev)?
                .to_dtype(dtype)
        };
        let g = || -> candle_core::Result<Tensor> {
            (Tensor::randn(0f32, 0.1, model, dev)? + 1.0)?.to_dtype(dtype)
        };
        Ok(Weights {
            norm1: g()?,
            norm2: g()?,
            qkv: w(model, 3 * model)?,
            out: w(model, model)?,
            up: w(model, 4 * model)?,
            down: w(4 * model, model)?,
        })
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Ops {
    Candle,
    CudnnSafe,
}

/// Causal attention of q, k, v `[b, h, s, d]` with candle's operations: the score matrix, the
/// mask filled with −∞, candle's fused softmax, the product (candle-transformers' pattern).
fn candle_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    scale: f64,
) -> candle_core::Result<Tensor> {
    let att = (q.contiguous()?.matmul(&k.t()?.contiguous()?)? * scale)?;
    let minus = Tensor::new(f32::NEG_INFINITY, att.device())?
        .to_dtype(att.dtype())?
        .broadcast_as(att.shape())?;
    let att = mask.broadcast_as(att.shape())?.where_cond(&minus, &att)?;
    let att = candle_nn::ops::softmax_last_dim(&att)?;
    att.matmul(&v.contiguous()?)
}

fn attention(
    ops: Ops,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    scale: f64,
) -> candle_core::Result<Tensor> {
    match ops {
        Ops::Candle => candle_attention(q, k, v, mask, scale),
        Ops::CudnnSafe => cudnn_safe_candle::sdpa(q, k, v, None, true, scale),
    }
}

fn rms(ops: Ops, x: &Tensor, g: &Tensor) -> candle_core::Result<Tensor> {
    match ops {
        Ops::Candle => candle_nn::ops::rms_norm(x, g, 1e-6),
        Ops::CudnnSafe => cudnn_safe_candle::rms_norm(x, g, 1e-6),
    }
}

/// x `[b, s, model]` → the block's output.
fn block(
    ops: Ops,
    a: &Args,
    w: &Weights,
    x: &Tensor,
    mask: &Tensor,
) -> candle_core::Result<Tensor> {
    let (b, s, model) = x.dims3()?;
    let (h, d) = (a.heads, a.head_dim);
    // The projections as single 2-D matmuls over all b·s tokens, as `candle_nn::Linear` does
    // for a contiguous input (a batched matmul against a broadcast weight is slower).
    let linear = |t: &Tensor, w: &Tensor| -> candle_core::Result<Tensor> {
        t.reshape((b * s, ()))?.matmul(w)?.reshape((b, s, ()))
    };
    let h1 = rms(ops, x, &w.norm1)?;
    let qkv = linear(&h1, &w.qkv)?.reshape((b, s, 3, h, d))?;
    let part = |i: usize| -> candle_core::Result<Tensor> {
        qkv.narrow(2, i, 1)?.squeeze(2)?.transpose(1, 2)
    };
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let o = attention(ops, &q, &k, &v, mask, 1.0 / (d as f64).sqrt())?;
    let o = o.transpose(1, 2)?.reshape((b, s, model))?;
    let x = (x + linear(&o, &w.out)?)?;
    let h2 = rms(ops, &x, &w.norm2)?;
    let up = linear(&h2, &w.up)?.silu()?;
    x + linear(&up, &w.down)?
}

/// Median milliseconds of `iters` runs of `f` (after two unmeasured ones), each synchronized.
fn time(
    dev: &Device,
    iters: usize,
    mut f: impl FnMut() -> candle_core::Result<Tensor>,
) -> candle_core::Result<f64> {
    for _ in 0..2 {
        f()?;
    }
    dev.synchronize()?;
    let mut ms = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        let y = f()?;
        dev.synchronize()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        drop(y);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}

fn rel_l2(a: &Tensor, b: &Tensor) -> candle_core::Result<f64> {
    let (a, b) = (a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?);
    let d = (&a - &b)?.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
    let r = b.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
    Ok((d / r.max(f64::MIN_POSITIVE)).sqrt())
}

fn run(a: &Args) -> candle_core::Result<bool> {
    let dev = Device::new_cuda(0)?;
    let model = a.heads * a.head_dim;
    println!(
        "block: batch {} × seq {} × model {} ({} heads of {}), {:?}, causal; median of {} runs",
        a.batch, a.seq, model, a.heads, a.head_dim, a.dtype, a.iters
    );
    if let Ok(v) = cudnn_safe_candle::cudnn_safe::versions() {
        println!(
            "  cuDNN {} from {}",
            cudnn_safe_candle::cudnn_safe::format_version(v.cudnn),
            v.library
        );
    }
    let w = Weights::new(model, a.dtype, &dev)?;
    let x = Tensor::randn(0f32, 1.0, (a.batch, a.seq, model), &dev)?.to_dtype(a.dtype)?;
    // candle-transformers' causal mask: 1 above the diagonal.
    let above: Vec<u8> = (0..a.seq)
        .flat_map(|i| (0..a.seq).map(move |j| u8::from(j > i)))
        .collect();
    let mask = Tensor::from_vec(above, (a.seq, a.seq), &dev)?;

    let first = Instant::now();
    let y_safe = block(Ops::CudnnSafe, a, &w, &x, &mask)?;
    dev.synchronize()?;
    println!(
        "  cudnn-safe first call (plans built): {:.3} s",
        first.elapsed().as_secs_f64()
    );
    let y_candle = block(Ops::Candle, a, &w, &x, &mask)?;
    let err = rel_l2(&y_safe, &y_candle)?;
    println!("  outputs: relative L2 difference {err:.2e}");
    if let Some(dir) = &a.export {
        std::fs::create_dir_all(dir)?;
        let named = [
            ("x", &x),
            ("norm1", &w.norm1),
            ("qkv", &w.qkv),
            ("out", &w.out),
            ("norm2", &w.norm2),
            ("up", &w.up),
            ("down", &w.down),
            ("y_candle", &y_candle),
            ("y_cudnn_safe", &y_safe),
        ];
        let tensors = named
            .into_iter()
            .map(|(k, t)| Ok((k.to_string(), t.to_device(&Device::Cpu)?)))
            .collect::<candle_core::Result<HashMap<_, _>>>()?;
        candle_core::safetensors::save(&tensors, dir.join("block.safetensors"))?;
        println!("  exported input, weights and outputs to {}", dir.display());
    }

    let (b, s, h, d) = (a.batch, a.seq, a.heads, a.head_dim);
    let qkv = Tensor::randn(0f32, 1.0, (b, s, 3, h, d), &dev)?.to_dtype(a.dtype)?;
    let part = |i: usize| -> candle_core::Result<Tensor> {
        qkv.narrow(2, i, 1)?.squeeze(2)?.transpose(1, 2)
    };
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let scale = 1.0 / (d as f64).sqrt();
    let o_safe = attention(Ops::CudnnSafe, &q, &k, &v, &mask, scale)?;
    let o_candle = attention(Ops::Candle, &q, &k, &v, &mask, scale)?;
    let attn_err = rel_l2(&o_safe, &o_candle)?;
    println!("  attention alone: relative L2 difference {attn_err:.2e}");

    let mut rows = Vec::new();
    for (what, ops) in [("candle", Ops::Candle), ("cudnn-safe", Ops::CudnnSafe)] {
        let block_ms = time(&dev, a.iters, || block(ops, a, &w, &x, &mask))?;
        let attn_ms = time(&dev, a.iters, || attention(ops, &q, &k, &v, &mask, scale))?;
        println!("  {what:<10} block {block_ms:8.3} ms   attention {attn_ms:8.3} ms");
        rows.push((block_ms, attn_ms));
    }
    let (block_x, attn_x) = (rows[0].0 / rows[1].0, rows[0].1 / rows[1].1);
    println!("  speed-up of cudnn-safe over candle: block {block_x:.2}×, attention {attn_x:.2}×");
    println!(
        "{{\"example\":\"attention_block\",\"dtype\":\"{:?}\",\"batch\":{b},\"heads\":{h},\"seq\":{s},\"head_dim\":{d},\"candle_block_ms\":{:.4},\"safe_block_ms\":{:.4},\"candle_attention_ms\":{:.4},\"safe_attention_ms\":{:.4},\"block_speedup\":{block_x:.3},\"attention_speedup\":{attn_x:.3},\"rel_l2\":{err:.3e}}}",
        a.dtype, rows[0].0, rows[1].0, rows[0].1, rows[1].1
    );
    // bf16 keeps 8 bits of mantissa: two correct computations differ by about 1e-2.
    let ok = err < 3e-2 && attn_err < 3e-2;
    if !ok {
        println!("  FAILED: the two outputs differ by more than 3e-2");
    }
    Ok(ok)
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("attention_block: {e}");
            std::process::exit(2);
        }
    };
    match run(&a) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("attention_block: {e}");
            std::process::exit(1);
        }
    }
}
