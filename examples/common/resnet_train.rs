//! ResNet-18 and ResNet-50 (torchvision's architecture) training on cudnn-safe, the way PyTorch's
//! autocast trains them: float32 master weights, bfloat16 channels-last activations and
//! convolutions, batch norm in training mode (batch statistics, float32 parameters), float32
//! log-softmax and cross-entropy, SGD with momentum on the float32 masters.
//!
//! One [`TrainNet::step`]:
//!
//! 1. the bfloat16 copies of every convolution and classifier weight, made from the masters in
//!    one `cudnnTransformTensor` over the flat parameter buffer;
//! 2. the forward: per convolution the [`Autotuner`]'s pick (legacy or graph engine), then batch
//!    norm with cuDNN's extended training call, the ReLU and the residual add fused into it
//!    (`BN_ACTIVATION`, `BN_ADD_ACTIVATION`) where cuDNN runs them for the type, else as separate
//!    calls; max and average pooling; the classifier as cuBLAS GEMMs;
//! 3. the loss: the logits in float32, log-softmax, the negative log-likelihood of the one-hot
//!    labels, and its gradient `(softmax − onehot)/N` as one log-softmax backward;
//! 4. the backward: the classifier's GEMMs, pooling backward, batch-norm backward (through the
//!    fused ReLU and add: `dz` is the skip connection's gradient), data and filter gradients of
//!    every convolution through the [`Autotuner`];
//! 5. the bfloat16 weight gradients made float32 in one `cudnnTransformTensor`, and the update
//!    `v ← μ·v + g; w ← w − lr·v` as two `cudnnAddTensor` over all parameters at once.
//!
//! Nothing in a step synchronizes with the host: a step can be captured once into a CUDA graph
//! ([`cudnn_safe::Cudnn::capture`]) and replayed.
#![allow(dead_code)] // each program uses a part

use std::ops::Range;
use std::sync::Arc;

use cudnn_safe::blas::GemmType;
use cudnn_safe::blas::{Blas, Transpose};
use cudnn_safe::conv::{ConvDesc, MathType};
use cudnn_safe::cudarc::driver::{CudaEvent, DeviceRepr, ValidAsZeroBits};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use cudnn_safe::half::bf16;
use cudnn_safe::norm::{BatchNormSaved, RunningStats};
use cudnn_safe::{
    ActivationDesc, ActivationMode, Autotuner, BatchNorm, BatchNormMode, BatchNormOps, Cudnn,
    DType, Error, FilterDesc, Layout, OpTensorOp, PoolingDesc, PoolingMode, SoftmaxAlgorithm,
    SoftmaxMode, TensorDesc, TensorFormat, Workspace,
};

use crate::resnet::{blocks, Arch, ConvSpec, Res, Tensors};

/// The activation and convolution types a [`TrainNet`] runs in: bfloat16 (autocast's), or
/// float32 (strict: FMA convolutions, no TF32) to check the step's arithmetic tightly.
pub trait Elem:
    cudnn_safe::NormType<Param = f32>
    + cudnn_safe::DataType<Scalar = f32>
    + GemmType
    + DeviceRepr
    + ValidAsZeroBits
{
    /// `to = from` in this type (a conversion, or a copy for float32).
    fn narrow(
        cudnn: &Cudnn,
        from: (&TensorDesc<f32>, &CudaSlice<f32>),
        to: (&TensorDesc<Self>, &mut CudaSlice<Self>),
    ) -> cudnn_safe::Result<()>;
    /// `to = from` in float32.
    fn widen(
        cudnn: &Cudnn,
        from: (&TensorDesc<Self>, &CudaSlice<Self>),
        to: (&TensorDesc<f32>, &mut CudaSlice<f32>),
    ) -> cudnn_safe::Result<()>;
}

impl Elem for bf16 {
    fn narrow(
        cudnn: &Cudnn,
        (xd, x): (&TensorDesc<f32>, &CudaSlice<f32>),
        (yd, y): (&TensorDesc<bf16>, &mut CudaSlice<bf16>),
    ) -> cudnn_safe::Result<()> {
        cudnn.transform_tensor(1.0, xd, x, 0.0, yd, y)
    }
    fn widen(
        cudnn: &Cudnn,
        (xd, x): (&TensorDesc<bf16>, &CudaSlice<bf16>),
        (yd, y): (&TensorDesc<f32>, &mut CudaSlice<f32>),
    ) -> cudnn_safe::Result<()> {
        cudnn.transform_tensor(1.0, xd, x, 0.0, yd, y)
    }
}

impl Elem for f32 {
    fn narrow(
        cudnn: &Cudnn,
        (xd, x): (&TensorDesc<f32>, &CudaSlice<f32>),
        (yd, y): (&TensorDesc<f32>, &mut CudaSlice<f32>),
    ) -> cudnn_safe::Result<()> {
        cudnn.add_tensor(1.0, xd, x, 0.0, yd, y)
    }
    fn widen(
        cudnn: &Cudnn,
        from: (&TensorDesc<f32>, &CudaSlice<f32>),
        to: (&TensorDesc<f32>, &mut CudaSlice<f32>),
    ) -> cudnn_safe::Result<()> {
        Self::narrow(cudnn, from, to)
    }
}
/// Classes of the classifier.
pub const CLASSES: i64 = 1000;
/// Parameter offsets in the flat buffers are multiples of this many elements (256 bytes of
/// float32).
const ALIGN: usize = 64;
/// PyTorch's batch-norm defaults.
const EPS: f64 = 1e-5;
const BN_MOMENTUM: f64 = 0.1;

