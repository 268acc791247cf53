//! Layer and RMS normalization over the last dimension, forward and backward.
use candle_core::{
    backend::BackendStorage, CpuStorage, CudaStorage, CustomOp2, CustomOp3, DType, Layout, Shape,
    Tensor, D,
};
use cudnn_safe::cudarc::driver::CudaSlice;
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::norm::RmsNorm;
use cudnn_safe::{GroupNorm, LayerNorm, NormType};

use crate::buf::{cuda_device, cuda_slice, output, packed, packed_aligned, tensor, Elem};
use crate::error::{like, wrap, Error};
use crate::state::with_held;

/// `(x − mean) / sqrt(var + eps) · gamma + beta` over the last dimension of `x` (biased
/// variance), as `candle_nn::ops::layer_norm(x, gamma, beta, eps)`, with the gradients of `x`,
/// `gamma` and `beta` in candle's autograd (candle's own fused kernel has none).
///
/// `gamma` and `beta`: `[x.dim(-1)]`, of x's dtype, on x's device. f32, f16 and bf16 on a CUDA
/// device run cuDNN (the fused normalization kernel where cuDNN has one for the shape, built at
/// the first call of each shape on a thread and kept; the backward pass recomputes the
/// statistics with a training forward, then runs cuDNN's backward); f64 and the CPU run candle's
/// operations. Statistics are computed in f32 for f16 and bf16. A non-contiguous `x` is made
/// contiguous first.
///
/// ```no_run
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{Device, Tensor};
/// let dev = Device::new_cuda(0)?;
/// let x = Tensor::randn(0f32, 1.0, (8, 128, 768), &dev)?;
/// let (g, b) = (Tensor::ones(768, x.dtype(), &dev)?, Tensor::zeros(768, x.dtype(), &dev)?);
/// let y = cudnn_safe_candle::layer_norm(&x, &g, &b, 1e-5)?;
/// # Ok(()) }
/// ```
pub fn layer_norm(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
) -> candle_core::Result<Tensor> {
    const OP: &str = "layer_norm";
    let f = features(OP, x)?;
    check(
        OP,
        x,
        f,
        "x's last dimension",
        &[(gamma, "gamma"), (beta, "beta")],
        eps,
    )?;
    if x.elem_count() == 0 {
        return x.zeros_like();
    }
    if !on_cudnn(x) {
        let xf = widen(x)?;
        let mean = xf.mean_keepdim(D::Minus1)?;
        let c = xf.broadcast_sub(&mean)?;
        let var = c.sqr()?.mean_keepdim(D::Minus1)?;
        let y = c.broadcast_div(&(var + f64::from(eps))?.sqrt()?)?;
        let y = y.to_dtype(x.dtype())?;
        return y.broadcast_mul(gamma)?.broadcast_add(beta);
    }
    let op = Norm {
        kind: Kind::Layer,
        eps,
    };
    let (x, gamma, beta) = (
        packed_aligned(x)?,
        packed_aligned(gamma)?,
        packed_aligned(beta)?,
    );
    if x.track_op() || gamma.track_op() || beta.track_op() {
        x.apply_op3(&gamma, &beta, op)
    } else {
        x.apply_op3_no_bwd(&gamma, &beta, &op)
    }
}

/// `x / sqrt(mean(x²) + eps) · gamma` over the last dimension of `x`, as
/// `candle_nn::ops::rms_norm(x, gamma, eps)`, with the gradients of `x` and `gamma` in
/// candle's autograd (candle's own fused kernel has none).
///
/// `gamma`: `[x.dim(-1)]`, of x's dtype, on x's device. f32, f16 and bf16 on a CUDA device run
/// cuDNN's RMS normalization (plans built at the first call of each shape on a thread and
/// kept; the backward pass recomputes the statistics with a training forward); f64 and the CPU
/// run candle's operations. A non-contiguous `x` is made contiguous first.
///
/// ```no_run
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{DType, Device, Tensor};
/// let dev = Device::new_cuda(0)?;
/// let x = Tensor::randn(0f32, 1.0, (4, 512, 4096), &dev)?.to_dtype(DType::BF16)?;
/// let g = Tensor::ones(4096, DType::BF16, &dev)?;
/// let y = cudnn_safe_candle::rms_norm(&x, &g, 1e-6)?;
/// # Ok(()) }
/// ```
pub fn rms_norm(x: &Tensor, gamma: &Tensor, eps: f32) -> candle_core::Result<Tensor> {
    const OP: &str = "rms_norm";
    let f = features(OP, x)?;
    check(OP, x, f, "x's last dimension", &[(gamma, "gamma")], eps)?;
    if x.elem_count() == 0 {
        return x.zeros_like();
    }
    let tracked = x.track_op() || gamma.track_op();
    if !on_cudnn(x) || !rms_plans(x, eps, tracked)? {
        let xf = widen(x)?;
        let ms = xf.sqr()?.mean_keepdim(D::Minus1)?;
        let y = xf.broadcast_div(&(ms + f64::from(eps))?.sqrt()?)?;
        return y.to_dtype(x.dtype())?.broadcast_mul(gamma);
    }
    let op = Norm {
        kind: Kind::Rms,
        eps,
    };
    let (x, gamma) = (packed_aligned(x)?, packed_aligned(gamma)?);
    if tracked {
        x.apply_op2(&gamma, op)
    } else {
        x.apply_op2_no_bwd(&gamma, &op)
    }
}

