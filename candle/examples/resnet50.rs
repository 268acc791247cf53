//! ResNet-50 inference in candle, on the same weights two ways: candle's own modules
//! (`candle_nn::Conv2d`, which runs candle's cuDNN convolution with the `cudnn` feature, and
//! `candle_nn::BatchNorm` in evaluation, as candle-transformers' ResNet builds it) and this
//! crate's [`conv2d_fused`] on batch norms folded into the convolutions (one cuDNN graph per
//! layer: convolution, bias, residual add, ReLU; channels-last). Prints the first call of each,
//! the median time per batch, the speed-up, and how far the logits are apart.
//!
//! ```text
//! cargo run --example resnet50 -- [--batch 32] [--iters 10] [--bf16]
//!                                 [--weights resnet50.safetensors] [--export DIR] [--train]
//!                                 [--thorough]
//! ```
//!
//! `--thorough` times every plan of each fused layer at its first call (`SearchEffort::Thorough`)
//! instead of the heuristics' first four. `--train` also times a training step both ways: candle's `Conv2d` and
//! `BatchNorm::forward_train` against this crate's `conv2d` and `batch_norm` (batch statistics,
//! running statistics updated), forward and backward, with the logits and gradients compared.
//!
//! Needs a CUDA GPU; f16 by default. The weights are a safetensors file with torchvision's
//! names (`conv1.weight`, `bn1.running_mean`, `layer3.4.conv2.weight`, `layer2.0.downsample.1.bias`,
//! `fc.weight`, ...: the names candle-transformers' ResNet reads too), any float dtype; without
//! `--weights` they are random (He initialization, batch-norm statistics near identity, fixed
//! seed), so the logits mean nothing, only their agreement does. `--export DIR` writes
//! `DIR/resnet50.safetensors` (the weights in f32) and `DIR/resnet50_io.safetensors` (the input
//! batch and both sets of logits, f32), so another framework can run the same model on the
//! same input and compare.
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device, Module, ModuleT, Tensor, Var, D};
use candle_nn::{BatchNorm, Conv2d, Conv2dConfig};
use cudnn_safe_candle::{conv2d_fused, fold_batch_norm, Conv2dParams};

/// Tensors by torchvision name.
type Weights = HashMap<String, Tensor>;

fn get(w: &Weights, name: &str) -> candle_core::Result<Tensor> {
    w.get(name)
        .cloned()
        .ok_or_else(|| candle_core::Error::Msg(format!("the weights have no `{name}`")))
}

/// How a forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Inference with candle's modules.
    Candle,
    /// Inference with [`conv2d_fused`] on folded weights.
    Fused,
    /// Training (batch statistics, gradients) with candle's modules.
    TrainCandle,
    /// Training with this crate's `conv2d` and `batch_norm`.
    TrainSafe,
}