/// Where a trained tensor lives in the flat parameter buffers, with its PyTorch name and shape.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub range: Range<usize>,
    /// PyTorch's shape (`[K, C, R, S]` for a filter).
    pub shape: Vec<usize>,
    /// For a filter: stored as `[K, R, S, cp]` (channels-last, input channels zero-padded to
    /// `cp`).
    pub padded_channels: Option<usize>,
}

impl Entry {
    /// PyTorch's layout of `stored` (this entry's slice of a flat buffer).
    pub fn to_torch(&self, stored: &[f32]) -> Vec<f32> {
        let Some(cp) = self.padded_channels else { return stored.to_vec() };
        let (k, c, rs) = (self.shape[0], self.shape[1], self.shape[2] * self.shape[3]);
        let mut out = vec![0.0; k * c * rs];
        for o in 0..k {
            for i in 0..c {
                for p in 0..rs {
                    out[(o * c + i) * rs + p] = stored[(o * rs + p) * cp + i];
                }
            }
        }
        out
    }

    /// This entry's values in the stored layout, from PyTorch's.
    fn stored_from_torch(&self, torch: &[f32]) -> Vec<f32> {
        let Some(cp) = self.padded_channels else { return torch.to_vec() };
        let (k, c, rs) = (self.shape[0], self.shape[1], self.shape[2] * self.shape[3]);
        let mut out = vec![0.0; k * rs * cp];
        for o in 0..k {
            for i in 0..c {
                for p in 0..rs {
                    out[(o * rs + p) * cp + i] = torch[(o * c + i) * rs + p];
                }
            }
        }
        out
    }
}

/// Every trained tensor in flat device buffers: the float32 masters, their gradients and
/// momenta; the first `cast_len` elements (filters and classifier) also have bfloat16 copies
/// and bfloat16 gradients. Batch-norm scales and shifts, which stay float32, follow.
pub struct Params<T: Elem> {
    pub master: CudaSlice<f32>,
    pub grad: CudaSlice<f32>,
    pub velocity: CudaSlice<f32>,
    lowp: CudaSlice<T>,
    grad_lowp: CudaSlice<T>,
    pub entries: Vec<Entry>,
    cast32: TensorDesc<f32>,
    cast16: TensorDesc<T>,
    all32: TensorDesc<f32>,
    /// Running mean and variance per batch norm, in layer order.
    running: Vec<(CudaSlice<f32>, CudaSlice<f32>)>,
}

/// Hands out aligned ranges of the flat buffers.
#[derive(Default)]
struct Allocator {
    next: usize,
    entries: Vec<Entry>,
}

impl Allocator {
    fn take(&mut self, name: String, shape: Vec<usize>, padded: Option<usize>) -> Range<usize> {
        let len = match padded {
            Some(cp) => shape[0] * shape[2] * shape[3] * cp,
            None => shape.iter().product(),
        };
        let start = self.next;
        self.next = (start + len).div_ceil(ALIGN) * ALIGN;
        self.entries.push(Entry {
            name,
            range: start..start + len,
            shape,
            padded_channels: padded,
        });
        start..start + len
    }
}

/// One convolution and the batch norm after it.
struct ConvBn<T: Elem> {
    conv_name: String,
    conv: ConvDesc,
    x_d: TensorDesc<T>,
    /// `x` as a flat tensor, for elementwise calls on its gradient.
    x_flat: TensorDesc<T>,
    w_d: FilterDesc<T>,
    c_d: TensorDesc<T>,
    bn: BatchNorm<T>,
    /// What follows the convolution: `Bn` (downsample), `BnRelu`, `BnAddRelu` (a block's last).
    ops: BatchNormOps,
    /// Whether the ReLU (and add) run as separate calls after a plain batch norm.
    split: bool,
    w: Range<usize>,
    /// Scale, then shift (`k` each, adjacent).
    gamma_beta: Range<usize>,
    k: usize,
}

/// Device buffers of one layer for a batch: the convolution's output `c`, the plain batch
/// norm's output `t` (only where the ReLU runs separately), the layer's output `y`.
struct Slot<T: Elem> {
    c: CudaSlice<T>,
    t: Option<CudaSlice<T>>,
    y: CudaSlice<T>,
}

/// The rest of a batch's activations and gradients.
struct Acts<T: Elem> {
    slots: Vec<Slot<T>>,
    pool: CudaSlice<T>,
    feat: CudaSlice<T>,
    logits: CudaSlice<T>,
    logits32: CudaSlice<f32>,
    logp: CudaSlice<f32>,
    dl32: CudaSlice<f32>,
    dl: CudaSlice<T>,
    dfeat: CudaSlice<T>,
    ones: CudaSlice<T>,
    /// Gradients of block outputs, used in turn, and of a block's inner tensors.
    g: [CudaSlice<T>; 2],
    dc: CudaSlice<T>,
    dmid: CudaSlice<T>,
    dds: CudaSlice<T>,
    du: CudaSlice<T>,
}

/// What a step uses besides the network.
pub struct TrainCx<'a> {
    pub cudnn: &'a Cudnn,
    pub blas: &'a Blas,
    pub tuner: &'a mut Autotuner,
    pub ws: &'a mut Workspace,
    /// Device time per kind of call, when profiling a step run call by call (never in a
    /// capture: events recorded there would belong to the graph).
    pub prof: Option<&'a mut Profile>,
}

