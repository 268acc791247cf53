//! Batch normalization folded into a fused convolution: `relu(bn(conv(x, w)))` at inference as
//! ONE `cudnnConvolutionBiasActivationForward`, checked against the three unfused calls, then a
//! ResNet block's second half, where the same call also adds the skip connection.
//!
//! ```text
//! cargo run --release --example conv_bn_relu
//! ```
//!
//! Folding (on the host, in f64): with `s_k = γ_k / √(var_k + ε)`, the filters become
//! `w'[k] = w[k]·s_k` and the bias `b'_k = β_k − mean_k·s_k`, so that
//! `conv(x, w') + b' = bn(conv(x, w))`. The fused call computes `act(α1·conv(x, w') + α2·z + b')`;
//! the residual block passes its input as `z` with `α2 = 1`:
//!
//! ```text
//! h = relu(bn1(conv(x, w1)))          unfused: conv, batch norm, ReLU   fused: 1 call
//! y = relu(bn2(conv(h, w2)) + x)      unfused: conv, batch norm, add, ReLU   fused: 1 call
//! ```
//!
//! Strict fp32 (FMA math), `8×64×56×56`, 64 filters of 3×3, padding 1. Prints the time of each
//! path and the largest difference between them. `cargo run --release -p cudnn-safe-tools --bin
//! conv_bn_relu` measures fp32, TF32 and fp16 with every algorithm, and a training step.
//!
//! Exit status: 0 when fused and unfused agree, 1 otherwise, 2 without a GPU.
#[path = "common/mod.rs"]
mod common;

use std::process::ExitCode;
use std::sync::Arc;

use common::{drv, Rng, Timer};
use cudnn_safe::activation::{ActivationDesc, ActivationMode};
use cudnn_safe::conv::{ConvDesc, ConvFwdAlgo, FusedActivation, MathType};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::norm::{BatchNorm, BatchNormMode};
use cudnn_safe::{Cudnn, FilterDesc, Result, TensorDesc, TensorFormat, Workspace};

const N: i64 = 8;
const C: i64 = 64;
const SIDE: i64 = 56;
const EPS: f64 = 1e-5;
/// The largest difference allowed, relative to the output's largest magnitude: both paths run
/// the same algorithm, only the folded weights round differently.
const TOLERANCE: f64 = 1e-4;