/// Group normalization (`torch.nn.functional.group_norm`, `candle_nn::GroupNorm`): the `c`
/// channels of each sample of `x` `[n, c, ...]` split into `groups` groups of `c / groups`
/// consecutive channels, each group (with all its positions) normalized to mean 0 and variance
/// 1 (biased), then `y = x̂ · gamma + beta` per channel; instance norm is `groups = c`. The
/// gradients of `x`, `gamma` and `beta` in candle's autograd.
///
/// `gamma` and `beta`: `[c]`, of x's dtype, on x's device. f32, f16 and bf16 on a CUDA device
/// run cuDNN (its batch-norm calls on a regrouped view; the backward pass recomputes the
/// statistics with a training forward); f64 and the CPU run candle's operations. A
/// non-contiguous `x` is made contiguous first.
///
/// ```no_run
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{Device, Tensor};
/// let dev = Device::new_cuda(0)?;
/// let x = Tensor::randn(0f32, 1.0, (4, 320, 32, 32), &dev)?;
/// let (g, b) = (Tensor::ones(320, x.dtype(), &dev)?, Tensor::zeros(320, x.dtype(), &dev)?);
/// let y = cudnn_safe_candle::group_norm(&x, 32, &g, &b, 1e-5)?;
/// # Ok(()) }
/// ```
pub fn group_norm(
    x: &Tensor,
    groups: usize,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
) -> candle_core::Result<Tensor> {
    const OP: &str = "group_norm";
    let dims = x.dims().to_vec();
    if dims.len() < 2 {
        return Err(Error::invalid(
            OP,
            "x",
            "at least 2 dimensions [n, c, ...]",
            dims,
        ));
    }
    let c = dims[1];
    if groups == 0 || !c.is_multiple_of(groups) {
        return Err(Error::invalid(
            OP,
            "groups",
            format!("a divisor of x's {c} channels"),
            groups,
        ));
    }
    check(
        OP,
        x,
        c,
        "x's channels, dimension 1",
        &[(gamma, "gamma"), (beta, "beta")],
        eps,
    )?;
    if x.elem_count() == 0 {
        return x.zeros_like();
    }
    if !on_cudnn(x) {
        let xf = widen(x)?.reshape((dims[0], groups, ()))?;
        let mean = xf.mean_keepdim(D::Minus1)?;
        let centred = xf.broadcast_sub(&mean)?;
        let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
        let y = centred.broadcast_div(&(var + f64::from(eps))?.sqrt()?)?;
        let y = y.reshape(dims.as_slice())?.to_dtype(x.dtype())?;
        let mut per_channel = vec![1; dims.len()];
        per_channel[1] = c;
        let (g, b) = (
            gamma.reshape(per_channel.as_slice())?,
            beta.reshape(per_channel.as_slice())?,
        );
        return y.broadcast_mul(&g)?.broadcast_add(&b);
    }
    let op = Norm {
        kind: Kind::Group(groups),
        eps,
    };
    let (x, gamma, beta) = (
        packed_aligned(x)?,
        packed_aligned(gamma)?,
        packed_aligned(beta)?,
    );
    if x.track_op() || gamma.track_op() || beta.track_op() {
        x.apply_op3(&gamma, &beta, op)
    } else {
        x.apply_op3_no_bwd(&gamma, &beta, &op)
    }
}

