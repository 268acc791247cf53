//! Batch normalization: training (batch statistics, running statistics updated in place) and
//! inference (running statistics), forward and backward.
use std::sync::{Arc, Mutex};

use candle_core::{
    backend::BackendStorage, CpuStorage, CudaStorage, CustomOp3, DType, Layout, ModuleT, Shape,
    Tensor,
};
use cudnn_safe::cudarc::driver::CudaSlice;
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::norm::{BatchNorm as CudnnBatchNorm, NormType, RunningStats};
use cudnn_safe::{DataType, Scalar};

use crate::buf::{cuda_device, cuda_slice, output, packed, packed_aligned, tensor, Elem};
use crate::error::{same_device, wrap, Error};
use crate::state::with_held;

const OP: &str = "batch_norm";

/// Batch normalization as `torch.nn.functional.batch_norm(x, running_mean, running_var, weight,
/// bias, training, momentum, eps)`: each channel `c` of `x` `[n, c, ...]` is normalized over the
/// batch and every position, `y = (x − mean_c) / sqrt(var_c + eps) · weight_c + bias_c`.
///
/// * `training`: the batch's mean and (biased) variance normalize `x`; with `running`
///   (`(running_mean, running_var)`) those are updated **in place**,
///   `running = (1 − momentum)·running + momentum·batch` (the variance unbiased, as PyTorch
///   and `candle_nn::BatchNorm`). Gradients of `x`, `weight` and `bias` in candle's autograd.
/// * not `training`: `running` normalizes `x` (and is required).
///
/// `running_mean`, `running_var`, `weight` and `bias`: `[c]`, on x's device, of x's dtype or
/// f32 (f32 parameters with f16/bf16 data is PyTorch's mixed precision); the running statistics
/// must be contiguous when they are updated, and share no memory with each other or with `x`,
/// `weight` and `bias`. `weight` and `bias` absent mean 1 and 0.
/// `momentum` in `0..=1`, `eps` finite and at least 0.
///
/// f32, f16 and bf16 on a CUDA device run cuDNN (statistics in f32; a packed or channels-last
/// `[n, c, h, w]` is read as it is stored, the result stored the same way; other layouts are
/// copied packed; the backward pass recomputes the batch statistics with a training forward);
/// f64, the CPU, and inference with a gradient to compute run candle's operations.
///
/// ```no_run
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{DType, Device, Tensor};
/// let dev = Device::new_cuda(0)?;
/// let x = Tensor::randn(0f32, 1.0, (32, 64, 28, 28), &dev)?;
/// let (mean, var) = (Tensor::zeros(64, DType::F32, &dev)?, Tensor::ones(64, DType::F32, &dev)?);
/// let y = cudnn_safe_candle::batch_norm(&x, Some((&mean, &var)), None, None, true, 0.1, 1e-5)?;
/// // mean and var now hold 0.9·(0, 1) + 0.1·(the batch's statistics).
/// # Ok(()) }
/// ```
pub fn batch_norm(
    x: &Tensor,
    running: Option<(&Tensor, &Tensor)>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> candle_core::Result<Tensor> {
    let call = Call {
        x,
        running,
        weight,
        bias,
        training,
        momentum,
        eps,
    };
    let c = call.check()?;
    if x.elem_count() == 0 {
        return x.zeros_like();
    }
    let tracked =
        x.track_op() || weight.is_some_and(Tensor::track_op) || bias.is_some_and(Tensor::track_op);
    if !on_cudnn(x) || (!training && tracked) {
        return call.composed();
    }
    let dev = x.device();
    // Parameters in f32 (cuDNN's parameter type for every data type run here); gradients flow
    // back to the caller's dtype through the conversion.
    let param = |p: Option<&Tensor>, fill: f64| match p {
        Some(p) => packed_aligned(&p.to_dtype(DType::F32)?),
        None => Tensor::ones(c, DType::F32, dev)? * fill,
    };
    let (w, b) = (param(weight, 1.0)?, param(bias, 0.0)?);
    let stats = match running {
        Some((m, v)) => Some((owned_f32(m)?, owned_f32(v)?)),
        None => None,
    };
    let stats = Arc::new(Mutex::new(stats));
    let (xp, form) = cudnn_form(x)?;
    let op = BatchNormOp {
        eps,
        momentum,
        training,
        nhwc: matches!(form, Form::ChannelsLast),
        stats: Arc::clone(&stats),
    };
    let y = if tracked {
        xp.apply_op3(&w, &b, op)?
    } else {
        xp.apply_op3_no_bwd(&w, &b, &op)?
    };
    if training {
        if let (Some((m, v)), Some((nm, nv))) = (running, lock(&stats).take()) {
            let cd = dev.as_cuda_device()?;
            store(m, &tensor(nm, cd, vec![c]))?;
            store(v, &tensor(nv, cd, vec![c]))?;
        }
    }
    match form {
        Form::ChannelsLast => y.permute((0, 3, 1, 2)),
        Form::Packed => y.reshape(x.dims()),
    }
}

/// A batch-norm layer as `candle_nn::BatchNorm`, on [`batch_norm`]: [`ModuleT::forward_t`]
/// with `train` normalizes by the batch and updates the running statistics in place, without
/// it by the running statistics (as `candle_nn::BatchNorm`, it is a `ModuleT`, not a `Module`).
///
/// ```no_run
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{DType, Device, ModuleT, Tensor};
/// let dev = Device::new_cuda(0)?;
/// let c = 64;
/// let bn = cudnn_safe_candle::BatchNorm::new(
///     Tensor::zeros(c, DType::F32, &dev)?,
///     Tensor::ones(c, DType::F32, &dev)?,
///     Some((Tensor::ones(c, DType::F32, &dev)?, Tensor::zeros(c, DType::F32, &dev)?)),
///     1e-5,
///     0.1,
/// )?;
/// let x = Tensor::randn(0f32, 1.0, (16, c, 32, 32), &dev)?;
/// let y = bn.forward_t(&x, true)?; // training: running statistics updated
/// // From a candle_nn::BatchNorm `l`: BatchNorm::new(l.running_mean().clone(),
/// // l.running_var().clone(), l.weight_and_bias().map(|(w, b)| (w.clone(), b.clone())),
/// // l.eps(), l.momentum()) shares its running statistics.
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct BatchNorm {
    running_mean: Tensor,
    running_var: Tensor,
    weight_and_bias: Option<(Tensor, Tensor)>,
    eps: f64,
    momentum: f64,
}

impl BatchNorm {
    /// A layer over `running_mean.dim(0)` channels; the running statistics are updated in place
    /// by training calls (tensors sharing their storage see the update). The arguments are
    /// checked as [`batch_norm`] checks them.
    pub fn new(
        running_mean: Tensor,
        running_var: Tensor,
        weight_and_bias: Option<(Tensor, Tensor)>,
        eps: f64,
        momentum: f64,
    ) -> candle_core::Result<BatchNorm> {
        let c = match running_mean.dims() {
            [c] => *c,
            d => {
                return Err(Error::invalid(
                    "BatchNorm::new",
                    "running_mean",
                    "one dimension [c]",
                    d,
                ))
            }
        };
        let (w, b) = match &weight_and_bias {
            Some((w, b)) => (Some(w), Some(b)),
            None => (None, None),
        };
        // The checks of a call on a [2, c] input of the parameters' dtype (the first that is
        // not f32, f32 parameters being allowed with any input).
        let dtype = [Some(&running_mean), Some(&running_var), w, b]
            .into_iter()
            .flatten()
            .map(Tensor::dtype)
            .find(|&d| d != DType::F32)
            .unwrap_or(DType::F32);
        let probe = Tensor::zeros((2, c), dtype, running_mean.device())?;
        Call {
            x: &probe,
            running: Some((&running_mean, &running_var)),
            weight: w,
            bias: b,
            training: true,
            momentum,
            eps,
        }
        .check()?;
        Ok(BatchNorm {
            running_mean,
            running_var,
            weight_and_bias,
            eps,
            momentum,
        })
    }

    /// The running mean.
    pub fn running_mean(&self) -> &Tensor {
        &self.running_mean
    }

    /// The running variance.
    pub fn running_var(&self) -> &Tensor {
        &self.running_var
    }

    /// The weight and bias, if the layer has them.
    pub fn weight_and_bias(&self) -> Option<(&Tensor, &Tensor)> {
        self.weight_and_bias.as_ref().map(|(w, b)| (w, b))
    }

    /// Epsilon.
    pub fn eps(&self) -> f64 {
        self.eps
    }

    /// The running statistics' momentum.
    pub fn momentum(&self) -> f64 {
        self.momentum
    }
}

impl ModuleT for BatchNorm {
    fn forward_t(&self, x: &Tensor, train: bool) -> candle_core::Result<Tensor> {
        let (w, b) = match &self.weight_and_bias {
            Some((w, b)) => (Some(w), Some(b)),
            None => (None, None),
        };
        batch_norm(
            x,
            Some((&self.running_mean, &self.running_var)),
            w,
            b,
            train,
            self.momentum,
            self.eps,
        )
    }
}

/// The arguments of one [`batch_norm`] call.
#[derive(Clone, Copy)]
struct Call<'a> {
    x: &'a Tensor,
    running: Option<(&'a Tensor, &'a Tensor)>,
    weight: Option<&'a Tensor>,
    bias: Option<&'a Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
}

