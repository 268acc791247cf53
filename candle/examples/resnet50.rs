//! ResNet-50 inference in candle, on the same weights two ways: candle's own modules
//! (`candle_nn::Conv2d`, which runs candle's cuDNN convolution with the `cudnn` feature, and
//! `candle_nn::BatchNorm` in evaluation, as candle-transformers' ResNet builds it) and this
//! crate's [`conv2d_fused`] on batch norms folded into the convolutions (one cuDNN graph per
//! layer: convolution, bias, residual add, ReLU; channels-last). Prints the first call of each,
//! the median time per batch, the speed-up, and how far the logits are apart.
//!
//! ```text
//! cargo run --example resnet50 -- [--batch 32] [--iters 10] [--bf16]
//! ```
//!
//! Needs a CUDA GPU; f16 by default. Weights are random (He initialization; batch-norm
//! statistics near identity), so the logits mean nothing, only their agreement does.
use std::time::Instant;

use candle_core::{DType, Device, Module, ModuleT, Tensor, D};
use candle_nn::{BatchNorm, Conv2d, Conv2dConfig};
use cudnn_safe_candle::{conv2d_fused, fold_batch_norm, Conv2dParams};

/// One convolution and its batch norm, held both ways.
struct Layer {
    conv: Conv2d,
    bn: BatchNorm,
    /// The folded weights and bias for [`conv2d_fused`].
    w: Tensor,
    b: Tensor,
    params: Conv2dParams,
}

/// Deterministic uniform values in [−1, 1).
struct Rng(u64);
impl Rng {
    fn tensor(
        &mut self,
        dims: &[usize],
        centre: f32,
        spread: f32,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                self.0 = self
                    .0
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                centre + spread * (((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
            })
            .collect();
        Tensor::from_vec(v, dims, dev)
    }
}

impl Layer {
    /// A `k × c × r × r` convolution with stride and padding, and its batch norm; `gamma`
    /// scales the norm's weight (small for a block's last layer, so the residual sum stays in
    /// range).
    #[allow(clippy::too_many_arguments)]
    fn new(
        rng: &mut Rng,
        c: usize,
        k: usize,
        r: usize,
        stride: usize,
        pad: usize,
        gamma: f32,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Layer> {
        // He initialization: uniform with the variance 2 / fan-in.
        let spread = (6.0 / (c * r * r) as f32).sqrt();
        let w = rng
            .tensor(&[k, c, r, r], 0.0, spread, dev)?
            .to_dtype(dtype)?;
        let g = rng.tensor(&[k], gamma, 0.1 * gamma, dev)?.to_dtype(dtype)?;
        let beta = rng.tensor(&[k], 0.0, 0.1, dev)?.to_dtype(dtype)?;
        let mean = rng.tensor(&[k], 0.0, 0.1, dev)?.to_dtype(dtype)?;
        let var = rng.tensor(&[k], 1.0, 0.1, dev)?.to_dtype(dtype)?;
        let eps = 1e-5;
        let (wf, bf) = fold_batch_norm(&w, None, &g, &beta, &mean, &var, eps)?;
        let cfg = Conv2dConfig {
            padding: pad,
            stride,
            dilation: 1,
            groups: 1,
            cudnn_fwd_algo: None,
        };
        Ok(Layer {
            conv: Conv2d::new(w, None, cfg),
            bn: BatchNorm::new(k, mean, var, g, beta, eps)?,
            w: wf,
            b: bf,
            params: Conv2dParams::new().padding([pad; 2]).stride([stride; 2]),
        })
    }

    /// candle's modules: convolution, batch norm, then the residual and ReLU.
    fn candle(
        &self,
        x: &Tensor,
        residual: Option<&Tensor>,
        relu: bool,
    ) -> candle_core::Result<Tensor> {
        let mut y = self.bn.forward_t(&self.conv.forward(x)?, false)?;
        if let Some(z) = residual {
            y = (y + z)?;
        }
        if relu {
            y.relu()
        } else {
            Ok(y)
        }
    }

    /// One fused cuDNN graph.
    fn fused(
        &self,
        x: &Tensor,
        residual: Option<&Tensor>,
        relu: bool,
    ) -> candle_core::Result<Tensor> {
        conv2d_fused(x, &self.w, &self.b, residual, relu, &self.params)
    }

    fn run(
        &self,
        fused: bool,
        x: &Tensor,
        residual: Option<&Tensor>,
        relu: bool,
    ) -> candle_core::Result<Tensor> {
        if fused {
            self.fused(x, residual, relu)
        } else {
            self.candle(x, residual, relu)
        }
    }
}

/// A bottleneck block: 1×1, 3×3 (with the stride), 1×1 expanding 4×, plus the shortcut.
struct Block {
    layers: [Layer; 3],
    down: Option<Layer>,
}

struct ResNet50 {
    stem: Layer,
    blocks: Vec<Block>,
    fc: Tensor,
}

impl ResNet50 {
    fn new(dtype: DType, dev: &Device) -> candle_core::Result<ResNet50> {
        let mut rng = Rng(42);
        let stem = Layer::new(&mut rng, 3, 64, 7, 2, 3, 1.0, dtype, dev)?;
        let mut blocks = Vec::new();
        let mut c = 64;
        for (stage, (width, count)) in [(64, 3), (128, 4), (256, 6), (512, 3)]
            .into_iter()
            .enumerate()
        {
            for i in 0..count {
                let stride = if i == 0 && stage > 0 { 2 } else { 1 };
                let out = 4 * width;
                let layers = [
                    Layer::new(&mut rng, c, width, 1, 1, 0, 1.0, dtype, dev)?,
                    Layer::new(&mut rng, width, width, 3, stride, 1, 1.0, dtype, dev)?,
                    Layer::new(&mut rng, width, out, 1, 1, 0, 0.2, dtype, dev)?,
                ];
                let down = if i == 0 {
                    Some(Layer::new(&mut rng, c, out, 1, stride, 0, 1.0, dtype, dev)?)
                } else {
                    None
                };
                blocks.push(Block { layers, down });
                c = out;
            }
        }
        let fc = rng
            .tensor(&[2048, 1000], 0.0, (3.0f32 / 2048.0).sqrt(), dev)?
            .to_dtype(dtype)?;
        Ok(ResNet50 { stem, blocks, fc })
    }