/// Whether cuDNN has RMS-norm plans for x's shape (inference, and with `training` the
/// forward-training and backward plans): built now and kept, so the operation finds them.
/// Where it has none, the caller runs candle's operations.
fn rms_plans(x: &Tensor, eps: f32, training: bool) -> candle_core::Result<bool> {
    fn plans<T: Elem + NormType>(
        x: &Tensor,
        eps: f32,
        training: bool,
    ) -> candle_core::Result<bool> {
        let Some(cuda) = x.device().as_cuda_device().ok() else {
            return Ok(false);
        };
        let norm = Norm {
            kind: Kind::Rms,
            eps,
        };
        let (dims, _) = norm.dims(x.dims());
        let layout = cudnn_safe::Layout::nchw_nd(&i64s(&dims)).map_err(wrap)?;
        with_held(cuda, |cudnn, held| {
            let made = held.objects.get_or_make(norm.key::<T>(&dims), || {
                RmsNorm::<T>::new(&layout, 1, f64::from(eps))
            });
            let built = made.and_then(|rn: &mut RmsNorm<T>| {
                rn.build_plan(cudnn)?;
                if training {
                    rn.build_training_plans(cudnn)?;
                }
                Ok(())
            });
            if let Err(e) = &built {
                log::warn!(
                    "rms_norm: no cuDNN plan for {dims:?} {:?}, candle's operations run it: {e}",
                    T::DTYPE
                );
            }
            Ok(built.is_ok())
        })
    }
    match x.dtype() {
        DType::F32 => plans::<f32>(x, eps, training),
        DType::F16 => plans::<f16>(x, eps, training),
        DType::BF16 => plans::<bf16>(x, eps, training),
        _ => Ok(false),
    }
}

/// f16 and bf16 as f32 (candle's own normalization computes in f32 too).
fn widen(x: &Tensor) -> candle_core::Result<Tensor> {
    match x.dtype() {
        DType::F16 | DType::BF16 => x.to_dtype(DType::F32),
        _ => Ok(x.clone()),
    }
}

fn on_cudnn(x: &Tensor) -> bool {
    x.device().is_cuda() && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
}