fn main() -> ExitCode {
    let Some((stream, cudnn)) = common::open_gpu("conv_bn_relu") else {
        return ExitCode::from(2);
    };
    println!("{}", common::device_line(&stream));
    match run(&stream, &cudnn) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("conv_bn_relu: {}", common::chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// One batch-norm layer: per-channel scale γ, shift β and running statistics.
struct Bn {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    mean: Vec<f32>,
    var: Vec<f32>,
}

impl Bn {
    fn random(rng: &mut Rng) -> Bn {
        let mut draw = |lo: f64, hi: f64| -> Vec<f32> {
            (0..C).map(|_| (lo + (hi - lo) * (rng.signed_unit() + 1.0) / 2.0) as f32).collect()
        };
        Bn {
            gamma: draw(0.5, 1.5),
            beta: draw(-0.3, 0.3),
            mean: draw(-0.1, 0.1),
            var: draw(0.25, 0.45),
        }
    }

    /// `(w', b')`: the filters `w` (KCRS) scaled per output channel, and the bias.
    fn fold(&self, w: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let per_filter = w.len() / self.gamma.len();
        let mut folded = Vec::with_capacity(w.len());
        let mut bias = Vec::with_capacity(self.gamma.len());
        for k in 0..self.gamma.len() {
            let s = f64::from(self.gamma[k]) / (f64::from(self.var[k]) + EPS).sqrt();
            let filter = &w[k * per_filter..(k + 1) * per_filter];
            folded.extend(filter.iter().map(|&v| (f64::from(v) * s) as f32));
            bias.push((f64::from(self.beta[k]) - f64::from(self.mean[k]) * s) as f32);
        }
        (folded, bias)
    }
}

/// A batch-norm layer's parameters on the device, `[1, C, 1, 1]`.
struct BnDev([CudaSlice<f32>; 4]);

impl BnDev {
    fn new(stream: &Arc<CudaStream>, bn: &Bn) -> Result<BnDev> {
        let up = |v: &Vec<f32>| stream.clone_htod(v).map_err(drv("uploading batch norm"));
        Ok(BnDev([up(&bn.gamma)?, up(&bn.beta)?, up(&bn.mean)?, up(&bn.var)?]))
    }
}

/// The descriptors every call shares: all activations are `N×C×H×W`, all filters `C×C×3×3`.
struct Layer {
    act: TensorDesc<f32>,
    filter: FilterDesc<f32>,
    bias: TensorDesc<f32>,
    conv: ConvDesc,
    bn: BatchNorm<f32>,
    relu: ActivationDesc,
    algo: ConvFwdAlgo,
}

impl Layer {
    /// `out = relu(bn(conv(input, w)) + skip)`: three or four calls; `t` and `u` are scratch.
    #[allow(clippy::too_many_arguments)] // the buffers of one layer
    fn unfused(
        &self,
        cudnn: &Cudnn,
        ws: &mut Workspace,
        input: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        bn: &BnDev,
        skip: Option<&CudaSlice<f32>>,
        [t, u]: &mut [CudaSlice<f32>; 2],
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (a, [gamma, beta, mean, var]) = (&self.act, &bn.0);
        cudnn.conv_forward(1.0, a, input, &self.filter, w, &self.conv, self.algo, ws, 0.0, a, t)?;
        cudnn.batch_norm_forward_inference(&self.bn, 1.0, 0.0, t, u, gamma, beta, mean, var)?;
        if let Some(skip) = skip {
            cudnn.add_tensor(1.0, a, skip, 1.0, a, u)?;
        }
        cudnn.activation_forward(&self.relu, 1.0, a, u, 0.0, a, out)
    }

    /// The same in one call: `out = relu(conv(input, w') + skip + b')`.
    #[allow(clippy::too_many_arguments)] // the buffers of one layer
    fn fused(
        &self,
        cudnn: &Cudnn,
        ws: &mut Workspace,
        input: &CudaSlice<f32>,
        w_folded: &CudaSlice<f32>,
        b_folded: &CudaSlice<f32>,
        skip: Option<&CudaSlice<f32>>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let a = &self.act;
        let (alpha2, z) = match skip {
            Some(s) => (1.0, Some(s.as_view())),
            None => (0.0, None),
        };
        cudnn.conv_bias_activation_forward(
            1.0,
            a,
            input,
            &self.filter,
            w_folded,
            &self.conv,
            self.algo,
            ws,
            alpha2,
            z,
            &self.bias,
            b_folded,
            FusedActivation::Relu,
            a,
            out,
        )
    }
}

/// Largest `|a − b|` over the largest `|b|`; NaN when an output is not finite.
fn relative_diff(a: &[f32], b: &[f32]) -> f64 {
    if a.iter().chain(b).any(|v| !v.is_finite()) {
        return f64::NAN;
    }
    let diff = a.iter().zip(b).map(|(x, y)| f64::from((x - y).abs()));
    let scale = b.iter().map(|y| f64::from(y.abs())).fold(0.0, f64::max);
    diff.fold(0.0, f64::max) / scale.max(f64::MIN_POSITIVE)
}

fn run(stream: &Arc<CudaStream>, cudnn: &Cudnn) -> Result<bool> {
    let act = TensorDesc::<f32>::nchw(N, C, SIDE, SIDE)?;
    let conv = ConvDesc::builder(2).pads(&[1, 1]).math(MathType::Fma).build::<f32>()?;
    let layer = Layer {
        bn: BatchNorm::builder()
            .mode(BatchNormMode::Spatial)
            .epsilon(EPS)
            .build::<f32>(act.layout())?,
        filter: FilterDesc::<f32>::new(&[C, C, 3, 3], TensorFormat::Nchw)?,
        bias: TensorDesc::<f32>::nchw(1, C, 1, 1)?,
        relu: ActivationDesc::new(ActivationMode::Relu)?,
        algo: ConvFwdAlgo::ImplicitPrecompGemm,
        act,
        conv,
    };

    // Random inputs, weights with variance 1/fan-in, and batch norms; folded on the host.
    let mut rng = Rng::new(7);
    let amplitude = (3.0 / (C * 9) as f64).sqrt();
    let mut weights =
        || -> Vec<f32> { (0..C * C * 9).map(|_| (amplitude * rng.signed_unit()) as f32).collect() };
    let (w1, w2) = (weights(), weights());
    let (bn1, bn2) = (Bn::random(&mut rng), Bn::random(&mut rng));
    let ((w1f, b1f), (w2f, b2f)) = (bn1.fold(&w1), bn2.fold(&w2));

    let up = |v: &[f32]| stream.clone_htod(v).map_err(drv("uploading"));
    let x = up(&rng.values::<f32>(layer.act.span()))?;
    let (w1, w2, w1f, w2f, b1f, b2f) =
        (up(&w1)?, up(&w2)?, up(&w1f)?, up(&w2f)?, up(&b1f)?, up(&b2f)?);
    let (bn1, bn2) = (BnDev::new(stream, &bn1)?, BnDev::new(stream, &bn2)?);
    let zeros = || stream.alloc_zeros::<f32>(layer.act.span()).map_err(drv("allocating"));
    let mut scratch = [zeros()?, zeros()?];
    let (mut h, mut y, mut hf, mut yf) = (zeros()?, zeros()?, zeros()?, zeros()?);
    let mut ws = Workspace::new(stream.clone());

    let timer = Timer::new(stream)?;
    let mut ok = true;
    println!(
        "{:<28} {:>12} {:>10} {:>9} {:>10}",
        "block", "unfused ms", "fused ms", "speedup", "rel diff"
    );

    // conv-bn-relu: h = relu(bn1(conv(x, w1))).
    let mut unfused = || layer.unfused(cudnn, &mut ws, &x, &w1, &bn1, None, &mut scratch, &mut h);
    let unfused_ms = timer.per_call_ms(&mut unfused)?;
    let mut fused = || layer.fused(cudnn, &mut ws, &x, &w1f, &b1f, None, &mut hf);
    let fused_ms = timer.per_call_ms(&mut fused)?;
    ok &= report(stream, "conv-bn-relu", unfused_ms, fused_ms, &h, &hf)?;

    // The residual block's second half: y = relu(bn2(conv(h, w2)) + x), the skip as `z`.
    let mut unfused =
        || layer.unfused(cudnn, &mut ws, &h, &w2, &bn2, Some(&x), &mut scratch, &mut y);
    let unfused_ms = timer.per_call_ms(&mut unfused)?;
    let mut fused = || layer.fused(cudnn, &mut ws, &hf, &w2f, &b2f, Some(&x), &mut yf);
    let fused_ms = timer.per_call_ms(&mut fused)?;
    ok &= report(stream, "residual (second conv + skip)", unfused_ms, fused_ms, &y, &yf)?;

    if !ok {
        eprintln!("conv_bn_relu: fused and unfused results differ by more than {TOLERANCE:e}");
    }
    Ok(ok)
}

/// Prints one row; whether the fused output matches the unfused one.
fn report(
    stream: &Arc<CudaStream>,
    name: &str,
    unfused_ms: f64,
    fused_ms: f64,
    unfused: &CudaSlice<f32>,
    fused: &CudaSlice<f32>,
) -> Result<bool> {
    let down = |b: &CudaSlice<f32>| stream.clone_dtoh(b).map_err(drv("downloading"));
    let diff = relative_diff(&down(fused)?, &down(unfused)?);
    let speedup = unfused_ms / fused_ms;
    println!("{name:<28} {unfused_ms:>12.4} {fused_ms:>10.4} {speedup:>8.2}x {diff:>10.2e}");
    Ok(diff <= TOLERANCE)
}