impl Call<'_> {
    /// Every argument against x: returns the channel count.
    fn check(self) -> candle_core::Result<usize> {
        let Call {
            x,
            running,
            weight,
            bias,
            training,
            momentum,
            eps,
        } = self;
        match x.dtype() {
            DType::F32 | DType::F16 | DType::BF16 | DType::F64 => {}
            d => return Err(Error::dtype(OP, "x", d)),
        }
        let dims = x.dims();
        if dims.len() < 2 {
            return Err(Error::invalid(
                OP,
                "x",
                "at least 2 dimensions [n, c, ...]",
                dims,
            ));
        }
        let c = dims[1];
        let params = [
            (running.map(|r| r.0), "running_mean"),
            (running.map(|r| r.1), "running_var"),
            (weight, "weight"),
            (bias, "bias"),
        ];
        for (p, arg) in params {
            let Some(p) = p else { continue };
            if p.dims() != [c] {
                return Err(Error::invalid(
                    OP,
                    arg,
                    format!("[{c}] (x's channels, dimension 1)"),
                    p.dims(),
                ));
            }
            if p.dtype() != x.dtype() && p.dtype() != DType::F32 {
                return Err(Error::invalid(
                    OP,
                    arg,
                    format!("of x's dtype {:?} or f32", x.dtype()),
                    p.dtype(),
                ));
            }
            same_device(OP, x, "x", p, arg)?;
        }
        if weight.is_some() != bias.is_some() {
            let arg = if weight.is_some() { "bias" } else { "weight" };
            return Err(Error::invalid(
                OP,
                arg,
                "given with the other affine parameter (weight and bias, or neither)",
                "absent",
            ));
        }
        match running {
            Some((m, v)) if training => {
                for (t, arg) in [(m, "running_mean"), (v, "running_var")] {
                    if !t.is_contiguous() {
                        return Err(Error::invalid(
                            OP,
                            arg,
                            "contiguous (it is updated in place)",
                            t.stride(),
                        ));
                    }
                }
                // Both statistics are written after the batch is normalized, and the backward
                // pass reads x, weight and bias again: no written element may be read or
                // written by another argument.
                if overlap(m, v) {
                    return Err(Error::invalid(
                        OP,
                        "running_var",
                        "memory of its own (both running statistics are updated in place)",
                        "a view overlapping running_mean",
                    ));
                }
                let read = [(Some(x), "x"), (weight, "weight"), (bias, "bias")];
                for (t, t_arg) in read.into_iter().filter_map(|(t, a)| Some((t?, a))) {
                    for (s, s_arg) in [(m, "running_mean"), (v, "running_var")] {
                        if overlap(s, t) {
                            return Err(Error::invalid(
                                OP,
                                s_arg,
                                format!("no memory shared with `{t_arg}` (it is updated in place)"),
                                format!("a view overlapping `{t_arg}`"),
                            ));
                        }
                    }
                }
            }
            None if !training => {
                return Err(Error::invalid(
                    OP,
                    "running_mean",
                    "given when training is false (inference normalizes by the running statistics)",
                    "None",
                ))
            }
            _ => {}
        }
        if training {
            let per_channel = x.elem_count() / c.max(1);
            if per_channel < 2 {
                return Err(Error::invalid(
                    OP,
                    "x",
                    "more than one value per channel when training",
                    dims,
                ));
            }
        }
        if !(momentum.is_finite() && (0.0..=1.0).contains(&momentum)) {
            return Err(Error::invalid(OP, "momentum", "in 0..=1", momentum));
        }
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(Error::invalid(OP, "eps", "finite and at least 0", eps));
        }
        Ok(c)
    }
    /// candle's operations (f64, the CPU, and inference with gradients): statistics in f32 for f16
    /// and bf16, the running statistics updated in place when training.
    fn composed(self) -> candle_core::Result<Tensor> {
        let Call {
            x,
            running,
            weight,
            bias,
            training,
            momentum,
            eps,
        } = self;
        let wide = match x.dtype() {
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        };
        let dims = x.dims();
        let c = dims[1];
        let mut per_channel = vec![1; dims.len()];
        per_channel[1] = c;
        let axes: Vec<usize> = (0..dims.len()).filter(|&i| i != 1).collect();
        let xf = x.to_dtype(wide)?;
        let (mean, var) = if training {
            let mean = xf.mean_keepdim(axes.as_slice())?;
            let var = xf
                .broadcast_sub(&mean)?
                .sqr()?
                .mean_keepdim(axes.as_slice())?;
            if let Some((rm, rv)) = running {
                let m = (x.elem_count() / c) as f64;
                let (bm, bv) = (mean.detach().flatten_all()?, var.detach().flatten_all()?);
                let nm = ((rm.to_dtype(wide)? * (1.0 - momentum))? + (bm * momentum)?)?;
                let nv = ((rv.to_dtype(wide)? * (1.0 - momentum))?
                    + (bv * (momentum * m / (m - 1.0)))?)?;
                store(rm, &nm)?;
                store(rv, &nv)?;
            }
            (mean, var)
        } else {
            let (rm, rv) = running.expect("checked: inference has running statistics");
            (
                rm.detach()
                    .to_dtype(wide)?
                    .reshape(per_channel.as_slice())?,
                rv.detach()
                    .to_dtype(wide)?
                    .reshape(per_channel.as_slice())?,
            )
        };
        let mut y = xf
            .broadcast_sub(&mean)?
            .broadcast_div(&(var + eps)?.sqrt()?)?;
        if let (Some(w), Some(b)) = (weight, bias) {
            y = y
                .broadcast_mul(&w.to_dtype(wide)?.reshape(per_channel.as_slice())?)?
                .broadcast_add(&b.to_dtype(wide)?.reshape(per_channel.as_slice())?)?;
        }
        y.to_dtype(x.dtype())
    }
}

