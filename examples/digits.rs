//! Trains a small convolutional network on real handwritten digits, to at least 97 % accuracy
//! on images it never saw.
//!
//! ```text
//! cargo run --release --example digits
//! ```
//!
//! The data: the 1,797 8×8 images (pixels 0..16) of the UCI ML hand-written digits (E. Alpaydin
//! and C. Kaynak, 1998) as scikit-learn distributes them, licensed CC BY 4.0, compiled into the
//! program from `examples/data/digits.bin` (`examples/data/README.md` says more). A fixed-seed
//! shuffle splits them into 1,437 training and 360 held-out images; pixels are standardized with
//! the training images' mean and deviation.
//!
//! The network, f32 NCHW throughout, strict fp32 (FMA convolutions, cuBLAS without TF32):
//!
//! ```text
//! x [N,1,8,8] → conv 3×3, 16, pad 1 + bias → ReLU → max-pool 2×2 → [N,16,4,4]
//!             → conv 3×3, 32, pad 1 + bias → ReLU → max-pool 2×2 → [N,32,2,2] = [N,128]
//!             → fully connected 128 → 10 (cuBLAS) + bias → log-softmax → cross-entropy
//! ```
//!
//! He-uniform weights, zero biases; SGD with momentum (lr 0.05, momentum 0.9, batch 64, 30
//! epochs, reshuffled every epoch). A step runs wholly on the GPU: the forward pass; the loss
//! gradient as a log-softmax backward; the backward pass (cuBLAS GEMMs for the fully connected
//! layer, then pooling, activation and convolution backward calls); the update as two
//! `cudnnAddTensor` per parameter. The host uploads each epoch's shuffled images and reads back
//! the epoch's summed loss and the held-out log-probabilities. The convolutions run the crate's
//! deterministic algorithms that support nearly every case ([`FixedAlgos::default`]).
//!
//! Prints one line per epoch and writes `digits_training.svg` (training loss and held-out
//! accuracy) to `$CUDNN_SAFE_OUT_DIR` (else the current directory). Exit status: 0 when the final
//! held-out accuracy is at least 97 %, 1 otherwise, 2 without a GPU.
#[path = "common/mod.rs"]
mod common;
#[path = "common/digits.rs"]
mod digits;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use common::{drv, Param, Rng};
use cudnn_safe::blas::{Blas, Transpose};
use cudnn_safe::conv::{
    ConvBackwardData, ConvBackwardFilter, ConvDesc, ConvForward, ConvOp, MathType,
};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::tune::FixedAlgos;
use cudnn_safe::{
    ActivationDesc, ActivationMode, Cudnn, DeviceBuffer, FilterDesc, OpTensorOp, PoolingDesc,
    PoolingMode, Result, SoftmaxAlgorithm, SoftmaxMode, TensorDesc, TensorFormat, Workspace,
};
use digits::{Images, CLASSES, PIXELS, SIDE};

const C1: usize = 16;
const C2: usize = 32;
/// Inputs of the fully connected layer: `C2 × 2 × 2` after the second pooling.
const FLAT: usize = C2 * (SIDE / 4) * (SIDE / 4);
const HELD_OUT: usize = 360;
const BATCH: usize = 64;
const EPOCHS: usize = 30;
const LR: f32 = 0.05;
const MOMENTUM: f32 = 0.9;
const SEED: u64 = 2024;
const REQUIRED_ACCURACY: f64 = 97.0;
/// Log-softmax over the channels of `[n, 10, 1, 1]` tensors: over the classes of each image.
const LOG_SOFTMAX: (SoftmaxAlgorithm, SoftmaxMode) = (SoftmaxAlgorithm::Log, SoftmaxMode::Channel);

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let Some((stream, cudnn)) = common::open_gpu("digits") else {
        return ExitCode::from(2);
    };
    match run(&stream, &cudnn) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("digits: {}", common::chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The handles, the convolutions' workspace, and what both convolution blocks share: 3×3
/// "same" convolutions in strict fp32, ReLU, and 2×2 max pooling with stride 2 (whose windows do
/// not overlap, so that its backward pass is deterministic).
struct Gpu<'a> {
    cudnn: &'a Cudnn,
    blas: Blas,
    ws: Workspace,
    conv: ConvDesc,
    algos: FixedAlgos,
    relu: ActivationDesc,
    pool: PoolingDesc,
}