    /// Logits `[n, 1000]` of images `[n, 3, 224, 224]`.
    fn forward(&self, fused: bool, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = self.stem.run(fused, x, None, true)?;
        // candle-transformers' max pool: pad by 1 with the edge values, 3×3 window, stride 2.
        let mut x = x
            .pad_with_same(D::Minus1, 1, 1)?
            .pad_with_same(D::Minus2, 1, 1)?
            .max_pool2d_with_stride(3, 2)?;
        for b in &self.blocks {
            let shortcut = match &b.down {
                Some(d) => d.run(fused, &x, None, false)?,
                None => x.clone(),
            };
            let y = b.layers[0].run(fused, &x, None, true)?;
            let y = b.layers[1].run(fused, &y, None, true)?;
            x = b.layers[2].run(fused, &y, Some(&shortcut), true)?;
        }
        x.mean(D::Minus1)?.mean(D::Minus1)?.matmul(&self.fc)
    }
}

/// Median milliseconds of `iters` synchronized runs of `f` after two unmeasured ones.
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
        drop(f()?);
        dev.synchronize()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}

fn run(batch: usize, iters: usize, dtype: DType) -> candle_core::Result<bool> {
    let dev = Device::new_cuda(0)?;
    println!("ResNet-50 inference, batch {batch}, {dtype:?}, 224×224; median of {iters} runs");
    let model = ResNet50::new(dtype, &dev)?;
    let x = Rng(7)
        .tensor(&[batch, 3, 224, 224], 0.0, 1.0, &dev)?
        .to_dtype(dtype)?;
    let mut first = Vec::new();
    let mut logits = Vec::new();
    for fused in [false, true] {
        let t = Instant::now();
        let y = model.forward(fused, &x)?;
        dev.synchronize()?;
        first.push(t.elapsed().as_secs_f64());
        logits.push(y.to_dtype(DType::F32)?);
    }
    let diff = (&logits[1] - &logits[0])?
        .sqr()?
        .sum_all()?
        .to_scalar::<f32>()?;
    let norm = logits[0].sqr()?.sum_all()?.to_scalar::<f32>()?;
    let err = (diff / norm.max(f32::MIN_POSITIVE)).sqrt();
    let candle_ms = time(&dev, iters, || model.forward(false, &x))?;
    let fused_ms = time(&dev, iters, || model.forward(true, &x))?;
    println!(
        "  candle (cuDNN conv + BatchNorm)   first {:6.2} s   {candle_ms:8.3} ms/batch",
        first[0]
    );
    println!(
        "  cudnn-safe conv2d_fused            first {:6.2} s   {fused_ms:8.3} ms/batch",
        first[1]
    );
    println!(
        "  speed-up {:.2}×; logits relative L2 difference {err:.2e}",
        candle_ms / fused_ms
    );
    println!(
        "{{\"example\":\"resnet50\",\"dtype\":\"{dtype:?}\",\"batch\":{batch},\"candle_ms\":{candle_ms:.4},\"fused_ms\":{fused_ms:.4},\"speedup\":{:.3},\"candle_first_s\":{:.3},\"fused_first_s\":{:.3},\"rel_l2\":{err:.3e}}}",
        candle_ms / fused_ms,
        first[0],
        first[1]
    );
    let ok = err.is_finite() && err < 5e-2;
    if !ok {
        println!("  FAILED: the logits differ by more than 5e-2");
    }
    Ok(ok)
}

fn main() {
    let (mut batch, mut iters, mut dtype) = (32, 10, DType::F16);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().and_then(|v| v.parse::<usize>().ok());
        match a.as_str() {
            "--batch" => batch = value().unwrap_or(batch),
            "--iters" => iters = value().unwrap_or(iters).max(1),
            "--bf16" => dtype = DType::BF16,
            other => {
                eprintln!("resnet50: unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    match run(batch, iters, dtype) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("resnet50: {e}");
            std::process::exit(1);
        }
    }
}