fn on_cudnn(x: &Tensor) -> bool {
    x.device().is_cuda() && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
}

/// Writes `value` (`[c]`) into the running statistic `dst`, in dst's dtype.
fn store(dst: &Tensor, value: &Tensor) -> candle_core::Result<()> {
    let value = value.detach().to_dtype(dst.dtype())?.contiguous()?;
    dst.slice_set(&value, 0, 0)
}

/// Whether `a` and `b` are views of one storage whose element ranges (first to last element
/// each reaches) intersect. Conservative for strided views that interleave without touching.
fn overlap(a: &Tensor, b: &Tensor) -> bool {
    fn reach(l: &Layout) -> std::ops::Range<usize> {
        let at = l.start_offset();
        let last = l
            .dims()
            .iter()
            .zip(l.stride())
            .try_fold(at, |acc, (&d, &s)| Some(acc + d.checked_sub(1)? * s));
        last.map_or(at..at, |last| at..last + 1)
    }
    // The storage's address identifies it while both tensors hold it; one lock at a time.
    fn storage(t: &Tensor) -> *const candle_core::Storage {
        &*t.storage_and_layout().0
    }
    let (ra, rb) = (reach(a.layout()), reach(b.layout()));
    std::ptr::eq(storage(a), storage(b))
        && !ra.is_empty()
        && !rb.is_empty()
        && ra.start < rb.end
        && rb.start < ra.end
}