/// A block `p = maxpool(relu(conv(x, w) + b))`, its parameters (filters `[K, C, 3, 3]`, bias
/// `[1, K, 1, 1]`) and its activations for a batch: `z = conv + bias`, `a = relu(z)`,
/// `p = pool(a)`; `d` holds ∂L/∂a, then ∂L/∂z (in place), and `dp` ∂L/∂p.
struct Block {
    w_d: FilterDesc<f32>,
    b_d: TensorDesc<f32>,
    z_d: TensorDesc<f32>,
    p_d: TensorDesc<f32>,
    w: Param,
    b: Param,
    z: CudaSlice<f32>,
    a: CudaSlice<f32>,
    d: CudaSlice<f32>,
    p: CudaSlice<f32>,
    dp: CudaSlice<f32>,
}

impl Block {
    /// `k` filters (He-uniform; zero bias) over the `c` channels of inputs described by `x_d`.
    fn new(
        stream: &Arc<CudaStream>,
        g: &Gpu,
        rng: &mut Rng,
        x_d: &TensorDesc<f32>,
        c: usize,
        k: usize,
    ) -> Result<Block> {
        let w_d = FilterDesc::new(&[k as i64, c as i64, 3, 3], TensorFormat::Nchw)?;
        let z_d = TensorDesc::nchw_nd(&g.conv.output_dims(x_d.dims(), w_d.dims())?)?;
        let p_d = TensorDesc::nchw_nd(&g.pool.output_dims(z_d.dims())?)?;
        let buf = |d: &TensorDesc<f32>| stream.alloc_zeros(d.span()).map_err(drv("allocating"));
        let (z, a, d, p, dp) = (buf(&z_d)?, buf(&z_d)?, buf(&z_d)?, buf(&p_d)?, buf(&p_d)?);
        let w = Param::new(stream, &rng.he_uniform(k * c * 9, c * 9))?;
        let (b, b_d) = (Param::new(stream, &vec![0.0; k])?, TensorDesc::nchw(1, k as i64, 1, 1)?);
        Ok(Block { w_d, b_d, z_d, p_d, w, b, z, a, d, p, dp })
    }

    fn forward(
        &mut self,
        g: &mut Gpu,
        x_d: &TensorDesc<f32>,
        x: &impl DeviceBuffer<f32>,
    ) -> Result<()> {
        let (cudnn, z_d, (w, z)) = (g.cudnn, &self.z_d, (&self.w.value, &mut self.z));
        let conv = ConvForward::new(&g.conv, x_d, &self.w_d, z_d)?;
        conv.launch(cudnn, g.algos.forward, (1.0, 0.0), (x, w), &mut g.ws, z)?;
        cudnn.add_tensor(1.0, &self.b_d, &self.b.value, 1.0, z_d, z)?;
        cudnn.activation_forward(&g.relu, 1.0, z_d, &*z, 0.0, z_d, &mut self.a)?;
        cudnn.pooling_forward(&g.pool, 1.0, z_d, &self.a, 0.0, &self.p_d, &mut self.p)
    }