/// One convolution and its batch norm, held every way.
struct Layer {
    conv: Conv2d,
    bn: BatchNorm,
    /// The folded weights and bias for [`conv2d_fused`].
    w: Tensor,
    b: Tensor,
    params: Conv2dParams,
    /// Training: the convolution weight, the norm's weight and bias (shared by both training
    /// paths), each path's norm (its own running statistics), candle's convolution on `tw`.
    tw: Var,
    tg: Var,
    tb: Var,
    train_conv: Conv2d,
    train_bn: BatchNorm,
    safe_bn: cudnn_safe_candle::BatchNorm,
    pad: usize,
    stride: usize,
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

/// The convolutions of ResNet-50 as (convolution name, batch-norm name, input channels, output
/// channels, kernel size, stride), in order, and the residual blocks' last layers (whose norm
/// weight starts small in random weights, so the residual sum stays in range).
fn layer_names() -> Vec<(String, String, usize, usize, usize, usize, bool)> {
    let mut v = vec![("conv1".into(), "bn1".into(), 3, 64, 7, 2, false)];
    let mut c = 64;
    for (stage, (width, count)) in [(64, 3), (128, 4), (256, 6), (512, 3)]
        .into_iter()
        .enumerate()
    {
        for i in 0..count {
            let p = format!("layer{}.{i}", stage + 1);
            let stride = if i == 0 && stage > 0 { 2 } else { 1 };
            v.push((
                format!("{p}.conv1"),
                format!("{p}.bn1"),
                c,
                width,
                1,
                1,
                false,
            ));
            v.push((
                format!("{p}.conv2"),
                format!("{p}.bn2"),
                width,
                width,
                3,
                stride,
                false,
            ));
            v.push((
                format!("{p}.conv3"),
                format!("{p}.bn3"),
                width,
                4 * width,
                1,
                1,
                true,
            ));
            if i == 0 {
                let (conv, bn) = (format!("{p}.downsample.0"), format!("{p}.downsample.1"));
                v.push((conv, bn, c, 4 * width, 1, stride, false));
            }
            c = 4 * width;
        }
    }
    v
}

/// Random f32 weights under torchvision's names.
fn random_weights(dev: &Device) -> candle_core::Result<Weights> {
    let mut rng = Rng(42);
    let mut w = Weights::new();
    for (conv, bn, c, k, r, _, last) in layer_names() {
        // He initialization: uniform with the variance 2 / fan-in.
        let spread = (6.0 / (c * r * r) as f32).sqrt();
        w.insert(
            format!("{conv}.weight"),
            rng.tensor(&[k, c, r, r], 0.0, spread, dev)?,
        );
        let gamma = if last { 0.2 } else { 1.0 };
        w.insert(
            format!("{bn}.weight"),
            rng.tensor(&[k], gamma, 0.1 * gamma, dev)?,
        );
        w.insert(format!("{bn}.bias"), rng.tensor(&[k], 0.0, 0.1, dev)?);
        w.insert(
            format!("{bn}.running_mean"),
            rng.tensor(&[k], 0.0, 0.1, dev)?,
        );
        w.insert(
            format!("{bn}.running_var"),
            rng.tensor(&[k], 1.0, 0.1, dev)?,
        );
    }
    let spread = (3.0f32 / 2048.0).sqrt();
    w.insert(
        "fc.weight".into(),
        rng.tensor(&[1000, 2048], 0.0, spread, dev)?,
    );
    w.insert("fc.bias".into(), rng.tensor(&[1000], 0.0, 0.01, dev)?);
    Ok(w)
}

impl Layer {
    /// The convolution `conv` (`[k, c, r, r]`, padding `r / 2`) and its batch norm `bn`.
    fn new(
        weights: &Weights,
        conv: &str,
        bn: &str,
        stride: usize,
        dtype: DType,
    ) -> candle_core::Result<Layer> {
        let f32 = |name: String| get(weights, &name)?.to_dtype(DType::F32);
        let w = f32(format!("{conv}.weight"))?;
        let (k, r) = (w.dim(0)?, w.dim(2)?);
        let (g, beta) = (f32(format!("{bn}.weight"))?, f32(format!("{bn}.bias"))?);
        let (mean, var) = (
            f32(format!("{bn}.running_mean"))?,
            f32(format!("{bn}.running_var"))?,
        );
        let eps = 1e-5;
        // Folded in f32, then rounded once.
        let (wf, bf) = fold_batch_norm(&w, None, &g, &beta, &mean, &var, eps)?;
        let pad = r / 2;
        let cfg = Conv2dConfig {
            padding: pad,
            stride,
            dilation: 1,
            groups: 1,
            cudnn_fwd_algo: None,
        };
        let d = |t: &Tensor| t.to_dtype(dtype);
        let (tw, tg, tb) = (
            Var::from_tensor(&d(&w)?)?,
            Var::from_tensor(&d(&g)?)?,
            Var::from_tensor(&d(&beta)?)?,
        );
        let (tgt, tbt) = (tg.as_tensor().clone(), tb.as_tensor().clone());
        Ok(Layer {
            conv: Conv2d::new(d(&w)?, None, cfg),
            bn: BatchNorm::new(k, d(&mean)?, d(&var)?, d(&g)?, d(&beta)?, eps)?,
            w: d(&wf)?,
            b: d(&bf)?,
            params: Conv2dParams::new().padding([pad; 2]).stride([stride; 2]),
            train_conv: Conv2d::new(tw.as_tensor().clone(), None, cfg),
            // f32 running statistics: `candle_nn::BatchNorm::forward_train` adds its f32 batch
            // statistics to them, which fails for f16 or bf16 ones.
            train_bn: BatchNorm::new(k, mean.copy()?, var.copy()?, tgt.clone(), tbt.clone(), eps)?,
            safe_bn: cudnn_safe_candle::BatchNorm::new(
                d(&mean)?.copy()?,
                d(&var)?.copy()?,
                Some((tgt, tbt)),
                eps,
                0.1,
            )?,
            tw,
            tg,
            tb,
            pad,
            stride,
        })
    }