/// A new f32 device buffer holding `t` (`[c]`), for cuDNN to update.
fn owned_f32(t: &Tensor) -> candle_core::Result<CudaSlice<f32>> {
    let t = t.detach().to_dtype(DType::F32)?.contiguous()?;
    let (s, l) = t.storage_and_layout();
    let dev = cuda_device(&s, OP, "running statistics")?;
    let view = packed(
        cuda_slice::<f32>(&s, OP, "running statistics")?,
        l,
        OP,
        "running",
    )?;
    dev.cuda_stream()
        .clone_dtod(&view)
        .map_err(|e| wrap(cudnn_safe::Error::driver("copying running statistics", e)))
}

/// How x goes to cuDNN.
#[derive(Debug, Clone, Copy)]
enum Form {
    /// Packed `[n, c, ...]` (rank above 5 folded to `[n, c, rest]`).
    Packed,
    /// `[n, c, h, w]` stored channels-last, given as the packed `[n, h, w, c]`.
    ChannelsLast,
}

fn cudnn_form(x: &Tensor) -> candle_core::Result<(Tensor, Form)> {
    let l = x.layout();
    let (d, s) = (l.dims(), l.stride());
    let nhwc = d.len() == 4 && {
        let want = [d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]];
        (0..4).all(|i| d[i] == 1 || s[i] == want[i])
    };
    if nhwc && !x.is_contiguous() {
        return Ok((
            packed_aligned(&x.permute((0, 2, 3, 1))?)?,
            Form::ChannelsLast,
        ));
    }
    let x = if d.len() > 5 {
        x.reshape((d[0], d[1], ()))?
    } else {
        x.clone()
    };
    Ok((packed_aligned(&x)?, Form::Packed))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