    /// From `dp`: the gradients of `w` and `b`, and of the block's input `x` into `dx` when
    /// asked. The pooling routes each gradient to its window's maximum, ReLU keeps it where
    /// `z > 0`; `db` is the sum of ∂L/∂z over N, H and W, `dw` the correlation of `x` with it,
    /// and `dx` its convolution back through `w` (before `w` changes).
    fn backward(
        &mut self,
        g: &mut Gpu,
        x_d: &TensorDesc<f32>,
        x: &impl DeviceBuffer<f32>,
        dx: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let (cudnn, (z_d, p_d), (pool, relu)) =
            (g.cudnn, (&self.z_d, &self.p_d), (&g.pool, &g.relu));
        let (z, a, d, p, dp) = (&self.z, &self.a, &mut self.d, &self.p, &self.dp);
        cudnn.pooling_backward(pool, 1.0, p_d, p, p_d, dp, z_d, a, 0.0, z_d, d)?;
        cudnn.activation_backward_in_place(relu, 1.0, z_d, a, z_d, z, 0.0, z_d, d)?;
        cudnn.conv_backward_bias(1.0, z_d, d, 0.0, &self.b_d, &mut self.b.grad)?;
        let (w_d, w, dw) = (&self.w_d, &self.w.value, &mut self.w.grad);
        let filter = ConvBackwardFilter::new(&g.conv, x_d, z_d, w_d)?;
        filter.launch(cudnn, g.algos.backward_filter, (1.0, 0.0), (x, &*d), &mut g.ws, dw)?;
        if let Some(dx) = dx {
            let data = ConvBackwardData::new(&g.conv, w_d, z_d, x_d)?;
            data.launch(cudnn, g.algos.backward_data, (1.0, 0.0), (w, &*d), &mut g.ws, dx)?;
        }
        Ok(())
    }
}

/// The network and its buffers for a batch of [`BATCH`] images: two blocks, then the fully
/// connected layer (`w3` `[10 × 128]`, PyTorch's `nn.Linear` layout; `b3` `[1, 10, 1, 1]`), its
/// logits, their log-probabilities and the loss gradient with respect to the logits
/// (`[BATCH, 10, 1, 1]`).
struct Net {
    x_d: TensorDesc<f32>,
    blocks: [Block; 2],
    w3: Param,
    b3: Param,
    b3_d: TensorDesc<f32>,
    out_d: TensorDesc<f32>,
    logits: CudaSlice<f32>,
    logp: CudaSlice<f32>,
    dlogits: CudaSlice<f32>,
    /// `−logp ⊙ onehot`, summed over an epoch's batches.
    nll: CudaSlice<f32>,
}

impl Net {
    fn new(stream: &Arc<CudaStream>, g: &Gpu, rng: &mut Rng) -> Result<Net> {
        let x_d = TensorDesc::nchw(BATCH as i64, 1, SIDE as i64, SIDE as i64)?;
        let b1 = Block::new(stream, g, rng, &x_d, 1, C1)?;
        let b2 = Block::new(stream, g, rng, &b1.p_d, C1, C2)?;
        let w3 = Param::new(stream, &rng.he_uniform(CLASSES * FLAT, FLAT))?;
        let b3 = Param::new(stream, &[0.0; CLASSES])?;
        let b3_d = TensorDesc::nchw(1, CLASSES as i64, 1, 1)?;
        let out_d = TensorDesc::nchw(BATCH as i64, CLASSES as i64, 1, 1)?;
        let buf = || stream.alloc_zeros(BATCH * CLASSES).map_err(drv("allocating"));
        let (logits, logp, dlogits, nll) = (buf()?, buf()?, buf()?, buf()?);
        Ok(Net { x_d, blocks: [b1, b2], w3, b3, b3_d, out_d, logits, logp, dlogits, nll })
    }

    /// The log-probabilities of the images `x` into `self.logp`.
    fn forward(&mut self, g: &mut Gpu, x: &impl DeviceBuffer<f32>) -> Result<()> {
        let [b1, b2] = &mut self.blocks;
        b1.forward(g, &self.x_d, x)?;
        b2.forward(g, &b1.p_d, &b1.p)?;
        // logits [B × 10] = p [B × 128] · w3ᵀ (the pooled [B, 32, 2, 2] read as rows), + b3.
        let (o, (algo, mode)) = (&self.out_d, LOG_SOFTMAX);
        let (n, f, c) = (BATCH as i64, FLAT as i64, CLASSES as i64);
        g.blas.linear(n, f, c, &b2.p, &self.w3.value, &mut self.logits)?;
        g.cudnn.add_tensor(1.0, &self.b3_d, &self.b3.value, 1.0, o, &mut self.logits)?;
        g.cudnn.softmax_forward(algo, mode, 1.0, o, &self.logits, 0.0, o, &mut self.logp)
    }