impl TrainCx<'_> {
    /// Attributes the device time since the previous mark to `label`.
    fn mark(&mut self, label: &'static str) -> cudnn_safe::Result<()> {
        match self.prof.as_deref_mut() {
            Some(p) => p.mark(label),
            None => Ok(()),
        }
    }
}

/// Device time per kind of call in a step: CUDA events recorded between the calls.
pub struct Profile {
    stream: Arc<CudaStream>,
    events: Vec<CudaEvent>,
    labels: Vec<&'static str>,
}

fn event_error(source: cudnn_safe::cudarc::driver::DriverError) -> Error {
    Error::Driver { context: "recording a profiling event", source }
}

impl Profile {
    pub fn new(stream: &Arc<CudaStream>) -> Profile {
        Profile { stream: stream.clone(), events: Vec::new(), labels: Vec::new() }
    }

    /// Starts a profiled step.
    pub fn begin(&mut self) -> cudnn_safe::Result<()> {
        self.labels.clear();
        self.mark("")
    }

    fn mark(&mut self, label: &'static str) -> cudnn_safe::Result<()> {
        let i = self.labels.len();
        if i == self.events.len() {
            let flags = Some(cudnn_safe::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            self.events.push(self.stream.context().new_event(flags).map_err(event_error)?);
        }
        self.events[i].record(&self.stream).map_err(event_error)?;
        self.labels.push(label);
        Ok(())
    }

    /// Milliseconds and call count per label since [`begin`](Self::begin), largest first.
    pub fn totals(&self) -> cudnn_safe::Result<Vec<(&'static str, f64, usize)>> {
        let mut out: Vec<(&'static str, f64, usize)> = Vec::new();
        for i in 1..self.labels.len() {
            let ms = self.events[i - 1].elapsed_ms(&self.events[i]).map_err(event_error)?;
            match out.iter_mut().find(|r| r.0 == self.labels[i]) {
                Some(r) => {
                    r.1 += f64::from(ms);
                    r.2 += 1;
                }
                None => out.push((self.labels[i], f64::from(ms), 1)),
            }
        }
        out.sort_by(|a, b| b.1.total_cmp(&a.1));
        Ok(out)
    }
}

/// SGD with momentum, as `torch.optim.SGD(lr, momentum)` (no weight decay, no dampening).
#[derive(Debug, Clone, Copy)]
pub struct Sgd {
    pub lr: f32,
    pub momentum: f32,
}

/// A ResNet in training mode for one batch size.
pub struct TrainNet<T: Elem> {
    pub arch: Arch,
    pub batch: i64,
    /// Input channels as stored (3, or zero-padded for engines that need more).
    pub in_channels: i64,
    /// Whether batch norm runs with the ReLU and add fused (else as separate calls).
    pub fused: bool,
    layers: Vec<ConvBn<T>>,
    /// Per block: the main path's layer indices, the downsample's.
    blocks: Vec<(Vec<usize>, Option<usize>)>,
    maxpool: (PoolingDesc, TensorDesc<T>, TensorDesc<T>),
    avgpool: (PoolingDesc, TensorDesc<T>, TensorDesc<T>),
    relu: ActivationDesc,
    fc_w: Range<usize>,
    fc_b: Range<usize>,
    features: i64,
    out16: TensorDesc<T>,
    out32: TensorDesc<f32>,
    pub params: Params<T>,
    acts: Acts<T>,
}

/// Where a layer reads its input: the max-pooling output or a layer's output.
#[derive(Clone, Copy)]
enum Src {
    Pool,
    Layer(usize),
}

fn missing(what: &'static str, j: usize) -> Error {
    Error::InvalidArgument {
        what,
        expected: "the layer's forward to have run in this step".into(),
        got: format!("no saved output for layer {j}"),
    }
}

/// The output of layer `j` in this step: its batch norm's output (fused) or the separate ReLU's.
fn output<'v, T: Elem>(
    saved: &'v [Option<BatchNormSaved<'_, T>>],
    split_out: &[Option<&'v CudaSlice<T>>],
    j: usize,
) -> cudnn_safe::Result<CudaView<'v, T>> {
    if let Some(y) = split_out[j] {
        return Ok(y.as_view());
    }
    saved[j].as_ref().and_then(|s| s.y()).ok_or_else(|| missing("layer output", j))
}

/// What a layer's forward leaves for its backward: the batch norm's saved values, the
/// convolution's output, and the layer's output where the ReLU ran separately.
type Forwarded<'a, T> = (BatchNormSaved<'a, T>, &'a CudaSlice<T>, Option<&'a CudaSlice<T>>);

/// Per block: the main path's layer indices, the downsample's.
type Blocks = [(Vec<usize>, Option<usize>)];