/// x's dtype, and the parameters' shape (`[channels]`, `which` says what that is), dtype and
/// device, and eps.
fn check(
    op: &'static str,
    x: &Tensor,
    channels: usize,
    which: &str,
    params: &[(&Tensor, &'static str)],
    eps: f32,
) -> candle_core::Result<()> {
    match x.dtype() {
        DType::F32 | DType::F16 | DType::BF16 | DType::F64 => {}
        d => return Err(Error::dtype(op, "x", d)),
    }
    for &(p, arg) in params {
        if p.dims() != [channels] {
            return Err(Error::invalid(
                op,
                arg,
                format!("[{channels}] ({which})"),
                p.dims(),
            ));
        }
        like(op, x, "x", p, arg)?;
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::invalid(op, "eps", "finite and at least 0", eps));
    }
    Ok(())
}

/// x's last dimension (which the norms over the last dimension normalize).
fn features(op: &'static str, x: &Tensor) -> candle_core::Result<usize> {
    match x.dims().last() {
        Some(&f) => Ok(f),
        None => Err(Error::invalid(op, "x", "at least one dimension", x.dims())),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Layer,
    Rms,
    /// Group norm in this many groups.
    Group(usize),
}

/// A normalization as a candle operation of (x, gamma[, beta]).
struct Norm {
    kind: Kind,
    eps: f32,
}

fn i64s(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&u| u as i64).collect()
}

impl Norm {
    fn op(&self) -> &'static str {
        match self.kind {
            Kind::Layer => "layer_norm",
            Kind::Rms => "rms_norm",
            Kind::Group(_) => "group_norm",
        }
    }

    /// The dims cuDNN's object describes x by (`[rows, features]` for the norms over the last
    /// dimension, x's own for group norm), and the length of gamma.
    fn dims(&self, x: &[usize]) -> (Vec<usize>, usize) {
        match self.kind {
            // Group norm depends on n, c and the positions per channel only: ranks above 4
            // are folded to [n, c, positions].
            Kind::Group(_) if x.len() > 4 => (vec![x[0], x[1], x[2..].iter().product()], x[1]),
            Kind::Group(_) => (x.to_vec(), x.get(1).copied().unwrap_or(1)),
            _ => {
                let features = x.last().copied().unwrap_or(1).max(1);
                let rows = x.iter().product::<usize>() / features;
                (vec![rows, features], features)
            }
        }
    }

    fn key<T: Elem>(&self, dims: &[usize]) -> String {
        format!(
            "{}-{:?}-{dims:?}-{:?}-{}",
            self.op(),
            T::DTYPE,
            self.kind,
            self.eps.to_bits()
        )
    }

    /// y from packed x, gamma (and beta).
    fn forward<T: Elem + NormType>(
        &self,
        xs: &CudaStorage,
        xl: &Layout,
        gs: &CudaStorage,
        gl: &Layout,
        beta: Option<(&CudaStorage, &Layout)>,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let op = self.op();
        let dev = xs.device().clone();
        let (dims, _) = self.dims(xl.dims());
        let len = xl.shape().elem_count();
        let x = packed(xs.as_cuda_slice::<T>()?, xl, op, "x")?;
        let g = packed(gs.as_cuda_slice::<T>()?, gl, op, "gamma")?;
        let b = match beta {
            Some((s, l)) => Some(packed(s.as_cuda_slice::<T>()?, l, op, "beta")?),
            None => None,
        };
        let layout = cudnn_safe::Layout::nchw_nd(&i64s(&dims)).map_err(wrap)?;
        let key = self.key::<T>(&dims);
        let eps = f64::from(self.eps);
        let y = with_held(&dev, |cudnn, held| {
            let mut y = output::<T>(cudnn, len, "allocating a normalization result")?;
            match (self.kind, &b) {
                (Kind::Layer, Some(b)) => {
                    let ln = held
                        .objects
                        .get_or_make(key, || LayerNorm::<T>::new(&layout, 1, eps))?;
                    cudnn.layer_norm_forward(ln, &x, &g, b, &mut y)?;
                }
                (Kind::Group(groups), Some(b)) => {
                    let gn = held
                        .objects
                        .get_or_make(key, || GroupNorm::<T>::new(&layout, groups as i64, eps))?;
                    cudnn.group_norm_forward(gn, &x, &g, b, &mut y)?;
                }
                _ => {
                    let rn = held
                        .objects
                        .get_or_make(key, || RmsNorm::<T>::new(&layout, 1, eps))?;
                    cudnn.rms_norm_forward(rn, &x, &g, &mut y, &mut held.ws)?;
                }
            }
            Ok(y)
        })?;
        Ok((CudaStorage::wrap_cuda_slice(y, dev), xl.shape().clone()))
    }

    /// dx, dgamma (and dbeta) from packed x, gamma and dy: a training forward recomputes the
    /// statistics, then cuDNN's backward pass runs.
    fn backward<T: Elem + NormType>(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: Option<&Tensor>,
        dy: &Tensor,
    ) -> candle_core::Result<(Tensor, Tensor, Option<Tensor>)> {
        let op = self.op();
        let (xs, xl) = x.storage_and_layout();
        let (gs, gl) = gamma.storage_and_layout();
        let (dys, dyl) = dy.storage_and_layout();
        let bs = beta.map(|b| b.storage_and_layout());
        let dev = cuda_device(&xs, op, "x")?;
        let xv = packed(cuda_slice::<T>(&xs, op, "x")?, xl, op, "x")?;
        let gv = packed(cuda_slice::<T>(&gs, op, "gamma")?, gl, op, "gamma")?;
        let dyv = packed(cuda_slice::<T>(&dys, op, "grad")?, dyl, op, "grad")?;
        let bv = match &bs {
            Some((s, l)) => Some(packed(cuda_slice::<T>(s, op, "beta")?, l, op, "beta")?),
            None => None,
        };
        let (dims, features) = self.dims(xl.dims());
        let len = xl.shape().elem_count();
        let layout = cudnn_safe::Layout::nchw_nd(&i64s(&dims)).map_err(wrap)?;
        let key = self.key::<T>(&dims);
        let eps = f64::from(self.eps);
        let what = "allocating normalization gradients";
        type Grads<T> = (CudaSlice<T>, CudaSlice<T>, Option<CudaSlice<T>>);
        let (dx, dg, db): Grads<T> = with_held(&dev, |cudnn, held| {
            let mut y = output::<T>(cudnn, len, what)?;
            let mut dx = output::<T>(cudnn, len, what)?;
            let mut dg = output::<T>(cudnn, features, what)?;
            match (self.kind, &bv) {
                (Kind::Group(groups), Some(b)) => {
                    let mut db = output::<T>(cudnn, features, what)?;
                    let gn = held
                        .objects
                        .get_or_make(key, || GroupNorm::<T>::new(&layout, groups as i64, eps))?;
                    let saved = cudnn.group_norm_forward_training(gn, &xv, &gv, b, &mut y)?;
                    cudnn.group_norm_backward(
                        gn,
                        &saved,
                        &xv,
                        &dyv,
                        &gv,
                        &mut dx,
                        &mut dg,
                        &mut db,
                        &mut held.ws,
                    )?;
                    Ok((dx, dg, Some(db)))
                }
                (Kind::Layer, Some(b)) => {
                    let mut db = output::<T>(cudnn, features, what)?;
                    let ln = held
                        .objects
                        .get_or_make(key, || LayerNorm::<T>::new(&layout, 1, eps))?;
                    let saved = cudnn.layer_norm_forward_training(ln, &xv, &gv, b, &mut y)?;
                    cudnn.layer_norm_backward(
                        ln,
                        &saved,
                        &xv,
                        &dyv,
                        &gv,
                        &mut dx,
                        &mut dg,
                        &mut db,
                        &mut held.ws,
                    )?;
                    Ok((dx, dg, Some(db)))
                }
                _ => {
                    let rn = held
                        .objects
                        .get_or_make(key, || RmsNorm::<T>::new(&layout, 1, eps))?;
                    let saved =
                        cudnn.rms_norm_forward_training(rn, &xv, &gv, &mut y, &mut held.ws)?;
                    cudnn.rms_norm_backward(
                        rn,
                        &saved,
                        &xv,
                        &dyv,
                        &gv,
                        &mut dx,
                        &mut dg,
                        &mut held.ws,
                    )?;
                    Ok((dx, dg, None))
                }
            }
        })?;
        Ok((
            tensor(dx, &dev, xl.dims().to_vec()),
            tensor(dg, &dev, vec![features]),
            db.map(|db| tensor(db, &dev, vec![features])),
        ))
    }

    fn cpu_refused(&self) -> candle_core::Error {
        Error::invalid(
            self.op(),
            "device",
            "a CUDA device for the cuDNN operation (the public functions run candle's own on \
             the CPU)",
            "cpu",
        )
    }
}