    /// One SGD step on the images `x` with one-hot labels `onehot`; adds their negative
    /// log-likelihoods into `self.nll`.
    fn train_step(
        &mut self,
        g: &mut Gpu,
        x: &impl DeviceBuffer<f32>,
        onehot: &impl DeviceBuffer<f32>,
    ) -> Result<()> {
        self.forward(g, x)?;
        let (cudnn, o, [b1, b2]) = (g.cudnn, &self.out_d, &mut self.blocks);
        let (n, f, c, (algo, mode)) = (BATCH as i64, FLAT as i64, CLASSES as i64, LOG_SOFTMAX);
        let (logp, nll) = (&self.logp, &mut self.nll);
        cudnn.op_tensor(OpTensorOp::Mul, -1.0, o, logp, 1.0, o, onehot, 1.0, o, nll)?;
        // L = −(1/n)·Σ onehot ⊙ logp. The log-softmax backward gives dx = dy − e^logp·Σ_class dy;
        // with dy = onehot (Σ = 1) and alpha = −1/n: dlogits = (softmax − onehot)/n = ∂L/∂logits.
        let dl = &mut self.dlogits;
        cudnn.softmax_backward(algo, mode, -1.0 / n as f32, o, logp, o, onehot, 0.0, o, dl)?;
        // Row-major: dw3 [10 × 128] = dlogitsᵀ [10 × B] · p [B × 128]; db3 = the sum of dlogits
        // over the batch; dp [B × 128] = dlogits [B × 10] · w3 [10 × 128].
        let (yes, no, dl) = (Transpose::Yes, Transpose::No, &*dl);
        let (w3, dw3) = (&self.w3.value, &mut self.w3.grad);
        g.blas.matmul_row_major(yes, no, c, f, n, 1.0, dl, c, &b2.p, f, 0.0, dw3, f)?;
        cudnn.conv_backward_bias(1.0, o, dl, 0.0, &self.b3_d, &mut self.b3.grad)?;
        g.blas.matmul_row_major(no, no, n, f, c, 1.0, dl, c, w3, f, 0.0, &mut b2.dp, f)?;
        b2.backward(g, &b1.p_d, &b1.p, Some(&mut b1.dp))?;
        b1.backward(g, &self.x_d, x, None)?;
        let params = [&mut b1.w, &mut b1.b, &mut b2.w, &mut b2.b, &mut self.w3, &mut self.b3];
        params.into_iter().try_for_each(|p| p.sgd(cudnn, LR, MOMENTUM))
    }

    /// The loss and the number of right answers on `images`, whose pixels `x` holds padded to
    /// whole batches: a forward pass per batch, its log-probabilities read back.
    fn evaluate(
        &mut self,
        g: &mut Gpu,
        x: &CudaSlice<f32>,
        images: &Images,
    ) -> Result<(f64, usize)> {
        let (mut nll, mut right) = (0.0, 0);
        for (i, labels) in images.labels.chunks(BATCH).enumerate() {
            self.forward(g, &x.slice(i * BATCH * PIXELS..(i + 1) * BATCH * PIXELS))?;
            let logp = g.cudnn.stream().clone_dtoh(&self.logp).map_err(drv("downloading"))?;
            for (row, &label) in logp.chunks(CLASSES).zip(labels) {
                nll -= f64::from(row[label]);
                let guess = (0..CLASSES).max_by(|&i, &j| row[i].total_cmp(&row[j])).unwrap_or(0);
                right += usize::from(guess == label);
            }
        }
        Ok((nll / images.labels.len() as f64, right))
    }
}