impl<T: Elem> ConvBn<T> {
    /// `c = conv(input, w)`, then `y = [relu](BN(c) [+ z])` in training mode (updating the
    /// running statistics). Returns what the backward pass needs: the batch norm's saved values,
    /// `c`, and `y` when the ReLU ran separately.
    #[allow(clippy::too_many_arguments)]
    fn forward<'a>(
        &self,
        cx: &mut TrainCx<'_>,
        (lowp, master): (&CudaSlice<T>, &CudaSlice<f32>),
        running: &mut (CudaSlice<f32>, CudaSlice<f32>),
        relu: &ActivationDesc,
        input: CudaView<'_, T>,
        z: Option<CudaView<'_, T>>,
        slot: &'a mut Slot<T>,
    ) -> cudnn_safe::Result<Forwarded<'a, T>> {
        let Slot { c, t, y } = slot;
        let w = lowp.slice(self.w.clone());
        let (x_d, w_d, c_d) = (&self.x_d, &self.w_d, &self.c_d);
        cx.tuner.forward(cx.cudnn, 1.0, x_d, &input, w_d, &w, &self.conv, 0.0, c_d, c)?;
        cx.mark("conv forward")?;
        let c: &'a CudaSlice<T> = c;
        let k = self.k;
        let gamma = master.slice(self.gamma_beta.start..self.gamma_beta.start + k);
        let beta = master.slice(self.gamma_beta.start + k..self.gamma_beta.end);
        let stats = Some(RunningStats::new(&mut running.0, &mut running.1, BN_MOMENTUM));
        let cudnn = cx.cudnn;
        let Some(t) = t.as_mut().filter(|_| self.split) else {
            let saved = cudnn.batch_norm_forward_training_ex(
                &self.bn, self.ops, 1.0, 0.0, c, z, y, &gamma, &beta, stats, cx.ws,
            )?;
            cx.mark("batch norm forward (fused)")?;
            return Ok((saved, c, None));
        };
        let plain = BatchNormOps::Bn;
        let saved = cudnn.batch_norm_forward_training_ex(
            &self.bn, plain, 1.0, 0.0, c, None, t, &gamma, &beta, stats, cx.ws,
        )?;
        {
            let tv = saved.y().ok_or_else(|| missing("batch-norm output", 0))?;
            match z {
                Some(z) => {
                    let add = OpTensorOp::Add;
                    cudnn.op_tensor(add, 1.0, c_d, &tv, 1.0, c_d, &z, 0.0, c_d, y)?;
                    cudnn.activation_forward_in_place(relu, 1.0, 0.0, c_d, y)?;
                }
                None => cudnn.activation_forward(relu, 1.0, c_d, &tv, 0.0, c_d, y)?,
            }
        }
        cx.mark("batch norm forward, then ReLU (and add)")?;
        let y: &'a CudaSlice<T> = y;
        Ok((saved, c, Some(y)))
    }

    /// From `dy` (the gradient of the layer's output): `dc` (the gradient of the convolution's
    /// output), the batch norm's scale and shift gradients, and `dz` (the skip connection's
    /// gradient) for a block's last layer. `du` is scratch for the separate ReLU.
    #[allow(clippy::too_many_arguments)]
    fn backward_bn(
        &self,
        cx: &mut TrainCx<'_>,
        (master, grad): (&CudaSlice<f32>, &mut CudaSlice<f32>),
        relu: &ActivationDesc,
        saved: &mut BatchNormSaved<'_, T>,
        (c, y_split): (&CudaSlice<T>, Option<&CudaSlice<T>>),
        dy: &CudaSlice<T>,
        du: &mut CudaSlice<T>,
        mut dz: Option<CudaViewMut<'_, T>>,
        dc: &mut CudaSlice<T>,
    ) -> cudnn_safe::Result<()> {
        let k = self.k;
        let gamma = master.slice(self.gamma_beta.start..self.gamma_beta.start + k);
        let beta = master.slice(self.gamma_beta.start + k..self.gamma_beta.end);
        let mut gb = grad.slice_mut(self.gamma_beta.clone());
        let (mut dgamma, mut dbeta) = gb.split_at_mut(k);
        let (cudnn, c_d) = (cx.cudnn, &self.c_d);
        let dy_bn: &CudaSlice<T> = match y_split {
            None => dy,
            Some(y) => {
                cudnn.activation_backward(relu, 1.0, c_d, y, c_d, dy, c_d, y, 0.0, c_d, du)?;
                if let Some(dz) = dz.take() {
                    let mut dz = dz;
                    cudnn.add_tensor(1.0, c_d, &*du, 0.0, c_d, &mut dz)?;
                }
                cx.mark("ReLU backward (and skip gradient copy)")?;
                du
            }
        };
        cudnn.batch_norm_backward_ex(
            &self.bn,
            saved,
            1.0,
            0.0,
            1.0,
            0.0,
            c,
            dy_bn,
            dz,
            dc,
            &gamma,
            &beta,
            &mut dgamma,
            &mut dbeta,
            cx.ws,
        )?;
        cx.mark("batch norm backward")
    }

    /// The filter gradient (into the bfloat16 gradient buffer) and, when asked, the input's
    /// (`dx = conv_backward_data(dc)`, or with a scratch buffer `dx += conv_backward_data(dc)`).
    fn backward_conv(
        &self,
        cx: &mut TrainCx<'_>,
        (lowp, grad_lowp): (&CudaSlice<T>, &mut CudaSlice<T>),
        input: &CudaView<'_, T>,
        dc: &CudaSlice<T>,
        dx: Option<(&mut CudaSlice<T>, Option<&mut CudaSlice<T>>)>,
    ) -> cudnn_safe::Result<()> {
        let (x_d, w_d, c_d, conv) = (&self.x_d, &self.w_d, &self.c_d, &self.conv);
        let mut dw = grad_lowp.slice_mut(self.w.clone());
        cx.tuner.backward_filter(cx.cudnn, 1.0, x_d, input, c_d, dc, conv, 0.0, w_d, &mut dw)?;
        cx.mark("conv backward filter")?;
        let Some((dx, scratch)) = dx else { return Ok(()) };
        let w = lowp.slice(self.w.clone());
        match scratch {
            None => {
                cx.tuner.backward_data(cx.cudnn, 1.0, w_d, &w, c_d, dc, conv, 0.0, x_d, dx)?;
                cx.mark("conv backward data")
            }
            // Into scratch, then added: cuDNN's graph engines (the fast ones in half precision)
            // only overwrite their output.
            Some(s) => {
                cx.tuner.backward_data(cx.cudnn, 1.0, w_d, &w, c_d, dc, conv, 0.0, x_d, s)?;
                cx.mark("conv backward data")?;
                let flat = &self.x_flat;
                cx.cudnn.add_tensor(1.0, flat, &*s, 1.0, flat, dx)?;
                cx.mark("skip gradient add")
            }
        }
    }
}