/// dy made packed with a 16-byte aligned start, as the graph engines take it: a broadcast
/// gradient (that of a sum) has zero strides, and nothing makes a gradient candle hands over
/// start on a 16-byte boundary.
fn packed_grad(dy: &Tensor) -> candle_core::Result<Tensor> {
    packed_aligned(dy)
}

impl CustomOp2 for Norm {
    fn name(&self) -> &'static str {
        "cudnn-safe-rms-norm"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        Err(self.cpu_refused())
    }

    fn cuda_fwd(
        &self,
        xs: &CudaStorage,
        xl: &Layout,
        gs: &CudaStorage,
        gl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        match xs.dtype() {
            DType::F32 => self.forward::<f32>(xs, xl, gs, gl, None),
            DType::F16 => self.forward::<f16>(xs, xl, gs, gl, None),
            DType::BF16 => self.forward::<bf16>(xs, xl, gs, gl, None),
            d => Err(Error::dtype(self.op(), "x", d)),
        }
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let dy = packed_grad(dy)?;
        let (dx, dg, _) = match x.dtype() {
            DType::F32 => self.backward::<f32>(x, gamma, None, &dy)?,
            DType::F16 => self.backward::<f16>(x, gamma, None, &dy)?,
            DType::BF16 => self.backward::<bf16>(x, gamma, None, &dy)?,
            d => return Err(Error::dtype(self.op(), "x", d)),
        };
        Ok((Some(dx), Some(dg)))
    }
}

impl CustomOp3 for Norm {
    fn name(&self) -> &'static str {
        match self.kind {
            Kind::Group(_) => "cudnn-safe-group-norm",
            _ => "cudnn-safe-layer-norm",
        }
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
        Err(self.cpu_refused())
    }

    fn cuda_fwd(
        &self,
        xs: &CudaStorage,
        xl: &Layout,
        gs: &CudaStorage,
        gl: &Layout,
        bs: &CudaStorage,
        bl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let b = Some((bs, bl));
        match xs.dtype() {
            DType::F32 => self.forward::<f32>(xs, xl, gs, gl, b),
            DType::F16 => self.forward::<f16>(xs, xl, gs, gl, b),
            DType::BF16 => self.forward::<bf16>(xs, xl, gs, gl, b),
            d => Err(Error::dtype(self.op(), "x", d)),
        }
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dy = packed_grad(dy)?;
        let (dx, dg, db) = match x.dtype() {
            DType::F32 => self.backward::<f32>(x, gamma, Some(beta), &dy)?,
            DType::F16 => self.backward::<f16>(x, gamma, Some(beta), &dy)?,
            DType::BF16 => self.backward::<bf16>(x, gamma, Some(beta), &dy)?,
            d => return Err(Error::dtype(self.op(), "x", d)),
        };
        Ok((Some(dx), Some(dg), db))
    }
}