fn run(stream: &Arc<CudaStream>, cudnn: &Cudnn) -> Result<bool> {
    let mut rng = Rng::new(SEED);
    let (train, held) = match digits::load(&mut rng, HELD_OUT) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("digits: examples/data/digits.bin is damaged: {e}");
            return Ok(false);
        }
    };
    let steps = train.labels.len() / BATCH;
    println!(
        "digits: {}, cuDNN {}; {} training and {HELD_OUT} held-out images; conv {C1}, conv {C2}, \
         fully connected {FLAT} → {CLASSES}, f32; batch {BATCH}, SGD lr {LR} momentum {MOMENTUM}",
        common::device_line(stream),
        cudnn_safe::format_version(cudnn.version()),
        train.labels.len(),
    );
    let mut g = Gpu {
        cudnn,
        blas: Blas::new(stream.clone())?,
        ws: Workspace::new(stream.clone()),
        conv: ConvDesc::builder(2).pads(&[1, 1]).math(MathType::Fma).build::<f32>()?,
        algos: FixedAlgos::default(),
        relu: ActivationDesc::new(ActivationMode::Relu)?,
        pool: PoolingDesc::builder(PoolingMode::Max, &[2, 2]).build()?,
    };
    let mut net = Net::new(stream, &g, &mut rng)?;
    let up = |v: &[f32]| stream.clone_htod(v).map_err(drv("uploading images"));
    let mut padded = held.x.clone();
    padded.resize(HELD_OUT.div_ceil(BATCH) * BATCH * PIXELS, 0.0);
    let held_x = up(&padded)?;
    let mut order: Vec<usize> = (0..train.labels.len()).collect();
    let (mut loss_curve, mut accuracy_curve, mut right) = (Vec::new(), Vec::new(), 0);
    for epoch in 1..=EPOCHS {
        let start = Instant::now();
        // A new order each epoch; the last `1437 % 64` images of it (a different few each
        // time) sit the epoch out.
        rng.shuffle(&mut order);
        let (x, onehot) = train.gather(&order);
        let (x, onehot) = (up(&x)?, up(&onehot)?);
        cudnn.set_tensor(&net.out_d, &mut net.nll, 0.0)?;
        for s in 0..steps {
            let x = x.slice(s * BATCH * PIXELS..(s + 1) * BATCH * PIXELS);
            let onehot = onehot.slice(s * BATCH * CLASSES..(s + 1) * BATCH * CLASSES);
            net.train_step(&mut g, &x, &onehot)?;
        }
        let nll = stream.clone_dtoh(&net.nll).map_err(drv("downloading the loss"))?;
        let loss = nll.iter().map(|&v| f64::from(v)).sum::<f64>() / (steps * BATCH) as f64;
        let (held_loss, r) = net.evaluate(&mut g, &held_x, &held)?;
        let (accuracy, ms) =
            (100.0 * r as f64 / HELD_OUT as f64, start.elapsed().as_secs_f64() * 1e3);
        println!(
            "epoch {epoch:>2}  train loss {loss:.4}  held-out loss {held_loss:.4}  \
             accuracy {accuracy:>6.2}%  {ms:>6.1} ms"
        );
        if !loss.is_finite() {
            eprintln!("digits: the training loss diverged in epoch {epoch}");
            return Ok(false);
        }
        loss_curve.push((epoch, loss));
        accuracy_curve.push((epoch, accuracy));
        right = r;
    }

    let (accuracy, a) = (100.0 * right as f64 / HELD_OUT as f64, &g.algos);
    println!(
        "convolutions: {} forward, {} backward data, {} backward filter; {} of workspace",
        a.forward,
        a.backward_data,
        a.backward_filter,
        common::bytes(g.ws.capacity())
    );
    let caption = format!("digits: a CNN on cuDNN and cuBLAS, held-out accuracy {accuracy:.2}%");
    let file = "digits_training.svg";
    match common::write_loss_accuracy_svg(file, &caption, &loss_curve, &accuracy_curve) {
        Ok(path) => println!("training curves: {}", path.display()),
        Err(e) => eprintln!("digits: training curves not written: {e}"),
    }
    let result =
        format!("held-out accuracy {accuracy:.2}% ({} of {HELD_OUT} wrong)", HELD_OUT - right);
    if accuracy < REQUIRED_ACCURACY {
        eprintln!("digits: {result}, below the {REQUIRED_ACCURACY}% required");
        return Ok(false);
    }
    println!("{result}: at least {REQUIRED_ACCURACY}%, as required");
    Ok(true)
}