/// `len` contiguous elements as a `[len / a, a, 1, 1]` tensor (`a` = [`ALIGN`] where it divides
/// `len`) for cuDNN's
/// elementwise calls, which spread such a tensor over the whole GPU (a `[1, len, 1, 1]` one has
/// the shape of a bias, which they handle with little parallelism).
fn flat<V: cudnn_safe::DataType>(len: usize) -> Res<TensorDesc<V>> {
    let a = [ALIGN, 32, 16, 8, 4, 2].into_iter().find(|a| len % a == 0).unwrap_or(1);
    Ok(TensorDesc::nchw((len / a) as i64, a as i64, 1, 1)?)
}

fn alloc<
    V: cudnn_safe::cudarc::driver::DeviceRepr + cudnn_safe::cudarc::driver::ValidAsZeroBits,
>(
    stream: &Arc<CudaStream>,
    n: usize,
) -> Res<CudaSlice<V>> {
    Ok(stream.alloc_zeros::<V>(n.max(1))?)
}

impl<T: Elem> TrainNet<T> {
    /// The network for `batch` images of 224×224 with `in_channels` stored input channels
    /// (3 or more; the extra ones are zero), initialized from `weights` (PyTorch's names and
    /// shapes). `split_bn` runs the ReLU and residual add as separate calls after a plain batch
    /// norm instead of fusing them into it.
    pub fn new(
        cudnn: &Cudnn,
        arch: Arch,
        batch: i64,
        in_channels: i64,
        weights: &Tensors,
        split_bn: bool,
    ) -> Res<Self> {
        let stream = cudnn.stream();
        // float32 runs strict, and cuDNN fuses the ReLU and add into batch norm for half types
        // only.
        let strict = T::DTYPE == DType::F32;
        let split_bn = split_bn || strict;
        // The persistent kernels (the fast NHWC half-precision path, and the fused ReLU/add)
        // for half types; the plain ones for the float32 check.
        let bn_mode =
            if strict { BatchNormMode::Spatial } else { BatchNormMode::SpatialPersistent };
        let (stem_spec, specs) = blocks(arch);
        let mut cast = Allocator::default();
        let mut norm = Allocator::default();
        let mut layers = Vec::new();
        let mut largest = 0usize;
        let mut layer = |c: &ConvSpec, x: [i64; 4], cp: i64, ops: BatchNormOps| -> Res<usize> {
            let pad = c.kernel / 2;
            let math = if strict { MathType::Fma } else { MathType::Default };
            let conv = ConvDesc::builder(2)
                .pads(&[pad, pad])
                .strides(&[c.stride, c.stride])
                .math(math)
                .build::<T>()?;
            let x_d = TensorDesc::<T>::nhwc(x[0], x[1], x[2], x[3])?;
            let w_d = FilterDesc::<T>::new(&[c.cout, cp, c.kernel, c.kernel], TensorFormat::Nhwc)?;
            let y = conv.output_dims(x_d.dims(), w_d.dims())?;
            let c_d = TensorDesc::<T>::nhwc(y[0], y[1], y[2], y[3])?;
            let bn = BatchNorm::builder()
                .mode(bn_mode)
                .epsilon(EPS)
                .build::<T>(&Layout::nhwc(y[0], y[1], y[2], y[3])?)?;
            let (k, kk) = (c.cout as usize, c.kernel as usize);
            let shape = vec![k, c.cin as usize, kk, kk];
            let padded = Some(cp as usize);
            let w = cast.take(format!("{}.weight", c.conv), shape, padded);
            let g = norm.take(format!("{}.weight", c.bn), vec![k], None);
            norm.next = g.end; // the shift right after the scale
            let b = norm.take(format!("{}.bias", c.bn), vec![k], None);
            largest = largest.max(x_d.span()).max(c_d.span());
            let split = split_bn && ops != BatchNormOps::Bn;
            layers.push(ConvBn {
                conv_name: c.conv.clone(),
                conv,
                x_flat: flat(x_d.span())?,
                x_d,
                w_d,
                c_d,
                bn,
                ops,
                split,
                w,
                gamma_beta: g.start..b.end,
                k,
            });
            Ok(layers.len() - 1)
        };
        let stem =
            layer(&stem_spec, [batch, in_channels, 224, 224], in_channels, BatchNormOps::BnRelu)?;
        let _ = stem;
        let side = (112 + 2 - 3) / 2 + 1;
        let mut dims = [batch, 64, side, side];
        let mut net_blocks = Vec::new();
        for b in &specs {
            let down = match &b.down {
                Some(c) => Some(layer(c, dims, c.cin, BatchNormOps::Bn)?),
                None => None,
            };
            let mut x = dims;
            let mut main = Vec::new();
            for (i, c) in b.main.iter().enumerate() {
                let last = i + 1 == b.main.len();
                let ops = if last { BatchNormOps::BnAddRelu } else { BatchNormOps::BnRelu };
                let at = layer(c, x, c.cin, ops)?;
                let side = (x[2] + 2 * (c.kernel / 2) - c.kernel) / c.stride + 1;
                x = [batch, c.cout, side, side];
                main.push(at);
            }
            net_blocks.push((main, down));
            dims = x;
        }
        let features = arch.features();
        let fc_w = cast.take("fc.weight".into(), vec![CLASSES as usize, features as usize], None);
        let fc_b = cast.take("fc.bias".into(), vec![CLASSES as usize], None);
        let cast_len = cast.next;
        // The float32-only tensors follow the cast ones.
        for e in &mut norm.entries {
            e.range = e.range.start + cast_len..e.range.end + cast_len;
        }
        for l in &mut layers {
            l.gamma_beta = l.gamma_beta.start + cast_len..l.gamma_beta.end + cast_len;
        }
        let total = cast_len + norm.next;
        let mut entries = cast.entries;
        entries.extend(norm.entries);

        // Initial values from PyTorch's tensors.
        let mut host = vec![0.0f32; total];
        for e in &entries {
            let (shape, v) = weights.get(&e.name)?;
            if shape[..] != e.shape[..] {
                return Err(
                    format!("{} has shape {shape:?}, expected {:?}", e.name, e.shape).into()
                );
            }
            host[e.range.clone()].copy_from_slice(&e.stored_from_torch(v));
        }
        let mut running = Vec::new();
        for l in &layers {
            running.push((alloc::<f32>(stream, l.k)?, stream.clone_htod(&vec![1.0f32; l.k])?));
        }
        let params = Params {
            master: stream.clone_htod(&host)?,
            grad: alloc(stream, total)?,
            velocity: alloc(stream, total)?,
            lowp: alloc(stream, cast_len)?,
            grad_lowp: alloc(stream, cast_len)?,
            entries,
            cast32: flat(cast_len)?,
            cast16: flat(cast_len)?,
            all32: flat(total)?,
            running,
        };

        let mp = PoolingDesc::builder(PoolingMode::Max, &[3, 3])
            .pads(&[1, 1])
            .strides(&[2, 2])
            .build()?;
        let mp_in = TensorDesc::<T>::nhwc(batch, 64, 112, 112)?;
        let mp_out = TensorDesc::<T>::nhwc(batch, 64, side, side)?;
        let ap =
            PoolingDesc::builder(PoolingMode::AvgIncludePadding, &[dims[2], dims[3]]).build()?;
        let ap_in = TensorDesc::<T>::nhwc(batch, features, dims[2], dims[3])?;
        let ap_out = TensorDesc::<T>::nhwc(batch, features, 1, 1)?;
        let out16 = TensorDesc::<T>::nchw(batch, CLASSES, 1, 1)?;
        let out32 = TensorDesc::<f32>::nchw(batch, CLASSES, 1, 1)?;

        let mut slots = Vec::new();
        for l in &layers {
            let n = l.c_d.span();
            let t = if l.split { Some(alloc(stream, n)?) } else { None };
            slots.push(Slot { c: alloc(stream, n)?, t, y: alloc(stream, n)? });
        }
        let (nb, nf, nc) =
            (batch as usize, (batch * features) as usize, (batch * CLASSES) as usize);
        let ones = stream.clone_htod(&vec![T::from_f64(1.0); nb])?;
        let acts = Acts {
            slots,
            pool: alloc(stream, mp_out.span())?,
            feat: alloc(stream, nf)?,
            logits: alloc(stream, nc)?,
            logits32: alloc(stream, nc)?,
            logp: alloc(stream, nc)?,
            dl32: alloc(stream, nc)?,
            dl: alloc(stream, nc)?,
            dfeat: alloc(stream, nf)?,
            ones,
            g: [alloc(stream, largest)?, alloc(stream, largest)?],
            dc: alloc(stream, largest)?,
            dmid: alloc(stream, largest)?,
            dds: alloc(stream, largest)?,
            du: alloc(stream, largest)?,
        };
        Ok(TrainNet {
            arch,
            batch,
            in_channels,
            fused: !split_bn,
            layers,
            blocks: net_blocks,
            maxpool: (mp, mp_in, mp_out),
            avgpool: (ap, ap_in, ap_out),
            relu: ActivationDesc::new(ActivationMode::Relu)?,
            fc_w,
            fc_b,
            features,
            out16,
            out32,
            params,
            acts,
        })
    }