    /// The layer: convolution and batch norm (fused into one graph in [`Mode::Fused`]), then
    /// the residual and ReLU.
    fn run(
        &self,
        mode: Mode,
        x: &Tensor,
        residual: Option<&Tensor>,
        relu: bool,
    ) -> candle_core::Result<Tensor> {
        let mut y = match mode {
            Mode::Fused => return conv2d_fused(x, &self.w, &self.b, residual, relu, &self.params),
            Mode::Candle => self.bn.forward_t(&self.conv.forward(x)?, false)?,
            Mode::TrainCandle => self
                .train_bn
                .forward_t(&self.train_conv.forward(x)?, true)?,
            Mode::TrainSafe => {
                let c = cudnn_safe_candle::conv2d(x, &self.tw, self.pad, self.stride, 1, 1)?;
                self.safe_bn.forward_t(&c, true)?
            }
        };
        if let Some(z) = residual {
            y = (y + z)?;
        }
        if relu {
            y.relu()
        } else {
            Ok(y)
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
    /// The classifier's weight transposed, `[2048, 1000]`, and its bias.
    fc_t: Tensor,
    fc_b: Tensor,
}

impl ResNet50 {
    /// The model from `weights` (torchvision's names), in `dtype`.
    fn new(weights: &Weights, dtype: DType) -> candle_core::Result<ResNet50> {
        let layer = |conv: &str, bn: &str, stride| Layer::new(weights, conv, bn, stride, dtype);
        let stem = layer("conv1", "bn1", 2)?;
        let mut blocks = Vec::new();
        for (stage, count) in [3, 4, 6, 3].into_iter().enumerate() {
            for i in 0..count {
                let p = format!("layer{}.{i}", stage + 1);
                let stride = if i == 0 && stage > 0 { 2 } else { 1 };
                let layers = [
                    layer(&format!("{p}.conv1"), &format!("{p}.bn1"), 1)?,
                    layer(&format!("{p}.conv2"), &format!("{p}.bn2"), stride)?,
                    layer(&format!("{p}.conv3"), &format!("{p}.bn3"), 1)?,
                ];
                let down = match i {
                    0 => Some(layer(
                        &format!("{p}.downsample.0"),
                        &format!("{p}.downsample.1"),
                        stride,
                    )?),
                    _ => None,
                };
                blocks.push(Block { layers, down });
            }
        }
        Ok(ResNet50 {
            stem,
            blocks,
            fc_t: get(weights, "fc.weight")?
                .to_dtype(dtype)?
                .t()?
                .contiguous()?,
            fc_b: get(weights, "fc.bias")?.to_dtype(dtype)?,
        })
    }

    /// Logits `[n, 1000]` of images `[n, 3, 224, 224]`.
    fn forward(&self, mode: Mode, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = self.stem.run(mode, x, None, true)?;
        // candle-transformers' max pool: pad by 1 with the edge values, 3×3 window, stride 2.
        let mut x = x
            .pad_with_same(D::Minus1, 1, 1)?
            .pad_with_same(D::Minus2, 1, 1)?
            .max_pool2d_with_stride(3, 2)?;
        for b in &self.blocks {
            let shortcut = match &b.down {
                Some(d) => d.run(mode, &x, None, false)?,
                None => x.clone(),
            };
            let y = b.layers[0].run(mode, &x, None, true)?;
            let y = b.layers[1].run(mode, &y, None, true)?;
            x = b.layers[2].run(mode, &y, Some(&shortcut), true)?;
        }
        x.mean(D::Minus1)?
            .mean(D::Minus1)?
            .matmul(&self.fc_t)?
            .broadcast_add(&self.fc_b)
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

struct Args {
    batch: usize,
    iters: usize,
    dtype: DType,
    weights: Option<PathBuf>,
    export: Option<PathBuf>,
    train: bool,
}

fn run(a: &Args) -> candle_core::Result<bool> {
    let (batch, iters, dtype) = (a.batch, a.iters, a.dtype);
    let dev = Device::new_cuda(0)?;
    let weights = match &a.weights {
        Some(path) => candle_core::safetensors::load(path, &dev)?,
        None => random_weights(&dev)?,
    };
    let source = match &a.weights {
        Some(p) => p.display().to_string(),
        None => "random weights".into(),
    };
    println!(
        "ResNet-50 inference, batch {batch}, {dtype:?}, 224×224, {source}; median of {iters} runs"
    );
    if let Ok(v) = cudnn_safe_candle::cudnn_safe::versions() {
        println!(
            "  cuDNN {} from {}",
            cudnn_safe_candle::cudnn_safe::format_version(v.cudnn),
            v.library
        );
    }
    let model = ResNet50::new(&weights, dtype)?;
    let x = Rng(7)
        .tensor(&[batch, 3, 224, 224], 0.0, 1.0, &dev)?
        .to_dtype(dtype)?;
    let mut first = Vec::new();
    let mut logits = Vec::new();
    for mode in [Mode::Candle, Mode::Fused] {
        let t = Instant::now();
        let y = model.forward(mode, &x)?;
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
    let candle_ms = time(&dev, iters, || model.forward(Mode::Candle, &x))?;
    let fused_ms = time(&dev, iters, || model.forward(Mode::Fused, &x))?;
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
    if let Some(dir) = &a.export {
        export(dir, &weights, &x, &logits)?;
        println!("  exported weights, input and logits to {}", dir.display());
    }
    let train = match a.train {
        true => Some(train(&model, &dev, &x, iters)?),
        false => None,
    };
    let ok = err.is_finite() && err < 5e-2;
    if !ok {
        println!("  FAILED: the logits differ by more than 5e-2");
    }
    let train_ok = train.is_none_or(|t| t.is_finite() && t < 5e-2);
    if !train_ok {
        println!("  FAILED: the training passes differ by more than 5e-2");
    }
    Ok(ok && train_ok)
}

/// A training step both ways (batch-norm batch statistics, loss = mean of the squared logits,
/// gradients of every convolution and norm weight): first call, median time per step, and how
/// far logits and the first and last layers' gradients are apart (median of half the inference
/// runs, at least 3). Returns the largest of those differences.
fn train(model: &ResNet50, dev: &Device, x: &Tensor, iters: usize) -> candle_core::Result<f64> {
    let step = |mode| -> candle_core::Result<(Tensor, candle_core::backprop::GradStore)> {
        let y = model.forward(mode, x)?;
        let grads = y.to_dtype(DType::F32)?.sqr()?.mean_all()?.backward()?;
        Ok((y, grads))
    };
    let mut first = Vec::new();
    let mut out = Vec::new();
    for mode in [Mode::TrainCandle, Mode::TrainSafe] {
        let t = Instant::now();
        let r = step(mode)?;
        dev.synchronize()?;
        first.push(t.elapsed().as_secs_f64());
        out.push(r);
    }
    let rel = |a: &Tensor, b: &Tensor| -> candle_core::Result<f64> {
        let (a, b) = (a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?);
        let d = (&a - &b)?.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        let n = b.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        Ok((d / n.max(f64::MIN_POSITIVE)).sqrt())
    };
    let grad = |i: usize, v: &Var| -> candle_core::Result<Tensor> {
        out[i]
            .1
            .get(v.as_tensor())
            .cloned()
            .ok_or_else(|| candle_core::Error::Msg("a weight without a gradient".into()))
    };
    let last = &model.blocks[model.blocks.len() - 1].layers[2];
    let errs = [
        ("logits", rel(&out[1].0, &out[0].0)?),
        (
            "d conv1.weight",
            rel(&grad(1, &model.stem.tw)?, &grad(0, &model.stem.tw)?)?,
        ),
        (
            "d bn1.weight",
            rel(&grad(1, &model.stem.tg)?, &grad(0, &model.stem.tg)?)?,
        ),
        (
            "d bn1.bias",
            rel(&grad(1, &model.stem.tb)?, &grad(0, &model.stem.tb)?)?,
        ),
        (
            "d layer4.2.conv3.weight",
            rel(&grad(1, &last.tw)?, &grad(0, &last.tw)?)?,
        ),
    ];
    drop(out);
    let iters = iters.div_ceil(2).max(3);
    let candle_ms = time(dev, iters, || step(Mode::TrainCandle).map(|r| r.0))?;
    let safe_ms = time(dev, iters, || step(Mode::TrainSafe).map(|r| r.0))?;
    println!("  training step (forward + backward, batch statistics):");
    println!(
        "  candle (conv2d + BatchNorm::forward_train)   first {:6.2} s   {candle_ms:8.3} ms/step",
        first[0]
    );
    println!(
        "  cudnn-safe conv2d + batch_norm              first {:6.2} s   {safe_ms:8.3} ms/step",
        first[1]
    );
    let list: Vec<String> = errs.iter().map(|(n, e)| format!("{n} {e:.2e}")).collect();
    println!(
        "  speed-up {:.2}×; relative L2 differences: {}",
        candle_ms / safe_ms,
        list.join(", ")
    );
    println!(
        "{{\"example\":\"resnet50_train\",\"candle_ms\":{candle_ms:.4},\"safe_ms\":{safe_ms:.4},\"speedup\":{:.3},\"candle_first_s\":{:.3},\"safe_first_s\":{:.3}}}",
        candle_ms / safe_ms,
        first[0],
        first[1]
    );
    Ok(errs.iter().map(|e| e.1).fold(0.0, f64::max))
}

/// Writes `dir/resnet50.safetensors` (the weights in f32) and `dir/resnet50_io.safetensors` (the
/// input and both sets of logits in f32).
fn export(
    dir: &std::path::Path,
    weights: &Weights,
    x: &Tensor,
    logits: &[Tensor],
) -> candle_core::Result<()> {
    std::fs::create_dir_all(dir)?;
    let cpu32 = |t: &Tensor| t.to_dtype(DType::F32)?.to_device(&Device::Cpu);
    let w = weights
        .iter()
        .map(|(k, v)| Ok((k.clone(), cpu32(v)?)))
        .collect::<candle_core::Result<HashMap<_, _>>>()?;
    candle_core::safetensors::save(&w, dir.join("resnet50.safetensors"))?;
    let io = HashMap::from([
        ("input".to_string(), cpu32(x)?),
        ("logits_candle".to_string(), cpu32(&logits[0])?),
        ("logits_cudnn_safe".to_string(), cpu32(&logits[1])?),
    ]);
    candle_core::safetensors::save(&io, dir.join("resnet50_io.safetensors"))
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        batch: 32,
        iters: 10,
        dtype: DType::F16,
        weights: None,
        export: None,
        train: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--bf16" {
            a.dtype = DType::BF16;
            continue;
        }
        if flag == "--train" {
            a.train = true;
            continue;
        }
        if flag == "--thorough" {
            cudnn_safe_candle::set_options(
                cudnn_safe_candle::Options::default()
                    .with_effort(cudnn_safe_candle::cudnn_safe::tune::SearchEffort::Thorough),
            );
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--batch" => a.batch = number()?.max(1),
            "--iters" => a.iters = number()?.max(1),
            "--weights" => a.weights = Some(PathBuf::from(&value)),
            "--export" => a.export = Some(PathBuf::from(&value)),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("resnet50: {e}");
            std::process::exit(2);
        }
    };
    match run(&a) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("resnet50: {e}");
            std::process::exit(1);
        }
    }
}