type Stats = Option<(CudaSlice<f32>, CudaSlice<f32>)>;

/// Batch norm of (x, weight, bias) in f32 parameters, x packed (`nhwc`: the packed
/// `[n, h, w, c]` of a channels-last `[n, c, h, w]`).
struct BatchNormOp {
    eps: f64,
    momentum: f64,
    training: bool,
    nhwc: bool,
    /// The running mean and variance: read by inference, updated by training.
    stats: Arc<Mutex<Stats>>,
}

impl BatchNormOp {
    /// The logical `[n, c, ...]` dims of the packed x and cuDNN's layout for them.
    fn layout(&self, dims: &[usize]) -> candle_core::Result<(Vec<i64>, cudnn_safe::Layout)> {
        let d: Vec<i64> = dims.iter().map(|&u| u as i64).collect();
        let layout = if self.nhwc {
            cudnn_safe::Layout::nhwc(d[0], d[3], d[1], d[2])
        } else {
            cudnn_safe::Layout::nchw_nd(&d)
        }
        .map_err(wrap)?;
        Ok((d, layout))
    }

    fn key<T: Elem>(&self, dims: &[i64]) -> String {
        format!(
            "batch_norm-{:?}-{dims:?}-{}-{}",
            T::DTYPE,
            self.nhwc,
            self.eps.to_bits()
        )
    }

    fn forward<T: Elem + NormType<Param = f32>>(
        &self,
        xs: &CudaStorage,
        xl: &Layout,
        ws: &CudaStorage,
        wl: &Layout,
        bs: &CudaStorage,
        bl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let dev = xs.device().clone();
        let x = packed(xs.as_cuda_slice::<T>()?, xl, OP, "x")?;
        let w = packed(ws.as_cuda_slice::<f32>()?, wl, OP, "weight")?;
        let b = packed(bs.as_cuda_slice::<f32>()?, bl, OP, "bias")?;
        let (dims, layout) = self.layout(xl.dims())?;
        let key = self.key::<T>(&dims);
        let one = <T as DataType>::Scalar::from_f64(1.0);
        let zero = <T as DataType>::Scalar::from_f64(0.0);
        let mut stats = lock(&self.stats);
        let y = with_held(&dev, |cudnn, held| {
            let bn = held.objects.get_or_make(key, || {
                CudnnBatchNorm::builder()
                    .epsilon(self.eps)
                    .build::<T>(&layout)
            })?;
            let mut y = output::<T>(cudnn, x.len(), "allocating a batch-norm result")?;
            if self.training {
                let running = stats
                    .as_mut()
                    .map(|(m, v)| RunningStats::new(m, v, self.momentum));
                cudnn.batch_norm_forward_training(bn, one, zero, &x, &mut y, &w, &b, running)?;
            } else {
                let Some((m, v)) = stats.as_ref() else {
                    return Err(cudnn_safe::Error::InvalidArgument {
                        what: "batch-norm running statistics",
                        expected: "given for inference".into(),
                        got: "none".into(),
                    });
                };
                cudnn.batch_norm_forward_inference(bn, one, zero, &x, &mut y, &w, &b, m, v)?;
            }
            Ok(y)
        })?;
        Ok((CudaStorage::wrap_cuda_slice(y, dev), xl.shape().clone()))
    }