    /// Elements of the input (`[N, 224, 224, C]` bfloat16) and of the one-hot labels and the
    /// per-class loss terms (`[N, 1000]` float32).
    pub fn input_len(&self) -> usize {
        self.layers[0].x_d.span()
    }
    pub fn labels_len(&self) -> usize {
        (self.batch * CLASSES) as usize
    }
    /// Convolution layers (each followed by a batch norm).
    pub fn conv_layers(&self) -> usize {
        self.layers.len()
    }

    /// One training step on the images `x` with one-hot labels `onehot`: `nll` receives
    /// `−onehot ⊙ log_softmax(logits)` (its sum over a batch divided by N is the loss), the
    /// gradients of every parameter land in [`Params::grad`], and with `sgd` the parameters are
    /// updated.
    pub fn step(
        &mut self,
        cx: &mut TrainCx<'_>,
        x: &CudaSlice<T>,
        onehot: &CudaSlice<f32>,
        nll: &mut CudaSlice<f32>,
        sgd: Option<Sgd>,
    ) -> cudnn_safe::Result<()> {
        let TrainNet {
            layers,
            blocks,
            params,
            acts,
            relu,
            maxpool: (mp, mp_in, mp_out),
            avgpool: (ap, ap_in, ap_out),
            out16,
            out32,
            fc_w,
            fc_b,
            batch,
            features,
            ..
        } = self;
        let (layers, blocks, relu): (&[ConvBn<T>], &Blocks, _) = (layers, blocks, &*relu);
        let (batch, features) = (*batch, *features);
        let cudnn = cx.cudnn;
        let Params {
            master, grad, velocity, lowp, grad_lowp, running, cast32, cast16, all32, ..
        } = params;
        T::narrow(cudnn, (cast32, &*master), (cast16, lowp))?;
        cx.mark("weights to the step's type")?;
        // Shared views for the forward and backward; the update at the end writes `master`.
        let (m32, lowp16): (&CudaSlice<f32>, &CudaSlice<T>) = (&*master, &*lowp);
        let (out16, out32): (&TensorDesc<T>, &TensorDesc<f32>) = (out16, out32);
        let (mp, mp_in, mp_out): (&PoolingDesc, &TensorDesc<T>, &TensorDesc<T>) =
            (mp, mp_in, mp_out);
        let (ap, ap_in, ap_out): (&PoolingDesc, &TensorDesc<T>, &TensorDesc<T>) =
            (ap, ap_in, ap_out);
        let Acts {
            slots,
            pool,
            feat,
            logits,
            logits32,
            logp,
            dl32,
            dl,
            dfeat,
            ones,
            g: [g0, g1],
            dc,
            dmid,
            dds,
            du,
        } = acts;

        // Forward. Layers are stored in the order they run.
        let n = layers.len();
        let mut saved: Vec<Option<BatchNormSaved<'_, T>>> = (0..n).map(|_| None).collect();
        let mut cs: Vec<Option<&CudaSlice<T>>> = vec![None; n];
        let mut split_out: Vec<Option<&CudaSlice<T>>> = vec![None; n];
        let mut slot_of = slots.iter_mut();
        macro_rules! run {
            ($i:expr, $input:expr, $z:expr) => {{
                let i = $i;
                let slot = slot_of.next().ok_or_else(|| missing("layer buffers", i))?;
                let (m, r) = (m32, &mut running[i]);
                let (s, c, y) = layers[i].forward(cx, (lowp16, m), r, relu, $input, $z, slot)?;
                (saved[i], cs[i], split_out[i]) = (Some(s), Some(c), y);
            }};
        }
        run!(0, x.as_view(), None);
        {
            let stem_y = output(&saved, &split_out, 0)?;
            cudnn.pooling_forward(mp, 1.0, mp_in, &stem_y, 0.0, mp_out, pool)?;
        }
        cx.mark("pooling forward")?;
        let pool: &CudaSlice<T> = pool;
        let mut src = Src::Pool;
        for (main, down) in blocks {
            if let Some(d) = *down {
                run!(d, view(pool, &saved, &split_out, src)?, None);
            }
            for (k, &i) in main.iter().enumerate() {
                let input = if k == 0 { src } else { Src::Layer(main[k - 1]) };
                let skip = down.map_or(src, Src::Layer);
                let z = if k + 1 == main.len() {
                    Some(view(pool, &saved, &split_out, skip)?)
                } else {
                    None
                };
                run!(i, view(pool, &saved, &split_out, input)?, z);
            }
            src = Src::Layer(*main.last().ok_or_else(|| missing("block", 0))?);
        }
        {
            let last = view(pool, &saved, &split_out, src)?;
            cudnn.pooling_forward(ap, 1.0, ap_in, &last, 0.0, ap_out, feat)?;
        }
        cx.mark("pooling forward")?;
        // Classifier: logits [N × 1000] = feat [N × F] · wᵀ + 1 · b.
        let (no, yes) = (Transpose::No, Transpose::Yes);
        let (nb, f, nc) = (batch, features, CLASSES);
        let (w_fc, b_fc) = (lowp16.slice(fc_w.clone()), lowp16.slice(fc_b.clone()));
        let blas = cx.blas;
        blas.matmul_row_major(no, yes, nb, nc, f, 1.0, &*feat, f, &w_fc, f, 0.0, logits, nc)?;
        blas.matmul_row_major(no, no, nb, nc, 1, 1.0, &*ones, 1, &b_fc, nc, 1.0, logits, nc)?;
        cx.mark("classifier")?;

        // Loss, in float32: L = −(1/N)·Σ onehot ⊙ log_softmax(logits). The log-softmax backward
        // gives dx = dy − e^logp·Σ_class dy; with dy = onehot and alpha = −1/N that is
        // (softmax − onehot)/N = ∂L/∂logits.
        let (lsm, ch) = (SoftmaxAlgorithm::Log, SoftmaxMode::Channel);
        T::widen(cudnn, (out16, &*logits), (out32, logits32))?;
        cudnn.softmax_forward(lsm, ch, 1.0, out32, &*logits32, 0.0, out32, logp)?;
        let mul = OpTensorOp::Mul;
        cudnn.op_tensor(mul, -1.0, out32, &*logp, 1.0, out32, onehot, 0.0, out32, nll)?;
        let inv_n = -1.0 / batch as f32;
        cudnn.softmax_backward(lsm, ch, inv_n, out32, &*logp, out32, onehot, 0.0, out32, dl32)?;
        T::narrow(cudnn, (out32, &*dl32), (out16, dl))?;
        cx.mark("loss and its gradient")?;

        // Classifier backward: dw = dlᵀ · feat, db = 1ᵀ · dl, dfeat = dl · w.
        let dl: &CudaSlice<T> = dl;
        {
            let mut dw = grad_lowp.slice_mut(fc_w.clone());
            blas.matmul_row_major(yes, no, nc, f, nb, 1.0, dl, nc, &*feat, f, 0.0, &mut dw, f)?;
        }
        {
            let mut db = grad_lowp.slice_mut(fc_b.clone());
            blas.matmul_row_major(no, no, 1, nc, nb, 1.0, &*ones, nb, dl, nc, 0.0, &mut db, nc)?;
        }
        blas.matmul_row_major(no, no, nb, f, nc, 1.0, dl, nc, &w_fc, f, 0.0, dfeat, f)?;
        cx.mark("classifier backward")?;
        let (mut gout, mut gin): (&mut CudaSlice<T>, &mut CudaSlice<T>) = (g0, g1);
        {
            let last = view(pool, &saved, &split_out, src)?;
            let (y, dy) = (&*feat, &*dfeat);
            cudnn
                .pooling_backward(ap, 1.0, ap_out, y, ap_out, dy, ap_in, &last, 0.0, ap_in, gout)?;
        }
        cx.mark("pooling backward")?;

        // Batch-norm backward of layer `i` from the gradient `dy` of its output into `dc`
        // (and the skip connection's gradient into `dz`).
        macro_rules! bn_back {
            ($i:expr, $dy:expr, $dz:expr) => {{
                let i = $i;
                let s = saved[i].as_mut().ok_or_else(|| missing("batch-norm saved values", i))?;
                let c = cs[i].ok_or_else(|| missing("convolution output", i))?;
                let io = (c, split_out[i]);
                layers[i].backward_bn(cx, (m32, &mut *grad), relu, s, io, $dy, du, $dz, dc)?;
            }};
        }
        // Blocks, last first: `gout` holds the gradient of the block's output; the block leaves
        // its input's gradient in `gin`.
        for (b, (main, down)) in blocks.iter().enumerate().rev() {
            let bin = match b.checked_sub(1) {
                Some(p) => Src::Layer(*blocks[p].0.last().ok_or_else(|| missing("block", p))?),
                None => Src::Pool,
            };
            let m = main.len();
            // The last layer: BN + add + ReLU backward gives dc and the skip's gradient.
            let last = main[m - 1];
            let dz = if down.is_some() { dds.as_view_mut() } else { gin.as_view_mut() };
            bn_back!(last, gout, Some(dz));
            {
                let input = view(pool, &saved, &split_out, Src::Layer(main[m - 2]))?;
                let dx = Some((&mut *dmid, None));
                layers[last].backward_conv(cx, (lowp16, &mut *grad_lowp), &input, dc, dx)?;
            }
            // The downsample: BN backward, then its filter and data gradients (into `gin`).
            if let Some(d) = *down {
                bn_back!(d, dds, None);
                let input = view(pool, &saved, &split_out, bin)?;
                let dx = Some((&mut *gin, None));
                layers[d].backward_conv(cx, (lowp16, &mut *grad_lowp), &input, dc, dx)?;
            }
            // The inner layers, last first; the first adds its data gradient to the skip's.
            for k in (0..m - 1).rev() {
                let i = main[k];
                bn_back!(i, dmid, None);
                let input = if k == 0 { bin } else { Src::Layer(main[k - 1]) };
                let input = view(pool, &saved, &split_out, input)?;
                let dx = if k == 0 { (&mut *gin, Some(&mut *du)) } else { (&mut *dmid, None) };
                layers[i].backward_conv(cx, (lowp16, &mut *grad_lowp), &input, dc, Some(dx))?;
            }
            std::mem::swap(&mut gout, &mut gin);
        }
        // `gout` now holds the gradient of the max pooling's output.
        {
            let stem_y = output(&saved, &split_out, 0)?;
            let dy = &*gout;
            cudnn.pooling_backward(
                mp, 1.0, mp_out, pool, mp_out, dy, mp_in, &stem_y, 0.0, mp_in, dmid,
            )?;
        }
        cx.mark("pooling backward")?;
        bn_back!(0, dmid, None);
        layers[0].backward_conv(cx, (lowp16, &mut *grad_lowp), &x.as_view(), dc, None)?;
        drop(saved);

        // Gradients in float32, then the update.
        T::widen(cudnn, (cast16, &*grad_lowp), (cast32, grad))?;
        cx.mark("gradients to float32")?;
        if let Some(Sgd { lr, momentum }) = sgd {
            cudnn.add_tensor(1.0, all32, &*grad, momentum, all32, velocity)?;
            cudnn.add_tensor(-lr, all32, &*velocity, 1.0, all32, master)?;
            cx.mark("SGD update")?;
        }
        Ok(())
    }
}

/// A layer's input in this step.
fn view<'v, T: Elem>(
    pool: &'v CudaSlice<T>,
    saved: &'v [Option<BatchNormSaved<'_, T>>],
    split_out: &[Option<&'v CudaSlice<T>>],
    src: Src,
) -> cudnn_safe::Result<CudaView<'v, T>> {
    match src {
        Src::Pool => Ok(pool.as_view()),
        Src::Layer(j) => output(saved, split_out, j),
    }
}