    /// dx, dweight and dbias: a training forward (running statistics untouched) recomputes the
    /// batch statistics, then cuDNN's backward pass runs.
    fn backward<T: Elem + NormType<Param = f32>>(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let (xs, xl) = x.storage_and_layout();
        let (ws, wl) = w.storage_and_layout();
        let (bs, bl) = b.storage_and_layout();
        let (dys, dyl) = dy.storage_and_layout();
        let dev = cuda_device(&xs, OP, "x")?;
        let xv = packed(cuda_slice::<T>(&xs, OP, "x")?, xl, OP, "x")?;
        let wv = packed(cuda_slice::<f32>(&ws, OP, "weight")?, wl, OP, "weight")?;
        let bv = packed(cuda_slice::<f32>(&bs, OP, "bias")?, bl, OP, "bias")?;
        let dyv = packed(cuda_slice::<T>(&dys, OP, "grad")?, dyl, OP, "grad")?;
        let (dims, layout) = self.layout(xl.dims())?;
        let key = self.key::<T>(&dims);
        let c = wl.shape().elem_count();
        let one = <T as DataType>::Scalar::from_f64(1.0);
        let zero = <T as DataType>::Scalar::from_f64(0.0);
        let what = "allocating batch-norm gradients";
        let (dx, dw, db) = with_held(&dev, |cudnn, held| {
            let bn = held.objects.get_or_make(key, || {
                CudnnBatchNorm::builder()
                    .epsilon(self.eps)
                    .build::<T>(&layout)
            })?;
            let mut y = output::<T>(cudnn, xv.len(), what)?;
            let mut dx = output::<T>(cudnn, xv.len(), what)?;
            let mut dw = output::<f32>(cudnn, c, what)?;
            let mut db = output::<f32>(cudnn, c, what)?;
            let saved =
                cudnn.batch_norm_forward_training(bn, one, zero, &xv, &mut y, &wv, &bv, None)?;
            cudnn.batch_norm_backward(
                bn, &saved, one, zero, one, zero, &xv, &dyv, &mut dx, &wv, &mut dw, &mut db,
            )?;
            Ok((dx, dw, db))
        })?;
        Ok((
            tensor(dx, &dev, xl.dims().to_vec()),
            tensor(dw, &dev, vec![c]),
            tensor(db, &dev, vec![c]),
        ))
    }
}

impl CustomOp3 for BatchNormOp {
    fn name(&self) -> &'static str {
        "cudnn-safe-batch-norm"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        Err(Error::invalid(
            OP,
            "device",
            "a CUDA device for the cuDNN operation (batch_norm runs candle's own on the CPU)",
            "cpu",
        ))
    }

    fn cuda_fwd(
        &self,
        xs: &CudaStorage,
        xl: &Layout,
        ws: &CudaStorage,
        wl: &Layout,
        bs: &CudaStorage,
        bl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        match xs.dtype() {
            DType::F32 => self.forward::<f32>(xs, xl, ws, wl, bs, bl),
            DType::F16 => self.forward::<f16>(xs, xl, ws, wl, bs, bl),
            DType::BF16 => self.forward::<bf16>(xs, xl, ws, wl, bs, bl),
            d => Err(Error::dtype(OP, "x", d)),
        }
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        if !self.training {
            return Err(Error::invalid(
                OP,
                "training",
                "true for cuDNN's backward pass (inference with gradients runs candle's \
                 operations)",
                false,
            ));
        }
        let dy = dy.contiguous()?;
        let (dx, dw, db) = match x.dtype() {
            DType::F32 => self.backward::<f32>(x, w, b, &dy)?,
            DType::F16 => self.backward::<f16>(x, w, b, &dy)?,
            DType::BF16 => self.backward::<bf16>(x, w, b, &dy)?,
            d => return Err(Error::dtype(OP, "x", d)),
        };
        Ok((Some(dx), Some(dw), Some(db)))
    }
}
